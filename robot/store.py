"""The bot's database and the dedupe store.

:mod:`robot.storage` holds the engines (embedded SQLite, PostgreSQL); this module keeps the names
the rest of the code has always imported (``Database`` is the SQLite engine) and the dedupe store.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from robot.storage import Engine, SQLiteDatabase, StorageError, Tx, iso, parse_iso, utcnow

__all__ = ["Database", "DedupeStore", "Engine", "StorageError", "Tx", "iso", "parse_iso", "utcnow"]

Database = SQLiteDatabase


class DedupeStore:
    """Platform message ids seen recently: platforms redeliver, the bot answers once."""

    def __init__(self, db: Engine, keep: timedelta = timedelta(hours=48)) -> None:
        self.db = db
        self.keep = keep
        db.migrate("dedupe", [self._schema])

    @staticmethod
    def _schema(db: Tx) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS seen (platform TEXT NOT NULL, message_id TEXT NOT NULL, "
            "seen_at TEXT NOT NULL, PRIMARY KEY (platform, message_id))"
        )
        db.execute("CREATE INDEX IF NOT EXISTS seen_at_idx ON seen (seen_at)")
        # 0 while the message is being handled: a crash then leaves it open for the redelivery.
        if "handled" not in {row[1] for row in db.execute("PRAGMA table_info(seen)").fetchall()}:
            db.execute("ALTER TABLE seen ADD COLUMN handled INTEGER NOT NULL DEFAULT 1")

    async def first_time(self, platform: str, message_id: str, now: datetime) -> bool:
        """True the first time a (platform, message id) is offered; False on redelivery."""

        def work(db: Tx) -> bool:
            cur = db.execute(
                "INSERT OR IGNORE INTO seen (platform, message_id, seen_at) VALUES (?, ?, ?)",
                [platform, message_id, iso(now)],
            )
            return cur.rowcount == 1

        return await self.db.run(work)

    async def receive(self, platform: str, message_id: str, now: datetime,
                      record: Callable[[Tx], object]) -> bool:
        """Whether to handle a message: True when new (``record`` stores it in the same transaction,
        so the message is durable with its dedupe row) or when an earlier copy was never
        :meth:`done` (the bot died or failed handling it); False for a handled message's redelivery."""

        def work(db: Tx) -> bool:
            cur = db.execute("INSERT OR IGNORE INTO seen (platform, message_id, seen_at, handled) VALUES (?, ?, ?, 0)",
                             [platform, message_id, iso(now)])
            if cur.rowcount == 1:
                record(db)
                return True
            row = db.execute("SELECT handled FROM seen WHERE platform = ? AND message_id = ?",
                             [platform, message_id]).fetchone()
            return row is not None and not row[0]

        return await self.db.transaction(work)

    async def done(self, platform: str, message_id: str) -> None:
        """Mark a received message handled: from now on its redeliveries are ignored."""
        await self.db.run(lambda db: db.execute("UPDATE seen SET handled = 1 WHERE platform = ? AND message_id = ?",
                                                [platform, message_id]))

    async def prune(self, now: datetime) -> int:
        cutoff = iso(now - self.keep)
        return await self.db.run(lambda db: db.execute("DELETE FROM seen WHERE seen_at < ?", [cutoff]).rowcount)
