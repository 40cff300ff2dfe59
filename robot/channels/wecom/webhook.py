"""The WeCom group-robot webhook (群机器人 / 消息推送): send-only, 20 messages a minute.

``POST {api_base}/cgi-bin/webhook/send?key=KEY`` with ``{"msgtype": "text", "text":
{"content", "mentioned_list"}}`` or ``{"msgtype": "markdown", "markdown": {"content"}}``.
WeCom refuses more than 20 messages per minute per robot, so sends wait in a sliding-window
limiter instead of being dropped.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from pydantic import SecretStr

from robot.channels.base import Capabilities, Channel, SendReceipt, SendRejected
from robot.channels.wecom.api import call_json, raise_for_errcode, split_utf8
from robot.channels.wecom.settings import WeComSettings
from robot.message import OutgoingMessage

__all__ = ["SlidingWindowLimiter", "WeComWebhook", "WeComWebhookChannel"]

log = logging.getLogger("robot.channels.wecom")

_TEXT_BYTES = 2048
_MARKDOWN_BYTES = 4096


class SlidingWindowLimiter:
    """At most ``limit`` acquisitions in any ``window`` seconds; callers wait their turn in order."""

    def __init__(
        self,
        limit: int,
        window: float,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("limit must be >= 1 and window > 0")
        self.limit = limit
        self.window = window
        self._clock = clock
        self._sleep = sleep
        self._stamps: collections.deque[float] = collections.deque()
        self._lock = asyncio.Lock()  # FIFO: waiters are served in arrival order

    def _time(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    async def acquire(self) -> None:
        """Wait until one more call fits in the window, then count it."""
        async with self._lock:
            while True:
                now = self._time()
                while self._stamps and now - self._stamps[0] >= self.window:
                    self._stamps.popleft()
                if len(self._stamps) < self.limit:
                    self._stamps.append(now)
                    return
                delay = self._stamps[0] + self.window - now
                log.debug("wecom webhook: rate limit reached, waiting %.2f s", delay)
                await self._sleep(delay)


class WeComWebhook:
    """A client for one group-robot webhook key."""

    def __init__(
        self,
        key: str | SecretStr,
        *,
        api_base: str = "https://qyapi.weixin.qq.com",
        session: aiohttp.ClientSession | None = None,
        limit: int = 20,
        window: float = 60.0,
        timeout: float = 10.0,
    ) -> None:
        self._key = key if isinstance(key, SecretStr) else SecretStr(key)
        if not self._key.get_secret_value():
            raise ValueError("the webhook key is empty")
        self._url = f"{api_base.rstrip('/')}/cgi-bin/webhook/send"
        self._session = session
        self._own_session = session is None
        self._timeout = timeout
        self.limiter = SlidingWindowLimiter(limit, window)

    def __repr__(self) -> str:
        return f"WeComWebhook(url={self._url!r}, key=***)"

    async def send_text(
        self, content: str, *, mentioned_list: Sequence[str] = (), mentioned_mobile_list: Sequence[str] = ()
    ) -> None:
        """Send text (split at 2048 bytes); ``mentioned_list`` holds user ids or ``"@all"``."""
        for index, piece in enumerate(split_utf8(content, _TEXT_BYTES)):
            text: dict[str, Any] = {"content": piece}
            if index == 0 and mentioned_list:
                text["mentioned_list"] = list(mentioned_list)
            if index == 0 and mentioned_mobile_list:
                text["mentioned_mobile_list"] = list(mentioned_mobile_list)
            await self._post({"msgtype": "text", "text": text})

    async def send_markdown(self, content: str) -> None:
        """Send markdown (split at 4096 bytes)."""
        for piece in split_utf8(content, _MARKDOWN_BYTES):
            await self._post({"msgtype": "markdown", "markdown": {"content": piece}})

    async def close(self) -> None:
        """Close the HTTP session if this client created it."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, payload: dict[str, Any]) -> None:
        await self.limiter.acquire()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        data = await call_json(
            self._session,
            "POST",
            self._url,
            what="webhook/send",
            params={"key": self._key.get_secret_value()},
            payload=payload,
            request_timeout=self._timeout,
        )
        raise_for_errcode(data, "webhook/send")


class WeComWebhookChannel(Channel):
    """A send-only channel that posts every message to one group through a webhook.

    The group is ``ChatRef(platform="wecom-webhook", chat_id=chat_id, kind="group")`` (its own
    platform, so it can run beside the callback channel); messages for any other chat are
    rejected so a reply never lands in the wrong group.
    """

    platform = "wecom-webhook"
    # One outbox part is one message (a character is at most 4 UTF-8 bytes): a retry never doubles a piece.
    capabilities = Capabilities(max_text_len=_TEXT_BYTES // 4, mentions=True, streaming=False, markdown=False)

    def __init__(self, webhook: WeComWebhook, *, chat_id: str = "webhook") -> None:
        super().__init__()
        self.webhook = webhook
        self.chat_id = chat_id

    @classmethod
    def from_settings(
        cls,
        settings: WeComSettings,
        *,
        chat_id: str = "webhook",
        session: aiohttp.ClientSession | None = None,
    ) -> WeComWebhookChannel:
        """Build from ``settings.webhook_key`` and ``settings.api_base``."""
        if settings.webhook_key is None:
            raise ValueError("settings.webhook_key is not set")
        webhook = WeComWebhook(
            settings.webhook_key,
            api_base=settings.api_base,
            session=session,
            timeout=settings.request_timeout,
        )
        return cls(webhook, chat_id=chat_id)

    async def start(self) -> None:
        log.info("wecom webhook channel ready (send only, chat %s)", self.chat_id)

    async def stop(self) -> None:
        await self.webhook.close()

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if message.chat.kind != "group" or message.chat.chat_id != self.chat_id:
            raise SendRejected(f"the WeCom webhook only reaches {self.platform}:group:{self.chat_id}")
        await self.webhook.send_text(message.text, mentioned_list=message.mention)
        return SendReceipt()
