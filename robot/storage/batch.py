"""Small units of work that arrive together share one transaction.

A burst (a firing pass queues rows for 500 chats) makes the outbox claim and mark rows for each
chat at once. As separate units, each takes a pooled connection and a transaction of its own on
PostgreSQL (500 lanes queued for a pool of 6) and a job of the writer thread on SQLite. A
:class:`Batched` call waits while the previous batch runs; every call made meanwhile goes in the
next one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from robot.storage.base import Engine, Tx

__all__ = ["Batched"]

A = TypeVar("A")
R = TypeVar("R")


class Batched(Generic[A, R]):
    """``await batched(item)``: ``work(tx, items)`` for the items of calls made close together.

    ``work`` returns one result per item, in their order, and is a unit of work like any other
    (pure but for the database: it may run twice under rehearsal). An error fails every call of its
    batch, as it would have failed each alone: callers retry as they did.
    """

    def __init__(self, db: Engine, work: Callable[[Tx, list[A]], Sequence[R]], *, limit: int = 200,
                 urgent: bool = False) -> None:
        self.db, self.work, self.limit, self.urgent = db, work, limit, urgent
        self._waiting: list[tuple[A, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, item: A) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        if self._task is not None and self._task.get_loop() is not loop:  # a bot started again in a new loop
            self._task, self._waiting = None, []  # (the old loop's calls went with it)
        self._waiting.append((item, future))
        if self._task is None or self._task.done():
            taken: list[tuple[A, asyncio.Future[R]]] = []
            self._task = loop.create_task(self._drain(taken), name="batched-units")
            self._task.add_done_callback(functools.partial(self._ended, taken))
        return await future

    async def _drain(self, taken: list[tuple[A, asyncio.Future[R]]]) -> None:
        while self._waiting:
            taken[:], self._waiting = self._waiting[:self.limit], self._waiting[self.limit:]
            try:
                results = await self.db.run(_unit(self.work, [item for item, _ in taken]), urgent=self.urgent)
            except Exception as exc:
                for _, future in taken:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(taken, results, strict=True):
                if not future.done():
                    future.set_result(result)

    def _ended(self, taken: list[tuple[A, asyncio.Future[R]]], task: asyncio.Task[None]) -> None:
        """A drain cancelled (the loop is closing; perhaps before it began) or broken: no call waits for ever."""
        error = None if task.cancelled() else task.exception()
        if not task.cancelled() and error is None:
            return
        ended = list(taken)
        if self._task is task:  # no later drain took over the calls waiting
            ended, self._waiting = ended + self._waiting, []
        for _, future in ended:
            if future.done():
                continue
            if error is None:
                future.cancel()
            else:
                future.set_exception(error)


def _unit(work: Callable[[Tx, list[A]], Sequence[R]], items: list[A]) -> Callable[[Tx], Sequence[R]]:
    return lambda tx: work(tx, items)
