"""The SQLite engine and its file beside units of work: the WAL truncated after a forget whatever
another program reads, reads that wait for no writer, and a file it cannot use refused at open."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from robot.storage import SQLiteDatabase, StorageError
from tests.robot.conftest import eventually

MARK = b"PHONE-13912345678"


def _copies(folder: Path) -> dict[str, int]:
    return {p.name: p.read_bytes().count(MARK) for p in sorted(folder.iterdir()) if p.is_file()}


async def test_a_checkpoint_behind_a_reader_returns_at_once_and_truncates_the_wal_once_the_reader_left(
        tmp_path: Path) -> None:
    """`/forget me` while a sqlite3 shell read the file: the bot's only writer stalled 30 s in the
    checkpoint (everyone's messages with it), and the person's text stayed in the -wal afterwards."""
    path = tmp_path / "qunbot.sqlite3"
    db = SQLiteDatabase(path)
    db.migrate("t", ["CREATE TABLE notes (text TEXT)"])
    await db.open()
    try:
        await db.run(lambda tx: tx.execute("PRAGMA busy_timeout = 3000"))  # stands for the 30 s wait
        await db.run(lambda tx: tx.execute("INSERT INTO notes VALUES (?)", [MARK.decode()]))
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM notes").fetchall()  # its snapshot holds the WAL's frames
        await db.run(lambda tx: tx.execute("DELETE FROM notes"))
        began = time.monotonic()
        await db.checkpoint()
        await db.run(lambda tx: tx.query("SELECT count(*) AS n FROM notes"))  # the next unit of work
        assert time.monotonic() - began < 1.5
        reader.execute("COMMIT")
        reader.close()
        await eventually(lambda: not any(_copies(tmp_path).values())
                         and (path.with_name(path.name + "-wal")).stat().st_size == 0)
    finally:
        await db.close()


async def test_a_read_waits_for_no_writer_and_cannot_write(tmp_path: Path) -> None:
    """`qunbot doctor`'s reads: another program's write transaction held each for the whole busy timeout."""
    path = tmp_path / "qunbot.sqlite3"
    db = SQLiteDatabase(path)
    db.busy_timeout_s = 0.5  # stands for the 30 s wait
    db.migrate("t", ["CREATE TABLE notes (text TEXT)"])
    await db.open()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # an owner's sqlite3 shell mid-UPDATE
    try:
        assert await db.read(lambda tx: tx.query("SELECT count(*) AS n FROM notes")) == [{"n": 0}]
        with pytest.raises(sqlite3.ProgrammingError, match="a read may not write"):
            await db.read(lambda tx: tx.execute("INSERT INTO notes VALUES ('x')"))
    finally:
        other.execute("ROLLBACK")
        other.close()
    await db.run(lambda tx: tx.execute("INSERT INTO notes VALUES ('y')"))  # the writer writes as before
    assert await db.read(lambda tx: tx.query("SELECT text FROM notes")) == [{"text": "y"}]
    await db.close()


async def test_a_file_sqlite_opens_read_only_is_refused_at_open_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "qunbot.sqlite3"
    first = SQLiteDatabase(path)
    first.migrate("t", ["CREATE TABLE notes (text TEXT)"])
    await first.open()
    await first.close()
    connect = sqlite3.connect  # (a file this user may only read: SQLite opens it read-only)
    monkeypatch.setattr(sqlite3, "connect", lambda p, *a, **kw: connect(f"file:{p}?mode=ro", *a, uri=True, **kw))
    db = SQLiteDatabase(path)
    db.migrate("t", ["CREATE TABLE notes (text TEXT)"])
    with pytest.raises(StorageError) as caught:
        await db.open()
    assert str(caught.value) == f"cannot open the database {path}: attempt to write a readonly database"
    await db.close()
