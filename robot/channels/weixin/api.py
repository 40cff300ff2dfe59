"""A small aiohttp client for the iLink bot API behind personal WeChat's official bot ("ClawBot").

Protocol facts follow the reference client, the npm package ``@tencent-weixin/openclaw-weixin``
2.4.9 (``src/api/types.ts``, ``src/api/api.ts``, ``src/auth/login-qr.ts``): JSON over HTTPS POST,
``AuthorizationType: ilink_bot_token`` + ``Authorization: Bearer <bot_token>``, a random
``X-WECHAT-UIN`` per request, ``base_info`` in every body, ``ret``/``errcode`` in answers and
``errcode -14`` for an expired session.

Errors::

    ChannelError (robot.channels.base)
    └── WeixinError
        ├── WeixinHTTPError      non-2xx answer, unreadable body or network failure (retry later)
        └── WeixinApiError       the server answered ret/errcode != 0
            └── SessionExpired   errcode -14: the account must log in again
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from robot.channels.base import ChannelError

__all__ = [
    "BOT_AGENT",
    "DEFAULT_API_BASE",
    "PROTOCOL_VERSION",
    "SESSION_EXPIRED",
    "CDNMedia",
    "FileItem",
    "GetUpdatesResp",
    "ImageItem",
    "MessageItem",
    "QRCode",
    "QRStatus",
    "RefMessage",
    "SessionExpired",
    "VoiceItem",
    "WeixinApi",
    "WeixinApiError",
    "WeixinError",
    "WeixinHTTPError",
    "WeixinMessage",
]

#: The reference client version whose protocol this module speaks.
PROTOCOL_VERSION = "2.4.9"
BOT_AGENT = "qunbot/0.1"
DEFAULT_API_BASE = "https://ilinkai.weixin.qq.com"
SESSION_EXPIRED = -14
ITEM_TEXT, ITEM_IMAGE, ITEM_VOICE, ITEM_FILE, ITEM_VIDEO = 1, 2, 3, 4, 5
MESSAGE_TYPE_USER, MESSAGE_TYPE_BOT = 1, 2
STATE_FINISH = 2
TYPING, TYPING_CANCEL = 1, 2


def _client_version(version: str) -> int:
    major, minor, patch = (int(p) for p in [*version.split("."), "0", "0"][:3])
    return ((major & 0xFF) << 16) | ((minor & 0xFF) << 8) | (patch & 0xFF)


class WeixinError(ChannelError):
    """Base of iLink client failures."""


class WeixinHTTPError(WeixinError):
    """The request did not get a usable answer: network, HTTP status or body; worth retrying."""


class WeixinApiError(WeixinError):
    """The server refused the request (``ret`` or ``errcode`` not 0)."""

    def __init__(self, endpoint: str, ret: int | None, errcode: int | None, errmsg: str) -> None:
        super().__init__(f"{endpoint}: ret={ret} errcode={errcode} errmsg={errmsg or '(none)'}")
        self.ret, self.errcode, self.errmsg = ret, errcode, errmsg


class SessionExpired(WeixinApiError):
    """``errcode -14``: the bot token is no longer valid; ``qunbot login weixin`` again."""


class _Wire(BaseModel):
    # uint64 ids arrive as JSON numbers; keep them as exact strings.
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class CDNMedia(_Wire):
    encrypt_query_param: str | None = None
    full_url: str | None = None


class ImageItem(_Wire):
    media: CDNMedia | None = None
    url: str | None = None


class VoiceItem(_Wire):
    media: CDNMedia | None = None
    playtime: int | None = None
    text: str | None = None


class FileItem(_Wire):
    media: CDNMedia | None = None
    file_name: str | None = None
    len: str | None = None


class TextItem(_Wire):
    text: str | None = None


class RefMessage(_Wire):
    message_item: MessageItem | None = None
    title: str | None = None
    svr_id: str | None = None


class MessageItem(_Wire):
    type: int | None = None
    msg_id: str | None = None
    create_time_ms: int | None = None
    ref_msg: RefMessage | None = None
    text_item: TextItem | None = None
    image_item: ImageItem | None = None
    voice_item: VoiceItem | None = None
    file_item: FileItem | None = None
    video_item: dict[str, Any] | None = None


class WeixinMessage(_Wire):
    """proto ``WeixinMessage``: one inbound (or echoed) message."""

    seq: int | None = None
    message_id: str | None = None
    from_user_id: str = ""
    to_user_id: str = ""
    create_time_ms: int | None = None
    session_id: str | None = None
    group_id: str | None = None
    message_type: int | None = None
    message_state: int | None = None
    item_list: list[MessageItem] = Field(default_factory=list)
    context_token: str | None = None


class GetUpdatesResp(_Wire):
    ret: int | None = None
    errcode: int | None = None
    errmsg: str | None = None
    # Parsed one by one: a bad one (even one that is not an object) is skipped, never the batch.
    msgs: list[Any] = Field(default_factory=list)
    get_updates_buf: str | None = None
    longpolling_timeout_ms: int | None = None


class QRCode(_Wire):
    qrcode: str
    qrcode_img_content: str


class QRStatus(_Wire):
    status: str = "wait"
    bot_token: str | None = None
    ilink_bot_id: str | None = None
    baseurl: str | None = None
    ilink_user_id: str | None = None
    redirect_host: str | None = None


class WeixinApi:
    """One account's view of the iLink API (``token`` empty for the QR-login calls)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str = "",
                 *, timeout_s: float = 15.0) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/") + "/"
        self.token = token
        self.timeout_s = timeout_s

    @staticmethod
    def base_info() -> dict[str, str]:
        return {"channel_version": PROTOCOL_VERSION, "bot_agent": BOT_AGENT}

    def _headers(self, *, auth: bool) -> dict[str, str]:
        headers = {"iLink-App-Id": "bot", "iLink-App-ClientVersion": str(_client_version(PROTOCOL_VERSION))}
        if auth:
            uin = str(int.from_bytes(secrets.token_bytes(4), "big"))
            headers |= {"Content-Type": "application/json", "AuthorizationType": "ilink_bot_token",
                        "X-WECHAT-UIN": base64.b64encode(uin.encode()).decode()}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def _request(self, method: str, endpoint: str, body: dict[str, Any] | None,
                       timeout_s: float) -> dict[str, Any]:
        url = self.base_url + endpoint
        data = None if body is None else json.dumps(body, ensure_ascii=False)
        try:
            async with self.session.request(method, url, data=data, headers=self._headers(auth=body is not None),
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.text()
                if resp.status >= 300:
                    # The body may echo request details; keep the error short and secret-free.
                    raise WeixinHTTPError(f"{endpoint.split('?')[0]}: HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WeixinHTTPError(f"{endpoint.split('?')[0]}: {type(exc).__name__}") from exc
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise WeixinHTTPError(f"{endpoint.split('?')[0]}: answer is not JSON") from exc
        if not isinstance(parsed, dict):
            raise WeixinHTTPError(f"{endpoint.split('?')[0]}: answer is not a JSON object")
        return parsed

    @staticmethod
    def _check(endpoint: str, answer: dict[str, Any]) -> None:
        ret, errcode = answer.get("ret"), answer.get("errcode")
        ret = ret if isinstance(ret, int) else None
        errcode = errcode if isinstance(errcode, int) else None
        if SESSION_EXPIRED in (ret, errcode):
            raise SessionExpired(endpoint, ret, errcode, str(answer.get("errmsg") or ""))
        if ret or errcode:
            raise WeixinApiError(endpoint, ret, errcode, str(answer.get("errmsg") or ""))

    async def get_updates(self, buf: str, timeout_ms: int) -> GetUpdatesResp:
        """Long-poll; a client-side timeout is the normal empty answer (the cursor is unchanged)."""
        try:
            answer = await self._request("POST", "ilink/bot/getupdates",
                                         {"get_updates_buf": buf, "base_info": self.base_info()},
                                         timeout_ms / 1000)
        except WeixinHTTPError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                return GetUpdatesResp(ret=0, get_updates_buf=buf)
            raise
        self._check("getupdates", answer)
        try:
            return GetUpdatesResp.model_validate(answer)
        except ValidationError as exc:
            raise WeixinHTTPError(f"getupdates: malformed answer ({exc.error_count()} errors)") from exc

    async def send_text(self, to_user_id: str, text: str, *, context_token: str, client_id: str) -> str | None:
        """``sendmessage`` with one finished text item; returns the server's message id if given."""
        msg = {"from_user_id": "", "to_user_id": to_user_id, "client_id": client_id,
               "message_type": MESSAGE_TYPE_BOT, "message_state": STATE_FINISH,
               "item_list": [{"type": ITEM_TEXT, "text_item": {"text": text}}], "context_token": context_token}
        answer = await self._request("POST", "ilink/bot/sendmessage", {"msg": msg, "base_info": self.base_info()},
                                     self.timeout_s)
        self._check("sendmessage", answer)
        mid = answer.get("message_id")
        return None if mid is None else str(mid)

    async def typing_ticket(self, user_id: str, context_token: str | None) -> str:
        """``getconfig``: the ticket ``sendtyping`` needs for this user ("" if none)."""
        body: dict[str, Any] = {"ilink_user_id": user_id, "base_info": self.base_info()}
        if context_token:
            body["context_token"] = context_token
        answer = await self._request("POST", "ilink/bot/getconfig", body, min(self.timeout_s, 10.0))
        self._check("getconfig", answer)
        return str(answer.get("typing_ticket") or "")

    async def send_typing(self, user_id: str, ticket: str, status: int = TYPING) -> None:
        answer = await self._request("POST", "ilink/bot/sendtyping",
                                     {"ilink_user_id": user_id, "typing_ticket": ticket, "status": status,
                                      "base_info": self.base_info()}, min(self.timeout_s, 10.0))
        self._check("sendtyping", answer)

    async def notify(self, start: bool) -> None:
        """``msg/notifystart`` / ``msg/notifystop``: tell the server the client starts or stops."""
        endpoint = "ilink/bot/msg/notifystart" if start else "ilink/bot/msg/notifystop"
        answer = await self._request("POST", endpoint, {"base_info": self.base_info()}, min(self.timeout_s, 10.0))
        self._check(endpoint, answer)

    async def get_bot_qrcode(self, bot_type: str, local_tokens: list[str]) -> QRCode:
        answer = await self._request("POST", f"ilink/bot/get_bot_qrcode?bot_type={bot_type}",
                                     {"local_token_list": local_tokens}, self.timeout_s)
        self._check("get_bot_qrcode", answer)
        try:
            return QRCode.model_validate(answer)
        except ValidationError as exc:
            raise WeixinHTTPError("get_bot_qrcode: malformed answer") from exc

    async def get_qrcode_status(self, qrcode: str, verify_code: str | None = None,
                                timeout_s: float = 35.0) -> QRStatus:
        """Long-poll the QR state; a client-side timeout reads as ``wait``."""
        endpoint = f"ilink/bot/get_qrcode_status?qrcode={quote(qrcode, safe='')}"
        if verify_code:
            endpoint += f"&verify_code={quote(verify_code, safe='')}"
        try:
            answer = await self._request("GET", endpoint, None, timeout_s)
        except WeixinHTTPError as exc:
            if isinstance(exc.__cause__, TimeoutError):
                return QRStatus(status="wait")
            raise
        try:
            return QRStatus.model_validate(answer)
        except ValidationError as exc:
            raise WeixinHTTPError("get_qrcode_status: malformed answer") from exc
