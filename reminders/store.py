"""The ``reminders`` table: the source of truth (APScheduler only wakes the bot up).

Every function ending in ``_sync`` takes the ``Tx`` and runs inside the
caller's ``bot.db.run``/``bot.db.transaction`` on the database thread; the async methods of
:class:`ReminderStore` wrap them. Instants are stored as sortable UTC text (``robot.store.iso``).

Errors::

    ReminderError      a request the store refuses; the message is written for the model and user
     └── LimitError    a per-user, per-chat or rate limit was reached
"""

from __future__ import annotations

import functools
import operator
import os
import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, get_args

from reminders.record import COLUMNS, Mode, Reminder, Status, new_id, parse_instant
from reminders.schema import SCHEMA, schema_v1
from reminders.settings import ReminderSettings
from reminders.timer import note_gone
from robot import Engine, Tx, columns, in_chunks, iso, unnest

__all__ = [
    "MIN_SHORT_ID",
    "SCHEMA",
    "LimitError",
    "Mode",
    "Reminder",
    "ReminderError",
    "ReminderStore",
    "Status",
    "new_id",
    "parse_instant",
]

_MODES = f"({', '.join(repr(m) for m in get_args(Mode))})"  # "mode IN" this: the firing index's second column
MIN_SHORT_ID = 4
_HEX = re.compile(r"[0-9a-f]{1,32}")
_INSERT = f"INSERT INTO reminders ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM reminders "


class ReminderError(Exception):
    """A request the reminders store refuses: ``str(exc)`` tells the model why (English),
    ``user_message`` tells the person (Chinese)."""

    def __init__(self, message: str, *, user_message: str | None = None) -> None:
        super().__init__(message)
        self.user_message = user_message


class LimitError(ReminderError):
    """Too many reminders (per person or chat) or created too quickly."""


def _id_text(typed: str) -> str:
    """A reminder id as a person typed it, as stored: NFKC folds an IME's full-width ``＃`` and
    ``７ｂ`` to ASCII; no leading ``#``, lower case."""
    return unicodedata.normalize("NFKC", typed).strip().lstrip("#").lower()


def _rows(db: Tx, where: str, params: list[Any]) -> list[Reminder]:
    """The reminders ``WHERE ...`` (and any ORDER BY, LIMIT, FOR UPDATE) selects: their columns named
    (a v0.1 file's table has its later columns elsewhere), read as tuples (a burst reads thousands)."""
    return [Reminder.from_values(t) for t in db.execute(_SELECT + where, params).fetchall()]


