"""A fake iLink server on loopback for tests and benches, following the reference client's types.

It checks every request the way the reference client (``@tencent-weixin/openclaw-weixin`` 2.4.9)
builds it: POST JSON bodies with ``base_info``, ``AuthorizationType: ilink_bot_token``, a bearer
token, a base64 ``X-WECHAT-UIN`` and the ``iLink-App-*`` headers; the QR-status call is a GET.
A request that breaks those rules gets HTTP 400 and is listed in :attr:`FakeILinkServer.errors`.
Message ids go out as bare JSON numbers beyond 2**53, as uint64 ids do on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from function_calls.testing.loopback import LoopbackServer

__all__ = ["FakeILinkServer", "SentText"]


@dataclass
class SentText:
    """One ``sendmessage`` the fake accepted."""

    token: str
    to_user_id: str
    text: str
    context_token: str
    client_id: str
    message_id: int


@dataclass
class _Bot:
    bot_id: str
    user_id: str
    queue: list[dict[str, Any]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    expired: bool = False
    issued: dict[str, set[str]] = field(default_factory=dict)  # chat id -> context tokens given out


class FakeILinkServer(LoopbackServer):
    """``async with FakeILinkServer() as fake:``; ``fake.url`` is the base URL (ends without '/')."""

    def __init__(self, *, hold_s: float = 0.2, longpolling_timeout_ms: int | None = None) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.longpolling_timeout_ms = longpolling_timeout_ms
        self.bots: dict[str, _Bot] = {}  # by token
        self.errors: list[str] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.sent: list[SentText] = []
        self.typing: list[tuple[str, str, int]] = []  # (user, ticket, status)
        self.fail_next: list[int] = []  # HTTP statuses for the next getupdates calls
        self.fail_sends: list[int] = []  # HTTP statuses for the next sendmessage calls
        self.qr_script: list[dict[str, Any]] = []  # get_qrcode_status answers, in order
        self.junk: list[Any] = []  # entries that are not messages, put before every batch's messages
        self.qrcodes_issued = 0
        self.seq = itertools.count(1)
        self.ids = itertools.count(7_300_000_000_000_000_001)  # > 2**53: lossless ids matter

    # --- scripting --------------------------------------------------------------------------
    def add_bot(self, token: str, bot_id: str = "b0f1@im.bot", user_id: str = "owner@im.wechat") -> None:
        self.bots[token] = _Bot(bot_id, user_id)

    def context_token(self, user: str, n: int) -> str:
        return f"ctx-{user}-{n}"

    def inject(self, token: str, from_user: str, *items: dict[str, Any], group_id: str | None = None,
               text: str | None = None) -> dict[str, Any]:
        """Queue one user message for the bot with ``token``; returns it as it will go out."""
        bot = self.bots[token]
        seq = next(self.seq)
        item_list = list(items) or [{"type": 1, "text_item": {"text": text or ""}}]
        msg: dict[str, Any] = {
            "seq": seq, "message_id": next(self.ids), "from_user_id": from_user, "to_user_id": bot.bot_id,
            "create_time_ms": int(time.time() * 1000), "session_id": f"s-{from_user}", "message_type": 1,
            "message_state": 2, "item_list": item_list, "context_token": self.context_token(from_user, seq),
        }
        if group_id:
            msg["group_id"] = group_id
        bot.queue.append(msg)
        bot.issued.setdefault(group_id or from_user, set()).add(msg["context_token"])
        bot.wake.set()
        return msg

    def expire(self, token: str) -> None:
        """From now on this token's calls answer ``errcode -14``."""
        self.bots[token].expired = True

    # --- server -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The iLink base URL to give the channel."""
        return self.root_url

    def routes(self, app: web.Application) -> None:
        for path, handler in (("getupdates", self._getupdates), ("sendmessage", self._sendmessage),
                              ("getconfig", self._getconfig), ("sendtyping", self._sendtyping),
                              ("msg/notifystart", self._notify), ("msg/notifystop", self._notify),
                              ("get_bot_qrcode", self._qrcode)):
            app.router.add_post(f"/ilink/bot/{path}", handler)
        app.router.add_get("/ilink/bot/get_qrcode_status", self._qrstatus)

    async def stop(self) -> None:
        for bot in self.bots.values():
            bot.wake.set()  # long polls in flight return now
        await super().stop()

    def _bad(self, what: str) -> web.Response:
        self.errors.append(what)
        return web.json_response({"ret": -1, "errmsg": what}, status=400)

    def _common_headers(self, request: web.Request) -> str | None:
        if request.headers.get("iLink-App-Id") is None:
            return "iLink-App-Id header missing"
        if not request.headers.get("iLink-App-ClientVersion", "").isdigit():
            return "iLink-App-ClientVersion must be a uint32 in decimal"
        return None

    async def _authed(self, request: web.Request) -> tuple[_Bot | None, dict[str, Any], web.Response | None]:
        """Check the reference client's POST conventions; returns (bot, body, error response)."""
        name = request.path.rsplit("/", 1)[-1]
        problem = self._common_headers(request)
        if problem is None and not request.headers.get("Content-Type", "").startswith("application/json"):
            problem = "Content-Type must be application/json"
        if problem is None and request.headers.get("AuthorizationType") != "ilink_bot_token":
            problem = "AuthorizationType must be ilink_bot_token"
        if problem is None:
            try:
                uin = base64.b64decode(request.headers.get("X-WECHAT-UIN", ""), validate=True).decode()
                if not uin.isdigit() or int(uin) >= 2**32:
                    problem = "X-WECHAT-UIN must be base64 of a uint32 in decimal"
            except (binascii.Error, UnicodeDecodeError):
                problem = "X-WECHAT-UIN must be base64"
        try:
            body = json.loads(await request.text())
        except ValueError:
            return None, {}, self._bad(f"{name}: body is not JSON")
        if problem is None and (not isinstance(body, dict) or not isinstance(body.get("base_info"), dict)):
            problem = "body must be an object with base_info"
        if problem is not None:
            return None, {}, self._bad(f"{name}: {problem}")
        self.requests.append((name, body))
        auth = request.headers.get("Authorization", "")
        bot = self.bots.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        if bot is None or bot.expired:
            return None, body, web.json_response({"ret": -14, "errcode": -14, "errmsg": "session timeout"})
        return bot, body, None

    @staticmethod
    def _raw_json(data: dict[str, Any]) -> web.Response:
        # json.dumps writes big ints as bare numbers, exactly what the lossless id parsing is for.
        return web.Response(text=json.dumps(data, ensure_ascii=False), content_type="application/json")

    async def _getupdates(self, request: web.Request) -> web.Response:
        if self.fail_next:
            return web.Response(status=self.fail_next.pop(0), text="upstream error")
        bot, body, error = await self._authed(request)
        if error is not None:
            return error
        assert bot is not None
        buf = body.get("get_updates_buf")
        if not isinstance(buf, str):
            return self._bad("getupdates: get_updates_buf must be a string")
        try:
            after = int(base64.b64decode(buf).decode() or 0) if buf else 0
        except (binascii.Error, ValueError):
            return self._bad("getupdates: unknown get_updates_buf")
        pending = bot.queue[bisect.bisect_right(bot.queue, after, key=lambda m: m["seq"]):]
        if not pending:
            bot.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(bot.wake.wait(), self.hold_s)
            pending = bot.queue[bisect.bisect_right(bot.queue, after, key=lambda m: m["seq"]):]
        last = max((m["seq"] for m in pending), default=after)
        if pending and self.junk:  # a real server resends the same batch: the junk with it
            pending = [*self.junk, *pending]
        answer: dict[str, Any] = {"ret": 0, "msgs": pending,
                                  "get_updates_buf": base64.b64encode(str(last).encode()).decode()}
        if self.longpolling_timeout_ms is not None:
            answer["longpolling_timeout_ms"] = self.longpolling_timeout_ms
        return self._raw_json(answer)

    async def _sendmessage(self, request: web.Request) -> web.Response:
        if self.fail_sends:
            return web.Response(status=self.fail_sends.pop(0), text="upstream error")
        bot, body, error = await self._authed(request)
        if error is not None:
            return error
        assert bot is not None
        msg = body.get("msg")
        if not isinstance(msg, dict):
            return self._bad("sendmessage: msg missing")
        items = msg.get("item_list") or []
        if msg.get("message_type") != 2 or msg.get("message_state") != 2 or not msg.get("client_id") \
                or not isinstance(msg.get("to_user_id"), str) or len(items) != 1 or items[0].get("type") != 1:
            return self._bad("sendmessage: not a finished bot text message")
        to, ctx = msg["to_user_id"], msg.get("context_token") or ""
        if ctx not in bot.issued.get(to, set()):
            return self._raw_json({"ret": -2, "errmsg": "invalid context_token"})
        mid = next(self.ids)
        token = request.headers["Authorization"].removeprefix("Bearer ")
        self.sent.append(SentText(token, to, str(items[0].get("text_item", {}).get("text", "")), ctx,
                                  str(msg["client_id"]), mid))
        return self._raw_json({"ret": 0, "message_id": mid})

    async def _getconfig(self, request: web.Request) -> web.Response:
        _, body, error = await self._authed(request)
        if error is not None:
            return error
        user = body.get("ilink_user_id")
        if not isinstance(user, str) or not user:
            return self._bad("getconfig: ilink_user_id missing")
        return self._raw_json({"ret": 0, "typing_ticket": base64.b64encode(f"ticket:{user}".encode()).decode()})

    async def _sendtyping(self, request: web.Request) -> web.Response:
        _, body, error = await self._authed(request)
        if error is not None:
            return error
        user, ticket, status = body.get("ilink_user_id"), body.get("typing_ticket"), body.get("status")
        if not isinstance(user, str) or ticket != base64.b64encode(f"ticket:{user}".encode()).decode() \
                or status not in (1, 2):
            return self._bad("sendtyping: bad user, ticket or status")
        self.typing.append((user, str(ticket), int(status)))
        return self._raw_json({"ret": 0})

    async def _notify(self, request: web.Request) -> web.Response:
        _, _, error = await self._authed(request)
        return error or self._raw_json({"ret": 0})

    async def _qrcode(self, request: web.Request) -> web.Response:
        problem = self._common_headers(request)
        if problem is None and request.query.get("bot_type") is None:
            problem = "bot_type query parameter missing"
        try:
            body = json.loads(await request.text())
        except ValueError:
            body = None
        if problem is None and (not isinstance(body, dict) or not isinstance(body.get("local_token_list"), list)):
            problem = "body must carry local_token_list"
        if problem is not None:
            return self._bad(f"get_bot_qrcode: {problem}")
        self.qrcodes_issued += 1
        code = f"qr-{self.qrcodes_issued}"
        return self._raw_json({"qrcode": code, "qrcode_img_content": f"https://liteapp.weixin.qq.com/q/{code}"})

    async def _qrstatus(self, request: web.Request) -> web.Response:
        problem = self._common_headers(request)
        if problem is None and not request.query.get("qrcode", "").startswith("qr-"):
            problem = "unknown qrcode"
        if problem is not None:
            return self._bad(f"get_qrcode_status: {problem}")
        answer = self.qr_script.pop(0) if self.qr_script else {"status": "wait"}
        return self._raw_json(answer)
