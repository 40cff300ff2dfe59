"""The firing pass of :class:`reminders.service.ReminderService` (a base class of it): what is due
is claimed, composed, queued and saved in one transaction per batch (see the service's docstring);
a busy instant's batches were composed ahead (:mod:`reminders.ahead`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from reminders.ahead import Ahead, Fired, Place, Prepared
from reminders.firing import Draft, FireReport, Outcome, compose, merge, skip
from reminders.settings import ReminderSettings
from reminders.store import Reminder, ReminderStore
from robot import OutgoingMessage, Tx

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["RETRY_BASE_S", "RETRY_MAX_S", "Applied", "Passes"]

log = logging.getLogger("reminders.service")

RETRY_BASE_S = 0.25
"""A failed firing pass is retried after this, doubling up to ``RETRY_MAX_S``."""
RETRY_MAX_S = 2.0
Applied = tuple[Reminder, Outcome, str | None]
"""A fired reminder's state afterwards, how it went, and the key of the message it went out in."""


class Passes:
    """Firing passes: requested (:meth:`kick`), retried when the database fails, batched."""

    store: ReminderStore
    bot: Bot
    settings: ReminderSettings
    clock: Callable[[], datetime]
    grace: timedelta
    batch: int
    ahead: Ahead
    _lock: asyncio.Lock
    _pass: asyncio.Task[None] | None
    _again: bool
    _prompts: dict[str, asyncio.Task[None]]
    _crash_at: str
    _recheck: asyncio.TimerHandle | None

    def _arm_now(self, items: Sequence[tuple[str, datetime, str]]) -> int:
        raise NotImplementedError

    def _start_prompt(self, reminder: Reminder, now: datetime, report: FireReport) -> asyncio.Task[None]:
        raise NotImplementedError

    async def _place(self) -> Place:
        """This process's place among the living processes (on PostgreSQL several fire one instant)."""
        return await self.bot.leases.place() if self.store.db.dialect == "postgresql" else (0, 1)

    async def _prepare(self, at: datetime) -> None:
        """The timer's call ``LEAD`` before a busy instant: compose its messages ahead."""
        try:
            await self.ahead.prepare(at)
        except Exception:  # the pass composes them at the instant instead
            log.warning("reminders: composing the reminders due at %s ahead failed", at, exc_info=True)

    def _look_again(self) -> None:
        self._recheck = None
        self.kick()

    def kick(self) -> None:
        """Request a pass; passes requested while one runs coalesce into one more."""
        if self._pass is not None and not self._pass.done():
            self._again = True
            return
        self._pass = asyncio.get_running_loop().create_task(self._pass_loop(), name="reminders-pass")

    async def _pass_loop(self) -> None:
        failures = 0
        while True:
            self._again = False
            try:
                await self.fire_due(self.clock(), wait_prompts=False)
            except Exception as exc:
                # A locked or full database is usually back in seconds: retry soon, not at the refill.
                failures += 1
                delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** min(failures - 1, 8))
                if failures == 1:
                    log.exception("reminders: firing pass failed; retrying every %.2g-%g s", RETRY_BASE_S,
                                  RETRY_MAX_S)
                else:
                    log.warning("reminders: firing pass failed again (%s: %s)", type(exc).__name__, exc)
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("reminders: firing works again after %d failed passes", failures)
                failures = 0
            if not self._again:
                return

    # --- firing ----------------------------------------------------------------------------
    async def fire_due(self, now: datetime | None = None, *, wait_prompts: bool = True) -> FireReport:
        """Fire everything due at ``now`` (default: the clock). ``wait_prompts`` awaits prompt runs."""
        now = now or self.clock()
        report = FireReport()
        async with self._lock:
            await self._fire_prepared(self.ahead.take(now), now, report)
            while True:
                # urgent: a reminder due while a burst of messages is queued goes ahead of their units.
                applied = await self.store.db.transaction(lambda db: self._text_batch(db, now), urgent=True)
                self._committed(applied, report)
                if len(applied) < self.batch:
                    break
            if self._recheck is None and self.store.db.dialect == "postgresql" and await self.store.db.run(
                    lambda db: bool(self.store.due_sync(db, now, "text", 1)), urgent=True):
                # Due rows another process has claimed (SKIP LOCKED passed them over): should it die
                # before committing, they are due again and no timer of ours would wake up for them.
                self._recheck = asyncio.get_running_loop().call_later(RETRY_MAX_S, self._look_again)
            prompts = await self.store.db.run(lambda db: [*self.store.due_sync(db, now, "prompt", 10_000),
                                                          *self.store.due_sync(db, now, "command", 10_000)],
                                              urgent=True)
            started: list[asyncio.Task[None]] = []
            for reminder in prompts:
                if reminder.id in self._prompts:
                    continue
                started.append(self._start_prompt(reminder, now, report))
        if wait_prompts and started:
            await asyncio.gather(*started, return_exceptions=True)
        return report

    async def _fire_prepared(self, parts: list[Prepared], now: datetime, report: FireReport) -> None:
        """Fire batches composed ahead; on PostgreSQL two at a time (the server rewrites one's rows
        while this process queues the other's).

        On PostgreSQL a lane stops at a batch it claims nothing of: another process started its share
        there (:meth:`Ahead.take`) and goes on from it. Trying every batch after it cost three processes
        a transaction each, on a busy server, for each of the others' batches; what no process fired
        (one died) the ordinary pass that follows fires."""
        todo = iter(parts)
        several = self.store.db.dialect == "postgresql"

        async def lane() -> None:
            for part in todo:  # shared: each lane takes the next batch
                unit = functools.partial(self._prepared_batch, part=part, now=now)
                applied = await self.store.db.transaction(unit, urgent=True)
                self._committed(applied, report)
                if several and not applied:
                    return

        lanes = 2 if several else 1
        for failed in await asyncio.gather(*(lane() for _ in range(lanes)), return_exceptions=True):
            if isinstance(failed, BaseException):  # the other lane finished first: nothing is left half done
                raise failed

    def _committed(self, applied: list[Applied], report: FireReport) -> None:
        if applied and self._crash_at == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        self._after_commit(applied, report)

    def _after_commit(self, applied: list[Applied], report: FireReport) -> None:
        # (each queued row woke its sender at the commit: robot.outbox_store.queue_sync)
        counted: set[str] = set()
        for _, outcome, key in applied:
            report.add(outcome, None if key in counted else key)  # a shared message counts once
            if key is not None:
                counted.add(key)
        self._arm_now([(r.id, r.next_fire, r.zone) for r, _, _ in applied if r.next_fire is not None])

    def _text_batch(self, db: Tx, now: datetime) -> list[Applied]:
        """Fire up to ``batch`` due text reminders in the caller's transaction, a chat's together."""
        # claim: on PostgreSQL the rows stay locked until this commits and other processes skip them.
        return self._commit_composed(db, self.store.due_sync(db, now, "text", self.batch, claim=True), now)

    def _prepared_batch(self, db: Tx, part: Prepared, now: datetime) -> list[Applied]:
        """Fire a batch composed ahead, in the caller's transaction: what was prepared when every one
        of its reminders is still due, in the same chat; else the reminders claimed, composed now."""
        claimed = self.store.claim_sync(db, part.ids, part.at)
        if not claimed:  # fired, or being fired, by another process (or deleted meanwhile)
            return []
        if set(claimed) == part.rows():
            return self._commit_fired(db, part.fired, part.messages, part.keys, now)
        return self._commit_composed(db, self.store.rows_sync(db, [rid for rid, _ in claimed]), now)

    def _commit_composed(self, db: Tx, rows: Sequence[Reminder], now: datetime) -> list[Applied]:
        fired = [(r, *self._compose(r, now)) for r in rows]
        messages, keys = merge(fired, now, across_owners=self.settings.merge_chat)
        return self._commit_fired(db, [(after, outcome) for _, after, outcome, _ in fired], messages, keys, now)

    def _commit_fired(self, db: Tx, fired: Sequence[Fired], messages: Sequence[OutgoingMessage],
                      keys: Sequence[str | None], now: datetime) -> list[Applied]:
        # One INSERT for the batch; this process sends what it fired (send_here: no other wakes for it).
        self.bot.outbox.enqueue_many_sync(db, messages, send_here=True)
        if fired:
            self.store.save_sync(db, *[after for after, _ in fired], updated_at=now)
        if fired and self._crash_at == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return [(after, outcome, key) for (after, outcome), key in zip(fired, keys, strict=True)]

    def _compose(self, r: Reminder, now: datetime, *, answer: str | None = None,
                 failed: bool = False) -> tuple[Reminder, Outcome, Draft | None]:
        try:
            if self.bot.ignores(r.chat_ref):  # the owner closed the chat since: nothing goes (or is kept) there
                return skip(r, now)
            return compose(r, now, self.grace, answer=answer, failed=failed)
        except Exception:  # one corrupted row must not block every other reminder
            log.exception("reminders: %s cannot be fired; marking it broken", r.id)
            return r.evolve(status="broken", next_fire=None, updated_at=now), "broken", None

    def _apply_sync(self, db: Tx, r: Reminder, now: datetime, *, answer: str | None = None,
                    failed: bool = False) -> Applied:
        """Commit one due reminder's message and new state (caller's transaction)."""
        after, outcome, draft = self._compose(r, now, answer=answer, failed=failed)
        if draft is not None:
            self.bot.outbox.enqueue_sync(db, draft.message())
        self.store.save_sync(db, after)
        return after, outcome, None if draft is None else draft.key

