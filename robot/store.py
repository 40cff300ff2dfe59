"""The bot's database and the dedupe store.

:mod:`robot.storage` holds the engines (embedded SQLite, PostgreSQL); this module keeps the names
the rest of the code has always imported (``Database`` is the SQLite engine) and the dedupe store.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from robot.storage import Engine, SQLiteDatabase, StorageError, Tx, iso, parse_iso, utcnow
from robot.storage.leases import Leases

__all__ = ["Database", "DedupeStore", "Engine", "StorageError", "Tx", "iso", "parse_iso", "utcnow"]

Database = SQLiteDatabase


class DedupeStore:
    """Platform message ids seen recently: platforms redeliver, the bot answers once.

    The ``seen`` row names the process that took the message (``owner``, its lease holder id): a
    redelivery of a message not yet :meth:`done` is taken over only when that process is dead (no
    longer renews its process lease; on SQLite any other owner is this process's dead predecessor),
    so a message delivered to two living processes is handled by one.
    """

    def __init__(self, db: Engine, keep: timedelta = timedelta(hours=48), *, leases: Leases | None = None) -> None:
        self.db = db
        self.keep = keep
        self.leases = leases if leases is not None else Leases(db)
        db.migrate("dedupe", [self._schema, "ALTER TABLE seen ADD COLUMN owner TEXT NOT NULL DEFAULT ''"])

    @staticmethod
    def _schema(db: Tx) -> None:
        # Step 1 (idempotent: a v0.1 SQLite file has the table, maybe without ``handled``).
        db.execute(
            "CREATE TABLE IF NOT EXISTS seen (platform TEXT NOT NULL, message_id TEXT NOT NULL, "
            "seen_at TEXT NOT NULL, handled INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (platform, message_id))"
        )
        db.execute("CREATE INDEX IF NOT EXISTS seen_at_idx ON seen (seen_at)")
        # 0 while the message is being handled: a crash then leaves it open for the redelivery.
        if db.dialect == "sqlite" and "handled" not in {
                row[1] for row in db.execute("PRAGMA table_info(seen)").fetchall()}:
            db.execute("ALTER TABLE seen ADD COLUMN handled INTEGER NOT NULL DEFAULT 1")

    async def first_time(self, platform: str, message_id: str, now: datetime) -> bool:
        """True the first time a (platform, message id) is offered; False on redelivery."""

        def work(db: Tx) -> bool:
            cur = db.execute(
                "INSERT INTO seen (platform, message_id, seen_at, owner) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (platform, message_id) DO NOTHING",
                [platform, message_id, iso(now), self.leases.holder],
            )
            return cur.rowcount == 1

        return await self.db.run(work)

    def receive_sync(self, db: Tx, platform: str, message_id: str, now: datetime,
                     record: Callable[[Tx], object]) -> bool:
        """:meth:`receive` inside a caller's transaction."""
        me = self.leases.holder
        cur = db.execute("INSERT INTO seen (platform, message_id, seen_at, handled, owner) VALUES (?, ?, ?, 0, ?) "
                         "ON CONFLICT (platform, message_id) DO NOTHING", [platform, message_id, iso(now), me])
        if cur.rowcount == 1:
            record(db)
            return True
        row = db.execute("SELECT handled, owner FROM seen WHERE platform = ? AND message_id = ?",
                         [platform, message_id]).fetchone()
        if row is None or row[0]:
            return False
        owner = str(row[1])
        if owner == me:
            return True  # this process failed handling it earlier: the redelivery is the retry
        if self.leases.alive_sync(db, owner):
            return False  # another living process is handling it
        # Its owner died mid-way: take it over, once (of two processes racing here one updates the row).
        return db.execute("UPDATE seen SET owner = ? WHERE platform = ? AND message_id = ? AND owner = ? "
                          "AND handled = 0", [me, platform, message_id, owner]).rowcount == 1

    async def receive(self, platform: str, message_id: str, now: datetime,
                      record: Callable[[Tx], object]) -> bool:
        """Whether to handle a message: True when new (``record`` stores it in the same transaction,
        so the message is durable with its dedupe row) or when an earlier copy was never
        :meth:`done` by this process or a dead one (it died or failed handling it); False for a
        handled message's redelivery, or one another living process is handling."""
        return await self.db.transaction(lambda db: self.receive_sync(db, platform, message_id, now, record))

    async def done(self, platform: str, message_id: str) -> None:
        """Mark a received message handled: from now on its redeliveries are ignored."""
        await self.db.run(lambda db: self.done_sync(db, platform, message_id))

    @staticmethod
    def done_sync(db: Tx, platform: str, message_id: str) -> None:
        """:meth:`done` inside a caller's unit of work (the pipeline marks it with the reply's enqueue)."""
        db.execute("UPDATE seen SET handled = 1 WHERE platform = ? AND message_id = ?", [platform, message_id])

    async def prune(self, now: datetime) -> int:
        cutoff = iso(now - self.keep)
        return await self.db.run(lambda db: db.execute("DELETE FROM seen WHERE seen_at < ?", [cutoff]).rowcount)
