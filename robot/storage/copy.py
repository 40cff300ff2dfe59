"""Copy a bot's SQLite database into an empty PostgreSQL database (``qunbot copy-db``: scaling out).

Both databases must already have the schema this code has (every component's migrations:
:func:`robot.maintenance.copy_db` starts a bot without channels on each). Then every table both
have is copied row by row, inside the one PostgreSQL transaction the caller runs
:func:`copy_sync` in: all or nothing. Left out: ``schema_version`` (the same on both by then) and
``leases`` (which process holds what: the old process's claims are void, and what it had claimed
is taken over) and ``install_secret`` (the fingerprint of the data_dir's ``secret.key``, which the
start on PostgreSQL records: the start on SQLite checked that it is the source's). Tables only PostgreSQL has hold figures its engine derives (the memory index's
corpus figures): they are emptied, and their component rebuilds them at the next start. The
identity counters go on after the copied ids.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from robot.storage.base import Tx

__all__ = ["SKIPPED", "CopyError", "CopyReport", "copy_sync", "living_processes", "occupied_error", "occupied_sync",
           "sqlite_tables"]

_VERSIONS = "schema_version"
SKIPPED = frozenset({_VERSIONS, "leases", "install_secret"})
_CHUNK = 2000  # rows read and written at a time: a large history never sits in memory whole


class CopyError(Exception):
    """The copy cannot be made (the target holds data, the schemas differ); nothing was written."""


@dataclass
class CopyReport:
    """Rows copied per table, and the derived tables emptied for their components to rebuild."""

    rows: dict[str, int] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)


def _read_only(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def sqlite_tables(path: str) -> dict[str, list[str]]:
    """The SQLite file's tables and their columns (read only)."""
    conn = _read_only(path)
    try:
        return _sqlite_tables(conn)
    finally:
        conn.close()


def living_processes(path: str, now: str) -> list[str]:
    """The qunbot processes whose lease on the SQLite file is still renewed at ``now`` (a running bot)."""
    conn = _read_only(path)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'leases'").fetchone() is None:
            return []
        return [str(r[0]) for r in conn.execute(
            "SELECT holder FROM leases WHERE name LIKE 'process:%' AND expires_at >= ?", [now])]
    finally:
        conn.close()


def occupied_sync(tx: Tx, source_tables: dict[str, list[str]]) -> list[str]:
    """Tables of the target that the copy would fill and that already hold rows (it refuses then)."""
    common = sorted(t for t in _pg_tables(tx) if t in source_tables and t not in SKIPPED)
    return [t for t in common if tx.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone() is not None]


def occupied_error(busy: list[str]) -> CopyError:
    """The refusal for a target whose ``busy`` tables already hold rows."""
    return CopyError(f"the target database already holds data (in {', '.join(busy[:5])}): copy into an empty database")


def _sqlite_tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    names = [str(r[0]) for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {name: [str(c[1]) for c in conn.execute(f'PRAGMA table_info("{name}")')] for name in names}


def _pg_tables(tx: Tx) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table, column in tx.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY table_name, ordinal_position").fetchall():
        out.setdefault(str(table), []).append(str(column))
    return out


def _versions_sqlite(conn: sqlite3.Connection) -> dict[str, int]:
    return {str(c): int(v) for c, v in conn.execute(f"SELECT component, version FROM {_VERSIONS}")}


def copy_sync(tx: Tx, source: str) -> CopyReport:
    """Copy the SQLite file ``source`` into the PostgreSQL database of ``tx`` (see the module)."""
    if tx.dialect != "postgresql":
        raise CopyError("the target must be a PostgreSQL database")
    conn = _read_only(source)
    conn.execute("BEGIN")  # one snapshot for every table (each read its own: a table's rows, not another's)
    try:
        theirs = {str(c): int(v) for c, v in tx.execute(f"SELECT component, version FROM {_VERSIONS}").fetchall()}
        ours = _versions_sqlite(conn)
        if ours != theirs:
            differ = sorted(c for c in {*ours, *theirs} if ours.get(c) != theirs.get(c))
            raise CopyError(f"the two schemas differ ({', '.join(differ)}): start the bot once on each first")
        source_tables, target_tables = _sqlite_tables(conn), _pg_tables(tx)
        common = sorted(t for t in target_tables if t in source_tables and t not in SKIPPED)
        busy = occupied_sync(tx, source_tables)
        if busy:
            raise occupied_error(busy)
        report = CopyReport()
        for table in common:
            columns = [c for c in target_tables[table] if c in source_tables[table]]
            names = ", ".join(f'"{c}"' for c in columns)
            cursor = conn.execute(f'SELECT {names} FROM "{table}"')
            insert = f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(columns))})'
            copied = 0
            while rows := cursor.fetchmany(_CHUNK):
                tx.executemany(insert, rows)
                copied += len(rows)
            report.rows[table] = copied
        for table in sorted(t for t in target_tables if t not in source_tables and t not in SKIPPED):
            tx.execute(f'DELETE FROM "{table}"')
            report.rebuilt.append(table)
        for table, column in tx.execute(
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND is_identity = 'YES'").fetchall():
            if str(table) in report.rows:
                tx.execute(f'SELECT setval(pg_get_serial_sequence(?, ?), coalesce(max("{column}"), 0) + 1, false) '
                           f'FROM "{table}"', [f'"{table}"', str(column)])
        return report
    finally:
        conn.close()
