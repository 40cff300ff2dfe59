"""Chat history: every message the bot sees or sends, per chat, with retention."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from pydantic import ConfigDict

from function_calls import HistoryTurn
from robot.message import ChatRef, Message, chat_moved
from robot.storage import Tx
from robot.storage.base import columns, padded, render_step, unnest
from robot.store import Engine, iso, parse_iso

__all__ = ["FORGOTTEN", "TO_USER", "HistoryEntry", "HistoryStore", "Said", "drop_windows"]


class HistoryEntry(HistoryTurn):
    """One stored message (a :class:`HistoryTurn` with its chat and platform message id)."""

    model_config = ConfigDict(frozen=True)

    chat: str
    message_id: str = ""

    def turn(self) -> HistoryTurn:
        """The message as the model sees it: the entry itself (no copy per message and read)."""
        return self


def _entry(row: dict[str, object]) -> HistoryEntry:
    return HistoryEntry(
        chat=str(row["chat"]), user_id=str(row["user_id"]), name=str(row["name"]), text=str(row["text"]),
        at=parse_iso(str(row["ts"])), from_bot=bool(row["from_bot"]), message_id=str(row["message_id"] or ""),
    )


#: Step 2: every person a bot message addresses when it addresses several (a reminder message shared
#: by the people of a chat): ``to_user`` holds one only, and ``/forget me`` of any must take it.
ADDRESSEES = ("CREATE TABLE IF NOT EXISTS history_to (user_id TEXT NOT NULL, history_id BIGINT NOT NULL, "
              "PRIMARY KEY (user_id, history_id)); "
              "CREATE INDEX IF NOT EXISTS history_to_history ON history_to (history_id)")
#: Chats the platform gave a new id: what an owner set for the old one still holds (robot.message.chat_moved).
MOVES = "CREATE TABLE IF NOT EXISTS chat_moves (new_key TEXT PRIMARY KEY, old_key TEXT NOT NULL)"
#: The bot messages of a chat addressed to a person (``?`` = chat, the person twice).
TO_USER = ("chat = ? AND from_bot = 1 AND (to_user = ? OR id IN "
           "(SELECT history_id FROM history_to WHERE user_id = ?))")

_COLUMNS = "chat, user_id, name, text, ts, from_bot, message_id"
#: Notification channel: the chat keys whose data a /forget (or a recall) deleted; every process drops
#: its cached copies (``robot.privacy`` listens).
FORGOTTEN = "forgotten"


_windows: dict[str, dict[tuple[object, ...], HistoryEntry]] = {}
_windows_lock = threading.Lock()
_MAX_WINDOWS = 1024
_ADDRESSEES_PER_INSERT = 128  # rows per INSERT into history_to (256 parameters: far below either engine's limit)
_ROWS_PER_INSERT = 32  # rows per INSERT in insert_many_sync (352 parameters)


def _entries(chat: str, rows: list[tuple[object, ...]]) -> list[HistoryEntry]:
    """Entries of ``rows`` (newest first), oldest first.

    Each chat's last window read is kept, keyed by the rows' whole content: the next read (the
    next message) builds only the rows it has not seen. Building an entry was a third of the
    writer thread's time per message. A row changed or deleted since is simply not found; a
    chat's kept window is replaced by every read, so a deleted message leaves it at the next one.
    """
    known = _windows.get(chat, {})
    window: dict[tuple[object, ...], HistoryEntry] = {}
    out: list[HistoryEntry] = []
    for row in reversed(rows):
        entry = known.get(row)
        if entry is None:
            entry = _entry_of(row)
        window[row] = entry
        out.append(entry)
    with _windows_lock:  # PostgreSQL reads on several threads
        _windows.pop(chat, None)
        _windows[chat] = window
        if len(_windows) > _MAX_WINDOWS:
            del _windows[next(iter(_windows))]
    return out


def drop_windows(chats: Iterable[str] | None) -> None:
    """Forget the kept windows of ``chats`` (keys; None: every chat), so no copy of a deleted message
    stays in memory."""
    with _windows_lock:
        if chats is None:
            _windows.clear()
        for chat in chats or ():
            _windows.pop(chat, None)


class Said(NamedTuple):
    """A message for :meth:`HistoryStore.insert_many_sync` (the arguments of :meth:`HistoryStore.insert_sync`)."""

    chat: ChatRef
    user_id: str
    name: str
    text: str
    at: datetime
    from_bot: bool = False
    message_id: str = ""
    reply_to: str | None = None
    to_user: str | None = None
    role: str = ""
    to_users: Sequence[str] = ()


def _address(db: Tx, pairs: Sequence[tuple[str, object]]) -> None:
    """Record (person, history id) pairs in ``history_to``: one statement per chunk (:func:`padded`;
    PostgreSQL: one for all, :func:`unnest`), not one per person (a merged reminder names up to 50)."""
    if db.dialect == "postgresql":
        # The ids are new (a sequence's, never reused as SQLite's rowids may be) and the pairs
        # distinct: no conflict to check for (ON CONFLICT cost a third more per row).
        if pairs:
            db.execute("INSERT INTO history_to (user_id, history_id) SELECT * FROM " + unnest("text", "bigint"),
                       columns(list(dict.fromkeys(pairs))))
        return
    for start in range(0, len(pairs), _ADDRESSEES_PER_INSERT):
        part = padded(pairs[start:start + _ADDRESSEES_PER_INSERT], _ADDRESSEES_PER_INSERT)
        db.execute("INSERT INTO history_to (user_id, history_id) VALUES " + ",".join(["(?, ?)"] * len(part))
                   + " ON CONFLICT (user_id, history_id) DO NOTHING", [v for pair in part for v in pair])


def _entry_of(row: tuple[object, ...]) -> HistoryEntry:
    """An entry from a row of ``_COLUMNS`` (a tuple: no dict per row on the hot path)."""
    chat, user_id, name, text, ts, from_bot, message_id = row
    return HistoryEntry(chat=str(chat), user_id=str(user_id), name=str(name), text=str(text), at=parse_iso(str(ts)),
                        from_bot=bool(from_bot), message_id=str(message_id or ""))


class HistoryStore:
    """Reads and writes the ``history`` table, indexed by (chat, time)."""

    def __init__(self, db: Engine, *, max_messages: int = 5000, max_age: timedelta = timedelta(days=30),
                 max_text_chars: int = 10_000) -> None:
        self.db = db
        self.max_messages = max_messages
        self.max_age = max_age
        self.max_text_chars = max_text_chars
        db.migrate("history", [self._schema, ADDRESSEES, MOVES])

    @staticmethod
    def _schema(db: Tx) -> None:
        # Step 1 (idempotent: a v0.1 SQLite file has the table, maybe without the later columns).
        key = "id INTEGER PRIMARY KEY" if db.dialect == "sqlite" else render_step("id {id}", db.dialect)
        db.execute(
            f"CREATE TABLE IF NOT EXISTS history ({key}, chat TEXT NOT NULL, user_id TEXT NOT NULL, "
            "name TEXT NOT NULL, text TEXT NOT NULL, ts TEXT NOT NULL, from_bot INTEGER NOT NULL DEFAULT 0, "
            "message_id TEXT, reply_to TEXT, to_user TEXT, role TEXT NOT NULL DEFAULT '')"
        )
        db.execute("CREATE INDEX IF NOT EXISTS history_chat_ts ON history (chat, ts)")
        if db.dialect != "sqlite":
            return
        # A bot message names the message it answers and the person it addresses (its @), so
        # /forget me can take the bot's replies and reminders to that person too. ``role`` is the
        # sender's group role as the platform reported it: evidence of admin rights when no live
        # message carries it (a scheduled command).
        columns = {row[1] for row in db.execute("PRAGMA table_info(history)").fetchall()}
        for column in ("reply_to", "to_user"):
            if column not in columns:
                db.execute(f"ALTER TABLE history ADD COLUMN {column} TEXT")
        if "role" not in columns:
            db.execute("ALTER TABLE history ADD COLUMN role TEXT NOT NULL DEFAULT ''")

    @staticmethod
    def insert_sync(db: Tx, chat: ChatRef, user_id: str, name: str, text: str,
                    at: datetime, *, from_bot: bool = False, message_id: str = "", reply_to: str | None = None,
                    to_user: str | None = None, role: str = "", to_users: Sequence[str] = ()) -> None:
        """Insert inside a caller's transaction (the outbox records the bot's replies this way).

        ``to_users``: everyone a bot message addresses; when that is more than ``to_user``, each is
        recorded in ``history_to`` (same transaction) so that any one's ``/forget me`` takes it.
        """
        others = [u for u in dict.fromkeys(to_users) if u != to_user]
        sql = ("INSERT INTO history (chat, user_id, name, text, ts, from_bot, message_id, reply_to, to_user, role) "
               "VALUES (?,?,?,?,?,?,?,?,?,?)")
        params = [chat.key, user_id, name, text, iso(at), int(from_bot), message_id, reply_to, to_user, role]
        if not others:  # the common case (one person answered): no id needed, no extra row
            db.execute(sql, params)
            return
        row = db.execute(sql + " RETURNING id", params).fetchone()
        assert row is not None
        _address(db, [(u, row[0]) for u in others])

    @staticmethod
    def insert_many_sync(db: Tx, said: Sequence[Said]) -> None:
        """:meth:`insert_sync` for many messages, in their order, with a few statements for all of them
        (a firing pass records hundreds: on PostgreSQL each statement is a round trip)."""
        if len(said) < 2:
            for s in said:
                HistoryStore.insert_sync(db, s.chat, s.user_id, s.name, s.text, s.at, from_bot=s.from_bot,
                                         message_id=s.message_id, reply_to=s.reply_to, to_user=s.to_user, role=s.role,
                                         to_users=s.to_users)
            return
        # The ids are taken first, so that each person addressed is recorded against the right row
        # (the order of the rows an INSERT returns is not defined on either engine).
        if db.dialect == "postgresql":
            ids = [int(r[0]) for r in db.execute("SELECT nextval(pg_get_serial_sequence('history', 'id')) "
                                                  "FROM generate_series(1, ?::int)", [len(said)]).fetchall()]
        else:  # one writer, inside its transaction: SQLite's own choice of a new rowid
            first = int(db.execute("SELECT coalesce(max(id), 0) + 1 FROM history").fetchone()[0])
            ids = list(range(first, first + len(said)))
        rows = [[i, s.chat.key, s.user_id, s.name, s.text, iso(s.at), int(s.from_bot), s.message_id, s.reply_to,
                 s.to_user, s.role] for i, s in zip(ids, said, strict=True)]
        into = "INSERT INTO history (id, chat, user_id, name, text, ts, from_bot, message_id, reply_to, to_user, role) "
        if db.dialect == "postgresql":  # one statement, a column an array
            db.execute(into + "SELECT * FROM " + unnest("bigint", *["text"] * 5, "int", *["text"] * 4), columns(rows))
        else:
            done = 0
            while done < len(rows):  # chunks of power-of-two sizes: a few statement shapes serve every count
                size = min(_ROWS_PER_INSERT, 1 << ((len(rows) - done).bit_length() - 1))
                db.execute(into + "VALUES " + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * size),
                           [v for row in rows[done:done + size] for v in row])
                done += size
        _address(db, [(u, i) for s, i in zip(said, ids, strict=True) for u in dict.fromkeys(s.to_users)
                      if u != s.to_user])

    @staticmethod
    def prune_addressees_sync(db: Tx) -> int:
        """Drop the ``history_to`` rows of messages no longer stored (they name people); returns how many.

        Run after deleting history rows: SQLite may reuse a deleted row's id.
        """
        return db.execute("DELETE FROM history_to WHERE NOT EXISTS "
                          "(SELECT 1 FROM history WHERE history.id = history_to.history_id)").rowcount

    @staticmethod
    def unsay_sync(db: Tx, chat: str, key: str, kept: str = "") -> None:
        """The bot's message queued as outbox ``key`` in ``chat`` (a key) was never delivered: its row
        holds only ``kept`` (the parts that went out), or goes when nothing did (the outbox's failed mark)."""
        where = "chat = ? AND from_bot = 1 AND message_id = ?"
        if kept:
            db.execute(f"UPDATE history SET text = ? WHERE {where}", [kept, chat, key])
            return
        db.execute(f"DELETE FROM history_to WHERE history_id IN (SELECT id FROM history WHERE {where})", [chat, key])
        db.execute(f"DELETE FROM history WHERE {where}", [chat, key])

    def cut(self, text: str) -> str:
        """``text`` as stored: at most ``max_text_chars``, a longer one cut with a note saying so."""
        if len(text) <= self.max_text_chars:
            return text
        return text[: self.max_text_chars] + f"…〔已截断：原文 {len(text)} 字，只保存了前 {self.max_text_chars} 字〕"

    async def record(self, message: Message) -> None:
        await self.db.run(lambda db: self.record_sync(db, message))

    def record_sync(self, db: Tx, message: Message) -> None:
        """:meth:`record` inside a caller's transaction (the pipeline stores a message with its dedupe row)."""
        self.insert_sync(
            db, message.chat, message.sender.user_id, message.sender.name or message.sender.user_id,
            self.cut(message.text), message.timestamp, from_bot=message.from_bot, message_id=message.message_id,
            role=message.sender.role if message.chat.kind == "group" else "",
        )

    async def last_role(self, chat: ChatRef, user_id: str) -> str:
        """The group role (owner/admin/member) the platform reported with the person's newest
        stored message in ``chat``; "" when none is stored."""
        row = await self.db.run(lambda db: db.execute(
            "SELECT role FROM history WHERE chat = ? AND user_id = ? AND from_bot = 0 ORDER BY ts DESC, id DESC "
            "LIMIT 1", [chat.key, user_id]).fetchone())
        return str(row[0] or "") if row else ""

    async def recent(self, chat: ChatRef, limit: int = 50, *, before: datetime | None = None,
                     before_message: str = "") -> list[HistoryEntry]:
        """The newest ``limit`` messages (before ``before``), oldest first.

        With ``before_message`` (the id of a stored incoming message at ``before``), messages of the
        same second recorded before it count too: platforms stamp whole seconds, and what was said
        a moment before someone @-s the bot is the context they mean.
        """
        return await self.db.run(lambda db: self.recent_sync(db, chat, limit, before=before,
                                                             before_message=before_message))

    @staticmethod
    def recent_sync(db: Tx, chat: ChatRef, limit: int = 50, *, before: datetime | None = None,
                    before_message: str = "") -> list[HistoryEntry]:
        """:meth:`recent` inside a caller's unit of work (the pipeline reads it with the message's record)."""
        cutoff = iso(before) if before else "9999"

        # Both queries walk the (chat, ts) index down from the cutoff: a read costs the rows it
        # returns, not the chat's length (this runs for every message the model answers).
        if before_message and before:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM history WHERE chat = ? AND ts <= ? AND (ts < ? OR id < COALESCE("
                "(SELECT MIN(id) FROM history WHERE chat = ? AND ts = ? AND message_id = ? AND from_bot = 0), "
                "-1)) ORDER BY ts DESC, id DESC LIMIT ?",
                [chat.key, cutoff, cutoff, chat.key, cutoff, before_message, limit],
            ).fetchall()
        else:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM history WHERE chat = ? AND ts < ? ORDER BY ts DESC, id DESC LIMIT ?",
                [chat.key, cutoff, limit],
            ).fetchall()
        return _entries(chat.key, rows)


    async def since(self, chat: ChatRef, start: datetime, *, end: datetime | None = None,
                    limit: int = 100_000) -> list[HistoryEntry]:
        """Messages with start <= time < end, oldest first."""
        stop = iso(end) if end else "9999"

        def work(db: Tx) -> list[HistoryEntry]:
            rows = db.execute_returning_dicts(
                "SELECT * FROM history WHERE chat = ? AND ts >= ? AND ts < ? ORDER BY ts, id LIMIT ?",
                [chat.key, iso(start), stop, limit],
            )
            return [_entry(r) for r in rows]

        return await self.db.run(work)

    async def move_chat(self, old: ChatRef, new: ChatRef) -> int:
        """The platform renamed a chat: its messages now belong to ``new`` (the move is kept: see
        :meth:`restore_moves`); returns how many."""
        def work(db: Tx) -> int:
            db.execute("INSERT INTO chat_moves (new_key, old_key) VALUES (?, ?) ON CONFLICT (new_key) DO UPDATE "
                       "SET old_key = excluded.old_key", [new.key, old.key])
            return int(db.execute("UPDATE history SET chat = ? WHERE chat = ?", [new.key, old.key]).rowcount)

        moved = await self.db.transaction(work)
        chat_moved(old.key, new.key)
        return moved

    async def restore_moves(self) -> None:
        """:func:`robot.message.chat_moved` for every chat the platform gave a new id (at start)."""
        for new_key, old_key in await self.db.run(lambda db: db.execute(
                "SELECT new_key, old_key FROM chat_moves").fetchall()):
            chat_moved(str(old_key), str(new_key))

    async def forget_user(self, chat: ChatRef, user_id: str) -> int:
        """Delete one person's stored messages in one chat; returns how many."""
        drop_windows([chat.key])
        return await self.db.run(lambda db: db.execute(
            "DELETE FROM history WHERE chat = ? AND user_id = ? AND from_bot = 0", [chat.key, user_id]
        ).rowcount)

    async def forget_message(self, chat: ChatRef, message_id: str, sender: str | None = None, *,
                             receipts: bool = False) -> int:
        """Delete one stored message, recalled on its platform, by its id in ``chat`` as received: a member's
        only if ``sender`` wrote it (when known). ``receipts`` (the bot's, beside the outbox's tables): also the
        bot's own (``sender`` its account: an admin recalled it), by its send's receipt. Returns how many rows
        went. Every process drops its copies."""
        if not message_id:
            return 0
        where, params = "chat = ? AND message_id = ? AND from_bot = 0", [chat.key, message_id]
        if sender is not None:
            where, params = where + " AND user_id = ?", [*params, sender]
        own = receipts and (sender is None or (bool(chat.account) and sender == chat.account))

        def work(db: Tx) -> int:
            removed = int(db.execute(f"DELETE FROM history WHERE {where}", params).rowcount)
            if own:  # (the bot's rows carry their outbox key; a part's receipt takes the whole message)
                removed += int(db.execute(
                    "DELETE FROM history WHERE chat = ? AND from_bot = 1 AND message_id IN (SELECT key FROM outbox "
                    "WHERE chat = ? AND receipt = ? UNION SELECT key FROM outbox_parts WHERE chat = ? AND receipt = ?)",
                    [chat.key, *[chat.key, message_id] * 2]).rowcount)
            if removed:
                db.notify(FORGOTTEN, json.dumps([chat.key]))
            return removed

        removed = await self.db.run(work)
        drop_windows([chat.key])
        return removed

    async def apply_retention(self, now: datetime) -> int:
        """Drop messages older than ``max_age`` and beyond ``max_messages`` per chat."""
        cutoff = iso(now - self.max_age)

        def work(db: Tx) -> int:
            removed = db.execute("DELETE FROM history WHERE ts < ?", [cutoff]).rowcount
            removed += db.execute(
                "DELETE FROM history WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY chat ORDER BY ts DESC, id DESC) AS n FROM history) AS ranked WHERE n > ?)",
                [self.max_messages],
            ).rowcount
            if removed:
                self.prune_addressees_sync(db)
            return removed

        return await self.db.run(work)
