"""The WeCom AI bot (智能机器人) channel: encrypted JSON callbacks, passive stream replies.

Protocol (developer.work.weixin.qq.com/document/path/100719 接收消息, 101031 被动回复消息,
101033 加解密方案, 101138 主动回复消息; cross-checked with sipeed/picoclaw
``pkg/channels/wecom/aibot.go``):

* A user message arrives as ``{"encrypt": ...}`` (receive_id ``""``) whose plaintext has
  ``msgid, aibotid, chatid, chattype ("single"|"group"), from.userid, response_url, msgtype``
  and ``text.content`` (``"@RobotA hello"`` in groups), ``voice.content`` (WeCom's transcription),
  ``image.url`` / ``file.url`` (encrypted media, shown as ``[图片]`` / ``[文件]``) or
  ``mixed.msg_item``. We answer at once with an encrypted
  ``{"msgtype": "stream", "stream": {"id": <new>, "finish": false, "content": ""}}``.
* Until a stream reply says ``finish: true`` (for up to 6 minutes), WeCom polls with
  ``msgtype: "stream"`` callbacks carrying ``stream.id``; each answer carries the whole
  content so far (at most 20,480 bytes). :meth:`WeComAIBotChannel.stream_delta` appends to it
  and :meth:`WeComAIBotChannel.send` sets the final text and finishes it. The outbox sends a
  long answer in parts, each a ``send`` of its own: later parts join the bubble while it has
  room and WeCom has not seen it finished (it is shown finished only after a moment with no
  further part, since WeCom stops polling then).
* A message the bot handled without an answer (rate-limited into silence, an ask_user answer, a
  duplicate) has its bubble finished as it stands (empty: no noise) at the first refresh
  :data:`_UNANSWERED` seconds after its handling ended.
* When the bot stops (its outbox has stopped: no part can follow), a polled bubble shows finished at
  once, and the stop waits up to :data:`_COLLECT` seconds for WeCom to collect the answers still in
  their bubbles; one it did not collect goes through the chat's unused ``response_url`` instead (after
  a restart the bubble is unknown, and WeCom's next poll of it would get it ended, empty).
* Encrypted replies are JSON ``{"encrypt", "msgsignature", "timestamp", "nonce"}``.
* With no open stream (a reminder, a part the bubble cannot take), ``send`` falls back to the
  message's ``response_url`` (plain JSON markdown, single use, valid one hour); a URL is spent
  only once WeCom accepted the post, so a post that failed for now is retried with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from robot.channels.base import Capabilities, ChannelError, SendFailed, SendReceipt, SendRejected
from robot.channels.wecom.api import call_json, raise_for_errcode, split_utf8
from robot.channels.wecom.callback import CallbackQuery, WeComCallbackChannel
from robot.channels.wecom.crypto import MalformedBody
from robot.channels.wecom.settings import WeComSettings
from robot.message import ChatRef, Message, OutgoingMessage, Sender

__all__ = ["WeComAIBotChannel", "parse_aibot_message"]

log = logging.getLogger("robot.channels.wecom")

_STREAM_OPEN = 330.0  # WeCom stops polling 6 min after the user's message; keep a margin
_STREAM_KEEP = 420.0  # finished streams still answer late polls for a while
_RESPONSE_URL_TTL = 3500.0  # response_url is valid for one hour
_STREAM_BYTES = 20480  # stream.content limit
_SETTLE = 1.0  # a finished bubble shows as finished once no further part came for this long
# The bot's sink returns once the message is handled and any answer committed to the outbox, whose
# send into the bubble (in memory, no network) follows within milliseconds, a second or two behind
# other chats' sends when the outbox is crowded. A bubble still open this long after is one the bot
# left unanswered (rate-limited into silence, an ask_user answer, a duplicate): it is finished, not
# left spinning for WeCom's 6 minutes. An answer later still is not lost: it uses the response_url.
_UNANSWERED = 3.0
# WeCom polls an open bubble about every second; a stopping bot waits this long for it to collect answers.
_COLLECT = 2.0
_PART_GAP = "\n\n"  # between the parts of a long answer in one bubble (they were cut at a break)
_MAX_STREAMS = 1024
_LEADING_MENTION = re.compile(r"^\s*@\S+\s*")
_PLACEHOLDERS = {"image": "[图片]", "file": "[文件]"}


def _item_text(item: dict[str, Any]) -> str | None:
    """One message (or mixed item) as text: a text's content, WeCom's transcription of a voice note, or a
    placeholder for an image or a file (sent as encrypted URLs, no name); ``None`` for anything else."""
    msgtype = item.get("msgtype")
    if msgtype == "text":
        return _str(_dict(item.get("text")).get("content"))
    if msgtype == "voice":
        said = _str(_dict(item.get("voice")).get("content")).strip()
        return f"[语音] {said}" if said else "[语音]"
    return _PLACEHOLDERS.get(_str(msgtype))


def parse_aibot_message(data: dict[str, Any], *, bot_name: str = "", received_at: datetime) -> Message | None:
    """Turn a decrypted AI-bot callback into a Message (a voice note as ``[语音] 转写``, an image or a file
    as ``[图片]`` / ``[文件]``: document/path/100719); ``None`` for events and stream refreshes."""
    if data.get("msgtype") == "mixed":
        items = _dict(data.get("mixed")).get("msg_item")
        parts = [_item_text(item) for item in (items if isinstance(items, list) else []) if isinstance(item, dict)]
        text = "\n".join(p for p in parts if p)
    elif (single := _item_text(data)) is not None:
        text = single
    else:
        return None
    msgid = _str(data.get("msgid"))
    user = _str(_dict(data.get("from")).get("userid"))
    if not msgid or not user:
        raise MalformedBody("AI-bot message without msgid or from.userid")
    group = data.get("chattype") == "group"
    if group:
        chat_id = _str(data.get("chatid"))
        if not chat_id:
            raise MalformedBody("AI-bot group message without chatid")
        chat = ChatRef(platform="wecom", chat_id=chat_id, kind="group")
    else:
        chat = ChatRef(platform="wecom", chat_id=user, kind="private")
    if bot_name:
        text = re.sub(rf"\s*@{re.escape(bot_name)}(?=\s|$)\s*", " ", text)
    elif group:
        text = _LEADING_MENTION.sub("", text, count=1)
    # response_url lets anyone post into the chat for an hour: keep it out of stored history.
    raw = {k: v for k, v in data.items() if k != "response_url"}
    return Message(
        chat=chat,
        sender=Sender(user_id=user, name=user),
        message_id=msgid,
        text=text.strip(),
        timestamp=received_at,
        mentions_bot=group,
        raw=raw,
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _cap(text: str) -> str:
    return split_utf8(text, _STREAM_BYTES)[0]


@dataclass
class _Stream:
    id: str
    chat_key: str
    msgid: str
    created: float
    content: str = ""
    finish: bool = False
    finished_at: float = 0.0
    #: Nothing more joins it: WeCom saw it finished, or a later part went out below it.
    sealed: bool = False
    #: When the bot was done handling its message (``None``: not yet).
    handled_at: float | None = None
    #: WeCom was served it finished, so with all of its content: nothing of it is left to hand over.
    collected: bool = False


class WeComAIBotChannel(WeComCallbackChannel):
    """WeCom AI bot (``settings.mode == "aibot"``): private and group chats, streamed replies.

    Construct with ``WeComAIBotChannel(settings)``; ``session`` shares an aiohttp ClientSession
    (used only for the ``response_url`` fallback).
    """

    capabilities = Capabilities(max_text_len=_STREAM_BYTES // 4, mentions=False, streaming=True, markdown=True)  # (uncut)

    def __init__(self, settings: WeComSettings, *, session: aiohttp.ClientSession | None = None) -> None:
        if settings.mode != "aibot":
            raise ValueError("WeComAIBotChannel needs mode='aibot'")
        super().__init__(settings, session=session)
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._response_urls: dict[str, tuple[str, float]] = {}
        self._posting: set[str] = set()  # response_urls a send is posting to now
        self._closing = False  # the stop has begun: no part can follow
        self._polled = asyncio.Event()  # WeCom was served a bubble

    async def start(self) -> None:
        self._closing = False
        await super().start()

    async def before_close(self) -> None:
        """Let WeCom collect the answers still in their bubbles, for up to :data:`_COLLECT` seconds."""
        self._closing = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_COLLECT):
                while self._uncollected():
                    self._polled.clear()
                    await self._polled.wait()

    async def after_close(self) -> None:
        """Post the answers WeCom did not collect through their chats' unused response_urls: the outbox
        recorded them sent, and after a restart their bubbles end empty."""
        chats: dict[str, list[_Stream]] = {}
        for stream in self._uncollected():
            chats.setdefault(stream.chat_key, []).append(stream)
        await asyncio.gather(*(self._hand_over(key, streams) for key, streams in chats.items()))

    async def _hand_over(self, chat_key: str, streams: list[_Stream]) -> None:
        url = self._unused_url(chat_key)
        try:
            if not url:
                raise SendRejected("no unused response_url")
            await self._post(chat_key, url, _PART_GAP.join(s.content for s in streams))
        except ChannelError as exc:
            log.warning("wecom aibot: %d answer(s) in %s were not collected from their bubbles before the stop, "
                        "and could not be posted instead: %s", len(streams), chat_key, exc)
            return
        for stream in streams:  # a poll of a bubble kept in memory (the channel restarted) shows it ended, empty
            stream.content, stream.collected = "", True

    def _uncollected(self) -> list[_Stream]:
        return [s for s in self._streams.values() if s.finish and s.content and not s.collected]

    # -- callbacks --------------------------------------------------------------------------

    async def handle_callback(self, query: CallbackQuery, body: bytes) -> web.StreamResponse:
        plain = self.crypto.decrypt_json(query.msg_signature, query.timestamp, query.nonce, body)
        try:
            data = json.loads(plain)
        except (ValueError, RecursionError):
            raise MalformedBody("decrypted AI-bot payload is not JSON") from None
        if not isinstance(data, dict):
            raise MalformedBody("decrypted AI-bot payload is not a JSON object")
        now = self._now()
        self._prune(now)
        if data.get("msgtype") == "stream":
            stream_id = _str(_dict(data.get("stream")).get("id"))
            stream = self._streams.get(stream_id)
            if stream is None:
                # Unknown (expired, or from before a restart): end it rather than leave the user waiting.
                log.info("wecom aibot: refresh for unknown stream %r, finishing it", stream_id)
                stream = _Stream(id=stream_id, chat_key="", msgid="", created=now, finish=True, sealed=True)
            return self._stream_reply(stream, query)
        message = parse_aibot_message(data, bot_name=self.settings.bot_name, received_at=datetime.now(UTC))
        if message is None:
            log.debug("wecom aibot: ignoring %r callback", data.get("msgtype"))
            return web.Response(text="")
        if not self.taking:
            return self.not_taking(message)
        stream = _Stream(
            id=uuid.uuid4().hex, chat_key=message.chat.key, msgid=message.message_id, created=now
        )
        earlier = self.remember(message.message_id, stream.id)
        if earlier is not None:
            log.info("wecom aibot: duplicate msgid %s (WeCom retry)", message.message_id)
            known = self._streams.get(earlier)
            return self._stream_reply(known, query) if known else web.Response(text="")
        self._streams[stream.id] = stream
        while len(self._streams) > _MAX_STREAMS:
            self._streams.popitem(last=False)
        response_url = _str(data.get("response_url"))
        if response_url:
            self._response_urls[message.chat.key] = (response_url, now)
        self.deliver_soon(message)
        return self._stream_reply(stream, query)

    async def deliver(self, message: Message) -> None:
        """Hand the message to the bot, then note when that ended (any answer is queued by then)."""
        try:
            await super().deliver(message)
        finally:  # (taken or not: nothing more will come for it from this delivery)
            now = self._now()
            for stream in self._streams.values():
                if stream.msgid == message.message_id and stream.chat_key == message.chat.key:
                    stream.handled_at = now

    def _stream_reply(self, stream: _Stream, query: CallbackQuery) -> web.Response:
        if not stream.finish and stream.handled_at is not None and self._now() - stream.handled_at >= _UNANSWERED:
            log.info("wecom aibot: message %s was handled without an answer; finishing its bubble", stream.msgid)
            stream.finish = stream.sealed = True
        # A part just sent may have more behind it (the outbox sends a long answer's parts one by one),
        # and WeCom polls no more once it sees the bubble finished: wait a moment before saying so.
        finish = stream.finish and (stream.sealed or self._closing or self._now() - stream.finished_at >= _SETTLE)
        stream.sealed = stream.sealed or finish
        stream.collected = stream.collected or finish
        self._polled.set()
        plain = json.dumps(
            {
                "msgtype": "stream",
                "stream": {"id": stream.id, "finish": finish, "content": stream.content},
            },
            ensure_ascii=False,
        )
        return web.json_response(self.crypto.encrypt_json_reply(plain, query.timestamp, query.nonce))

    # -- sending ----------------------------------------------------------------------------

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:
        stream = self._reply_stream(chat.key, run_id)  # the run's own bubble (run_id: the message answered)
        if stream is not None and not stream.finish:
            stream.content = _cap(stream.content + delta)

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        stream = self._reply_stream(message.chat.key, message.reply_to)
        if stream is not None:
            if not stream.finish:  # the answer replaces what streamed while it was written
                stream.content, stream.finish = _cap(message.text), True
            elif len((stream.content + _PART_GAP + message.text).encode()) <= _STREAM_BYTES:
                stream.content += _PART_GAP + message.text  # a later part of a long answer
            else:
                stream.sealed = True  # the part goes out below the bubble: no later one may show above it
                return await self._post_response_url(message, full=True)
            stream.finished_at = self._now()
            return SendReceipt(platform_message_id=stream.id)
        return await self._post_response_url(message, full=message.reply_to is not None)

    async def _post_response_url(self, message: OutgoingMessage, *, full: bool) -> SendReceipt:
        """Send through the chat's unused ``response_url``; it is spent only once WeCom took the post
        (or refused it for good), so a post that failed for now is retried with it."""
        key = message.chat.key
        url = self._unused_url(key)
        if not url:
            if full:
                raise SendRejected(
                    f"WeCom AI bot: no way left to deliver this part of the answer to {message.reply_to} in {key}: "
                    "its stream bubble is full or ended, and there is no unused response_url"
                )
            raise SendRejected(
                f"WeCom AI bot cannot start a conversation in {key}: no open stream and no unused response_url"
            )
        await self._post(key, url, message.text)
        return SendReceipt()

    def _unused_url(self, key: str) -> str:
        url, received = self._response_urls.get(key, ("", 0.0))
        return url if url and self._now() - received <= _RESPONSE_URL_TTL else ""

    async def _post(self, key: str, url: str, text: str) -> None:
        if url in self._posting:  # it may still fail for now and be free again: try later
            raise SendFailed(f"WeCom AI bot: the response_url of {key} is in use by another send")
        self._posting.add(url)
        try:
            data = await call_json(
                self.http(),
                "POST",
                url,
                what="aibot response_url",
                payload={"msgtype": "markdown", "markdown": {"content": _cap(text)}},
                request_timeout=self.settings.request_timeout,
            )
            raise_for_errcode(data, "aibot response_url")
        except SendRejected:
            self._spend(key, url)
            raise
        finally:
            self._posting.discard(url)
        self._spend(key, url)

    def _spend(self, chat_key: str, url: str) -> None:
        if self._response_urls.get(chat_key, ("", 0.0))[0] == url:  # not a newer one that came meanwhile
            del self._response_urls[chat_key]

    def _reply_stream(self, chat_key: str, reply_to: str | None) -> _Stream | None:
        """The stream of the message ``reply_to`` answers while it can take text. Never another's: the oldest
        open one took a reminder, then the next answer went into the next asker's bubble, and theirs was refused."""
        now = self._now()
        for stream in self._streams.values():
            if (stream.chat_key == chat_key and not stream.sealed and now - stream.created < _STREAM_OPEN
                    and reply_to is not None and stream.msgid == reply_to):
                return stream
        return None

    def _prune(self, now: float) -> None:
        for stream_id in [sid for sid, s in self._streams.items() if now - s.created > _STREAM_KEEP]:
            del self._streams[stream_id]
        for key in [k for k, (_, t) in self._response_urls.items() if now - t > _RESPONSE_URL_TTL]:
            del self._response_urls[key]

    @staticmethod
    def _now() -> float:
        # Monotonic: streams only need relative ages, immune to wall-clock jumps.
        return time.monotonic()
