"""Which stored messages a summary reads, and each chat's "summarised up to here" mark.

The mark is the ``history`` row id of the newest message a summary covered, kept in this
plugin's own table ``summary_marks``. Row ids grow in the order messages are stored, so
"since the last summary" means ``id > last_id``: a message stored after a summary is never
skipped and never counted twice, even when platform timestamps are whole seconds (OneBot) and
it carries the same second as the mark.

The message that asked for the summary (``Caller.message_id``) is never part of the window,
but the mark moves past it, so the request is not summarised next time either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlite_utils

from robot import ChatRef, Database, HistoryEntry, iso, parse_iso

__all__ = ["MARKS_TABLE", "Fetched", "advance_mark", "create_marks_table", "fetch", "read_mark"]

MARKS_TABLE = "summary_marks"


def create_marks_table(db: sqlite_utils.Database) -> None:
    """Schema step (idempotent) for the row-id marks; run it with ``bot.db.ensure``."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {MARKS_TABLE} (chat TEXT PRIMARY KEY, last_id INTEGER NOT NULL)")


async def read_mark(db: Database, chat: ChatRef) -> int | None:
    """The history row id the chat's last summary reached, or None before any."""

    def work(db: sqlite_utils.Database) -> int | None:
        row = db.execute(f"SELECT last_id FROM {MARKS_TABLE} WHERE chat = ?", [chat.key]).fetchone()
        return int(row[0]) if row else None

    return await db.run(work)


async def advance_mark(db: Database, chat: ChatRef, last_id: int) -> None:
    """Move the chat's mark to ``last_id``; it never moves backwards (a slower, older summary)."""
    await db.run(lambda db: db.execute(
        f"INSERT INTO {MARKS_TABLE} (chat, last_id) VALUES (?, ?) "
        "ON CONFLICT(chat) DO UPDATE SET last_id = MAX(last_id, excluded.last_id)",
        [chat.key, last_id],
    ))


@dataclass
class Fetched:
    """Messages of one window (oldest first), the window's full count, and its newest row id."""

    entries: list[HistoryEntry]
    total: int
    newest_id: int | None
    """Highest history row id in the window, the request itself included (where the mark moves)."""


def _entry(row: dict[str, object]) -> HistoryEntry:
    return HistoryEntry(chat=str(row["chat"]), user_id=str(row["user_id"]), name=str(row["name"]),
                        text=str(row["text"]), at=parse_iso(str(row["ts"])), from_bot=bool(row["from_bot"]),
                        message_id=str(row["message_id"] or ""))


async def fetch(db: Database, chat: ChatRef, *, limit: int, after_id: int | None = None,
                start: datetime | None = None, skip_message_id: str = "", people_only: bool = False) -> Fetched:
    """The newest ``limit`` messages of the chat with ``id > after_id`` and/or ``ts >= start``.

    Neither bound means the whole chat (the "last N messages" window). ``skip_message_id`` (the
    request being answered) is left out of the entries and the count, not out of ``newest_id``;
    so are the bot's own messages with ``people_only``.
    """
    where: list[str] = ["chat = ?"]
    params: list[object] = [chat.key]
    if after_id is not None:
        where.append("id > ?")
        params.append(after_id)
    if start is not None:
        where.append("ts >= ?")
        params.append(iso(start))
    window = " AND ".join(where)
    kept, kept_params = window, list(params)
    if skip_message_id:
        kept += " AND NOT (from_bot = 0 AND message_id IS NOT NULL AND message_id = ?)"
        kept_params.append(skip_message_id)
    if people_only:
        kept += " AND from_bot = 0"

    def work(db: sqlite_utils.Database) -> Fetched:
        # One call on the single DB thread: no message can land between these reads.
        newest = db.execute(f"SELECT MAX(id) FROM history WHERE {window}", params).fetchone()[0]
        total = int(db.execute(f"SELECT COUNT(*) FROM history WHERE {kept}", kept_params).fetchone()[0])
        rows = db.execute_returning_dicts(
            f"SELECT * FROM history WHERE {kept} ORDER BY ts DESC, id DESC LIMIT ?", [*kept_params, limit]
        )
        return Fetched([_entry(r) for r in reversed(rows)], total, None if newest is None else int(newest))

    return await db.run(work)
