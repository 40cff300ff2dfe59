"""The WeCom self-built app (自建应用) channel: XML callbacks in, ``message/send`` out.

Only private chats exist here: every text message becomes a ``robot.Message`` in the chat
``wecom:private:<FromUserName>``, and replies go to that user through the app.
"""

from __future__ import annotations

import logging
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


def parse_app_message(xml_text: str) -> Message | None:
    """Turn a decrypted app callback into a Message; ``None`` for events and non-text messages."""
    root = parse_xml(xml_text)
    msg_type = root.findtext("MsgType") or ""
    if msg_type != "text":
        return None
    user = root.findtext("FromUserName") or ""
    msg_id = root.findtext("MsgId") or ""
    if not user or not msg_id:
        raise MalformedBody("text message without FromUserName or MsgId")
    try:
        created = datetime.fromtimestamp(int(root.findtext("CreateTime") or ""), tz=UTC)
    except (ValueError, OverflowError, OSError):
        created = datetime.now(UTC)
    raw: dict[str, object] = {child.tag: child.text or "" for child in root}
    return Message(
        chat=ChatRef(platform="wecom", chat_id=user, kind="private"),
        sender=Sender(user_id=user, name=user),
        message_id=msg_id,
        text=(root.findtext("Content") or "").strip(),
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
            log.debug("wecom: ignoring a non-text callback")
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
