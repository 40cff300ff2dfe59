"""``qunbot backup``, ``pending``, ``copy-db`` and ``adopt-secret``: commands on the bot's database."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from robot import secret_key
from robot.config import Settings
from robot.snapshots import SnapshotStore
from robot.storage import (
    POSTGRES_SCHEMES,
    SQLITE_FILE,
    Engine,
    SQLiteDatabase,
    iso,
    open_database,
)
from robot.storage.copy import (
    CopyError,
    copy_sync,
    living_processes,
    occupied_error,
    occupied_sync,
    sqlite_tables,
)
from robot.storage.leases import PROCESS_PREFIX, Leases
from robot.storage.lockfile import sole_process

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["COMMANDS", "add_parsers", "adopt_secret", "backup", "copy_db", "housekeep", "pending", "run",
           "undelivered"]
log = logging.getLogger(__name__)

COMMANDS = ("backup", "pending", "copy-db", "adopt-secret")  #: the subcommands this module runs


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """The subcommands of this module, on ``qunbot``'s parser."""
    backup = sub.add_parser("backup", parents=[common], help="copy the SQLite database while the bot runs",
                            description="Copy the bot's SQLite database to a file with SQLite's online backup "
                                        "API: safe while the bot is running.")
    backup.add_argument("target", help="the backup file to write (e.g. backups/qunbot-2026-11-23.sqlite3)")
    backup.add_argument("--force", action="store_true", help="overwrite an existing file")
    pending = sub.add_parser("pending", parents=[common], help="list runs waiting for an approval or an answer",
                             description="List the paused runs (snapshots) waiting for an approval or an answer.")
    pending.add_argument("--all", action="store_true", help="every snapshot, not only the pending ones")
    copy = sub.add_parser("copy-db", parents=[common], help="copy the SQLite database into an empty PostgreSQL one",
                          description="Scale out: copy the bot's SQLite database (history, reminders, memories, "
                                      "the outbox, channel logins...) into an empty PostgreSQL database, in one "
                                      "transaction. Stop the bot first.")
    copy.add_argument("--to", required=True, metavar="URL", help="postgresql://user:password@host:5432/dbname")
    sub.add_parser("adopt-secret", parents=[common], help="make this data_dir's secret.key the database's",
                   description="After the database's secret.key was lost or leaked: make this data_dir's "
                               "secret.key (created if missing) the one every process must have. What the old "
                               "key sealed (stored Weixin logins, runs waiting for an approval) can no longer be "
                               "opened. Stop every process first.")


def run(command: str, settings: Settings, args: argparse.Namespace) -> int:
    """Run one of :data:`COMMANDS` with its parsed arguments; its exit status."""
    if command == "backup":
        return backup(settings, args.target, args.force)
    if command == "pending":
        return asyncio.run(pending(settings, args.all))
    if command == "copy-db":
        return asyncio.run(copy_db(settings, args.to))
    return asyncio.run(adopt_secret(settings))


async def adopt_secret(settings: Settings) -> int:
    """``qunbot adopt-secret``: this data_dir's ``secret.key`` becomes the database's (see
    :mod:`robot.secret_key`), unless a process is running on the database."""
    path = settings.bot.data_dir / "secret.key"
    db = settings.storage.engine(settings.bot.data_dir)
    db.migrate("install_secret", secret_key.SCHEMA)
    leases = Leases(db)
    try:
        await db.open()
        running = sorted((await leases.holders(PROCESS_PREFIX)).values())
        if running:  # it would go on sealing and signing with the old key
            print(f"error: stop every process using the database {db.where} first; still running: "
                  f"{', '.join(running)} (one that was killed counts as running for [storage] lease_s seconds)",
                  file=sys.stderr)
            return 2
        await secret_key.check_secret(db, path, adopt=True)
    finally:
        await db.close()
    print(f"{path} is now the database's secret.key: copy it into every other process's data_dir. What the old "
          "key sealed (stored Weixin logins, runs waiting for an approval) can no longer be opened: log Weixin in "
          "again.")
    return 0


async def housekeep(bot: Bot) -> None:
    """Hourly: prune dedupe rows, history past retention, old outbox rows and finished snapshots."""
    while True:
        try:
            await bot.dedupe.prune(bot.clock())
            await bot.history.apply_retention(bot.clock())
            hist = bot.settings.history
            await bot.outbox.prune(bot.clock(), keep=min(timedelta(days=7), timedelta(days=hist.retention_days)),
                                   max_rows=hist.max_messages)
            await bot.approvals.store.prune(bot.clock() - timedelta(days=hist.retention_days))
            await bot.budget.prune()
        except Exception:
            log.exception("housekeeping failed")
        await asyncio.sleep(3600)


def _engine(settings: Settings) -> Engine | None:
    """The configured database (not opened), or None for an SQLite file that does not exist yet."""
    db = settings.storage.engine(settings.bot.data_dir)
    if isinstance(db, SQLiteDatabase) and not Path(db.path).is_file():
        return None
    return db


