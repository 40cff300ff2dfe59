"""The ``reminders`` table's versioned migrations (component ``reminders``): append a step, never edit one.

``bot.db.ensure("reminders", SCHEMA)``. Step 1 is idempotent: SQLite files from v0.1 have the
table (perhaps without later columns) but no version row.
"""

from __future__ import annotations

from collections.abc import Callable

from robot import Tx, bytewise

__all__ = ["SCHEMA", "schema_v1"]


def schema_v1(db: Tx) -> None:
    """Migration step 1 (``SCHEMA``): idempotent, since v0.1 SQLite files have the table but no version."""
    # PostgreSQL compares text by the database's locale; ids and UTC instants must sort bytewise.
    c = bytewise(db)
    db.execute(
        f"CREATE TABLE IF NOT EXISTS reminders (id TEXT{c} PRIMARY KEY, owner TEXT NOT NULL, "
        "owner_name TEXT NOT NULL, chat TEXT NOT NULL, type TEXT NOT NULL, wall TEXT NOT NULL, "
        "zone TEXT NOT NULL, weekday INTEGER, content TEXT NOT NULL, mode TEXT NOT NULL DEFAULT 'text', "
        f"created_at TEXT{c} NOT NULL, updated_at TEXT{c} NOT NULL, next_fire TEXT{c}, last_fired TEXT, "
        "status TEXT NOT NULL, failure_reported INTEGER NOT NULL DEFAULT 0, "
        "account TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '')"
    )
    if db.dialect == "sqlite":  # a file from before accounts or request digests lacks the columns
        have = {row[1] for row in db.execute("PRAGMA table_info(reminders)").fetchall()}
        for column in ("account", "source"):
            if column not in have:
                db.execute(f"ALTER TABLE reminders ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
    db.execute("CREATE INDEX IF NOT EXISTS reminders_due ON reminders (status, next_fire)")
    db.execute("CREATE INDEX IF NOT EXISTS reminders_owner ON reminders (owner, status, next_fire)")
    db.execute("CREATE INDEX IF NOT EXISTS reminders_chat ON reminders (chat, status, next_fire)")
    db.execute("CREATE INDEX IF NOT EXISTS reminders_created ON reminders (owner, created_at)")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS reminders_source ON reminders (source) WHERE source != ''")


SCHEMA: list[Callable[[Tx], None] | str] = [
    schema_v1,
    # 2: a firing pass reads due rows in this order (chat by chat, so one chat's reminders share a
    # message); without it, every batch sorts all the rows due at that instant.
    "CREATE INDEX IF NOT EXISTS reminders_firing ON reminders (status, mode, next_fire, chat, id)",
    # 3: which process runs a scheduled prompt's model, until when (several processes share the table).
    "ALTER TABLE reminders ADD COLUMN run_by TEXT NOT NULL DEFAULT ''; ALTER TABLE reminders ADD COLUMN run_until TEXT",
    # 4: fewer indexes for a firing to rewrite (it moves every fired reminder's next_fire): the firing
    # index serves every due-time question (see ReminderStore.upcoming), reminders_created a person's
    # reminders, and a chat's need not be in time order. Saving 10,000 fired on SQLite: 270 -> 105 ms.
    "DROP INDEX IF EXISTS reminders_due; DROP INDEX IF EXISTS reminders_owner; DROP INDEX IF EXISTS reminders_chat; "
    "CREATE INDEX IF NOT EXISTS reminders_in_chat ON reminders (chat, status)",
]
