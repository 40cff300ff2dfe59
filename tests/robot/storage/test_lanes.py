"""Urgent units go ahead of a backlog: the worker threads (robot.storage.lanes), PostgreSQL's engine and SQLite's writer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robot.storage import SQLiteDatabase, Tx, open_database
from robot.storage.lanes import Lanes
from robot.storage.postgres import PostgresDatabase


def test_urgent_calls_go_before_the_queued_ones_and_each_kind_keeps_its_order() -> None:
    lanes = Lanes(1, "test-lanes")
    try:
        gate, done = threading.Event(), []
        first = lanes.submit(gate.wait)  # holds the only thread while the rest is queued

        def note(name: str) -> Callable[[], str]:
            return lambda: done.append(name) or name

        later = [lanes.submit(note(f"n{i}")) for i in range(4)]
        urgent = [lanes.submit(note(f"u{i}"), urgent=True) for i in range(2)]
        gate.set()
        assert [f.result(5) for f in [first, *urgent, *later]] == [True, "u0", "u1", "n0", "n1", "n2", "n3"]
        assert done == ["u0", "u1", "n0", "n1", "n2", "n3"]
    finally:
        lanes.shutdown()


def test_a_failing_or_abandoned_call_is_told_apart() -> None:
    lanes = Lanes(1, "test-lanes")
    try:
        gate, ran = threading.Event(), []
        lanes.submit(gate.wait)
        abandoned = lanes.submit(lambda: ran.append("abandoned"))
        assert abandoned.cancel()  # its caller gave up before it began: it never runs
        failing = lanes.submit(lambda: 1 // 0)
        gate.set()
        try:
            failing.result(5)
        except ZeroDivisionError:
            pass
        else:
            raise AssertionError("the call's error did not reach its caller")
        assert lanes.submit(lambda: "after").result(5) == "after" and ran == []
    finally:
        lanes.shutdown()
    try:
        lanes.submit(lambda: "late")
    except RuntimeError:
        pass
    else:
        raise AssertionError("a call submitted after the shutdown was taken, and would never run")


async def test_an_urgent_unit_overtakes_a_backlog_of_units_on_postgresql(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=2)
    await db.open()
    try:
        finished: set[int] = set()  # (a rehearsed unit runs twice)

        def slow(i: int) -> Callable[[Tx], None]:
            def unit(tx: Tx) -> None:
                tx.execute("SELECT 1")
                time.sleep(0.05)  # a unit holding its connection: 40 of them are a second's backlog
                finished.add(i)
            return unit

        backlog = [asyncio.ensure_future(db.transaction(slow(i))) for i in range(40)]
        await asyncio.sleep(0.1)  # the backlog is queued and under way
        urgent = await db.transaction(lambda tx: (len(finished), tx.execute("SELECT 1").fetchone()), urgent=True)
        assert urgent[0] < 20  # it waited for a thread, not for the backlog (in order it would see 40)
        await asyncio.gather(*backlog)
        assert finished == set(range(40))
    finally:
        await db.close()


async def test_on_sqlite_an_urgent_unit_overtakes_the_units_queued_before_it_and_each_kind_keeps_its_order(
        tmp_path: Path) -> None:
    db = open_database("", tmp_path)
    await db.open()
    try:
        gate = threading.Event()
        finished: list[str] = []  # each unit once (a rehearsed unit runs twice)

        def unit(name: str) -> Callable[[Tx], int]:
            def run(tx: Tx) -> int:
                if name not in finished:
                    finished.append(name)
                return int(tx.execute("SELECT 41 + 1").fetchone()[0])
            return run

        # The writer is held by one unit while 30 others queue up behind it, then two urgent ones: these
        # open the next group.
        held = asyncio.ensure_future(db.run(lambda tx: gate.wait(10)))
        await asyncio.sleep(0.05)
        backlog = [asyncio.ensure_future(db.run(unit(f"n{i}"))) for i in range(30)]
        urgent = [asyncio.ensure_future(db.transaction(unit(f"u{i}"), urgent=True)) for i in range(2)]
        await asyncio.sleep(0.05)
        gate.set()
        assert await asyncio.gather(held, *urgent, *backlog) == [True, *[42] * 32]
        assert finished == ["u0", "u1", *[f"n{i}" for i in range(30)]]  # in order they would come last
        assert await db.run(lambda tx: tx.execute("SELECT 1").fetchone()[0], urgent=True) == 1
    finally:
        await db.close()


def test_on_sqlite_any_mix_of_units_queued_behind_a_busy_writer_runs_urgent_ones_first_and_each_once(
        tmp_path: Path) -> None:
    """Urgent, plain, durable and raw units (some failing after a write, which makes their group run
    again with savepoints), queued while the writer is busy: each caller gets its own outcome, only
    the units that returned keep their row, and the urgent ones ran before the others queued with
    them, each kind in the order it was queued."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    kinds = st.sampled_from(["urgent", "plain", "durable", "raw"])
    loop = asyncio.new_event_loop()
    db = SQLiteDatabase(tmp_path / "qunbot.sqlite3")
    loop.run_until_complete(db.open())
    loop.run_until_complete(db.run(lambda tx: tx.execute("CREATE TABLE t (name TEXT PRIMARY KEY)")))
    try:
        @settings(max_examples=60, deadline=None)
        @given(units=st.lists(st.tuples(kinds, st.booleans()), min_size=1, max_size=40))
        def check(units: list[tuple[str, bool]]) -> None:
            began: list[str] = []  # first run of each unit (a group with a failed writer runs again)

            def unit(name: str, kind: str, fails: bool) -> Callable[[Tx], str]:
                def run(tx: Tx) -> str:
                    if name not in began:
                        began.append(name)
                    if kind != "raw":
                        tx.execute("INSERT INTO t VALUES (?)", [name])
                    if fails:
                        raise ValueError(name)
                    return name
                return run

            async def scenario() -> list[object]:
                await db.run(lambda tx: tx.execute("DELETE FROM t"))
                gate = threading.Event()
                held = asyncio.ensure_future(db.run(lambda tx: gate.wait(10)))
                await asyncio.sleep(0.01)
                calls = []
                for i, (kind, fails) in enumerate(units):
                    work = unit(f"{kind}{i}", kind, fails and kind != "raw")
                    if kind == "raw":
                        calls.append(db.run_raw(work))
                    else:
                        calls.append(db.transaction(work, urgent=kind == "urgent", durable=kind == "durable"))
                futures = [asyncio.ensure_future(c) for c in calls]
                await asyncio.sleep(0.01)
                gate.set()
                await held
                return await asyncio.gather(*futures, return_exceptions=True)

            outcomes = loop.run_until_complete(scenario())
            names = [f"{kind}{i}" for i, (kind, _) in enumerate(units)]
            failed = {f"{kind}{i}" for i, (kind, fails) in enumerate(units) if fails and kind != "raw"}
            for name, outcome in zip(names, outcomes, strict=True):
                if name in failed:
                    assert isinstance(outcome, ValueError) and str(outcome) == name
                else:
                    assert outcome == name
            kept = {str(r[0]) for r in loop.run_until_complete(db.run(lambda tx: tx.execute("SELECT name FROM t")
                                                                      .fetchall()))}
            assert kept == {n for n in names if not n.startswith("raw") and n not in failed}
            assert began == [n for n in names if n.startswith("urgent")] + [n for n in names
                                                                           if not n.startswith("urgent")]

        check()
    finally:
        loop.run_until_complete(db.close())
        loop.close()


