"""Firing reminders: APScheduler wakes the bot, the ``reminders`` table decides what is due.

A *pass* (:meth:`ReminderService.fire_due`) takes every active reminder due at ``now`` and, per
batch of up to ``batch`` rows (a chat's together), commits their new state (done, or the next
occurrence) together with their outbox rows in one transaction; on-time reminders of one chat due
at the same instant share a message (:func:`reminders.firing.merge`). The outbox key
``rem:<id>:<occurrence>`` makes a refire of the same occurrence a no-op, so a crash anywhere
neither loses nor duplicates a reminder. Deleted reminders never fire: the pass selects
``status = 'active'`` inside the transaction; one due in a chat the gate now ignores sends nothing
and runs no model, its schedule only moves on (:func:`reminders.firing.skip`). On PostgreSQL,
where several processes fire, a pass claims its rows with ``FOR UPDATE SKIP LOCKED``: each
occurrence is fired by one process.

The timer (:mod:`reminders.timer`) holds one APScheduler job per distinct instant due within
``horizon`` (at most ``max_armed`` reminders, soonest first); a ``rem:refill`` job re-arms the
window every ``horizon / 2``. Creations and deletions are announced on the ``reminders``
notification channel, so every process arms or drops its own timer at once. An instant that many
reminders share has its messages composed a few seconds ahead (:mod:`reminders.ahead`); its pass
then only claims, queues and saves them (:mod:`reminders.passes`).

Command-mode reminders (a stored ``/command`` such as a daily ``/summary``) take the prompts'
path, run through ``bot.call_tool`` as their owner. Prompt-mode reminders run the model
(``bot.run_scheduled``, in the reminder's stored zone) outside any transaction, at most
``prompt_concurrency`` at a time, then commit the answer after re-checking (row locked) that the
row is still active and unchanged. A run that stopped early, or whose every tool call failed,
counts as failed: the owner hears about it once, not daily.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from function_calls import Caller
from reminders.ahead import AT_LEAST, LEAD, Ahead
from reminders.firing import ON_TIME, FireReport, Outcome, catch_up, format_local
from reminders.passes import RETRY_BASE_S, RETRY_MAX_S, Passes
from reminders.prompts import allowed_tools, run_command, run_prompt
from reminders.schedule import Schedule, ScheduleError, first_fire
from reminders.settings import ReminderSettings
from reminders.store import Mode, Reminder, ReminderError, ReminderStore, new_id
from reminders.timer import CHANNEL, Timer, note_armed
from robot import ChatRef, ForgetRequest, OutgoingMessage, Tx, reply_key

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["CRASH_ENV", "ON_TIME", "RETRY_BASE_S", "RETRY_MAX_S", "FireReport", "ReminderService", "format_local"]

log = logging.getLogger(__name__)

CRASH_ENV = "QUNBOT_REMINDERS_CRASH_AT"
"""Test-only: ``before_commit`` / ``after_commit`` SIGKILLs the process at that point of a pass."""
_BATCH = 1000
_KEEP_FINISHED = timedelta(days=30)
_RUN_LEASE = timedelta(minutes=15)  # a process that dies running a prompt's model leaves it to another then


class ReminderService(Passes):
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
        #: What command and prompt reminders may run, by real tool name (raises ConfigError for an unknown one).
        self.allowed = allowed_tools(bot, settings)
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
        self._listening = False
        self._recheck: asyncio.TimerHandle | None = None
        self._holder = os.urandom(8).hex()  # this service's name in prompt-run claims
        #: Due rows claimed per firing transaction.
        self.batch = _BATCH
        self.ahead = Ahead(store, self._compose, merge_chat=settings.merge_chat, batch=lambda: self.batch,
                           clock=self.clock, place=self._place)
        self.timer = Timer(scheduler, self.clock, horizon, self.kick, prepare=self._prepare, lead=LEAD,
                           at_least=AT_LEAST)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the timer, fire (or report) what fell due while the bot was down, arm the window.

        Every process sharing the database hears of reminders added or deleted elsewhere (the
        ``reminders`` notification channel) and arms or drops its own timer job at once; after a
        gap in those notifications it reads its window again.
        """
        if not self._listening:
            self.store.db.subscribe(CHANNEL, self.timer.on_note)
            # Reminders added or moved elsewhere while notifications were cut: the window is read again.
            self.store.db.after_gap(self._refill)
            self._listening = True
        if self.scheduler is not None:
            if not self.scheduler.running:
                self.scheduler.start()
            # Every trigger names UTC: without it APScheduler asks tzlocal for the host's TZ, and a POSIX one
            # (TZ=CST-8) failed the plugin's setup.
            self.scheduler.add_job(self._refill, IntervalTrigger(
                seconds=max(1.0, self.horizon.total_seconds() / 2), timezone=UTC),
                id="rem:refill", replace_existing=True, misfire_grace_time=None, coalesce=True)
        await self.fire_due(self.clock(), wait_prompts=False)
        await self.arm_window()

    async def stop(self) -> None:
        """Stop the timer; give a running pass a moment to finish, cancel prompt runs."""
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down in a loop callback
        if self._recheck is not None:
            self._recheck.cancel()
        if self._pass is not None and not self._pass.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._pass), 2.0)
            self._pass.cancel()
        for task in list(self._prompts.values()):
            task.cancel()
        await asyncio.gather(*self._prompts.values(), return_exceptions=True)
        try:  # what they were running is run elsewhere (or at the next start) now, not 15 minutes late
            await self.store.release_runs(self._holder)
        except Exception:  # (the database going away as the bot stops): their claims expire as before
            log.warning("reminders: could not give up the prompts this process was running", exc_info=True)

    # --- the timer -------------------------------------------------------------------------
    def _arm_now(self, items: Sequence[tuple[str, datetime, str]]) -> int:
        return self.timer.arm(items)

    def arm(self, reminder: Reminder) -> None:
        """Wake up for a reminder (if it is due within the horizon)."""
        if reminder.next_fire is not None and reminder.status == "active":
            self._arm_now([(reminder.id, reminder.next_fire, reminder.zone)])

    def disarm(self, reminder_id: str) -> None:
        self.timer.disarm(reminder_id)

    def armed_at(self, reminder_id: str) -> datetime | None:
        """When this process's timer wakes up for the reminder (None: it does not)."""
        return self.timer.armed_at(reminder_id)

    async def arm_window(self) -> int:
        """Wake up for the active reminders due within the horizon (at most ``max_armed``, soonest
        first; a ``rem:refill-next`` job at the last one's instant arms the next ones). Returns how
        many reminders were newly armed."""
        if self.scheduler is None:
            return 0
        now = self.clock()
        upcoming = await self.store.upcoming(now, now + self.horizon, self.max_armed)
        armed = 0
        for start in range(0, len(upcoming), 250):  # yield between chunks: never block the loop long
            armed += self._arm_now(upcoming[start:start + 250])
            await asyncio.sleep(0)
        if len(upcoming) >= self.max_armed:
            self.scheduler.add_job(self._refill, DateTrigger(run_date=upcoming[-1][1], timezone=UTC), id="rem:refill-next",
                                   replace_existing=True, misfire_grace_time=None, coalesce=True)
        # Whatever fell due before ``now`` (between start-up's pass and this query, say) has no job.
        due = await self.store.next_due()
        if due is not None and due <= self.clock():
            self.kick()
        return armed

    async def _refill(self) -> None:
        try:
            await self.arm_window()
            await self.store.prune(self.clock() - _KEEP_FINISHED)
        except Exception:
            log.exception("reminders: re-arming the timer failed")
        self.kick()  # safety net: anything due without a job fires now

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
            latest = catch_up(r.schedule, planned, now)[0]
            zone: ZoneInfo | None = ZoneInfo(r.zone)
            ignored = self.bot.ignores(r.chat_ref)
        except (ScheduleError, ZoneInfoNotFoundError, ValueError):
            latest, zone, ignored = planned, None, False  # a corrupted row: the commit below marks it broken
        # The model runs only for what will be delivered: on time, and not into a chat the gate ignores.
        if zone is not None and now - latest <= self.grace and not ignored:
            async with self._running:
                # Still due (a queued run may wait a while; deleted meanwhile, it is skipped) and ours:
                # of several processes, only the one holding the claim runs the model.
                if not await self.store.claim_run(r.id, planned, self._holder, self.clock(), _RUN_LEASE):
                    return
                if r.mode == "command":  # a stored /command (a scheduled digest) runs like a prompt
                    answer = await run_command(self.bot, r, self.allowed.command_tools, zone)
                else:
                    answer = await run_prompt(self.bot, r, self.allowed.prompt_tools, zone)

        def commit(db: Tx) -> tuple[Reminder, Outcome, str | None] | None:
            current = self.store.get_sync(db, r.id, lock=True)  # another process may be committing it
            if current is None or current.status != "active" or current.next_fire != planned:
                return None  # deleted or changed while the model ran: no ghost message
            return self._apply_sync(db, current, now, answer=answer, failed=answer is None)

        try:
            applied = await self.store.db.transaction(commit)
        except Exception:  # locked or full: the row is still due, so a pass soon runs it again
            log.exception("reminders: saving scheduled prompt %s failed; retrying in %g s", r.id, RETRY_MAX_S)
            asyncio.get_running_loop().call_later(RETRY_MAX_S, self.kick)
            return
        if applied is not None:
            self._after_commit([applied], report)

    # --- requests from tools ---------------------------------------------------------------
    async def create(self, caller: Caller, schedule: Schedule, content: str, mode: Mode, *,
                     confirm: Callable[[Reminder, str], str] | None = None,
                     ahead_since: datetime | None = None) -> Reminder:
        """Store a new reminder (limits checked atomically) and arm it. Raises ScheduleError/ReminderError.

        Idempotent per request: the same message (``caller.message_id``) asking for the same
        reminder again (a platform's redelivery after a crash) gets the reminder it made before; a
        typed one (``confirm``) even when its relative time ("10分钟后") now reads a later minute.
        ``confirm(reminder, short_id)`` is the confirmation the pipeline will send as the message's
        first reply: it is queued in the same transaction, under the pipeline's key, so the
        reminder is never stored without its confirmation (the pipeline's own enqueue is then a no-op).
        ``ahead_since``: the one-time time was checked to be after this instant (a typed ``/remind``, when
        it was sent); passed since, only while the message waited, it is kept and due at once (late).
        """
        now = self.clock()
        chat = ChatRef.of(caller)
        source = ""
        if caller.message_id:
            # A typed request makes one reminder: its redelivery may resolve "10分钟后" to another minute,
            # so its key leaves the time out (the model's calls keep it: one message may set several)
            wall = "typed" if confirm is not None else schedule.wall
            request = "\0".join([chat.account, chat.key, caller.message_id, caller.qualified_user, schedule.kind,
                                 wall, schedule.zone, str(schedule.weekday), content, mode])
            source = hashlib.sha256(request.encode()).hexdigest()[:32]
        reminder = Reminder(
            id=new_id(), owner=caller.qualified_user, owner_name=caller.user_name or caller.user_id, chat=chat.key,
            type=schedule.kind, wall=schedule.wall, zone=schedule.zone, weekday=schedule.weekday, content=content,
            mode=mode, created_at=now, updated_at=now, next_fire=_first(schedule, now, ahead_since), account=chat.account,
            source=source,
        )

        def work(db: Tx) -> Reminder:
            stored = self.store.create_sync(db, reminder, self.settings, now)
            if stored.status == "active":  # every process wakes up for it
                note_armed(db, stored.id, stored.next_fire, stored.zone)
            if confirm is not None and caller.message_id:
                short = self.store.short_ids_sync(db, [stored.id])[stored.id]
                self.bot.outbox.enqueue_sync(db, OutgoingMessage(
                    key=reply_key(caller.platform, caller.chat_id, caller.message_id), chat=chat,
                    text=confirm(stored, short), mention=(caller.user_id,) if chat.kind == "group" else (),
                    reply_to=caller.message_id))
            return stored

        try:
            stored = await self.store.db.transaction(work, durable=self.store.durable)
        except ReminderError:
            raise
        except Exception as exc:  # locked past the busy timeout, disk full, I/O error, PostgreSQL unreachable
            # SQLite's reasons are plain; another engine's may name its server, so only the kind is shown.
            why = str(exc) if isinstance(exc, sqlite3.Error) else type(exc).__name__
            log.warning("reminders: cannot store a reminder: %s", why)
            raise ReminderError(f"the reminder could not be saved ({why}); nothing was stored, try again later",
                                user_message="暂时无法保存，请稍后再试。") from None
        if confirm is not None and caller.message_id:
            self.bot.outbox.notify(chat.platform)
        self.arm(stored)
        return stored

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


def _first(schedule: Schedule, now: datetime, ahead_since: datetime | None) -> datetime:
    """The first fire; a one-time one past ``now`` but after ``ahead_since`` is kept (due at once)."""
    try:
        return first_fire(schedule, now)
    except ScheduleError as exc:
        if ahead_since is None or ahead_since >= now:
            raise
        try:
            return first_fire(schedule, ahead_since)
        except ScheduleError:
            raise exc from None
