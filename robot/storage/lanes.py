"""Worker threads that take urgent calls first: :class:`robot.storage.postgres.PostgresDatabase`'s units.

A burst of messages queues thousands of units; a reminder due meanwhile (its firing, the outbox's
claims and marks that send it) waited behind all of them, about a pass over the queue for each of
its units: 37 s with 3,000 messages at once. Urgent calls (``Engine.run(urgent=True)``) go before
every call not urgent, and otherwise in order; every thread takes either kind, so nothing is kept
idle for urgent work that is not there (two threads kept for it made a reminder burst on its own
slower: p99 0.8-0.95 s became 1.3-1.9 s).

While a burst of sends goes out (:class:`robot.admission.Crowd`'s window, a few seconds at most),
:meth:`Lanes.hold` keeps the threads from starting calls that are not urgent: the messages already
running wait, and the server's time goes to the burst. Behind 3,000 messages, three processes sent
10,000 reminders with p99 2.0-3.5 s before, 0.8-1.2 s with the hold.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Lanes"]

T = TypeVar("T")
_Call = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class Lanes:
    """``workers`` threads running the calls submitted, urgent ones first, each kind in order."""

    def __init__(self, workers: int, name: str) -> None:
        # A token per call (a C queue the threads block on), the calls in two deques: a thread that
        # takes a token runs the oldest urgent call, else the oldest other one. (A PriorityQueue
        # costs a Python-level lock and condition per call.)
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._urgent: collections.deque[_Call] = collections.deque()
        self._other: collections.deque[_Call] = collections.deque()
        self._closed = False
        self._held: float | None = None  # (monotonic) until when calls not urgent wait: see hold()
        self._holding = threading.Condition()
        # Daemons: a call a closed engine still runs ends with its connection, not the interpreter's exit.
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[], T], *, urgent: bool = False) -> concurrent.futures.Future[T]:
        if self._closed:  # no thread would take it
            raise RuntimeError("the engine's threads are shut down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        (self._urgent if urgent else self._other).append((fn, future))
        self._tokens.put(True)
        if urgent and self._held is not None:
            with self._holding:  # a thread waiting out the hold with a token takes this call
                self._holding.notify()
        return future

    def hold(self, until: float | None) -> None:
        """Start no call that is not urgent before ``until`` (``time.monotonic()``); None: start them again."""
        with self._holding:
            self._held = until
            self._holding.notify_all()

    def holding(self) -> bool:
        """Whether calls not urgent wait now (a hold set and not over)."""
        held = self._held
        return held is not None and time.monotonic() < held

    def shutdown(self) -> None:
        """The threads end once every call submitted before is done."""
        self._closed = True
        self.hold(None)
        for _ in self._threads:
            self._tokens.put(False)  # after every call's token: each call was taken by then

    def _serve(self) -> None:
        while self._tokens.get():
            try:
                fn, future = self._urgent.popleft()
            except IndexError:
                fn, future = self._next_other()
            if not future.set_running_or_notify_cancel():  # its caller gave up before it began
                continue
            try:
                result = fn()
            except BaseException as exc:  # (as concurrent.futures does: the caller gets it)
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _next_other(self) -> _Call:
        """The oldest call not urgent, once the hold is over; an urgent call submitted meanwhile
        first. (This thread's token stands for some call still queued: it takes whichever is due.)"""
        with self._holding:  # (other threads pop urgent calls without it: try, never test then pop)
            while (held := self._held) is not None and (left := held - time.monotonic()) > 0:
                with contextlib.suppress(IndexError):
                    return self._urgent.popleft()
                self._holding.wait(left)
            with contextlib.suppress(IndexError):
                return self._urgent.popleft()
            return self._other.popleft()
