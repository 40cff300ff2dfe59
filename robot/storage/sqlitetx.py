"""SQLite's unit of work: a :class:`~robot.storage.base.Tx` over the writer thread's connection
(see :mod:`robot.storage.sqlite`), with a savepoint at its first write when its group runs again."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from robot.storage import base
from robot.storage.base import Dialect

__all__ = ["SQLiteTx"]


class SQLiteTx:
    """A :class:`~robot.storage.base.Tx` over the writer thread's connection."""

    dialect: Dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection, *, guarded: bool = False) -> None:
        self.conn = conn
        self.notes: list[tuple[str, str]] = []
        #: In a group's second pass: the unit's savepoint is opened before its first write, so a
        #: read-only unit costs no savepoint statements.
        self.guarded = guarded
        self.saved = False
        #: Whether the unit ran (or tried) a statement that is not a SELECT: a failing unit that
        #: wrote nothing needs nothing undone (SQLite backs out a failed statement by itself).
        self.wrote = False

    def _before(self, sql: str) -> None:
        if not self.wrote and sql.lstrip()[:6].upper() != "SELECT":
            self.wrote = True
            if self.guarded:
                self.conn.execute("SAVEPOINT unit")
                self.saved = True

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self._before(sql)
        return self._bind(sql, params)

    def _bind(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, tuple(params))
        except UnicodeEncodeError:  # a lone surrogate: binding failed before the statement ran
            return self.conn.execute(sql, base.mend_params(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._before(sql)  # mended up front: rows before a failing one would already be written
        self.conn.executemany(sql, base.mend_rows(rows))

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        self._before(sql)
        cur = self._bind(sql, params)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    execute_returning_dicts = query

    def notify(self, channel: str, payload: str) -> None:
        self.notes.append((channel, payload))