def test_while_held_only_urgent_calls_start_and_the_rest_start_once_the_hold_ends() -> None:
    lanes = Lanes(2, "test-lanes")
    try:
        lanes.hold(time.monotonic() + 30)
        ran: list[str] = []
        ordinary = lanes.submit(lambda: ran.append("ordinary"))
        urgent = lanes.submit(lambda: ran.append("urgent"), urgent=True)
        urgent.result(5)
        time.sleep(0.05)
        assert ran == ["urgent"] and not ordinary.done()  # a message's unit waits out the burst
        lanes.hold(None)
        ordinary.result(5)
        assert ran == ["urgent", "ordinary"]
    finally:
        lanes.shutdown()


def test_a_hold_ends_by_itself_at_its_deadline() -> None:
    lanes = Lanes(1, "test-lanes")
    try:
        lanes.hold(time.monotonic() + 0.1)
        started = time.monotonic()
        lanes.submit(lambda: None).result(5)  # nobody releases it: the window's end does
        assert time.monotonic() - started >= 0.05
    finally:
        lanes.shutdown()


def test_calls_submitted_from_many_threads_through_holds_all_run_once() -> None:
    # Threads waiting out a hold race the others for urgent calls: none may lose a call or die.
    lanes = Lanes(4, "test-lanes")
    ran: list[int] = []
    futures: list[Any] = []
    lock = threading.Lock()

    def submit(start: int) -> None:
        for i in range(start, start + 500):
            if i % 50 == 0:
                lanes.hold(time.monotonic() + 0.01 if i % 100 else None)
            future = lanes.submit(lambda i=i: ran.append(i), urgent=i % 3 == 0)  # type: ignore[misc]
            with lock:
                futures.append(future)

    try:
        submitters = [threading.Thread(target=submit, args=(k * 500,)) for k in range(4)]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
        lanes.hold(None)
        for future in futures:
            future.result(10)
        assert sorted(ran) == list(range(2000))
    finally:
        lanes.shutdown()
