"""The bot's SQLite database: one file, WAL, one thread that owns the connection.

Every read and write runs on that thread (``await db.run(fn)``), so the event loop never
blocks on disk and writes never contend. ``fn`` receives the ``sqlite_utils.Database``;
``await db.transaction(fn)`` wraps it in one atomic transaction, which is how a reminder's
state change and its outbox row commit together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import sqlite_utils

__all__ = ["Database", "DedupeStore", "iso", "parse_iso", "utcnow"]

T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """Aware datetime -> sortable UTC text (microseconds kept). Naive input is a bug."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


class Database:
    """An SQLite file (or ``":memory:"``) served by a single dedicated thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.exists():
                parent.mkdir(parents=True, mode=0o700)  # people's messages live here: the owner's eyes only
                parent.chmod(0o700)  # mkdir's mode is cut by the umask
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="qunbot-db")
        self._db: sqlite_utils.Database | None = None
        self._thread: int | None = None
        self._migrations: list[Callable[[sqlite_utils.Database], object]] = []

    def _open(self) -> sqlite_utils.Database:
        if self._db is None:
            import sqlite3

            if self.path != ":memory:":
                _private_files(self.path)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            db = sqlite_utils.Database(conn)
            # Deleted rows are overwritten, not just unlinked: /forget me leaves no copy in free pages.
            db.execute("PRAGMA secure_delete=ON")
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
                _private_files(self.path)  # SQLite gives the WAL and SHM the database's mode
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            self._db = db
            self._thread = threading.get_ident()
        return self._db

    def migrate(self, step: Callable[[sqlite_utils.Database], object]) -> None:
        """Register an idempotent schema step that runs on :meth:`open` (constructors use this).

        On an open database the step runs at once, blocking: async code uses :meth:`ensure`.
        """
        self._migrations.append(step)
        if self._db is not None:
            self._pool.submit(step, self._db).result()

    async def ensure(self, step: Callable[[sqlite_utils.Database], object]) -> None:
        """Register a schema step and, if the database is already open, run it now (plugin setup)."""
        self._migrations.append(step)
        if self._db is not None:
            await self.run(step)

    async def open(self) -> None:
        def work() -> None:
            db = self._open()
            for step in self._migrations:
                step(db)

        await self.run_raw(work)

    async def run_raw(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._pool.submit(fn))

    async def run(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run ``fn(db)`` on the database thread (autocommit)."""
        return await self.run_raw(lambda: fn(self._open()))

    async def transaction(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run ``fn(db)`` in one transaction on the database thread."""

        def work() -> T:
            db = self._open()
            with db.atomic():
                return fn(db)

        return await self.run_raw(work)

    def run_sync(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Blocking variant for start-up code and the CLI, never for async code paths."""
        return self._pool.submit(lambda: fn(self._open())).result()

    async def checkpoint(self) -> None:
        """Copy the WAL into the database and truncate it to zero bytes (after a forget: no old copies)."""
        if self.path != ":memory:":
            await self.run(lambda db: db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())

    async def close(self) -> None:
        def work() -> None:
            if self._db is not None:
                self._db.conn.close()
                self._db = None

        await self.run_raw(work)
        self._pool.shutdown(wait=True)


def _private_files(path: str) -> None:
    """The database, WAL and SHM readable by the owner only (created so, tightened if found looser)."""
    if not Path(path).exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for name in (path, path + "-wal", path + "-shm"):
        file = Path(name)
        with contextlib.suppress(FileNotFoundError):
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)


class DedupeStore:
    """Platform message ids seen recently: platforms redeliver, the bot answers once."""

    def __init__(self, db: Database, keep: timedelta = timedelta(hours=48)) -> None:
        self.db = db
        self.keep = keep
        db.migrate(self._schema)

    @staticmethod
    def _schema(db: sqlite_utils.Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS seen (platform TEXT NOT NULL, message_id TEXT NOT NULL, "
            "seen_at TEXT NOT NULL, PRIMARY KEY (platform, message_id))"
        )
        db.execute("CREATE INDEX IF NOT EXISTS seen_at_idx ON seen (seen_at)")

    async def first_time(self, platform: str, message_id: str, now: datetime) -> bool:
        """True the first time a (platform, message id) is offered; False on redelivery."""

        def work(db: sqlite_utils.Database) -> bool:
            cur = db.execute(
                "INSERT OR IGNORE INTO seen (platform, message_id, seen_at) VALUES (?, ?, ?)",
                [platform, message_id, iso(now)],
            )
            return cur.rowcount == 1

        return await self.db.run(work)

    async def prune(self, now: datetime) -> int:
        cutoff = iso(now - self.keep)
        return await self.db.run(lambda db: db.execute("DELETE FROM seen WHERE seen_at < ?", [cutoff]).rowcount)
