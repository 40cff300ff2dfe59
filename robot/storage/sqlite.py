"""The embedded engine: one SQLite file, WAL, one thread that owns the connection, commits grouped.

Every unit of work (``await db.run(fn)`` / ``db.transaction(fn)``) is queued to that thread. The
thread takes whatever is queued, runs the units one after another inside one transaction and
commits once: no unit's caller resumes before the commit holds its rows. Under load this turns
hundreds of commits a second into a few, without a timer that would delay a lone write.
``bench/bench_scale.py`` measures it. Urgent units (``urgent=True``: reminders firing, the outbox
sending) open the next group, ahead of the units queued before them: a reminder due behind a burst
of messages waits for the group under way, not for the burst's whole queue.

A unit that fails rolls back alone. Should one fail after writing, the transaction is rolled back
and the whole group runs again, each unit in a savepoint taken at its first write (units are pure
functions of the database: PostgreSQL re-runs them too). The first pass takes no savepoints
because every statement hands the interpreter lock to the busy event loop and has to win it back
(``bench/bench_gil.py``): two statements per unit saved are worth more than their SQL.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from robot.storage import sqlitefile
from robot.storage.base import SCHEMA_TABLE, Dialect, Engine, Step, StorageError, unit_error
from robot.storage.sqlitetx import SQLiteTx

__all__ = ["SQLiteDatabase", "SQLiteTx"]

T = TypeVar("T")
log = logging.getLogger(__name__)
_MAX_GROUP = 512
_URGENT = object()  # queued for an urgent unit: wakes the writer thread


@dataclass
class _Job:
    fn: Callable[[SQLiteTx], Any]
    durable: bool = False
    raw: bool = False  # outside any transaction (open, close, checkpoint)
    #: A blocking caller's future (``run_sync``); None for an async caller, who has ``waiter``.
    future: concurrent.futures.Future[Any] | None = None
    #: An async caller's future: settled on its loop together with the rest of the group (one wake-up).
    waiter: asyncio.Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def start(self) -> bool:
        """False when the caller gave up before the unit started (a cancelled task): skip it."""
        if self.waiter is not None:
            return not self.waiter.cancelled()  # cancelled later: it runs, its outcome is dropped
        assert self.future is not None
        return self.future.set_running_or_notify_cancel()


class SQLiteDatabase(Engine):
    """An SQLite file (or ``":memory:"``) served by a single dedicated thread."""

    dialect: Dialect = "sqlite"
    #: How long a statement waits for another connection's lock before "database is locked" (tests shorten it).
    busy_timeout_s = 30.0
    #: The first pause before truncating the WAL again, when a reader held a checkpoint up (it doubles).
    checkpoint_retry_s = 0.5

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = str(path)
        self.where = self.path if self.path == ":memory:" else str(Path(self.path).absolute())
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.exists():
                parent.mkdir(parents=True, mode=0o700)  # people's messages live here: the owner's eyes only
                parent.chmod(0o700)  # mkdir's mode is cut by the umask
        self._queue: queue.SimpleQueue[_Job | object | None] = queue.SimpleQueue()  # None: stop
        self._urgent: collections.deque[_Job] = collections.deque()  # run before anything queued
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settled: list[_Job] = []  # finished units whose async callers are not yet told (thread only)
        self._notes: list[tuple[str, str]] = []  # notifications committed, not yet delivered (thread only)
        self.commits = 0  # transactions committed (each may hold many units of work): for the bench
        self.thread_cpu_s = 0.0  # the writer thread's CPU time so far (at its last group): for the bench
        #: First pass of a group without savepoints (see the module's docstring); False: always with them.
        self.optimistic = True
        self.thread_busy_s = 0.0  # wall time the writer spent on groups (CPU plus waits for the GIL): for the bench
        self._truncating: asyncio.Task[None] | None = None  # trying again to truncate the WAL (see checkpoint)

    # -- the writer thread -----------------------------------------------------------------------

    def _settle(self, job: _Job, result: Any = None, error: BaseException | None = None) -> None:
        """Finish ``job`` (thread side): its async caller hears at :meth:`_wake`, once per group. Once open,
        an error saying the file cannot be used (read-only, damaged) is a StorageError naming it."""
        if error is not None and self.opened:
            error = sqlitefile.unusable(error, self.where)
        job.done, job.result, job.error = True, result, None if error is None else unit_error(error)
        if job.waiter is not None:
            self._settled.append(job)
        elif job.future is not None:
            if job.error is not None:
                job.future.set_exception(job.error)
            else:
                job.future.set_result(result)

    def _wake(self) -> None:
        """Hand the finished units' outcomes and their notifications to the loops, one call each:
        a wake-up per unit (a pipe write each) costs more than a small unit of work itself."""
        settled, notes, self._settled, self._notes = self._settled, self._notes, [], []
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for job in settled:
            assert job.loop is not None
            by_loop.setdefault(job.loop, []).append(job)
        if notes and self._loop is not None:
            by_loop.setdefault(self._loop, [])
        for loop, jobs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(self._resume, jobs, notes if loop is self._loop else [])

    def _resume(self, jobs: list[_Job], notes: list[tuple[str, str]]) -> None:
        """On the loop: pass each outcome to its waiter (unless cancelled meanwhile), then notify."""
        for job in jobs:
            waiter = job.waiter
            if waiter is None or waiter.done():
                continue
            if job.error is not None:
                waiter.set_exception(job.error)
            else:
                waiter.set_result(job.result)
        for channel, payload in notes:
            self._deliver(channel, payload)

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="qunbot-db", daemon=True)
            self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = sqlitefile.connect(self.path, self.busy_timeout_s, reading=self.reading)
        return self._conn

    def _serve(self) -> None:
        waiting: collections.deque[_Job] = collections.deque()  # taken off the queue, not yet run
        stopping = False
        while waiting or self._urgent or not stopping:
            if not waiting and not self._urgent:
                job = self._queue.get()
                stopping = job is None
                if isinstance(job, _Job):
                    waiting.append(job)
            while not stopping:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                stopping = more is None  # the units queued before it still run
                if isinstance(more, _Job):
                    waiting.append(more)
            # Urgent units open the next group, ahead of what was queued before them.
            group: list[_Job] = []
            began = time.perf_counter()
            for source in (self._urgent, waiting):
                while source and len(group) < _MAX_GROUP:
                    group.append(source.popleft())
            pending: list[_Job] = []
            for item in group:
                if not item.start():
                    continue  # its caller gave up before it started (a cancelled task): like an executor
                if item.raw:
                    self._commit(pending)
                    pending = []
                    self._raw(item)
                else:
                    pending.append(item)
            self._commit(pending)
            self._wake()
            self.thread_cpu_s = time.thread_time()
            self.thread_busy_s += time.perf_counter() - began

    def _raw(self, job: _Job) -> None:
        try:
            result = job.fn(SQLiteTx(self._connect()))
        except BaseException as exc:
            self._settle(job, error=exc)
        else:
            self._settle(job, result)

    def _commit(self, group: list[_Job]) -> None:
        """Run ``group`` in one transaction and commit once (again with savepoints if a unit that
        wrote failed)."""
        guarded = not self.optimistic
        while group:
            group, again = self._commit_some(group, guarded)
            guarded = guarded or again

    def _commit_some(self, group: list[_Job], guarded: bool) -> tuple[list[_Job], bool]:
        """Commit a prefix of ``group``; return the units still to run (after SQLite itself rolled
        the transaction back mid-group: a full disk, an I/O error), and whether they must run with
        savepoints (a unit failed after writing in a pass without them: nothing was committed)."""
        try:
            conn = self._connect()
        except Exception as exc:
            for job in group:
                self._settle(job, error=exc)
            return [], False
        durable = any(job.durable for job in group)
        outcomes: list[tuple[_Job, Any, BaseException | None, list[tuple[str, str]]]] = []
        rest: list[_Job] = []
        try:
            if durable:
                conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
            for index, job in enumerate(group):
                tx = SQLiteTx(conn, guarded=guarded)
                try:
                    result = job.fn(tx)
                except BaseException as exc:
                    outcomes.append((job, None, exc, []))
                else:
                    outcomes.append((job, result, None, tx.notes))
                if not guarded and tx.wrote and outcomes[-1][2] is not None and conn.in_transaction:
                    conn.execute("ROLLBACK")  # its writes cannot be undone alone: the group runs again
                    return group, True
                if not conn.in_transaction:
                    # SQLite rolled everything back (SQLITE_FULL, IOERR...), even if the unit caught
                    # the error: every unit so far is undone, so each one's caller hears so.
                    lost = sqlite3.OperationalError("the database rolled the transaction back "
                                                    "(disk full or I/O error); nothing was saved")
                    for done, _, error, _ in outcomes:
                        self._settle(done, error=error if error is not None else lost)
                    return group[index + 1:], guarded
                if tx.saved:  # it wrote: keep or undo just its own writes
                    if outcomes[-1][2] is not None:
                        conn.execute("ROLLBACK TO unit")
                    conn.execute("RELEASE unit")
            if self.rehearse and not guarded:
                conn.execute("ROLLBACK")
                return group, True
            conn.execute("COMMIT")
            self.commits += 1
        except BaseException as exc:
            # The transaction itself failed (locked, disk full at commit): nothing of the group holds.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for job in group:
                if not job.done:
                    self._settle(job, error=exc)
            return rest, False
        finally:
            if durable:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous=NORMAL")
        for job, result, error, notes in outcomes:
            self._settle(job, result, error)
            self._notes.extend(notes)
        return rest, False

    def _submit(self, fn: Callable[[SQLiteTx], Any], *, durable: bool = False,
                raw: bool = False) -> concurrent.futures.Future[Any]:
        self._start_thread()
        job = _Job(fn, durable=durable, raw=raw, future=concurrent.futures.Future())
        self._queue.put(job)
        assert job.future is not None
        return job.future

    async def _call(self, fn: Callable[[SQLiteTx], T], *, durable: bool = False, raw: bool = False,
                    urgent: bool = False) -> T:
        """Queue ``fn`` and await its outcome without a thread-to-loop wake-up of its own."""
        self._start_thread()
        loop = asyncio.get_running_loop()
        job = _Job(fn, durable=durable, raw=raw, waiter=loop.create_future(), loop=loop)
        if urgent:
            self._urgent.append(job)
            self._queue.put(_URGENT)  # wakes the thread; the unit itself is taken from the deque
        else:
            self._queue.put(job)
        assert job.waiter is not None
        result: T = await job.waiter
        return result

    # -- the engine ----------------------------------------------------------------------------

    async def _apply(self, migrations: dict[str, list[Step]]) -> None:
        def work(tx: SQLiteTx) -> None:
            tx.execute(SCHEMA_TABLE)
            for component, steps in migrations.items():
                tx.execute("BEGIN IMMEDIATE")
                try:
                    self._upgrade(tx, component, steps)
                except BaseException:
                    tx.execute("ROLLBACK")
                    raise
                tx.execute("COMMIT")

        await self._call(work, raw=True)

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._call(lambda tx: None, raw=True)
            await self._apply(dict(self._migrations))
            await self._call(sqlitefile.probe_write, raw=True)  # read-only: fails here, not at the first write
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the database {self.where}: {exc}") from exc
        self.opened = True

    async def open_to_read(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.reading = True  # (its connection is SQLite's read-only one: see sqlitefile.connect)
        try:  # (the schema's first page: a file that is no database fails here)
            await self._call(lambda tx: tx.execute("SELECT count(*) FROM sqlite_master").fetchall(), raw=True)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the database {self.where}: {exc}") from exc
        self.opened = True

    async def read(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run ``fn`` on the writer thread in a deferred, query-only transaction: it takes no write
        lock, so it waits for no other program's writer (a unit of :meth:`run` opens with one)."""
        return await self._call(lambda tx: sqlitefile.read_only(tx, fn), raw=True)

    async def run(self, fn: Callable[[SQLiteTx], T], *, urgent: bool = False) -> T:
        return await self._call(fn, urgent=urgent)

    async def transaction(self, fn: Callable[[SQLiteTx], T], *, durable: bool = False, urgent: bool = False) -> T:
        """Run ``fn(tx)`` in one transaction on the database thread.

        ``durable``: the commit is synced to disk (``synchronous=FULL`` for its group) before this
        returns, for rows a user is told about; otherwise (``NORMAL``, WAL) a power loss may drop
        the last commits, though never corrupt the file. ``bench/bench_durability.py`` measures both.
        """
        return await self._call(fn, durable=durable, urgent=urgent)

    def run_sync(self, fn: Callable[[SQLiteTx], T]) -> T:
        result: T = self._submit(fn).result()
        return result

    async def run_raw(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run ``fn`` on the writer thread outside any transaction (VACUUM, a backup, a pragma)."""
        return await self._call(fn, raw=True)

    async def checkpoint(self) -> None:
        """Copy the WAL into the database and truncate it to zero bytes (after a forget: no old copies).

        Another program reading the file (a sqlite3 shell, a backup) holds the truncation up while it
        reads: this waits a moment only, as the writer thread every unit of work needs waits with it,
        and a task tries again, pausing longer each time, until a truncation completes."""
        if self.path == ":memory:":
            return
        done = False
        try:
            done = await self.run_raw(sqlitefile.truncate_wal)
        finally:
            if not done and (self._truncating is None or self._truncating.done()):
                retry = sqlitefile.keep_truncating(lambda: self.run_raw(sqlitefile.truncate_wal), self.where,
                                                   self.checkpoint_retry_s)
                self._truncating = asyncio.create_task(retry, name="qunbot-wal-truncate")

    async def close(self) -> None:
        if self._truncating is not None:  # (closing the connection checkpoints, if no reader is left)
            self._truncating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._truncating
        if self._thread is None:
            return

        def shut(tx: SQLiteTx) -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        if self._conn is not None:  # (none after a failed open: connecting just to close raised over its error)
            await self._call(shut, raw=True)
        self._queue.put(None)
        thread, self._thread = self._thread, None
        await asyncio.to_thread(thread.join)
        self.opened = False

