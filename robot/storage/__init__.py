"""Storage behind one interface, two engines: embedded SQLite (the default) and PostgreSQL.

``[storage] url`` chooses: empty or ``sqlite:///path`` for the file under the data folder (or
that path), ``postgresql://user:password@host:port/dbname`` for a database shared by many
processes (``pip install 'qunbot[postgresql]'``).
"""

from __future__ import annotations

from pathlib import Path

from robot.storage.base import Cursor, Dialect, Engine, Step, StorageError, Tx, iso, parse_iso, utcnow
from robot.storage.pending import Pending
from robot.storage.sqlite import SQLiteDatabase

__all__ = ["Cursor", "Dialect", "Engine", "Pending", "SQLiteDatabase", "Step", "StorageError", "Tx", "iso",
           "open_database", "parse_iso", "utcnow"]

SQLITE_FILE = "qunbot.sqlite3"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")  #: what a PostgreSQL ``[storage] url`` starts with


def open_database(url: str, data_dir: Path, *, pool_size: int = 8, stall_s: float | None = None,
                  listen_url: str = "") -> Engine:
    """The engine ``url`` names (not yet opened): see the module's docstring. ``stall_s`` and
    ``listen_url``: see :class:`~robot.storage.postgres.PostgresDatabase`."""
    url = url.strip()
    if not url:
        return SQLiteDatabase(data_dir / SQLITE_FILE)
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        return SQLiteDatabase(path if path.is_absolute() else data_dir / path)
    if url.startswith(POSTGRES_SCHEMES):
        from robot.storage.postgres import PostgresDatabase

        return PostgresDatabase(url, max_size=pool_size, stall_s=stall_s, listen_url=listen_url.strip() or None)
    # Only a scheme is quoted: a libpq "host=… password=…" string has no other part fit to print
    what = f"{url.split('://', 1)[0]!r}" if "://" in url else "a connection string without a scheme"
    raise StorageError(f"[storage] url must be empty, sqlite:///path or postgresql://..., not {what}")
