"""The outbox's slots (:mod:`robot.outbox`): how many sends of a channel await the platform at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["Slots"]


class Slots:
    """A channel's sends awaiting the platform: ``size`` at once, and ``size`` more that are slow.

    A send still unanswered after ``slow_s`` (a peer that never answers) moves to a slow slot when
    one is free, and a retry (a send that timed out before; OneBot first waits for its late answer)
    waits for one: chats that get no answer hold up each other, never the chats that do."""

    def __init__(self, size: int, slow_s: float) -> None:
        self.fast, self.slow, self.slow_s = asyncio.Semaphore(size), asyncio.Semaphore(size), slow_s

    async def run(self, send: Callable[[], Awaitable[str]], *, retry: bool) -> str:
        """``send()`` in a slot, and its outcome."""
        if retry:
            async with self.slow:
                return await send()
        await self.fast.acquire()
        held: list[asyncio.Semaphore] = [self.fast]
        mover: asyncio.Task[None] | None = None

        def slow() -> None:  # (a timer, not a task and a wait per send: 30 us each, on every reply)
            nonlocal mover
            if not self.slow.locked():
                mover = asyncio.ensure_future(self._move(held))

        timer = asyncio.get_running_loop().call_later(self.slow_s, slow)
        try:
            return await send()
        finally:
            timer.cancel()
            if mover is not None and not mover.done():
                mover.cancel()  # (not started: it holds nothing; started, it finishes at once)
                await asyncio.gather(mover, return_exceptions=True)
            held[0].release()

    async def _move(self, held: list[asyncio.Semaphore]) -> None:
        await self.slow.acquire()  # (free: taken at once)
        self.fast.release()
        held[0] = self.slow
