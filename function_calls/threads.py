"""Sync tool handlers' threads: a bounded pool of their own, apart from the loop's default executor.

Python cannot stop a thread: a sync handler past its ``timeout_s`` keeps running, and keeps its
thread, until it returns. On the loop's default executor those threads were the ones
``asyncio.to_thread`` and ``loop.getaddrinfo`` (every HTTP connection) wait for; here they only
keep other sync tools waiting, and a tool with too many such calls is refused until they end.
The threads are daemons: a hung handler does not hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from function_calls.errors import ToolError

__all__ = ["MAX_OVERDUE", "MAX_THREADS", "SyncCalls"]

#: Threads all sync handlers share; more calls wait for one (their timeout runs meanwhile).
MAX_THREADS = 32
#: Calls of one tool that may still run past their timeout before its next call is refused.
MAX_OVERDUE = 4

_Work = tuple[Future[Any], Callable[[], Any]]


class _Pool:
    """Daemon threads, started as needed up to ``size``, and kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._work.put((future, fn))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if self._threads < self.size:
                    self._threads += 1
                    threading.Thread(target=self._serve, name=f"qunbot-tool-{self._threads}", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            future, fn = self._work.get()
            if future.set_running_or_notify_cancel():  # (else it timed out while waiting: never run)
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the awaiting call, as a pool's worker does
                    future.set_exception(exc)
                del future, fn  # (a result held here would live until the next call)
            self._idle.release()


_POOL = _Pool(MAX_THREADS)


class SyncCalls:
    """One tool's sync calls on the shared pool, and how many still run past their timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.overdue = 0

    async def run(self, name: str, timeout_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a pool thread (the caller's context variables with it); refused with a
        :class:`ToolError` while :data:`MAX_OVERDUE` earlier calls still run past their timeout."""
        with self._lock:
            overdue = self.overdue
        if overdue >= MAX_OVERDUE:
            raise ToolError(f"`{name}` not run: {overdue} earlier calls are still running past its {timeout_s:g}s "
                            "timeout. Do not call it again now; tell the user it is not answering.",
                            user_message=f"{name} 之前的 {overdue} 次调用超时后仍未结束，这次没有执行，请稍后再试。")
        context = contextvars.copy_context()
        future = _POOL.submit(lambda: context.run(fn, *args))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.cancel():  # it started: its thread runs on, counted until it ends
                with self._lock:
                    self.overdue += 1
                future.add_done_callback(self._ended)
            raise

    def _ended(self, _future: Future[Any]) -> None:
        with self._lock:
            self.overdue -= 1
