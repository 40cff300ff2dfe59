"""Worker threads that take urgent calls first: :class:`robot.storage.postgres.PostgresDatabase`'s units.

A burst of messages queues thousands of units; a reminder due meanwhile (its firing, the outbox's
claims and marks that send it) waited behind all of them, about a pass over the queue for each of
its units: 37 s with 3,000 messages at once. Urgent calls (``Engine.run(urgent=True)``) go before
every call not urgent, and otherwise in order; every thread takes either kind, so nothing is kept
idle for urgent work that is not there (two threads kept for it made a reminder burst on its own
slower: p99 0.8-0.95 s became 1.3-1.9 s).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Lanes"]

T = TypeVar("T")
_Item = tuple[int, int, Callable[[], Any] | None, "concurrent.futures.Future[Any] | None"]


class Lanes:
    """``workers`` threads running the calls submitted, urgent ones first, each kind in order."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.PriorityQueue[_Item] = queue.PriorityQueue()
        self._order = itertools.count()  # ties: in order, and never a comparison of two calls
        # Daemons: a call a closed engine still runs ends with its connection, not the interpreter's exit.
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[], T], *, urgent: bool = False) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((0 if urgent else 1, next(self._order), fn, future))
        return future

    def shutdown(self) -> None:
        """The threads end once every call submitted before is done."""
        for _ in self._threads:
            self._queue.put((2, next(self._order), None, None))

    def _serve(self) -> None:
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():  # its caller gave up before it began
                continue
            try:
                result = fn()
            except BaseException as exc:  # (as concurrent.futures does: the caller gets it)
                future.set_exception(exc)
            else:
                future.set_result(result)
