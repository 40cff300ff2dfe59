"""Units of work that must land eventually: retried until the database takes them.

A write that only records what already happened (tokens spent and a hold to release, a message
answered) cannot be answered with an error to anyone, and dropping it would leave the database
wrong: a budget smaller for the rest of the day, a message answered again when redelivered. :class:`Pending` keeps such units in order and retries them with backoff while the
database is unreachable. A unit whose commit may have happened (:class:`CommitUnknown`) is not
retried unless it is idempotent: applying it twice would be worse than not at all, so it is
logged instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from robot.storage.base import CommitUnknown, Engine, Tx

__all__ = ["Pending"]

log = logging.getLogger(__name__)


class Pending:
    """Failed units of ``db`` retried in order (``first_s`` doubling up to ``max_s`` between tries)."""

    def __init__(self, db: Engine, *, first_s: float = 0.5, max_s: float = 30.0) -> None:
        self.db = db
        self.first_s = first_s
        self.max_s = max_s
        self._units: list[tuple[Callable[[Tx], Any], str, bool]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._units)

    def add(self, unit: Callable[[Tx], Any], what: str, error: BaseException, *, idempotent: bool = False) -> None:
        """``unit`` failed with ``error``: retry it (``what`` names it in the log), unless it may have
        landed and is not ``idempotent`` (applying it twice changes nothing, as setting a flag)."""
        if isinstance(error, CommitUnknown) and not idempotent:
            log.error("storage: %s may or may not have been written (%s); not retried, to never write it twice",
                      what, error)
            return
        if self._stopped:  # the owner is closing the database: nothing would retry it
            log.error("storage: %s failed while stopping (%s: %s); lost", what, type(error).__name__, error)
            return
        log.warning("storage: %s failed (%s: %s); retrying until the database takes it", what,
                    type(error).__name__, error)
        self._units.append((unit, what, idempotent))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._retry(), name="qunbot-pending-units")

    async def _retry(self) -> None:
        delay = self.first_s
        while self._units:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if self._stopped:
                return
            if await self.flush():
                log.info("storage: the units that had failed are written")
            delay = min(self.max_s, delay * 2)

    async def flush(self) -> bool:
        """Try every waiting unit once, in order (stopping at the first failure); whether none wait."""
        while self._units:
            unit, what, idempotent = self._units[0]
            try:
                await self.db.transaction(unit, durable=not self.db.crash_safe)
            except CommitUnknown as exc:
                if idempotent:
                    return False
                log.error("storage: %s may or may not have been written (%s); not retried", what, exc)
            except Exception as exc:
                log.debug("storage: %s failed again (%s: %s)", what, type(exc).__name__, exc)
                return False
            self._units.pop(0)
        return True

    async def stop(self) -> None:
        """Stop retrying after one last try; what still fails (or fails from now on) is logged as lost."""
        self._stopped = True
        if self._task is not None:
            # Not cancelled: a unit cut off while the database ran it could be written, and then
            # written again by the last try below. The task ends after the try under way, if any.
            self._wake.set()
            await self._task
            self._task = None
        if self._units and not await self.flush():
            log.error("storage: stopping with %d unwritten units, lost: %s", len(self._units),
                      "; ".join(what for _, what, _ in self._units))
            self._units.clear()