async def pending(settings: Settings, everything: bool) -> int:
    """``qunbot pending``: the snapshots waiting for a person (no run state or arguments shown).

    It reads the database as it stands, writing nothing: a running bot's database is not upgraded under
    it, and a read-only file or another program's write transaction does not stop it."""
    db = _engine(settings)
    if db is None:
        print(f"no database at {settings.bot.data_dir / SQLITE_FILE}: nothing is waiting")
        return 0
    probe = Engine()
    SnapshotStore(probe)  # (registers the snapshots schema on a bare engine: how many steps this code knows)
    known = probe.schemas()["snapshots"]
    where = "WHERE status = 'pending' " if not everything else ""
    try:
        await db.open_to_read()
        versions = await db.read_present(lambda tx: tx.execute(
            "SELECT version FROM schema_version WHERE component = 'snapshots'").fetchall(), None)
        have = int(versions[0][0]) if versions else 0
        rows = None if have > known else await db.read_present(lambda tx: tx.query(
            f"SELECT code, status, kind, approver, requester, chat, expires_at FROM snapshots {where}"
            "ORDER BY created_at DESC"), None)
    finally:
        await db.close()
    if have != known and (rows is not None or have > known):  # (no snapshots table at all: nothing waits)
        print(f"error: the database {db.where} holds 'snapshots' at schema version {have}, " + (
              f"newer than this qunbot knows ({known}): upgrade qunbot" if have > known else
              f"older than this qunbot's ({known}): start the bot once (`qunbot run`) to upgrade it, then "
              "run `qunbot pending` again"), file=sys.stderr)
        return 2
    if not rows:
        print("nothing is waiting")
    for row in rows or []:
        who = "answer" if row["kind"] == "input" else f"{row['approver']} approval"
        print(f"{row['code']}  {row['status']:<11} {who:<18} {row['requester']} in {row['chat']}  "
              f"expires {row['expires_at'][:16].replace('T', ' ')} UTC")
    return 0


