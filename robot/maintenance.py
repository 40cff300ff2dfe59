"""``qunbot backup`` and ``qunbot pending``: commands that read or copy the bot's database."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from robot.config import Settings
from robot.snapshots import SnapshotStore
from robot.store import Database

__all__ = ["backup", "pending"]


async def pending(settings: Settings, everything: bool) -> int:
    """``qunbot pending``: the snapshots waiting for a person (no run state or arguments shown)."""
    path = settings.bot.data_dir / "qunbot.sqlite3"
    if not path.exists():
        print(f"no database at {path}: nothing is waiting")
        return 0
    db = Database(path)
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
    """``qunbot backup``: a consistent copy of the database, safe while the bot runs."""
    source = settings.bot.data_dir / "qunbot.sqlite3"
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
