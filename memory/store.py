"""The ``memories`` table, its FTS5 index and the dreams; synchronous functions for the DB thread.

One row per memory: ``chat`` (the chat key it was made in), ``kind`` (``user``: about one person
in that chat; ``group``: about the group; ``private``: the person's own, made in their private
chat), ``user_id`` (who saved it), the text, ``created``, ``time`` (last successful recall),
``level``, ``long_term``, ``decayed_at`` and an optional float32 ``vector``.

Visibility is one rule, applied in SQL: a memory is seen only in its own chat, and there only by
the person who saved it, unless it is a group memory (see :func:`visible`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from memory import lexicon
from memory.strength import Strength
from memory.terms import fts_query, index_terms, trigram_query
from robot import Tx, iso, parse_iso

__all__ = ["MIGRATIONS", "Kind", "MemoryRow", "MemoryStore", "visible"]

Kind = Literal["user", "group", "private"]
_COLUMNS = "id, chat, kind, user_id, user_name, text, created, time, level, long_term, decayed_at"


def visible(alias: str = "m") -> str:
    """The SQL condition for "this caller may see it here" (parameters: chat key, user id)."""
    return f"{alias}.chat = ? AND ({alias}.kind = 'group' OR {alias}.user_id = ?)"


_SQLITE_V1 = """
    CREATE TABLE IF NOT EXISTS memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        chat TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('user', 'group', 'private')),
        user_id TEXT NOT NULL,
        user_name TEXT NOT NULL DEFAULT '',
        text TEXT NOT NULL,
        created TEXT NOT NULL,
        time TEXT NOT NULL,
        level INTEGER NOT NULL DEFAULT 0,
        long_term INTEGER NOT NULL DEFAULT 0,
        decayed_at TEXT,
        vector BLOB
    );
    CREATE INDEX IF NOT EXISTS memories_scope ON memories (chat, user_id);
    CREATE VIRTUAL TABLE IF NOT EXISTS memory_terms USING fts5(terms, tokenize = 'unicode61');
    CREATE VIRTUAL TABLE IF NOT EXISTS memory_trigrams USING fts5(text, tokenize = 'trigram');
    CREATE TABLE IF NOT EXISTS memory_dreams (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        chat TEXT NOT NULL,
        created TEXT NOT NULL,
        fragments INTEGER NOT NULL,
        text TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS memory_sleeps (chat TEXT PRIMARY KEY, local_date TEXT NOT NULL)
"""


def _v1(db: Tx) -> None:
    """Memories, their lexical index, dreams and sleeps. Idempotent: v0.1 SQLite files already have
    the tables (without a version row), and keep them as they are."""
    for statement in (_SQLITE_V1 if db.dialect == "sqlite" else lexicon.POSTGRES_V1).split(";"):
        if statement.strip():
            db.execute(statement)


MIGRATIONS: list[Callable[[Tx], None]] = [_v1]
"""The ``memory`` component's schema steps (``engine.ensure("memory", MIGRATIONS)``): append, never edit."""


@dataclass(frozen=True)
class MemoryRow:
    """One memory as read from the table."""

    id: int
    chat: str
    kind: Kind
    user_id: str
    user_name: str
    text: str
    created: datetime
    strength: Strength

    @classmethod
    def of(cls, row: Sequence[Any]) -> MemoryRow:
        return cls(id=int(row[0]), chat=row[1], kind=row[2], user_id=row[3], user_name=row[4], text=row[5],
                   created=parse_iso(row[6]),
                   strength=Strength(level=int(row[8]), time=parse_iso(row[7]), long_term=bool(row[9]),
                                     decayed_at=parse_iso(row[10]) if row[10] else None))


class MemoryStore:
    """SQL for memories. ``lexical``: precomputed bigram terms or trigrams (see :mod:`memory.terms`)."""

    def __init__(self, lexical: Literal["bigram", "trigram"] = "bigram") -> None:
        self.lexical = lexical

    def migrate(self, db: Tx) -> None:
        """Apply every migration step and sync the lexical index (tests on a bare :class:`Tx`)."""
        for step in MIGRATIONS:
            step(db)
        self.sync_index(db)

    def sync_index(self, db: Tx) -> None:
        """After a switch of ``lexical`` (or on a v0.1 file), rebuild the index it uses: run at each start."""
        if db.dialect == "postgresql":
            lexicon.sync(db, self.lexical)
            return
        # Only the configured FTS5 table is kept up to date; a count that differs means it went stale.
        table = "memory_terms" if self.lexical == "bigram" else "memory_trigrams"
        indexed = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        if indexed != db.execute("SELECT count(*) FROM memories").fetchone()[0]:
            db.execute(f"DELETE FROM {table}")
            for mid, text in db.execute("SELECT id, text FROM memories").fetchall():
                value = index_terms(text) if self.lexical == "bigram" else text.lower()
                db.execute(f"INSERT INTO {table} (rowid, {'terms' if self.lexical == 'bigram' else 'text'})"
                           " VALUES (?, ?)", [mid, value])

    # --- writing ---------------------------------------------------------------------------
    def count_scope(self, db: Tx, chat: str, kind: Kind, user_id: str) -> int:
        if kind == "group":
            sql, params = "SELECT count(*) FROM memories WHERE chat = ? AND kind = 'group'", [chat]
        else:
            sql, params = "SELECT count(*) FROM memories WHERE chat = ? AND kind = ? AND user_id = ?", [chat, kind,
                                                                                                      user_id]
        return int(db.execute(sql, params).fetchone()[0])

    def insert(self, db: Tx, *, chat: str, kind: Kind, user_id: str, user_name: str, text: str,
               now: datetime, vector: bytes | None = None) -> int:
        values = [chat, kind, user_id, user_name, text, iso(now), iso(now), vector]
        if db.dialect == "postgresql":
            terms = lexicon.doc_terms(text, self.lexical)
            mid = int(db.execute(
                "INSERT INTO memories (chat, kind, user_id, user_name, text, created, time, level, long_term, vector,"
                " terms, n_terms) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?::tsvector, ?) RETURNING id",
                [*values, lexicon.tsvector(terms), len(terms)]).fetchone()[0])
            lexicon.added(db, len(terms))
            return mid
        mid = int(db.execute(
            "INSERT INTO memories (chat, kind, user_id, user_name, text, created, time, level, long_term, vector)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, ?) RETURNING id", values).fetchone()[0])
        if self.lexical == "bigram":
            db.execute("INSERT INTO memory_terms (rowid, terms) VALUES (?, ?)", [mid, index_terms(text)])
        else:
            db.execute("INSERT INTO memory_trigrams (rowid, text) VALUES (?, ?)", [mid, text.lower()])
        return mid

    def delete(self, db: Tx, ids: Iterable[int]) -> int:
        """Delete memories and their index entries; how many existed."""
        gone = 0
        for mid in ids:
            if db.dialect == "postgresql":
                row = db.execute("DELETE FROM memories WHERE id = ? RETURNING n_terms", [mid]).fetchone()
                if row is not None:
                    lexicon.removed(db, int(row[0]))
                    gone += 1
                continue
            gone += db.execute("DELETE FROM memories WHERE id = ?", [mid]).rowcount
            db.execute("DELETE FROM memory_terms WHERE rowid = ?", [mid])
            db.execute("DELETE FROM memory_trigrams WHERE rowid = ?", [mid])
        return gone

    def save_strength(self, db: Tx, changes: Iterable[tuple[int, Strength]]) -> None:
        for mid, s in changes:
            db.execute("UPDATE memories SET level = ?, time = ?, long_term = ?, decayed_at = ? WHERE id = ?",
                       [s.level, iso(s.time), int(s.long_term), iso(s.decayed_at) if s.decayed_at else None, mid])

    # --- reading ---------------------------------------------------------------------------
    def lexical_search(self, db: Tx, chat: str, user_id: str, query: str,
                       limit: int) -> list[int]:
        """Ids of visible matches, best BM25 first."""
        if db.dialect == "postgresql":
            return lexicon.search(db, chat, user_id, query, limit, self.lexical)
        if self.lexical == "bigram":
            table, match = "memory_terms", fts_query(query)
        else:
            table, match = "memory_trigrams", trigram_query(query)
        if match is None:
            return []
        rows = db.execute(
            f"SELECT m.id FROM {table} f JOIN memories m ON m.id = f.rowid"
            f" WHERE {table} MATCH ? AND {visible()} ORDER BY bm25({table}), m.id DESC LIMIT ?",
            [match, chat, user_id, limit]).fetchall()
        return [int(r[0]) for r in rows]

    def rows(self, db: Tx, ids: Sequence[int]) -> dict[int, MemoryRow]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        found = db.execute(f"SELECT {_COLUMNS} FROM memories WHERE id IN ({marks})", list(ids)).fetchall()
        return {int(r[0]): MemoryRow.of(r) for r in found}

    def get(self, db: Tx, mid: int) -> MemoryRow | None:
        return self.rows(db, [mid]).get(mid)

    def listing(self, db: Tx, chat: str, user_id: str, limit: int) -> list[MemoryRow]:
        """What the caller may see here, newest first."""
        found = db.execute(f"SELECT {_COLUMNS} FROM memories m WHERE {visible()} ORDER BY id DESC LIMIT ?",
                           [chat, user_id, limit]).fetchall()
        return [MemoryRow.of(r) for r in found]

    def vectors(self, db: Tx, chat: str) -> list[tuple[int, str, str, bytes]]:
        """(id, kind, user_id, vector) of the chat's memories that have a vector."""
        return [(int(r[0]), r[1], r[2], bytes(r[3])) for r in db.execute(
            "SELECT id, kind, user_id, vector FROM memories WHERE chat = ? AND vector IS NOT NULL ORDER BY id",
            [chat]).fetchall()]

    def owned_by(self, db: Tx, platform: str, user_id: str,
                 chats: Sequence[str] | None) -> list[tuple[str, int]]:
        """(chat, id) of what a person saved in ``chats``, or in every chat of the platform."""
        if chats is None:
            rows = db.execute("SELECT chat, id FROM memories WHERE user_id = ? AND substr(chat, 1, ?) = ?",
                              [user_id, len(platform) + 1, f"{platform}:"]).fetchall()
        else:
            marks = ",".join("?" * len(chats))
            rows = db.execute(f"SELECT chat, id FROM memories WHERE user_id = ? AND chat IN ({marks})",
                              [user_id, *chats]).fetchall()
        return [(str(r[0]), int(r[1])) for r in rows]

    def sample(self, db: Tx, chat: str, n: int) -> list[MemoryRow]:
        """Up to ``n`` random memories of the chat that are not long-term (sleep's sample)."""
        found = db.execute(f"SELECT {_COLUMNS} FROM memories WHERE chat = ? AND long_term = 0"
                           " ORDER BY random() LIMIT ?", [chat, n]).fetchall()
        return [MemoryRow.of(r) for r in found]

    def chats(self, db: Tx) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT DISTINCT chat FROM memories").fetchall()]

    # --- sleep bookkeeping -------------------------------------------------------------------
    def slept_on(self, db: Tx, chat: str) -> str | None:
        row = db.execute("SELECT local_date FROM memory_sleeps WHERE chat = ?", [chat]).fetchone()
        return str(row[0]) if row else None

    def claim_night(self, db: Tx, chat: str, local_date: str) -> tuple[bool, str | None]:
        """Take the chat's sleep for ``local_date``, unless someone took it: (taken now, the night before)."""
        before = self.slept_on(db, chat)
        row = db.execute("INSERT INTO memory_sleeps (chat, local_date) VALUES (?, ?) ON CONFLICT (chat) DO UPDATE"
                         " SET local_date = excluded.local_date WHERE memory_sleeps.local_date <> excluded.local_date"
                         " RETURNING chat", [chat, local_date]).fetchone()
        return row is not None, before

    def release_night(self, db: Tx, chat: str, local_date: str, before: str | None) -> None:
        """Undo :meth:`claim_night` (the sleep failed)."""
        if before is None:
            db.execute("DELETE FROM memory_sleeps WHERE chat = ? AND local_date = ?", [chat, local_date])
        else:
            db.execute("UPDATE memory_sleeps SET local_date = ? WHERE chat = ? AND local_date = ?",
                       [before, chat, local_date])

    def add_dream(self, db: Tx, chat: str, now: datetime, fragments: int, text: str) -> int:
        cur = db.execute("INSERT INTO memory_dreams (chat, created, fragments, text) VALUES (?, ?, ?, ?) RETURNING id",
                         [chat, iso(now), fragments, text])
        return int(cur.fetchone()[0])

    def dreams(self, db: Tx, chat: str, limit: int = 10) -> list[tuple[datetime, str]]:
        return [(parse_iso(r[0]), str(r[1])) for r in db.execute(
            "SELECT created, text FROM memory_dreams WHERE chat = ? ORDER BY id DESC LIMIT ?", [chat, limit]).fetchall()]

    def delete_dreams(self, db: Tx, chat: str) -> int:
        """A dream may quote any forgotten memory of the chat, so ``/forget me`` drops them all."""
        return int(db.execute("DELETE FROM memory_dreams WHERE chat = ?", [chat]).rowcount)
