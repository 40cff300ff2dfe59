"""Batched units of work: calls made together share one transaction, on both engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from robot.storage import Engine, Tx
from robot.storage.batch import Batched

SCHEMA = ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL UNIQUE)"]


@pytest.fixture
async def notes(engine: Engine) -> AsyncIterator[Engine]:
    """The engine, open, with a ``notes`` table."""
    engine.migrate("notes", SCHEMA)
    await engine.open()
    yield engine
    await engine.close()


def _insert(seen: list[list[str]]) -> Callable[[Tx, list[str]], list[int]]:
    def work(tx: Tx, bodies: list[str]) -> list[int]:
        seen.append(list(bodies))  # (twice for one unit when units are rehearsed)
        tx.executemany("INSERT INTO notes (id, body) VALUES (?, ?)",
                       [(int(b.split("-")[1]), b) for b in bodies])
        return [int(b.split("-")[1]) * 10 for b in bodies]
    return work


async def test_calls_made_together_share_a_unit_and_each_gets_its_own_result(notes: Engine) -> None:
    seen: list[list[str]] = []
    batched = Batched(notes, _insert(seen), limit=20)
    results = await asyncio.gather(*(batched(f"n-{i}") for i in range(50)))
    assert results == [i * 10 for i in range(50)]
    batches = [b for k, b in enumerate(seen) if k == 0 or b != seen[k - 1]]  # rehearsals repeat one
    assert [len(b) for b in batches] == [20, 20, 10]
    assert await notes.run(lambda tx: tx.execute("SELECT count(*) FROM notes").fetchone()[0]) == 50
    # A call made while a batch runs waits for it and goes in the next one.
    first = asyncio.ensure_future(batched("n-100"))
    await asyncio.sleep(0)  # the first batch has started
    later = [asyncio.ensure_future(batched(f"n-{i}")) for i in range(101, 104)]
    assert await first == 1000 and [await f for f in later] == [1010, 1020, 1030]
    assert [len(b) for b in seen[-1:]] == [3]


async def test_a_failing_unit_fails_every_call_in_it_and_the_next_batch_still_runs(notes: Engine) -> None:
    batched = Batched(notes, _insert([]))
    await batched("n-1")
    # n-1 again breaks the UNIQUE body (and key): the whole batch rolls back, n-2 with it.
    outcomes = await asyncio.gather(batched("n-2"), batched("n-1"), return_exceptions=True)
    assert all(isinstance(o, Exception) for o in outcomes)
    assert await batched("n-2") == 20  # not written by the failed batch, written now
    rows = await notes.run(lambda tx: [r[0] for r in tx.execute("SELECT id FROM notes ORDER BY id").fetchall()])
    assert rows == [1, 2]


async def test_calls_waiting_when_the_loop_closes_are_cancelled_not_left_hanging(notes: Engine) -> None:
    batched = Batched(notes, _insert([]))
    calls = [asyncio.ensure_future(batched(f"n-{i}")) for i in range(3)]
    await asyncio.sleep(0)
    assert batched._task is not None
    batched._task.cancel()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
    with pytest.raises(asyncio.CancelledError):
        await batched._task


async def test_a_unit_returning_the_wrong_number_of_results_fails_its_calls(notes: Engine) -> None:
    batched: Batched[str, int] = Batched(notes, lambda tx, items: [])
    outcomes = await asyncio.gather(batched("a"), batched("b"), return_exceptions=True)
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert await asyncio.wait_for(asyncio.gather(batched("c"), return_exceptions=True), 5)  # not stuck


def test_a_batcher_used_again_from_a_new_event_loop_still_answers(tmp_path: Path) -> None:
    # A bot stopped and started again under a new event loop keeps its stores; the old loop may have
    # been closed with a batch still waiting to start (its task never ran, never finished).
    from robot.storage import SQLiteDatabase

    engine = SQLiteDatabase(tmp_path / "q.sqlite3")
    engine.migrate("notes", SCHEMA)
    batched = Batched(engine, _insert([]))
    old = asyncio.new_event_loop()
    queued = old.create_task(batched("n-1"))
    old.run_until_complete(asyncio.sleep(0))  # the call is queued and its batch's task created, not run
    old.close()
    assert not queued.done()

    async def again() -> int:
        await engine.open()
        try:
            return await asyncio.wait_for(batched("n-2"), 5)
        finally:
            await engine.close()

    assert asyncio.run(again()) == 20
