"""When an incoming message starts being handled: a bounded number at once, and not while a burst goes out.

Thousands of messages delivered together (a flood, a backlog after a reconnect) all ran at once
before: each turn of the event loop then ran a step of every one of them, and whatever else the
loop had to do waited for those turns. The worst hit were reminders falling due meanwhile: on
SQLite 10,000 of them went out 4.9 s late (p99) behind 3,000 messages, against 0.8 s alone. So:

- :meth:`Admission.turn`: at most ``at_once`` messages start together; the others wait their turn,
  in order. A message gives its place up after :data:`HOLD_S` whatever it is doing: one waiting on
  a slow model, a long tool or a person's answer keeps the next waiting that long at most (and the
  answer it waits for cannot be kept out for good); slow runs start at ``at_once`` per
  :data:`HOLD_S`, however many are running.
- :class:`Crowd`: when more than :data:`CROWD` chats have messages going out at once (a burst of
  reminders, say), messages wait to start until the burst has gone out (:data:`CLEAR` chats or
  fewer still sending), for at most ``priority_s`` per burst. Then they start again; a backlog that
  lasts (a platform sending slowly) gets no second window until it has cleared. On PostgreSQL
  the messages already running wait out the window too: the database's threads start no unit that
  is not urgent meanwhile (:meth:`robot.storage.Engine.hold_ordinary`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["CLEAR", "CROWD", "HOLD_S", "Admission", "Crowd"]

log = logging.getLogger(__name__)

HOLD_S = 1.0  #: how long a message keeps its place among those starting together
CROWD = 64  #: chats sending at once (in all channels) above which new messages wait for the burst to go out
CLEAR = CROWD // 4  #: chats still sending at which a burst counts as gone out


class Crowd:
    """Whether a burst of sends should go ahead of new messages (the outbox reports its lanes)."""

    def __init__(self, priority_s: float, crowd: int = CROWD, clear: int = CLEAR,
                 hold: Callable[[float | None], None] | None = None) -> None:
        self.priority_s, self.crowd, self.clear = priority_s, crowd, clear
        self._hold = hold  # the database's: units not urgent wait for the window too (Engine.hold_ordinary)
        self._lanes: dict[str, int] = {}
        self._clear = asyncio.Event()
        self._clear.set()
        self._window: asyncio.TimerHandle | None = None
        self._spent = False  # this burst had its window: no other until the outbox has cleared

    @property
    def holding(self) -> bool:
        """Whether new messages wait now."""
        return not self._clear.is_set()

    def sending(self, platform: str, chats: int) -> None:
        """The outbox's word: ``chats`` chats of ``platform`` have messages going out now."""
        self._lanes[platform] = chats
        sending = sum(self._lanes.values())
        if sending <= self.clear:
            self._spent = False
            self._open()
        elif sending > self.crowd and not self._spent and self.priority_s > 0:
            self._spent = True
            self._clear.clear()
            self._window = asyncio.get_running_loop().call_later(self.priority_s, self._open)
            if self._hold is not None:
                self._hold(time.monotonic() + self.priority_s)

    def _open(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
            if self._hold is not None:
                self._hold(None)
        self._clear.set()

    async def wait(self) -> None:
        """Return once no burst is going out ahead of new messages (at most ``priority_s``)."""
        if not self._clear.is_set():
            await self._clear.wait()  # the window's timer opens it at the latest


class Admission:
    """The turns of incoming messages (see the module's docstring)."""

    def __init__(self, at_once: int, crowd: Crowd, hold_s: float = HOLD_S) -> None:
        self.crowd, self.hold_s = crowd, hold_s
        self._slots = asyncio.Semaphore(at_once)
        self.closed, self._warned = False, False
        self.turned_away = 0  #: messages that were still waiting for their turn when the bot stopped

    def close(self) -> None:
        """The bot is stopping: messages still waiting for their turn do not start (nothing of them
        was stored; a platform that redelivers sends them again)."""
        self.closed, self._warned = True, False

    def _turned_away(self) -> None:
        self.turned_away += 1
        if not self._warned:
            self._warned = True
            log.warning("stopping: messages still waiting for their turn are not handled")

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[bool]:
        """Wait for a place among the messages starting now, and for a burst of sends to go out; then
        hold the place for the block or :data:`HOLD_S`, whichever ends first. Yields False, and the
        message must not start, once the bot is stopping."""
        await self._slots.acquire()
        held = True

        def give_up() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        timer: asyncio.TimerHandle | None = None
        try:
            if not self.closed:
                await self.crowd.wait()  # (the place is kept meanwhile: the burst's window is bounded)
            if self.closed:
                self._turned_away()
                yield False
                return
            timer = asyncio.get_running_loop().call_later(self.hold_s, give_up)
            yield True
        finally:
            if timer is not None:
                timer.cancel()
            give_up()
