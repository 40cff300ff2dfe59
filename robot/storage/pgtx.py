"""PostgreSQL's unit of work: a :class:`~robot.storage.base.Tx` over one psycopg connection, with
SQLite's ``?`` placeholders and text PostgreSQL can store (see :mod:`robot.storage.postgres`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from robot.storage.base import Dialect, as_stored

__all__ = ["CHANNEL", "PostgresTx", "read_only"]

T = TypeVar("T")

CHANNEL = "qunbot"  #: the one LISTEN/NOTIFY channel; what a notification is for travels in its payload
_sql_cache: dict[str, str] = {}


def _translate(sql: str) -> str:
    """``?`` placeholders -> psycopg's ``%s`` (a literal ``%`` doubled first)."""
    out = _sql_cache.get(sql)
    if out is None:
        out = sql.replace("%", "%%").replace("?", "%s")
        if len(_sql_cache) < 4096:
            _sql_cache[sql] = out
    return out


def _clean(value: Any) -> Any:
    """PostgreSQL's text cannot hold NUL (0x00), which chat text and model output may carry: it
    becomes U+FFFD, in writes and lookups alike, rather than failing the whole unit of work (and so
    does a lone surrogate, which UTF-8 cannot carry: :func:`mend_text`)."""
    if isinstance(value, str):
        return as_stored(value)
    if isinstance(value, list):
        return _array(value)
    return value


_PLAIN = frozenset({str, int, type(None)})


def _array(values: list[Any]) -> Any:
    """A flat list of text, integers and NULLs as PostgreSQL's array literal, for a ``?::type[]``
    parameter (sent untyped, the cast types it). psycopg builds an array element by element, with a
    regex or two per element: a firing burst's thousand-row columns took 8 times as long."""
    if not {type(v) for v in values} <= _PLAIN:  # nested, bytes, bool...: psycopg's own array
        return [_clean(v) for v in values]
    # Every element quoted (so "NULL" stays a text), its quotes and backslashes escaped.
    return _clean("{" + ",".join("NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
                                 for v in values) + "}")


def _params(params: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_clean(p) for p in params)


class PostgresTx:
    """A :class:`~robot.storage.base.Tx` over one pooled psycopg connection (text without NUL: :func:`_clean`)."""

    dialect: Dialect = "postgresql"

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.notes: list[str] = []  # sent by :meth:`flush` at the unit's end, in one statement

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(_translate(sql), _params(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(_translate(sql), [_params(r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(_translate(sql), _params(params))
            return list(cur.fetchall()) if cur.description else []

    execute_returning_dicts = query

    def notify(self, channel: str, payload: str) -> None:
        # PostgreSQL delivers a transaction's notifications only at its commit, so holding them until
        # the unit's end changes nothing a listener sees, and a burst (a firing pass queues hundreds
        # of rows) costs one statement instead of one per row.
        self.notes.append(json.dumps([channel, payload]))

    def flush(self) -> None:
        """Send the notifications :meth:`notify` held (in the transaction, before its commit)."""
        if self.notes:
            notes, self.notes = self.notes, []
            self.conn.execute("SELECT pg_notify(%s, note) FROM unnest(%s::text[]) WITH ORDINALITY AS n(note, i) "
                              "ORDER BY i", (CHANNEL, _clean(notes)))


def read_only(tx: PostgresTx, fn: Callable[[PostgresTx], T]) -> T:
    """``fn(tx)`` in a transaction made read-only first: a statement in it that would write fails."""
    tx.execute("SET TRANSACTION READ ONLY")
    return fn(tx)
