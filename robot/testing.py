"""Test seams for bots and plugins: an in-memory channel that records what the bot sends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import UTC, datetime

from robot.channels.base import Capabilities, Channel, ChannelUnavailable, SendReceipt
from robot.message import ChatRef, Message, OutgoingMessage, Role, Sender

__all__ = ["MemoryChannel"]


class MemoryChannel(Channel):
    """A channel whose traffic is Python calls: ``await inject(...)`` in, ``sent`` out.

    ``down = True`` makes sends fail as :class:`ChannelUnavailable`, to exercise the outbox.
    """

    def __init__(self, platform: str = "memory", *, max_text_len: int = 4000,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__()
        self.platform = platform
        self.capabilities = Capabilities(max_text_len=max_text_len, streaming=True)
        self.clock = clock
        self.sent: list[OutgoingMessage] = []
        self.deltas: list[str] = []
        self.events: list[dict[str, object]] = []
        self._down = False
        self._ids = itertools.count(1)
        self._arrived = asyncio.Condition()

    @property
    def down(self) -> bool:
        """While True, sends fail as :class:`ChannelUnavailable`; setting it back announces a reconnect."""
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        was, self._down = self._down, value
        if was and not value:
            self.announce_connected()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if self.down:
            raise ChannelUnavailable("memory channel is down")
        async with self._arrived:
            self.sent.append(message)
            self._arrived.notify_all()
        return SendReceipt(platform_message_id=f"m{len(self.sent)}")

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:
        self.deltas.append(delta)

    async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:
        self.events.append(event)

    def chat(self, chat_id: str = "g1", kind: str = "group") -> ChatRef:
        return ChatRef(platform=self.platform, chat_id=chat_id, kind="group" if kind == "group" else "private")

    async def inject(self, text: str, *, user: str = "u1", name: str = "", chat: ChatRef | None = None,
                     at_bot: bool = False, role: Role = "member", message_id: str | None = None,
                     at: datetime | None = None) -> Message:
        """Deliver a message as if a person had written it; returns it once the bot handled it."""
        message = Message(
            chat=chat or self.chat(), sender=Sender(user_id=user, name=name or user, role=role),
            message_id=message_id or f"{self.platform}-{next(self._ids)}", text=text,
            timestamp=at or self.clock(), mentions_bot=at_bot,
        )
        await self.deliver(message)
        return message

    async def wait_sent(self, count: int, timeout: float = 5.0) -> list[OutgoingMessage]:
        """Wait until at least ``count`` messages were sent (the outbox works asynchronously)."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.sent) >= count), timeout)
        return list(self.sent)
