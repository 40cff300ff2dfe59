"""``qunbot backup`` and ``qunbot pending``: commands that read or copy the bot's database."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from robot.config import Settings
from robot.snapshots import SnapshotStore
from robot.storage import SQLITE_FILE, Engine, SQLiteDatabase, iso, open_database

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["backup", "housekeep", "pending", "undelivered"]
log = logging.getLogger(__name__)


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
    url = settings.storage.url.get_secret_value()
    db = open_database(url, settings.bot.data_dir)
    if isinstance(db, SQLiteDatabase) and not Path(db.path).is_file():
        return None
    return db


async def pending(settings: Settings, everything: bool) -> int:
    """``qunbot pending``: the snapshots waiting for a person (no run state or arguments shown)."""
    db = _engine(settings)
    if db is None:
        print(f"no database at {settings.bot.data_dir / SQLITE_FILE}: nothing is waiting")
        return 0
    store = SnapshotStore(db)
    try:
        await db.open()
        rows = await store.with_status(None if everything else "pending")
    finally:
        await db.close()
    if not rows:
        print("nothing is waiting")
    for row in rows:
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
    if dest.exists() and not force:
        print(f"error: {dest} exists; use --force to overwrite", file=sys.stderr)
        return 2
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
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
        print(f"error: the copy failed its integrity check: {check}", file=sys.stderr)
        return 1
    partial.replace(dest)
    print(f"backed up {source} to {dest} ({dest.stat().st_size // 1024} KiB)")
    return 0


async def undelivered(settings: Settings, days: int = 7) -> list[dict[str, str]]:
    """Outgoing messages given up in the last ``days`` (newest first); [] without a database."""
    db = _engine(settings)
    if db is None:
        return []
    cutoff = iso(datetime.now(UTC) - timedelta(days=days))
    try:
        await db.open()
        try:
            rows = await db.run(lambda tx: tx.execute(
                "SELECT chat, coalesce(error, '') FROM outbox WHERE status = 'failed' AND sent_at >= ? "
                "ORDER BY sent_at DESC LIMIT 100", [cutoff]).fetchall())
        finally:
            await db.close()
    except Exception:  # no outbox table yet, an unreachable server (doctor reports it on its own line)
        log.debug("undelivered: cannot read the outbox", exc_info=True)
        return []
    return [{"chat": str(chat), "error": str(error)[:200]} for chat, error in rows]
