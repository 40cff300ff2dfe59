"""The SQLite store: its single DB thread, transactions, and the persistent dedupe table."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from robot.storage import Tx
from robot.store import Database, DedupeStore, iso, parse_iso

T0 = datetime(2026, 3, 1, 8, 0, 0, 123456, tzinfo=UTC)


def test_iso_round_trips_in_utc_and_sorts() -> None:
    beijing = timezone(timedelta(hours=8))
    local = datetime(2026, 3, 1, 16, 0, 0, 123456, tzinfo=beijing)
    assert iso(local) == iso(T0) == "2026-03-01T08:00:00.123456Z"
    assert parse_iso(iso(local)) == T0
    assert iso(T0) < iso(T0 + timedelta(microseconds=1))


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        iso(datetime(2026, 3, 1, 8, 0))


async def test_work_runs_on_one_dedicated_thread(tmp_path: Path) -> None:
    db = Database(tmp_path / "sub" / "x.sqlite3")
    await db.open()
    here = threading.get_ident()
    threads = {await db.run(lambda _db: threading.get_ident()) for _ in range(5)}
    assert len(threads) == 1 and here not in threads
    mode = await db.run(lambda d: d.execute("PRAGMA journal_mode").fetchone()[0])
    assert mode == "wal"
    await db.close()


async def test_a_failed_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.sqlite3")
    db.migrate("t", ["CREATE TABLE IF NOT EXISTS t (v INTEGER)"])
    await db.open()

    def half_done(d: Tx) -> None:
        d.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("crash between two writes")

    with pytest.raises(RuntimeError):
        await db.transaction(half_done)
    await db.transaction(lambda d: d.execute("INSERT INTO t VALUES (2)"))
    rows = await db.run(lambda d: [r[0] for r in d.execute("SELECT v FROM t").fetchall()])
    assert rows == [2]
    await db.close()


async def test_migration_registered_after_open_runs_at_once(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    await db.ensure("late", ["CREATE TABLE late (v INTEGER)"])
    assert await db.run(lambda d: d.execute("SELECT count(*) FROM late").fetchone()[0]) == 0
    await db.close()


async def test_dedupe_answers_once_and_remembers_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    db = Database(path)
    seen = DedupeStore(db)
    await db.open()
    assert await seen.first_time("onebot", "2001", T0)
    assert not await seen.first_time("onebot", "2001", T0)
    assert await seen.first_time("wecom", "2001", T0)  # same id on another platform is another message
    await db.close()

    db2 = Database(path)
    seen2 = DedupeStore(db2)
    await db2.open()
    assert not await seen2.first_time("onebot", "2001", T0 + timedelta(minutes=5))
    await db2.close()


async def test_dedupe_prune_forgets_old_ids_only(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.sqlite3")
    seen = DedupeStore(db, keep=timedelta(hours=1))
    await db.open()
    await seen.first_time("p", "old", T0)
    await seen.first_time("p", "new", T0 + timedelta(minutes=90))
    assert await seen.prune(T0 + timedelta(minutes=100)) == 1
    assert await seen.first_time("p", "old", T0 + timedelta(minutes=100))
    assert not await seen.first_time("p", "new", T0 + timedelta(minutes=100))
    await db.close()
