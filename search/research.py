"""Deep research (``/research``, the ``deep_research`` tool in :mod:`search.tools`): Perplexity's ``sonar-deep-research`` in background mode.

A run takes minutes, far more than a chat reply (or a tool call) may wait. So ``deep_research``
stores a job row (the ``research_jobs`` table), submits the question with the row id as the
idempotency key, answers at once that the research is running, and a poller (every
``research_poll_s``) asks Perplexity how each running job stands. When one is done, its report
and the job's new state commit in one transaction with an outbox row keyed ``research:<id>``:
the report reaches the chat exactly once, after restarts too. Jobs survive a restart: the
poller resumes them, and a job whose submission may not have reached Perplexity (a crash between
storing and submitting) is submitted again under the same idempotency key, so no second paid run
starts: at once when the process that stored it is gone (its lease lapsed; on SQLite, any other
process), else once it was stored two request timeouts ago (a living process is still submitting
it, or hung). This process never sends one it is submitting itself twice.
A failed run, or one not done after ``research_timeout_min``, is reported to the asker.
Each person may start ``research_per_user_day`` runs per day (0, the default: not offered); a run
Perplexity refused to start does not count. ``/forget me`` blanks a job of the last day (its
question, chat and run id go; it stays, status ``forgotten``, to be counted) and deletes older ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from function_calls import Caller, ToolError
from robot import ChatRef, ForgetRequest, OutgoingMessage, Tx, iso
from search.client import (
    PerplexityClient,
    SearchAuthError,
    SearchError,
    SearchNotConfigured,
    SearchRateLimited,
    SearchRejected,
)
from search.format import format_answer
from search.settings import SearchSettings

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["ResearchJob", "ResearchService"]

log = logging.getLogger(__name__)

#: Perplexity answered the submission with a refusal (an HTTP 4xx) or it was never sent: no run started.
_REFUSED = (SearchAuthError, SearchNotConfigured, SearchRateLimited, SearchRejected)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS research_jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, chat TEXT NOT NULL, "
    "account TEXT NOT NULL DEFAULT '', question TEXT NOT NULL, status TEXT NOT NULL, api_id TEXT, "
    "created_at TEXT NOT NULL, updated_at TEXT NOT NULL)"
)
#: The process (lease holder id) that stored and submits the job ('' before this column).
_SUBMITTER = "ALTER TABLE research_jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''"


@dataclass(frozen=True)
class ResearchJob:
    """One stored run: ``status`` is submitting, running, done, failed or forgotten (blanked by ``/forget me``)."""

    id: str
    owner: str
    chat: str
    account: str
    question: str
    status: str
    api_id: str | None
    created_at: datetime
    submitter: str = ""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ResearchJob:
        return cls(row["id"], row["owner"], row["chat"], row["account"], row["question"], row["status"],
                   row["api_id"], datetime.fromisoformat(row["created_at"]), str(row.get("submitter") or ""))


class ResearchService:
    """Starts deep-research runs and delivers their reports; ``start()`` begins polling."""

    def __init__(self, bot: Bot, client: PerplexityClient, settings: SearchSettings) -> None:
        self.bot, self.client, self.settings = bot, client, settings
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._submitting: set[str] = set()  # ids of the jobs this process is submitting now

    @property
    def offered(self) -> bool:
        return self.client.configured and self.settings.research_per_user_day > 0

    async def start(self) -> None:
        await self.bot.db.ensure("research", [_SCHEMA, _SUBMITTER])
        await self._prune()  # also when research was switched off since: forgotten jobs must still go
        if self.offered:
            self._task = asyncio.get_running_loop().create_task(self._poll_loop(), name="research-poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, caller: Caller, question: str) -> ResearchJob:
        """Store and submit one run (the daily limit checked in the same transaction as the insert)."""
        now = self.bot.clock()
        chat = ChatRef.of(caller)
        job = ResearchJob(uuid.uuid4().hex, caller.qualified_user, chat.key, chat.account, question, "submitting",
                          None, now, self.bot.leases.leases.holder)
        limit = self.settings.research_per_user_day

        def insert(db: Tx) -> int:
            if db.dialect == "postgresql":  # processes submitting for one owner count one at a time
                db.execute("SELECT pg_advisory_xact_lock(hashtext(?))", ["research:" + job.owner])
            used = int(db.execute("SELECT count(*) FROM research_jobs WHERE owner = ? AND created_at > ?",
                                  [job.owner, iso(now - timedelta(days=1))]).fetchone()[0])
            if used < limit:
                db.execute("INSERT INTO research_jobs (id, owner, chat, account, question, status, api_id, created_at, "
                           "updated_at, submitter) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           [job.id, job.owner, job.chat, job.account, question, "submitting", None, iso(now), iso(now),
                            job.submitter])
            return used

        with self._sending(job.id):  # from its insert until marked running or failed: not the poller's
            if await self.bot.db.transaction(insert) >= limit:
                raise ToolError(f"deep research limit reached ({limit} a day)",
                                user_message=f"你今天的深度研究次数已用完（每天 {limit} 次），明天再试。")
            try:
                await self._submit(job)
            except SearchError as exc:
                # Refused on the first try: no run started. A refusal of the retry may follow an attempt
                # Perplexity took (a 502 after it started the run): counted.
                await self._not_started(job.id, refused=isinstance(exc, _REFUSED) and exc.attempts <= 1)
                raise ToolError(f"deep research could not start: {exc}",
                                user_message=f"深度研究没能开始：{exc}") from None
        return job

    @contextlib.contextmanager
    def _sending(self, job_id: str) -> Iterator[None]:
        """The job is being submitted by this process for the block (the poller leaves it alone)."""
        self._submitting.add(job_id)
        try:
            yield
        finally:
            self._submitting.discard(job_id)

    async def _submit(self, job: ResearchJob) -> None:
        api_id = await self.client.submit_research(job.question, key=job.id)
        await self.bot.db.run(lambda db: db.execute(
            "UPDATE research_jobs SET status = 'running', api_id = ?, updated_at = ? WHERE id = ? AND status = "
            "'submitting'", [api_id, iso(self.bot.clock()), job.id]))

    async def _submitting_elsewhere(self, submitter: str) -> bool:
        """Whether the process that stored a job, another living one, may still be submitting it (what
        this one submits is in ``_submitting``)."""
        leases = self.bot.leases.leases
        if not submitter or submitter == leases.holder:
            return False
        return await self.bot.db.run(lambda db: leases.alive_sync(db, submitter))

    async def _not_started(self, job_id: str, *, refused: bool) -> None:
        """A submission failed: refused, no run started and the job goes (not counted); else Perplexity
        may have started one (a timeout after sending), so it stays, failed, and counts."""
        if refused:
            await self.bot.db.run(lambda db: db.execute(
                "DELETE FROM research_jobs WHERE id = ? AND status IN ('submitting', 'forgotten')", [job_id]))
            return
        await self.bot.db.run(lambda db: db.execute(
            "UPDATE research_jobs SET status = 'failed', updated_at = ? WHERE id = ? AND status = 'submitting'",
            [iso(self.bot.clock()), job_id]))

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:
                log.exception("research: polling failed")
            await asyncio.sleep(self.settings.research_poll_s)

    async def poll_once(self) -> int:
        """Check every unfinished job once; returns how many were delivered (report or failure)."""
        async with self._lock:
            await self._prune()
            rows = await self.bot.db.run(lambda db: db.execute_returning_dicts(
                "SELECT * FROM research_jobs WHERE status IN ('submitting', 'running') ORDER BY created_at"))
            finished = 0
            for job in map(ResearchJob.from_row, rows):
                finished += await self._check(job)
            return finished

    async def _prune(self) -> None:
        # Finished jobs only count towards the daily limit: a week later they go; a forgotten one
        # (no question left) is kept no longer than it counts.
        now = self.bot.clock()
        week, day = iso(now - timedelta(days=7)), iso(now - timedelta(days=1))
        await self.bot.db.run(lambda db: db.execute(
            "DELETE FROM research_jobs WHERE (status IN ('done', 'failed') AND updated_at < ?) OR "
            "(status = 'forgotten' AND created_at <= ?)", [week, day]))

    async def _check(self, job: ResearchJob) -> int:
        late = self.bot.clock() - job.created_at > timedelta(minutes=self.settings.research_timeout_min)
        try:
            if job.status == "submitting":  # maybe never reached Perplexity: the idempotency key makes this safe
                # In flight here, or (younger than the longest a submission takes, two attempts) in a
                # living process: sending it again would be a second request for nothing.
                if job.id not in self._submitting and (
                        self.bot.clock() - job.created_at > timedelta(seconds=2 * self.settings.timeout_s + 5)
                        or not await self._submitting_elsewhere(job.submitter)):
                    with self._sending(job.id):
                        await self._submit(job)
                return 0
            assert job.api_id is not None
            status = await self.client.research_status(job.api_id)
        except SearchError as exc:
            log.warning("research %s: %s", job.id, exc)
            if not late:
                return 0
            status = None
        head = f"🔎 深度研究「{job.question[:40]}」"
        if status is not None and status.state == "done" and status.answer is not None:
            report = format_answer(status.answer, max_chars=self.settings.research_max_chars,
                                   max_sources=self.settings.max_sources)
            return await self._finish(job, "done", f"{head}完成：\n{report}")
        if status is not None and status.state == "failed":
            why = f"（{status.error[:200]}）" if status.error else ""
            return await self._finish(job, "failed", f"{head}没能完成{why}，请稍后重试。")
        if late:
            return await self._finish(job, "failed", f"{head}超过 {self.settings.research_timeout_min:g} 分钟仍未完成，"
                                                     "已放弃。")
        return 0

    async def forget(self, request: ForgetRequest) -> int:
        """``/forget me``: the person's jobs (their questions) in the chats it covers; a running one's
        report then never comes (the poller delivers only submitting and running jobs).

        A job of the last day is blanked, not deleted: the daily limit counts it (deleting it would
        let a person start paid runs without end, a /forget me after each)."""
        owner = f"{request.platform}:{request.user_id}"
        chats = None if request.everywhere else [c.key for c in request.chats]
        if chats == []:
            return 0
        where = "" if chats is None else f" AND chat IN ({','.join('?' * len(chats))})"
        mine = [owner, *(chats or [])]
        now = self.bot.clock()

        def forget(db: Tx) -> int:
            gone = db.execute(f"DELETE FROM research_jobs WHERE owner = ? AND status <> 'forgotten'{where} AND "
                              "created_at <= ?", [*mine, iso(now - timedelta(days=1))]).rowcount
            return int(gone) + int(db.execute(
                "UPDATE research_jobs SET status = 'forgotten', question = '', chat = '', account = '', api_id = NULL, "
                f"submitter = '', updated_at = ? WHERE owner = ? AND status <> 'forgotten'{where}",
                [iso(now), *mine]).rowcount)

        return await self.bot.db.transaction(forget)

    async def move_chat(self, old: str, new: str) -> int:
        """A chat got a new id: its jobs report there, and ``/forget me`` there reaches them."""
        return int(await self.bot.db.run(lambda db: db.execute(
            "UPDATE research_jobs SET chat = ? WHERE chat = ?", [new, old]).rowcount))

    async def _finish(self, job: ResearchJob, status: str, text: str) -> int:
        chat = ChatRef.from_key(job.chat, job.account)
        owner_id = job.owner.split(":", 1)[1]
        message = OutgoingMessage(key=f"research:{job.id}", chat=chat, text=text,
                                  mention=(owner_id,) if chat.kind == "group" else ())

        def commit(db: Tx) -> bool:
            moved = db.execute("UPDATE research_jobs SET status = ?, updated_at = ? WHERE id = ? AND status IN "
                               "('submitting', 'running')", [status, iso(self.bot.clock()), job.id]).rowcount
            if moved:
                self.bot.outbox.enqueue_sync(db, message)
            return bool(moved)

        if not await self.bot.db.transaction(commit):
            return 0
        self.bot.outbox.notify(chat.platform)
        return 1
