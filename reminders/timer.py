"""The wake-up timer: one APScheduler job per distinct instant (not per reminder), and the
notifications that keep every process's timer in step with the table.

The ``reminders`` table decides what fires; a job only wakes the service, whose pass fires every
reminder due by then. Ten thousand reminders due in the same second therefore cost one job, not
ten thousand (APScheduler handled those one by one on the event loop before the first pass could
start: 0.4 s in bench/bench_reminders.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from apscheduler.triggers.date import DateTrigger

from robot import Tx, iso

log = logging.getLogger(__name__)
__all__ = ["CHANNEL", "Timer", "note_armed", "note_gone", "parse_note"]

CHANNEL = "reminders"
"""Notification channel: a reminder was added or changed (``arm``) or deleted (``drop``), in any process."""
_DROP_CHUNK = 100  # ids per notification: PostgreSQL caps a payload at 8000 bytes


def note_armed(db: Tx, reminder_id: str, at: datetime | None, zone: str) -> None:
    """Tell every process (after commit) to wake up for the reminder at ``at`` (None: never)."""
    if at is not None:
        db.notify(CHANNEL, f"arm {reminder_id} {iso(at)} {zone}")


def note_gone(db: Tx, ids: list[str]) -> None:
    """Tell every process (after commit) to drop these reminders' timer jobs."""
    for start in range(0, len(ids), _DROP_CHUNK):
        db.notify(CHANNEL, "drop " + ",".join(ids[start:start + _DROP_CHUNK]))


def parse_note(payload: str) -> tuple[list[tuple[str, datetime, str]], list[str]]:
    """``([(id, next fire, zone)] to arm, [ids] to drop)``; ValueError for anything else."""
    kind, _, rest = payload.partition(" ")
    if kind == "arm":
        rid, at, zone = rest.split(" ")
        return [(rid, datetime.fromisoformat(at), zone)], []
    if kind == "drop":
        return [], [rid for rid in rest.split(",") if rid]
    raise ValueError(f"not a reminders notification: {payload[:80]!r}")


class Timer:
    """Which reminders this process will wake up for, and when (``armed_at``)."""

    def __init__(self, scheduler: AsyncIOScheduler | None, clock: Callable[[], datetime], horizon: timedelta,
                 wake: Callable[[], None], *, prepare: Callable[[datetime], Awaitable[None]] | None = None,
                 lead: timedelta = timedelta(0), at_least: int = 0) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.horizon = horizon
        self.wake = wake  # requests a firing pass
        # ``lead`` before an instant that ``at_least`` reminders share, ``prepare(instant)`` runs
        # (reminders.ahead composes their messages).
        self.prepare = prepare
        self.lead = lead
        self.at_least = at_least
        self._at: dict[datetime, set[str]] = {}
        self._of: dict[str, datetime] = {}

    def on_note(self, payload: str) -> None:
        """A reminder was added (``arm``) or deleted (``drop``), by this process or another one."""
        try:
            arm, drop = parse_note(payload)
        except ValueError:
            log.warning("reminders: ignoring a malformed notification %.100r", payload)
            return
        self.arm(arm)
        for rid in drop:
            self.disarm(rid)

    def armed_at(self, reminder_id: str) -> datetime | None:
        return self._of.get(reminder_id)

    def arm(self, items: Sequence[tuple[str, datetime, str]]) -> int:
        """Wake up at each ``(id, instant, zone)`` within the horizon; how many reminders were (re)armed.

        One already due (created while the database was busy past its time, say) gets no job, which
        would never run: a pass is requested now instead.
        """
        scheduler = self.scheduler
        if scheduler is None:
            return 0
        now = self.clock()
        limit = now + self.horizon
        if any(at <= now for _, at, _ in items):
            self.wake()
        armed = 0
        paused = scheduler.state == STATE_RUNNING  # paused, an add does not wake the scheduler each time
        if paused:
            scheduler.pause()
        try:
            for rid, at, _zone in items:
                if at > limit or at <= now or self._of.get(rid) == at:
                    continue  # far away: the refill arms it; due: a pass fires it; armed already
                self.disarm(rid)
                ids = self._at.get(at)
                if ids is None:
                    ids = self._at[at] = set()
                    scheduler.add_job(self._fired, DateTrigger(run_date=at.astimezone(UTC), timezone=UTC), args=(at,),
                                      id=_job_id(at), replace_existing=True, misfire_grace_time=None, coalesce=True)
                ids.add(rid)
                self._of[rid] = at
                armed += 1
                if len(ids) == self.at_least and self.prepare is not None and at - self.lead > now:
                    scheduler.add_job(self.prepare, DateTrigger(run_date=(at - self.lead).astimezone(UTC),
                                                                timezone=UTC), args=(at,), id=_job_id(at, "ahead"),
                                      replace_existing=True, misfire_grace_time=None, coalesce=True)
        finally:
            if paused:
                scheduler.resume()
        return armed

    def disarm(self, reminder_id: str) -> None:
        """Forget the reminder; its instant's job goes when no other reminder needs it."""
        at = self._of.pop(reminder_id, None)
        if at is None:
            return
        ids = self._at.get(at, set())
        ids.discard(reminder_id)
        if not ids:
            self._at.pop(at, None)
            if self.scheduler is not None:
                for kind in ("at", "ahead"):
                    with contextlib.suppress(JobLookupError):
                        self.scheduler.remove_job(_job_id(at, kind))

    async def _fired(self, at: datetime) -> None:
        for rid in self._at.pop(at, set()):
            self._of.pop(rid, None)
        self.wake()


def _job_id(at: datetime, kind: str = "at") -> str:
    return f"rem:{kind}:{iso(at)}"
