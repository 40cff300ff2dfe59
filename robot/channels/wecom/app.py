"""The WeCom self-built app (自建应用) channel: XML callbacks in, ``message/send`` out.

Only private chats exist here: every message (a picture, a voice note, a place or a link as a
placeholder) becomes a ``robot.Message`` in the chat ``wecom:private:<FromUserName>``, and
replies go to that user through the app.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from robot.channels.base import Capabilities, SendReceipt, SendRejected
from robot.channels.wecom.api import WeComAPI, split_utf8
from robot.channels.wecom.callback import CallbackQuery, WeComCallbackChannel
from robot.channels.wecom.crypto import MalformedBody, parse_xml
from robot.channels.wecom.settings import WeComSettings
from robot.message import ChatRef, Message, OutgoingMessage, Sender

__all__ = ["WeComChannel", "parse_app_message"]

log = logging.getLogger("robot.channels.wecom")

_TEXT_LIMIT = 2048  # message/send text content limit, in UTF-8 bytes
_LABEL_LEN = 200
_PLACEHOLDERS = {"image": "[图片]", "video": "[视频]"}


def _label(text: str | None, limit: int = _LABEL_LEN) -> str:
    # A sender's client chooses titles and labels: one short line, never a fake speaker line.
    return " ".join((text or "").split())[:limit]


def _message_text(root: ET.Element, msg_type: str) -> str | None:
    """The text a message shows the bot: a text's content, a placeholder for the rest
    (the types of document/path/90239); ``None`` for events and unknown types."""
    if msg_type == "text":
        return (root.findtext("Content") or "").strip()
    if msg_type in _PLACEHOLDERS:
        return _PLACEHOLDERS[msg_type]
    if msg_type == "voice":  # (a transcription, when the corp has one turned on)
        said = (root.findtext("Recognition") or "").strip()
        return f"[语音] {said}" if said else "[语音]"
    if msg_type == "location":
        where = _label(root.findtext("Label")) or ", ".join(
            p for p in (_label(root.findtext("Location_X")), _label(root.findtext("Location_Y"))) if p)
        return f"[位置: {where}]" if where else "[位置]"
    if msg_type == "link":
        shown = " ".join(p for p in (_label(root.findtext("Title")), _label(root.findtext("Url"), 2000)) if p)
        return f"[链接: {shown}]" if shown else "[链接]"
    return None


def parse_app_message(xml_text: str) -> Message | None:
    """Turn a decrypted app callback into a Message (media, places and links as placeholders such as
    ``[图片]``, ``[语音] 转写``, ``[位置: 地点]``, ``[链接: 标题 url]``); ``None`` for events."""
    root = parse_xml(xml_text)
    text = _message_text(root, root.findtext("MsgType") or "")
    if text is None:
        return None
    user = root.findtext("FromUserName") or ""
    msg_id = root.findtext("MsgId") or ""
    if not user or not msg_id:
        raise MalformedBody("message without FromUserName or MsgId")
    try:
        created = datetime.fromtimestamp(int(root.findtext("CreateTime") or ""), tz=UTC)
    except (ValueError, OverflowError, OSError):
        created = datetime.now(UTC)
    raw: dict[str, object] = {child.tag: child.text or "" for child in root}
    return Message(
        chat=ChatRef(platform="wecom", chat_id=user, kind="private"),
        sender=Sender(user_id=user, name=user),
        message_id=msg_id,
        text=text,
        timestamp=created,
        raw=raw,
    )


class WeComChannel(WeComCallbackChannel):
    """WeCom self-built app: encrypted XML callbacks in, ``message/send`` replies out.

    Construct with ``WeComChannel(settings)`` (``settings.mode == "app"``); pass ``session``
    to share an ``aiohttp.ClientSession``.
    """

    # One outbox part is one message (a character is at most 4 UTF-8 bytes): see the Telegram channel's note.
    capabilities = Capabilities(max_text_len=_TEXT_LIMIT // 4, mentions=False, streaming=False, markdown=False)

    def __init__(self, settings: WeComSettings, *, session: aiohttp.ClientSession | None = None) -> None:
        if settings.mode != "app":
            raise ValueError("WeComChannel needs mode='app'; use WeComAIBotChannel for mode='aibot'")
        super().__init__(settings, session=session)
        self._api: WeComAPI | None = None
        self._api_session: aiohttp.ClientSession | None = None

    def api(self) -> WeComAPI:
        """The server-API client (token cache), created on first use."""
        session = self.http()
        if self._api is None or self._api_session is not session:
            self._api = WeComAPI(
                session,
                api_base=self.settings.api_base,
                corp_id=self.settings.corp_id,
                corp_secret=self.settings.corp_secret.get_secret_value(),
                agent_id=self.settings.agent_id or 0,
                timeout=self.settings.request_timeout,
            )
            self._api_session = session
        return self._api

    async def handle_callback(self, query: CallbackQuery, body: bytes) -> web.StreamResponse:
        plain = self.crypto.decrypt_xml(query.msg_signature, query.timestamp, query.nonce, body)
        message = parse_app_message(plain)
        if message is None:
            log.debug("wecom: ignoring an event callback")
        elif not self.taking:
            return self.not_taking(message)
        elif self.remember(message.message_id) is not None:
            log.info("wecom: duplicate MsgId %s ignored (WeCom retry)", message.message_id)
        else:
            self.deliver_soon(message)
        return web.Response(text="success")

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if message.chat.kind != "private":
            raise SendRejected("a WeCom app can only send to private chats (users)")
        api = self.api()
        first: str | None = None
        for piece in split_utf8(message.text, _TEXT_LIMIT):
            msgid = await api.send_text(message.chat.chat_id, piece)
            first = first or msgid
        return SendReceipt(platform_message_id=first)
