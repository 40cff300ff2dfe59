"""Firing reminders: APScheduler wakes the bot, the ``reminders`` table decides what is due.

A *pass* (:meth:`ReminderService.fire_due`) takes every active reminder due at ``now`` and, per
batch of rows, commits the reminder's new state (done, or its next occurrence) together with
its outbox row in one transaction. The outbox key ``rem:<id>:<occurrence>`` makes a refire of
the same occurrence a no-op, so a crash anywhere neither loses nor duplicates a reminder.
Deleted reminders never fire: the pass selects ``status = 'active'`` inside the transaction.

APScheduler (``AsyncIOScheduler``, in-memory jobstore) holds one ``DateTrigger`` job
``rem:<id>`` per reminder due within ``horizon`` (at most ``max_armed``, soonest first); a
``rem:refill`` job re-arms the window every ``horizon / 2``. Keeping far-away reminders out of
APScheduler (about 1 KB per job) keeps start-up with 100k stored reminders fast and small. Any
job firing triggers one coalesced pass, so reminders due in the same second fire in a handful
of transactions, however many there are.

Prompt-mode reminders run the model (``bot.run_scheduled``, in the reminder's stored zone)
outside any transaction, at most ``prompt_concurrency`` at a time, then commit the answer the
same way after re-checking that the row is still active and unchanged. A run that stopped early,
or whose every tool call failed, counts as failed: the owner hears about it once, not daily.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import sqlite_utils
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from function_calls import Caller
from reminders.prompts import run_prompt
from reminders.schedule import MISSED_FIRES_CAP, Schedule, ScheduleError, first_fire, next_fire
from reminders.settings import ReminderSettings
from reminders.store import Mode, Reminder, ReminderStore, new_id
from robot import ChatRef, ForgetRequest, OutgoingMessage, iso

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["CRASH_ENV", "ON_TIME", "FireReport", "ReminderService", "format_local"]

log = logging.getLogger(__name__)

ON_TIME = timedelta(seconds=60)
"""Up to this late a reminder counts as on time: no late note, and never "missed"."""
CRASH_ENV = "QUNBOT_REMINDERS_CRASH_AT"
"""Test-only: ``before_commit`` / ``after_commit`` SIGKILLs the process at that point of a pass."""
_BATCH = 200
_KEEP_FINISHED = timedelta(days=30)
Outcome = Literal["delivered", "missed", "failed", "broken"]


def format_local(instant: datetime, zone: str, *, seconds: bool = False) -> str:
    """An instant as local wall time, e.g. ``2026-11-21 08:00``."""
    return instant.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


@dataclass
class FireReport:
    """What one pass did: reminders handled per outcome, and the outbox keys it committed."""

    delivered: int = 0
    missed: int = 0
    failed: int = 0
    broken: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome, key: str | None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if key is not None:
            self.keys.append(key)


def _catch_up(schedule: Schedule, planned: datetime, now: datetime) -> tuple[datetime, int, datetime | None]:
    """(latest occurrence <= now, how many occurred since ``planned`` inclusive, next one after now)."""
    latest, count = planned, 1
    upcoming = next_fire(schedule, planned)
    while upcoming is not None and upcoming <= now and count < MISSED_FIRES_CAP:
        latest, count = upcoming, count + 1
        upcoming = next_fire(schedule, upcoming)
    if upcoming is not None and upcoming <= now:  # capped: jump straight past now
        upcoming = next_fire(schedule, now)
    return latest, count, upcoming


class ReminderService:
    """Creates, deletes and fires reminders for one bot. ``scheduler=None``: no timer (tests drive passes)."""

    def __init__(
        self,
        store: ReminderStore,
        bot: Bot,
        settings: ReminderSettings,
        *,
        scheduler: AsyncIOScheduler | None = None,
        clock: Callable[[], datetime] | None = None,
        horizon: timedelta = timedelta(hours=1),
        max_armed: int = 20_000,
    ) -> None:
        self.store = store
        self.bot = bot
        self.settings = settings
        self.scheduler = scheduler
        self.clock: Callable[[], datetime] = clock or bot.clock
        self.horizon = horizon
        self.max_armed = max_armed
        self.grace = max(timedelta(hours=settings.grace_hours), ON_TIME)
        self._lock = asyncio.Lock()
        self._pass: asyncio.Task[None] | None = None
        self._again = False
        self._prompts: dict[str, asyncio.Task[None]] = {}
        self._running = asyncio.Semaphore(settings.prompt_concurrency)  # model runs at once, not tasks
        self._crash_at = os.environ.get(CRASH_ENV, "")

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the timer, fire (or report) what fell due while the bot was down, arm the window."""
        if self.scheduler is not None:
            if not self.scheduler.running:
                self.scheduler.start()
            self.scheduler.add_job(self._refill, IntervalTrigger(seconds=max(1.0, self.horizon.total_seconds() / 2)),
                                   id="rem:refill", replace_existing=True, misfire_grace_time=None, coalesce=True)
        await self.fire_due(self.clock(), wait_prompts=False)
        await self.arm_window()

    async def stop(self) -> None:
        """Stop the timer; give a running pass a moment to finish, cancel prompt runs."""
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down in a loop callback
        if self._pass is not None and not self._pass.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._pass), 2.0)
            self._pass.cancel()
        for task in list(self._prompts.values()):
            task.cancel()
        await asyncio.gather(*self._prompts.values(), return_exceptions=True)

    # --- the timer -------------------------------------------------------------------------
    def _arm_now(self, items: Sequence[tuple[str, datetime, str]]) -> int:
        scheduler = self.scheduler
        if scheduler is None:
            return 0
        now = self.clock()
        limit = now + self.horizon
        armed = 0
        paused = scheduler.state == STATE_RUNNING  # paused, an add does not wake the scheduler each time
        if paused:
            scheduler.pause()
        try:
            for rid, at, zone in items:
                if at > limit or at <= now:  # far away: the refill arms it; due: a pass fires it
                    continue
                job = scheduler.get_job(f"rem:{rid}")
                if job is not None and job.next_run_time == at:
                    continue
                try:
                    tz = ZoneInfo(zone)
                except (ZoneInfoNotFoundError, ValueError, OSError):  # a corrupted row: its pass marks it broken
                    tz = ZoneInfo("UTC")
                scheduler.add_job(self._on_timer, DateTrigger(run_date=at.astimezone(tz), timezone=tz), args=(rid,),
                                  id=f"rem:{rid}", replace_existing=True, misfire_grace_time=None, coalesce=True)
                armed += 1
        finally:
            if paused:
                scheduler.resume()
        return armed

    def arm(self, reminder: Reminder) -> None:
        """Give a reminder its timer job (if it is due within the horizon)."""
        if reminder.next_fire is not None and reminder.status == "active":
            self._arm_now([(reminder.id, reminder.next_fire, reminder.zone)])

    def disarm(self, reminder_id: str) -> None:
        if self.scheduler is not None:
            with contextlib.suppress(JobLookupError):
                self.scheduler.remove_job(f"rem:{reminder_id}")

    async def arm_window(self) -> int:
        """Arm jobs for the active reminders due within the horizon (at most ``max_armed``, soonest
        first; a ``rem:refill-next`` job at the last one's instant arms the next ones). Returns how
        many jobs were added."""
        if self.scheduler is None:
            return 0
        now = self.clock()
        upcoming = await self.store.upcoming(now, now + self.horizon, self.max_armed)
        armed = 0
        for start in range(0, len(upcoming), 250):  # yield between chunks: never block the loop long
            armed += self._arm_now(upcoming[start:start + 250])
            await asyncio.sleep(0)
        if len(upcoming) >= self.max_armed:
            self.scheduler.add_job(self._refill, DateTrigger(run_date=upcoming[-1][1]), id="rem:refill-next",
                                   replace_existing=True, misfire_grace_time=None, coalesce=True)
        return armed

    async def _refill(self) -> None:
        try:
            await self.arm_window()
            await self.store.prune(self.clock() - _KEEP_FINISHED)
        except Exception:
            log.exception("reminders: re-arming the timer failed")
        self.kick()  # safety net: anything due without a job fires now

    async def _on_timer(self, reminder_id: str) -> None:
        self.kick()

    def kick(self) -> None:
        """Request a pass; passes requested while one runs coalesce into one more."""
        if self._pass is not None and not self._pass.done():
            self._again = True
            return
        self._pass = asyncio.get_running_loop().create_task(self._pass_loop(), name="reminders-pass")

    async def _pass_loop(self) -> None:
        while True:
            self._again = False
            try:
                await self.fire_due(self.clock(), wait_prompts=False)
            except Exception:
                log.exception("reminders: firing pass failed")
                return
            if not self._again:
                return

    # --- firing ----------------------------------------------------------------------------
    async def fire_due(self, now: datetime | None = None, *, wait_prompts: bool = True) -> FireReport:
        """Fire everything due at ``now`` (default: the clock). ``wait_prompts`` awaits prompt runs."""
        now = now or self.clock()
        report = FireReport()
        async with self._lock:
            while True:
                applied = await self.store.db.transaction(lambda db: self._text_batch(db, now))
                if applied and self._crash_at == "after_commit":
                    os.kill(os.getpid(), signal.SIGKILL)
                self._after_commit(applied, report)
                if len(applied) < _BATCH:
                    break
            prompts = await self.store.db.run(lambda db: self.store.due_sync(db, now, "prompt", 10_000))
            started: list[asyncio.Task[None]] = []
            for reminder in prompts:
                if reminder.id in self._prompts:
                    continue
                started.append(self._start_prompt(reminder, now, report))
        if wait_prompts and started:
            await asyncio.gather(*started, return_exceptions=True)
        return report

    def _after_commit(self, applied: list[tuple[Reminder, Outcome, str | None]], report: FireReport) -> None:
        for platform in {r.chat.split(":", 1)[0] for r, _, key in applied if key is not None}:
            self.bot.outbox.notify(platform)
        for _, outcome, key in applied:
            report.add(outcome, key)
        self._arm_now([(r.id, r.next_fire, r.zone) for r, _, _ in applied if r.next_fire is not None])

    def _text_batch(self, db: sqlite_utils.Database, now: datetime) -> list[tuple[Reminder, Outcome, str | None]]:
        applied = [self._apply_sync(db, r, now) for r in self.store.due_sync(db, now, "text", _BATCH)]
        if applied and self._crash_at == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return applied

    def _apply_sync(self, db: sqlite_utils.Database, r: Reminder, now: datetime, *, answer: str | None = None,
                    failed: bool = False) -> tuple[Reminder, Outcome, str | None]:
        """Commit one due reminder's message and new state (caller's transaction)."""
        try:
            after, outcome, message = self._compose(r, now, answer=answer, failed=failed)
        except Exception:  # one corrupted row must not block every other reminder
            log.exception("reminders: %s cannot be fired; marking it broken", r.id)
            after, outcome, message = r.evolve(status="broken", next_fire=None, updated_at=now), "broken", None
        if message is not None:
            self.bot.outbox.enqueue_sync(db, message)
        self.store.save_sync(db, after)
        return after, outcome, None if message is None else message.key

    def _compose(self, r: Reminder, now: datetime, *, answer: str | None,
                 failed: bool) -> tuple[Reminder, Outcome, OutgoingMessage | None]:
        """The message a due reminder sends now (if any) and its state afterwards."""
        assert r.next_fire is not None
        latest, count, following = _catch_up(r.schedule, r.next_fire, now)
        late = now - latest
        seconds = not r.wall.endswith(":00")
        when = format_local(latest, r.zone, seconds=seconds)
        text: str | None
        if late > self.grace:
            outcome: Outcome = "missed"
            key = f"rem:{r.id}:{iso(latest)}:missed"
            what = "定时任务" if r.mode == "prompt" else "提醒"
            text = f"⚠️ 错过的{what}：{r.content}\n机器人离线，没能按时发出（原定 {when}，共错过 {count} 次）。"
            if following is not None:
                text += f"\n下次：{format_local(following, r.zone, seconds=seconds)}"
        elif r.mode == "prompt" and answer == "":  # paused for an approval: the request is already posted
            outcome, key, text = "delivered", f"rem:{r.id}:{iso(latest)}", None
        elif failed:
            outcome, key = "failed", f"rem:{r.id}:{iso(latest)}:failed"
            text = None if r.failure_reported else (
                f"⚠️ 定时任务「{r.content[:60]}」这次没能执行，之后仍会按时尝试（连续失败不再重复通知）。")
        else:
            outcome, key = "delivered", f"rem:{r.id}:{iso(latest)}"
            text = answer if r.mode == "prompt" and answer else f"⏰ 提醒：{r.content}"
            if late > ON_TIME:
                text += f"\n（迟到提醒：原定 {when}）"
                if count > 1:
                    text += f"\n（另有 {count - 1} 次在机器人离线期间错过）"
        status = "active" if following is not None else ("missed" if outcome == "missed" else "done")
        reported = r.failure_reported if outcome == "missed" else outcome == "failed"
        after = r.evolve(next_fire=following, last_fired=latest, status=status, updated_at=now,
                         failure_reported=reported)
        if text is None:
            return after, outcome, None
        chat = r.chat_ref
        mention = (r.owner_id,) if chat.kind == "group" else ()
        return after, outcome, OutgoingMessage(key=key, chat=chat, text=text, mention=mention)

    def _start_prompt(self, reminder: Reminder, now: datetime, report: FireReport) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run_prompt(reminder, now, report),
                                                      name=f"reminder-prompt-{reminder.id[:8]}")
        self._prompts[reminder.id] = task
        task.add_done_callback(lambda _: self._prompts.pop(reminder.id, None))
        return task

    async def _run_prompt(self, r: Reminder, now: datetime, report: FireReport) -> None:
        assert r.next_fire is not None
        planned = r.next_fire
        answer: str | None = None
        try:
            latest = _catch_up(r.schedule, planned, now)[0]
            zone: ZoneInfo | None = ZoneInfo(r.zone)
        except (ScheduleError, ZoneInfoNotFoundError, ValueError):
            latest, zone = planned, None  # a corrupted row: the commit below marks it broken
        if zone is not None and now - latest <= self.grace:  # run the model only for what will be delivered
            async with self._running:
                if await self._still_due(r.id, planned):
                    answer = await run_prompt(self.bot, r, self.settings.prompt_tools, zone)

        def commit(db: sqlite_utils.Database) -> tuple[Reminder, Outcome, str | None] | None:
            current = self.store.get_sync(db, r.id)
            if current is None or current.status != "active" or current.next_fire != planned:
                return None  # deleted or changed while the model ran: no ghost message
            return self._apply_sync(db, current, now, answer=answer, failed=answer is None)

        applied = await self.store.db.transaction(commit)
        if applied is not None:
            self._after_commit([applied], report)

    async def _still_due(self, reminder_id: str, planned: datetime) -> bool:
        # A queued prompt may wait a while for its turn: skip the model for one deleted meanwhile.
        current = await self.store.get(reminder_id)
        return current is not None and current.status == "active" and current.next_fire == planned

    # --- requests from tools ---------------------------------------------------------------
    async def create(self, caller: Caller, schedule: Schedule, content: str, mode: Mode) -> Reminder:
        """Store a new reminder (limits checked atomically) and arm it. Raises ScheduleError/LimitError."""
        now = self.clock()
        chat = ChatRef.of(caller)
        reminder = Reminder(
            id=new_id(), owner=caller.qualified_user, owner_name=caller.user_name or caller.user_id, chat=chat.key,
            type=schedule.kind, wall=schedule.wall, zone=schedule.zone, weekday=schedule.weekday, content=content,
            mode=mode, created_at=now, updated_at=now, next_fire=first_fire(schedule, now), account=chat.account,
        )
        await self.store.create(reminder, self.settings, now)
        self.arm(reminder)
        return reminder

    async def delete(self, reminder_id: str) -> bool:
        """Delete at once: the row first (the fire path re-checks it), then the timer job."""
        deleted = await self.store.delete(reminder_id, self.clock())
        self.disarm(reminder_id)
        return deleted

    async def forget(self, request: ForgetRequest) -> int:
        """``/forget me``: the person's reminders in the chats concerned go (rows and timers); how many were active."""
        chats = None if request.everywhere else [c.key for c in request.chats]
        ids = await self.store.erase_owner(f"{request.platform}:{request.user_id}", chats, request.platform)
        for rid in ids:
            self.disarm(rid)
        return len(ids)

    async def delete_chat(self, chat: ChatRef, *, owner: str | None = None) -> int:
        """Delete every active reminder of a chat (only ``owner``'s, if given) at once; returns how many."""
        ids = await self.store.delete_chat(chat.key, self.clock(), owner=owner)
        for rid in ids:
            self.disarm(rid)
        return len(ids)