class ReminderStore:
    """Reads and writes the ``reminders`` table through the bot's :class:`robot.store.Database`."""

    def __init__(self, db: Engine, *, durable: bool = True) -> None:
        self.db = db
        #: Creations and deletions (what a user is told about) are synced to disk before the answer.
        self.durable = durable

    schema = staticmethod(schema_v1)

    @staticmethod
    def migrations() -> list[Callable[[Tx], None] | str]:
        """The ``reminders`` component's steps: ``db.migrate("reminders", ReminderStore.migrations())``."""
        return list(SCHEMA)

    # --- synchronous helpers (database thread) -----------------------------------------------
    @staticmethod
    def insert_sync(db: Tx, reminders: list[Reminder]) -> None:
        """Insert without limit checks (imports, benchmarks)."""
        db.executemany(_INSERT, [r.row() for r in reminders])

    @staticmethod
    def create_sync(db: Tx, reminder: Reminder, limits: ReminderSettings,
                    now: datetime) -> Reminder:
        """Check the limits and insert, in the caller's transaction (so two requests cannot race).

        Returns the stored reminder: the one made earlier by the same request (same ``source``), or
        for a command, the chat's active one running the same command on the same schedule (typed
        twice, or by two of a group's admins: its reply would be posted twice), if any, else ``reminder``.
        """
        if db.dialect == "postgresql":
            # Other processes create too: the counts below hold only while nobody else adds for this
            # person or chat, so take their locks (sorted: two creates never wait on each other in a cycle).
            for key in sorted({f"reminders:{reminder.owner}", f"reminders:{reminder.chat}"}):
                db.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", [key])
        if reminder.source:
            earlier = _rows(db, "WHERE source = ?", [reminder.source])
            if earlier:
                return earlier[0]
        if reminder.mode == "command":
            # Under the chat's lock above (PostgreSQL) or the one writer (SQLite): two creates cannot both miss it.
            when = operator.attrgetter("account", "type", "wall", "zone", "weekday")
            for twin in _rows(db, "WHERE chat = ? AND status = 'active' AND mode = 'command' AND content = ?",
                              [reminder.chat, reminder.content]):
                if when(twin) == when(reminder):
                    return twin

        def count(sql: str, params: list[Any]) -> int:
            return int(db.execute(sql, params).fetchone()[0])

        mine = count("SELECT count(*) FROM reminders WHERE owner = ? AND status = 'active'", [reminder.owner])
        if mine >= limits.max_per_user:
            # The limit counts every chat, a group's listing only its own: say where they are
            mine_here = count("SELECT count(*) FROM reminders WHERE owner = ? AND chat = ? AND status = 'active'",
                              [reminder.owner, reminder.chat])
            raise LimitError(f"you already have {mine} active reminders (limit {limits.max_per_user}), "
                             f"{mine_here} in this chat and {mine - mine_here} in other chats; delete some with "
                             "reminder_delete first (in a private chat with the bot reminder_list shows them all)",
                             user_message=f"你已经有 {mine} 个提醒了（上限 {limits.max_per_user} 个）：本聊天 "
                             f"{mine_here} 个，其他聊天 {mine - mine_here} 个。请先删除一些：私聊机器人发送 "
                             "/reminders 可查看全部，/unremind 编号 删除。")
        here = count("SELECT count(*) FROM reminders WHERE chat = ? AND status = 'active'", [reminder.chat])
        if here >= limits.max_per_chat:
            raise LimitError(f"this chat already has {here} active reminders (limit {limits.max_per_chat})",
                             user_message=f"这个聊天已经有 {here} 个提醒了（上限 {limits.max_per_chat} 个）。")
        recent = count("SELECT count(*) FROM reminders WHERE owner = ? AND created_at > ?",
                       [reminder.owner, iso(now - timedelta(minutes=10))])
        if recent >= limits.create_per_10min:
            raise LimitError(f"you created {recent} reminders in the last 10 minutes (limit "
                             f"{limits.create_per_10min}); try again later",
                             user_message=f"你在 10 分钟内已经设置了 {recent} 个提醒（上限 "
                             f"{limits.create_per_10min} 个），请稍后再试。")
        if reminder.source:
            # The same request in another process, committed since the look-up above: keep theirs.
            added = db.execute(_INSERT + " ON CONFLICT (source) WHERE source != '' DO NOTHING", list(reminder.row()))
            if added.rowcount != 1:
                return _rows(db, "WHERE source = ?", [reminder.source])[0]
        else:
            db.execute(_INSERT, list(reminder.row()))
        return reminder

    @staticmethod
    def get_sync(db: Tx, reminder_id: str, *, lock: bool = False) -> Reminder | None:
        """One reminder; ``lock``: hold its row until the transaction ends (PostgreSQL; SQLite has one writer)."""
        sql = "WHERE id = ?"
        if lock and db.dialect == "postgresql":
            sql += " FOR UPDATE"
        found = _rows(db, sql, [reminder_id])
        return found[0] if found else None

    @staticmethod
    def due_sync(db: Tx, now: datetime, mode: Mode, limit: int, *, claim: bool = False) -> list[Reminder]:
        """Active reminders of ``mode`` due at ``now``, oldest first.

        ``claim``: on PostgreSQL, lock the rows until the transaction ends and skip those another
        process has locked (it is firing them): each due occurrence goes to exactly one process.
        SQLite has one writer, so its transaction already holds them all.
        """
        sql = ("WHERE status = 'active' AND mode = ? AND next_fire <= ? "
               "ORDER BY next_fire, chat, id LIMIT ?")
        if claim and db.dialect == "postgresql":
            sql += " FOR UPDATE SKIP LOCKED"
        return _rows(db, sql, [mode, iso(now), limit])

    @staticmethod
    def due_at_sync(db: Tx, at: datetime, limit: int) -> list[Reminder]:
        """Active text reminders due exactly at ``at``, a chat's together (what :mod:`reminders.ahead` composes)."""
        return _rows(db, "WHERE status = 'active' AND mode = 'text' AND next_fire = ? ORDER BY chat, id LIMIT ?",
                     [iso(at), limit])

    @staticmethod
    def claim_sync(db: Tx, ids: list[str], at: datetime) -> list[tuple[str, str]]:
        """``(id, chat)`` of those of ``ids`` still active text reminders due exactly at ``at``; on
        PostgreSQL they stay locked until the transaction ends, and rows another process holds are skipped."""
        where = "AND status = 'active' AND mode = 'text' AND next_fire = ?"
        if db.dialect == "postgresql":
            return [(str(i), str(c)) for i, c in db.execute(
                f"SELECT id, chat FROM reminders WHERE id = ANY(?::text[]) {where} FOR UPDATE SKIP LOCKED",
                [ids, iso(at)]).fetchall()]
        return [(str(i), str(c)) for part, marks in in_chunks(ids) for i, c in db.execute(
            f"SELECT id, chat FROM reminders WHERE id IN ({marks}) {where}", [*part, iso(at)]).fetchall()]

    @staticmethod
    def rows_sync(db: Tx, ids: list[str]) -> list[Reminder]:
        """The reminders with these ids, a chat's together."""
        found = [r for part, marks in in_chunks(ids) for r in _rows(db, f"WHERE id IN ({marks})", part)]
        return sorted(found, key=lambda r: (r.chat, r.id))

    @staticmethod
    def save_sync(db: Tx, *reminders: Reminder, updated_at: datetime | None = None) -> None:
        """Write fired reminders' state back: rows this transaction read as active (and, on PostgreSQL,
        locked). A row no longer active is left as it is: a deleted reminder never comes back.
        ``updated_at``: the time every row is written as last changed (default: each reminder's own)."""
        text = functools.lru_cache(maxsize=None)(lambda at: None if at is None else iso(at))  # shared instants
        rows = {r.id: [text(r.next_fire), text(r.last_fired), r.status, int(r.failure_reported),
                       text(updated_at or r.updated_at), r.id] for r in reminders}  # by id: a reminder given twice
        if db.dialect == "postgresql" and len(rows) > 1:
            # One statement: a firing batch's thousand UPDATEs, even pipelined, took a quarter of its time.
            db.execute(
                "UPDATE reminders AS r SET next_fire = v.next_fire, last_fired = v.last_fired, status = v.status, "
                "failure_reported = v.failure_reported, updated_at = v.updated_at, run_until = NULL "
                f"FROM {unnest('text', 'text', 'text', 'int', 'text', 'text')} "
                "AS v(next_fire, last_fired, status, failure_reported, updated_at, id) "
                "WHERE r.id = v.id AND r.status = 'active'", columns(list(rows.values())))
            return
        # One that stays active (its next occurrence) keeps its status: not setting it spares SQLite
        # an index rewrite (10,000 fired: a fifth of the save).
        db.executemany("UPDATE reminders SET next_fire = ?, last_fired = ?, failure_reported = ?, updated_at = ?, "
                       "run_until = NULL WHERE id = ? AND status = 'active'",
                       [(*r[:2], *r[3:]) for r in rows.values() if r[2] == "active"])
        db.executemany("UPDATE reminders SET next_fire = ?, last_fired = ?, status = ?, failure_reported = ?, "
                       "updated_at = ?, run_until = NULL WHERE id = ? AND status = 'active'",
                       [r for r in rows.values() if r[2] != "active"])

    async def claim_run(self, reminder_id: str, planned: datetime, holder: str, now: datetime,
                        lease: timedelta) -> bool:
        """Take the right to run a due prompt's model (its occurrence ``planned``) until ``now + lease``:
        False when it is no longer due so, or another holder's claim has not expired."""
        return bool(await self.db.transaction(lambda db: db.execute(
            "UPDATE reminders SET run_by = ?, run_until = ? WHERE id = ? AND status = 'active' AND next_fire = ? "
            "AND (run_until IS NULL OR run_until < ? OR run_by = ?)",
            [holder, iso(now + lease), reminder_id, iso(planned), iso(now), holder]).rowcount))

    async def release_runs(self, holder: str) -> int:
        """Give up ``holder``'s claims on prompts it was running (a clean stop): another process, or the
        next start, runs them at once instead of after the claim's lease (15 minutes)."""
        return int(await self.db.run(lambda db: db.execute(
            "UPDATE reminders SET run_until = NULL WHERE run_by = ?", [holder]).rowcount))

    @staticmethod
    def short_ids_sync(db: Tx, ids: list[str]) -> dict[str, str]:
        """The shortest prefix of each id that no other stored id shares (at least 4 characters)."""
        out: dict[str, str] = {}
        for rid in ids:
            length = MIN_SHORT_ID
            for sql in ("SELECT max(id) FROM reminders WHERE id < ?", "SELECT min(id) FROM reminders WHERE id > ?"):
                other = db.execute(sql, [rid]).fetchone()[0]
                if other is not None:
                    length = max(length, len(os.path.commonprefix([rid, other])) + 1)  # noqa: RUF071 (ids)
            out[rid] = rid[:length]
        return out

    # --- async API -------------------------------------------------------------------------
    async def create(self, reminder: Reminder, limits: ReminderSettings, now: datetime) -> Reminder:
        return await self.db.transaction(lambda db: self.create_sync(db, reminder, limits, now),
                                         durable=self.durable)

    async def get(self, reminder_id: str) -> Reminder | None:
        return await self.db.run(lambda db: self.get_sync(db, reminder_id))

    async def for_owner(self, owner: str) -> list[Reminder]:
        """The person's active reminders in every chat, soonest first."""
        return await self.db.run(lambda db: _rows(
            db, "WHERE owner = ? AND status = 'active' ORDER BY next_fire, id", [owner]))

    async def for_chat(self, chat: str) -> list[Reminder]:
        """A chat's active reminders, soonest first."""
        return await self.db.run(lambda db: _rows(
            db, "WHERE chat = ? AND status = 'active' ORDER BY next_fire, id", [chat]))

    async def short_ids(self, ids: list[str]) -> dict[str, str]:
        return await self.db.run(lambda db: self.short_ids_sync(db, ids))

    async def match(self, prefix: str, *, owner: str | None, chat: str | None = None) -> list[Reminder]:
        """Active reminders whose id starts with ``prefix``: ``owner``'s, or anyone's when ``owner`` is None;
        with ``chat``, that chat's only (chosen before the first 20 are: another chat's could crowd them out).

        ``prefix`` may carry a leading ``#`` and any case, typed full-width too (``＃７ｂ``, as a Chinese
        IME gives it); anything but hex matches nothing.
        """
        text = _id_text(prefix)
        if not _HEX.fullmatch(text):
            return []
        # Every id with this prefix sorts in [prefix, prefix + "g"): the primary key index serves it.
        sql = "WHERE id >= ? AND id < ? AND status = 'active'"
        params: list[Any] = [text, text + "g"]
        for column, value in (("owner", owner), ("chat", chat)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        return await self.db.run(lambda db: _rows(db, sql + " ORDER BY next_fire, id LIMIT 20", params))

    async def delete(self, reminder_id: str, now: datetime) -> bool:
        """Mark an active reminder deleted; False when it was not active (already fired or gone)."""
        def work(db: Tx) -> bool:
            done = db.execute("UPDATE reminders SET status = 'deleted', next_fire = NULL, updated_at = ? "
                              "WHERE id = ? AND status = 'active'", [iso(now), reminder_id]).rowcount == 1
            if done:
                note_gone(db, [reminder_id])
            return done

        return await self.db.transaction(work, durable=self.durable)

    async def move_chat(self, old: str, new: str) -> int:
        """A chat got a new id: its reminders now live there."""
        return await self.db.run(lambda db: db.execute(
            "UPDATE reminders SET chat = ? WHERE chat = ?", [new, old]).rowcount)

    async def delete_chat(self, chat: str, now: datetime, *, owner: str | None = None) -> list[str]:
        """Delete every active reminder of a chat (only ``owner``'s, if given); returns their ids."""
        where, params = "chat = ? AND status = 'active'", [chat]
        if owner is not None:
            where += " AND owner = ?"
            params.append(owner)

        def work(db: Tx) -> list[str]:
            ids = [r[0] for r in db.execute(f"SELECT id FROM reminders WHERE {where}", params).fetchall()]
            db.execute(f"UPDATE reminders SET status = 'deleted', next_fire = NULL, updated_at = ? WHERE {where}",
                       [iso(now), *params])
            note_gone(db, ids)
            return ids

        return await self.db.transaction(work, durable=self.durable)

    async def erase_owner(self, owner: str, chats: list[str] | None, platform: str) -> list[str]:
        """Delete a person's reminders (rows and text, whatever their status) in ``chats``, or in every
        chat of ``platform`` when ``chats`` is None; returns the ids that were still active."""
        where = "owner = ?"
        params: list[object] = [owner]
        if chats is not None and not chats:
            return []  # no chat named: nothing to erase (and ``IN ()`` is not SQL PostgreSQL accepts)
        if chats is None:
            where += " AND substr(chat, 1, ?) = ?"
            params.extend([len(platform) + 1, f"{platform}:"])
        else:
            where += f" AND chat IN ({','.join('?' * len(chats))})"
            params.extend(chats)

        def work(db: Tx) -> list[str]:
            active = [r[0] for r in db.execute(f"SELECT id FROM reminders WHERE {where} AND status = 'active'",
                                               params).fetchall()]
            db.execute(f"DELETE FROM reminders WHERE {where}", params)
            note_gone(db, active)
            return active

        return await self.db.transaction(work, durable=self.durable)

    async def upcoming(self, after: datetime, until: datetime, limit: int) -> list[tuple[str, datetime, str]]:
        """``(id, next fire, zone)`` of active reminders due in ``(after, until]``, soonest first."""
        def work(db: Tx) -> list[tuple[str, datetime, str]]:
            rows = db.execute("SELECT id, next_fire, zone FROM reminders WHERE status = 'active' AND mode IN "
                              f"{_MODES} AND next_fire > ? AND next_fire <= ? ORDER BY next_fire LIMIT ?",
                              [iso(after), iso(until), limit])
            return [(rid, datetime.fromisoformat(at), zone) for rid, at, zone in rows.fetchall()]

        return await self.db.run(work)

    async def next_due(self) -> datetime | None:
        """The earliest next fire of any active reminder."""
        text = await self.db.run(lambda db: min(
            (at for mode in get_args(Mode) if (at := db.execute(  # each a seek in the firing index
                "SELECT min(next_fire) FROM reminders WHERE status = 'active' AND mode = ?", [mode]).fetchone()[0])),
            default=None))
        return parse_instant(text)

    async def prune(self, before: datetime) -> int:
        """Forget finished (done, missed, deleted, broken) reminders last changed before ``before``."""
        return await self.db.run(lambda db: db.execute(
            "DELETE FROM reminders WHERE status != 'active' AND updated_at < ?", [iso(before)]).rowcount)
