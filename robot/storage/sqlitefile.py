"""The SQLite engine's dealings with its file beside units of work (see :mod:`robot.storage.sqlite`):
the files' modes, the probe at open, reads that take no lock, the WAL's truncation after a forget,
and the errors that say the file itself cannot be used."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from robot.storage.base import StorageError
from robot.storage.sqlitetx import SQLiteTx

__all__ = ["UnusableDatabase", "connect", "keep_truncating", "private_files", "probe_write", "read_only",
           "truncate_wal", "unusable"]

T = TypeVar("T")
log = logging.getLogger(__name__)
#: How long one checkpoint waits for readers: the writer thread, which every unit of work needs, waits with it.
_CHECKPOINT_WAIT_MS = 100
_RETRY_MOST_S = 30.0  # the longest pause between two attempts to truncate the WAL
_PATIENCE_S = 60.0  # attempts failing this long are worth a warning (once)
# SQLite's primary result codes for a file that cannot be used as it stands (whatever is retried).
_UNUSABLE = {8: "SQLITE_READONLY", 11: "SQLITE_CORRUPT", 26: "SQLITE_NOTADB"}


class UnusableDatabase(StorageError, sqlite3.DatabaseError):
    """The SQLite file is read-only to this process or damaged: a :class:`StorageError` naming the
    file (``qunbot run`` prints one line, not a traceback), still an ``sqlite3.DatabaseError``."""


def unusable(exc: BaseException, where: str) -> BaseException:
    """``exc`` as an :class:`UnusableDatabase` when it says the file cannot be used; else ``exc``."""
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, StorageError) or code is None \
            or code & 0xFF not in _UNUSABLE:
        return exc
    error = UnusableDatabase(f"cannot use the database {where}: {exc}")
    error.__cause__ = exc
    return error


def private_files(path: str) -> None:
    """The database, WAL and SHM readable by the owner only (created so, tightened if found looser)."""
    if not Path(path).exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for name in (path, path + "-wal", path + "-shm"):
        file = Path(name)
        with contextlib.suppress(FileNotFoundError):
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)


def connect(path: str, timeout_s: float, *, reading: bool = False) -> sqlite3.Connection:
    """The engine's connection to ``path`` (WAL, its files private). ``reading``: SQLite's read-only
    mode, for commands that only read: it creates no database, changes no file's mode and writes nothing
    into the database (SQLite may add the empty -wal and -shm files every reader of a WAL file needs)."""
    if reading and path != ":memory:":
        return sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                               isolation_level=None, timeout=timeout_s)
    if path != ":memory:":
        private_files(path)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=timeout_s)
    # Deleted rows are overwritten, not just unlinked: /forget me leaves no copy in free pages.
    conn.execute("PRAGMA secure_delete=ON")
    if path != ":memory:":
        conn.execute("PRAGMA journal_mode=WAL")
        private_files(path)  # SQLite gives the WAL and SHM the database's mode
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def probe_write(tx: SQLiteTx) -> None:
    """Raise now if the file takes no write (read-only to this user), rather than at the first unit."""
    conn = tx.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("UPDATE schema_version SET version = version WHERE 0")  # a write that changes nothing
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def read_only(tx: SQLiteTx, fn: Callable[[SQLiteTx], T]) -> T:
    """``fn(tx)`` in a deferred transaction that may not write: in WAL mode it waits for no writer."""
    conn = tx.conn
    conn.execute("PRAGMA query_only = ON")
    try:
        conn.execute("BEGIN DEFERRED")
        try:
            return fn(tx)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == 8:  # (not the file's fault: see unusable())
                raise sqlite3.ProgrammingError(f"a read may not write: {exc}") from exc
            raise
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # it read only: nothing to keep
    finally:
        conn.execute("PRAGMA query_only = OFF")


def truncate_wal(tx: SQLiteTx) -> bool:
    """Copy the WAL into the database and truncate it, waiting a moment only for readers (another
    program's snapshot holds its frames); whether that completed."""
    conn = tx.conn
    was = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    conn.execute(f"PRAGMA busy_timeout = {min(was, _CHECKPOINT_WAIT_MS)}")
    try:
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.execute(f"PRAGMA busy_timeout = {was}")
    return not busy


async def keep_truncating(attempt: Callable[[], Awaitable[bool]], where: str, first_s: float) -> None:
    """Call ``attempt`` (:func:`truncate_wal` on the writer thread), pausing longer each time, until it
    completes: deleted rows' old copies stay in ``<where>-wal`` until then. Warns once if it takes long."""
    pause, began, warned = first_s, time.monotonic(), False
    while True:
        await asyncio.sleep(pause)
        try:
            if await attempt():
                if warned:
                    log.warning("storage: the WAL of %s is truncated at last", where)
                return
            why = "another program still reads an older state of the file"
        except Exception as exc:  # (an I/O error: tried again like a reader's hold)
            why = str(exc)
        if not warned and time.monotonic() - began >= _PATIENCE_S:
            warned = True
            log.warning("storage: cannot truncate the WAL of %s (%s): rows deleted (a /forget) may still be in "
                        "%s-wal until it is; still trying", where, why, where)
        pause = min(pause * 2, _RETRY_MOST_S)