def backup(settings: Settings, target: str, force: bool) -> int:
    """``qunbot backup``: a consistent copy of the SQLite database, safe while the bot runs."""
    if settings.storage.url.get_secret_value().strip().startswith(("postgresql:", "postgres:")):
        print("error: qunbot backup copies the embedded SQLite file; [storage] url names PostgreSQL: back it "
              "up with PostgreSQL's own tools, e.g. pg_dump -Fc -f qunbot.dump <dbname>", file=sys.stderr)
        return 2
    db = open_database(settings.storage.url.get_secret_value(), settings.bot.data_dir)
    source = Path(db.path) if isinstance(db, SQLiteDatabase) else settings.bot.data_dir / SQLITE_FILE
    dest = Path(target)
    if not source.is_file():
        print(f"error: no database at {source} (is [bot] data_dir right?)", file=sys.stderr)
        return 2
    where = dest.resolve()
    if where in {source.resolve(), *(source.with_name(source.name + x).resolve()
                                     for x in ("-wal", "-shm", "-journal", ".lock"))}:
        # --force swapped the live database (its WAL left behind): corrupt at the next read
        print(f"error: {dest} is the database itself or one of its files; back it up to another file",
              file=sys.stderr)
        return 2
    data_dir = settings.bot.data_dir.resolve()
    if where == data_dir or data_dir in where.parents:
        # --force made secret.key an SQLite file (the next start refused), or replaced a running bot's lock
        print(f"error: {dest} is inside [bot] data_dir ({settings.bot.data_dir}), among the bot's own files; "
              "write the backup elsewhere", file=sys.stderr)
        return 2
    if dest.is_dir():
        print(f"error: {dest} is a directory; name the backup file, e.g. {dest / 'qunbot-backup.sqlite3'}",
              file=sys.stderr)
        return 2
    if dest.exists() and not dest.is_file():  # a device or a pipe: renamed away by --force
        print(f"error: {dest} is not a regular file; name a new file or an older backup", file=sys.stderr)
        return 2
    if dest.exists() and not force:
        print(f"error: {dest} exists; use --force to overwrite", file=sys.stderr)
        return 2
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private as the database itself
    # SQLite's online backup API: a consistent copy even while the bot writes (WAL mode).
    try:
        src = sqlite3.connect(source, timeout=30)
        try:
            dst = sqlite3.connect(partial)
            try:
                src.backup(dst)
                check = dst.execute("PRAGMA quick_check").fetchone()[0]
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        print(f"error: backup failed: {exc}", file=sys.stderr)
        return 1
    if check != "ok":
        partial.unlink(missing_ok=True)
        print(f"error: the copy failed its integrity check: {check}", file=sys.stderr)
        return 1
    try:
        partial.replace(dest)
    except OSError as exc:  # (a full copy was left beside it, and the error read "cannot start")
        partial.unlink(missing_ok=True)
        print(f"error: cannot write {dest}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"backed up {source} to {dest} ({dest.stat().st_size // 1024} KiB)")
    return 0


async def undelivered(settings: Settings, days: int = 7, *, db: Engine | None = None) -> list[dict[str, str]]:
    """Outgoing messages given up in the last ``days`` (newest first); [] without a database. ``db``: the
    database already opened to read (doctor's), read and left open; else it is opened here to read."""
    own = db is None
    engine = _engine(settings) if db is None else db
    if engine is None:
        return []
    cutoff = iso(datetime.now(UTC) - timedelta(days=days))
    try:
        if own:
            await engine.open_to_read()  # (doctor: another program's write transaction must not hold it up)
        try:
            rows = await engine.read(lambda tx: tx.execute(
                "SELECT chat, coalesce(error, '') FROM outbox WHERE status = 'failed' AND sent_at >= ? "
                "ORDER BY sent_at DESC LIMIT 100", [cutoff]).fetchall())
        finally:
            if own:
                await engine.close()
    except Exception as exc:  # no outbox table yet, an unreachable server (doctor reports it on its own line)
        log.debug("undelivered: cannot read the outbox (%s)", type(exc).__name__)  # (no traceback: it may quote a DSN)
        return []
    return [{"chat": str(chat), "error": str(error)[:200]} for chat, error in rows]


async def copy_db(settings: Settings, to_url: str) -> int:
    """``qunbot copy-db --to URL``: the bot's SQLite database into an empty PostgreSQL database.

    Both get this code's schema first (a bot without channels starts and stops on each), then
    :func:`robot.storage.copy.copy_sync` copies every table in one transaction.
    """
    from robot.bot import Bot
    from robot.storage.postgres import PostgresDatabase, redact_dsn

    url, to_url = settings.storage.url.get_secret_value().strip(), to_url.strip()
    source = open_database(url, settings.bot.data_dir) if not url.startswith("postgres") else None
    if not isinstance(source, SQLiteDatabase):
        print("error: copy-db copies the embedded SQLite database; [storage] url already names PostgreSQL",
              file=sys.stderr)
        return 2
    if not to_url.startswith(POSTGRES_SCHEMES):
        print("error: --to must be a postgresql://user:password@host:5432/dbname URL", file=sys.stderr)
        return 2
    if not await asyncio.to_thread(Path(source.path).is_file):
        print(f"error: no database at {source.path} (is [bot] data_dir right?)", file=sys.stderr)
        return 2
    try:
        running = await asyncio.to_thread(living_processes, source.path, iso(datetime.now(UTC)))
    except sqlite3.Error as exc:  # (a damaged file ended in a traceback)
        print(f"error: cannot read {source.path}: {exc}; nothing was copied", file=sys.stderr)
        return 1
    if running:  # its later writes would be lost, and a second bot on the file would fire its reminders too
        print(f"error: a bot is running on {source.path} ({', '.join(running)}): stop it, then copy (one "
              f"that was killed counts as running for [storage] lease_s seconds)", file=sys.stderr)
        return 2
    shown = redact_dsn(to_url)
    tables = await asyncio.to_thread(sqlite_tables, source.path)
    target = settings.model_copy(update={"storage": settings.storage.model_copy(update={"url": SecretStr(to_url)})})
    try:
        probe = PostgresDatabase(to_url, max_size=1)  # fail closed before any bot starts on someone's data
        await probe.open()
        try:
            busy = await probe.run(lambda tx: occupied_sync(tx, tables))
        finally:
            await probe.close()
        if busy:
            raise occupied_error(busy)
        old = Bot(settings, channels=[])  # a start applies this code's schema: the source's first
        await old.start()
        await old.stop()
        new = Bot(target, channels=[])
        # The file held as a bot holds it while copying: a bot started meanwhile wrote rows the copy had passed
        with sole_process(Path(source.path)):
            await new.start()
            try:
                report = await new.db.transaction(lambda tx: copy_sync(tx, source.path), durable=True)
            finally:
                await new.stop()
    except CopyError as exc:
        print(f"error: {exc}; nothing was copied", file=sys.stderr)
        return 2
    except Exception as exc:  # the server unreachable, a refused login, a value PostgreSQL rejects
        log.debug("copy-db failed: %s", type(exc).__name__)  # (no traceback: its causes may quote the password)
        print(f"error: copying to {shown} failed, nothing was copied: {redact_dsn(str(exc), to_url)[:500]}", file=sys.stderr)
        return 1
    print(f"copied {sum(report.rows.values())} rows of {len(report.rows)} tables from {source.path} to {shown}")
    for table, rows in sorted(report.rows.items()):
        print(f"  {table}: {rows}")
    if report.rebuilt:
        print(f"rebuilt at the next start: {', '.join(report.rebuilt)}")
    print("next: set [storage] url to it in every process's config, copy "
          f"{settings.bot.data_dir / 'secret.key'} into each process's data_dir, and start them (README: Scale out). "
          "Keep the SQLite file as a backup.")
    return 0
