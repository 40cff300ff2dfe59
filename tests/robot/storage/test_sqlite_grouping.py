"""The SQLite engine's grouped commits as callers see them: outcomes, cancellation, notifications."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from robot.storage import SQLiteDatabase, Tx, parse_iso

SCHEMA = ["CREATE TABLE t (id {id}, v TEXT NOT NULL UNIQUE)"]


async def _opened(tmp_path: Path) -> SQLiteDatabase:
    db = SQLiteDatabase(tmp_path / "q.sqlite3")
    db.migrate("t", SCHEMA)
    await db.open()
    return db


async def _as_one_group(db: SQLiteDatabase, units: list[Callable[[Tx], Any]]) -> list[Any]:
    """Run ``units`` as one group (queued while the writer is held busy); their outcomes, errors included."""
    gate = threading.Event()
    busy = asyncio.ensure_future(db.run(lambda tx: gate.wait(10)))
    await asyncio.sleep(0.05)
    calls = [asyncio.ensure_future(db.run(unit)) for unit in units]
    await asyncio.sleep(0.05)
    gate.set()
    await busy
    return await asyncio.gather(*calls, return_exceptions=True)


async def test_a_caller_that_gave_up_before_its_turn_never_writes(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        gate = threading.Event()
        busy = asyncio.ensure_future(db.run(lambda tx: gate.wait(10)))  # holds the writer thread
        await asyncio.sleep(0.05)
        gave_up = asyncio.ensure_future(db.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES ('abandoned')")))
        kept = asyncio.ensure_future(db.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES ('kept')").rowcount))
        await asyncio.sleep(0.05)
        gave_up.cancel()
        gate.set()
        assert await busy is True
        assert await kept == 1
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        rows = await db.run(lambda tx: [r[0] for r in tx.execute("SELECT v FROM t").fetchall()])
        assert rows == ["kept"]
    finally:
        await db.close()


async def test_a_group_of_units_wakes_each_caller_with_its_own_outcome_and_commits_once(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        heard: list[str] = []
        db.subscribe("t", heard.append)

        def unit(i: int) -> Callable[[Tx], int]:
            def work(tx: Tx) -> int:
                if i % 3 == 0:
                    raise ValueError(f"unit {i} refuses")
                tx.execute("INSERT INTO t (v) VALUES (?)", [f"v{i}"])
                tx.notify("t", f"v{i}")
                return i
            return work

        before = db.commits
        results = await _as_one_group(db, [unit(i) for i in range(30)])
        for i, result in enumerate(results):
            if i % 3 == 0:
                assert isinstance(result, ValueError) and str(result) == f"unit {i} refuses"
            else:
                assert result == i
        assert db.commits - before <= 2  # the 30 queued units went in one transaction (the busy one aside)
        await asyncio.sleep(0.05)
        assert sorted(heard) == sorted(f"v{i}" for i in range(30) if i % 3)
    finally:
        await db.close()


def test_only_stored_timestamps_parse() -> None:
    assert parse_iso("2026-03-01T08:00:00.123456Z").isoformat() == "2026-03-01T08:00:00.123456+00:00"
    for other in ("2026-03-01T08:00:00Z", "2026-03-01 08:00:00.123456Z", "2026-03-01T08:00:00.123456+00:00"):
        with pytest.raises(ValueError):
            parse_iso(other)


async def test_a_unit_that_read_then_wrote_then_failed_undoes_only_its_own_writes(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        def read_write_fail(tx: Tx) -> None:
            tx.execute("SELECT count(*) FROM t").fetchone()  # no savepoint yet: reads change nothing
            tx.execute("INSERT INTO t (v) VALUES ('undone')")
            raise RuntimeError("after its write")

        def read_only_fail(tx: Tx) -> None:
            tx.query("SELECT v FROM t")
            raise RuntimeError("after a read")

        outcomes = await _as_one_group(db, [lambda tx: tx.execute("INSERT INTO t (v) VALUES ('before')"),
                                            read_write_fail, read_only_fail,
                                            lambda tx: tx.execute("INSERT INTO t (v) VALUES ('after')")])
        assert [type(o).__name__ for o in outcomes[1:3]] == ["RuntimeError", "RuntimeError"]
        rows = await db.run(lambda tx: sorted(r[0] for r in tx.execute("SELECT v FROM t").fetchall()))
        assert rows == ["after", "before"]
    finally:
        await db.close()


async def test_a_failure_after_writes_reruns_the_group_and_nothing_lands_or_is_heard_twice(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        heard: list[str] = []
        db.subscribe("t", heard.append)

        def unit(i: int) -> Callable[[Tx], int]:
            def work(tx: Tx) -> int:
                tx.execute("INSERT INTO t (v) VALUES (?)", [f"v{i}"])
                tx.notify("t", f"v{i}")
                if i in (7, 19):  # wrote, then failed: its rows must go, everyone else's stay once
                    tx.execute("INSERT INTO t (v) VALUES (?)", [f"w{i}"])
                    raise RuntimeError(f"unit {i} fails after writing")
                # a read of what this unit wrote: the same answer in a second run
                return int(tx.execute("SELECT count(*) FROM t WHERE v = ?", [f"v{i}"]).fetchone()[0])
            return work

        results = await _as_one_group(db, [unit(i) for i in range(25)])
        for i, result in enumerate(results):
            if i in (7, 19):
                assert isinstance(result, RuntimeError) and str(result) == f"unit {i} fails after writing"
            else:
                assert result == 1
        rows = await db.run(lambda tx: [r[0] for r in tx.execute("SELECT v FROM t ORDER BY v").fetchall()])
        assert rows == sorted(f"v{i}" for i in range(25) if i not in (7, 19))
        await asyncio.sleep(0.05)
        assert sorted(heard) == rows  # the rolled-back pass's notifications are dropped with it
    finally:
        await db.close()
