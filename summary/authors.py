"""Who spoke in the windows a chat's summaries read (``summary_authors``), for ``/forget me all``.

A summary is a bot message in the history, so it outlives the messages it quotes: once a person's
own messages in a group have aged out (``[history]``), that group holds no trace of them, and
``/forget me all`` would leave its summaries. So each summary records, for the chat it read, the
members whose messages it read; ``/forget me all`` then deletes the summaries (and admins' private
copies) of every chat that names them. One row per chat and member, dated by the newest summary:
every summary of a chat goes on a forget anyway (see :func:`summary.window.forget_summaries_sync`).
Rows older than the history's retention go when the next summary is recorded (their summaries
have aged out too), and a person's own rows go with their ``/forget me``.

Summaries stored before this table existed have no rows: ``/forget me all`` also deletes every
summary on the platform that names the person by the ``名字(<id>)`` label summaries quote people with
(:func:`quoting_label_sync`). A model's summary that quoted them without it is not found so.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from robot import ChatRef, Engine, Tx, iso
from summary.extractive import HEADER, PRIVATE_HEADER, clean_name

__all__ = ["AUTHORS_TABLE", "create_authors_table", "forget_authors_sync", "move_authors_sync",
           "quoted_chats_sync", "quoting_label_sync", "record_authors"]

AUTHORS_TABLE = "summary_authors"


def create_authors_table(db: Tx) -> None:
    """Schema step 2 of ``summary`` (idempotent): who spoke in each chat's summarised windows."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {AUTHORS_TABLE} (chat TEXT NOT NULL, user_id TEXT NOT NULL, "
               "last_at TEXT NOT NULL, PRIMARY KEY (chat, user_id))")
    db.execute(f"CREATE INDEX IF NOT EXISTS {AUTHORS_TABLE}_user ON {AUTHORS_TABLE} (user_id)")


async def record_authors(db: Engine, chat: ChatRef, user_ids: Iterable[str], now: datetime, keep: timedelta) -> None:
    """Record that a summary of ``chat`` read these members' messages (before it is shown: fail closed)."""
    rows = [[chat.key, user_id, iso(now)] for user_id in sorted(set(user_ids))]

    def work(tx: Tx) -> None:
        tx.execute(f"DELETE FROM {AUTHORS_TABLE} WHERE last_at < ?", [iso(now - keep)])
        if rows:
            tx.executemany(f"INSERT INTO {AUTHORS_TABLE} (chat, user_id, last_at) VALUES (?, ?, ?) ON CONFLICT "
                           "(chat, user_id) DO UPDATE SET last_at = excluded.last_at", rows)

    await db.transaction(work)


def quoted_chats_sync(db: Tx, platform: str, user_id: str) -> list[ChatRef]:
    """The chats on ``platform`` whose summaries read ``user_id``'s messages."""
    rows = db.execute(f"SELECT chat FROM {AUTHORS_TABLE} WHERE user_id = ? AND substr(chat, 1, ?) = ?",
                      [user_id, len(platform) + 1, f"{platform}:"]).fetchall()
    return [ChatRef.from_key(str(r[0])) for r in rows]


def quoting_label_sync(db: Tx, platform: str, user_id: str) -> int:
    """Delete the summaries on ``platform`` (sent or pending) that name ``user_id`` by its label; how many."""
    escaped = clean_name(user_id, 64).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    where = ("substr(chat, 1, ?) = ? AND (substr(text, 1, ?) = ? OR substr(text, 1, ?) = ?) "
             "AND text LIKE ? ESCAPE '\\'")
    params = [len(platform) + 1, f"{platform}:", len(HEADER), HEADER, len(PRIVATE_HEADER), PRIVATE_HEADER,
              f"%({escaped})%"]
    db.execute(f"DELETE FROM outbox WHERE status = 'pending' AND {where}", params)
    return int(db.execute(f"DELETE FROM history WHERE from_bot = 1 AND {where}", params).rowcount)


def forget_authors_sync(db: Tx, user_id: str, chats: Iterable[ChatRef]) -> None:
    """A person's rows in ``chats`` go with their ``/forget me`` (that they spoke there is theirs too)."""
    for chat in chats:
        db.execute(f"DELETE FROM {AUTHORS_TABLE} WHERE chat = ? AND user_id = ?", [chat.key, user_id])


def move_authors_sync(db: Tx, old: str, new: str) -> None:
    """A chat's new id: its rows follow it (its summaries in the history do)."""
    db.execute(f"INSERT INTO {AUTHORS_TABLE} (chat, user_id, last_at) SELECT ?, user_id, last_at FROM "
               f"{AUTHORS_TABLE} WHERE chat = ? ON CONFLICT (chat, user_id) DO UPDATE SET last_at = CASE WHEN "
               f"excluded.last_at > {AUTHORS_TABLE}.last_at THEN excluded.last_at ELSE {AUTHORS_TABLE}.last_at END",
               [new, old])
    db.execute(f"DELETE FROM {AUTHORS_TABLE} WHERE chat = ?", [old])
