"""The engine contract, on SQLite and on a real PostgreSQL: units of work, migrations, notifications."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from robot.storage import Engine, StorageError, Tx
from robot.storage.postgres import PostgresDatabase

SCHEMA = ["CREATE TABLE t (id {id}, v TEXT NOT NULL UNIQUE, n BIGINT NOT NULL DEFAULT 0, f {real})"]


async def test_a_unit_of_work_commits_whole_or_not_at_all(engine: Engine) -> None:
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        def half_done(tx: Tx) -> None:
            tx.execute("INSERT INTO t (v) VALUES (?)", ["first"])
            raise RuntimeError("crash between two writes")

        with pytest.raises(RuntimeError):
            await engine.transaction(half_done)
        await engine.run(lambda tx: tx.execute("INSERT INTO t (v, f) VALUES (?, ?)", ["kept 100%", 0.1]))
        rows = await engine.run(lambda tx: tx.query("SELECT v, n, f FROM t WHERE v LIKE '%100%'"))
        assert rows == [{"v": "kept 100%", "n": 0, "f": 0.1}]
    finally:
        await engine.close()


async def test_a_unit_raising_stop_iteration_fails_its_caller_instead_of_hanging_it(engine: Engine) -> None:
    # asyncio refuses StopIteration on a future: passed through, the caller would wait for ever.
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        def first_match(tx: Tx) -> Any:
            tx.execute("INSERT INTO t (v) VALUES (?)", ["written before the error"])
            return next(iter(tx.query("SELECT v FROM t WHERE v = 'absent'")))

        with pytest.raises(RuntimeError, match="StopIteration") as caught:
            await asyncio.wait_for(engine.run(first_match), 10)
        assert isinstance(caught.value.__cause__, StopIteration)
        assert await engine.run(lambda tx: tx.query("SELECT v FROM t")) == []  # rolled back, as any failure
        assert await engine.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES ('next')").rowcount) == 1
    finally:
        await engine.close()


async def test_rehearsal_runs_each_unit_twice_and_keeps_only_the_second_run(engine: Engine) -> None:
    # What `pytest --rehearse-units` relies on: a unit's Python side effect shows up doubled, its rows do not.
    engine.migrate("t", SCHEMA)
    engine.rehearse = True
    await engine.open()
    try:
        runs: list[str] = []

        def insert(v: str) -> Any:
            def unit(tx: Tx) -> int:
                runs.append(v)
                return int(tx.execute("INSERT INTO t (v) VALUES (?)", [v]).rowcount)
            return unit

        assert await asyncio.gather(*(engine.run(insert(f"r{i}")) for i in range(5))) == [1] * 5
        assert sorted(runs) == sorted([f"r{i}" for i in range(5)] * 2)
        rows = await engine.run(lambda tx: tx.query("SELECT v FROM t ORDER BY v"))
        assert [r["v"] for r in rows] == [f"r{i}" for i in range(5)]
        with pytest.raises(Exception):  # noqa: B017 - each engine's own unique-violation error
            await engine.run(insert("r0"))
    finally:
        await engine.close()


async def test_concurrent_units_each_keep_their_own_fate(engine: Engine) -> None:
    # SQLite groups concurrent units into one commit: a failing unit must still roll back alone.
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        def insert(v: str) -> Any:
            return lambda tx: tx.execute("INSERT INTO t (v) VALUES (?)", [v]).rowcount

        results = await asyncio.gather(*(engine.run(insert(f"v{i % 150}")) for i in range(200)),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        assert len(failed) == 50  # the 50 duplicates hit the UNIQUE constraint, alone
        assert await engine.run(lambda tx: tx.execute("SELECT count(*) FROM t").fetchone()[0]) == 150
        ids = await engine.run(lambda tx: [r[0] for r in tx.execute(
            "INSERT INTO t (v) VALUES ('x'), ('y') RETURNING id").fetchall()])
        assert len(ids) == 2 and ids[1] > ids[0]
    finally:
        await engine.close()


async def test_migrations_apply_once_in_order_and_a_newer_database_is_refused(engine: Engine, request: Any) -> None:
    engine.migrate("t", SCHEMA)
    await engine.open()
    await engine.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES ('old row')"))
    await engine.close()

    again = _reopen(engine)
    again.migrate("t", [*SCHEMA, "ALTER TABLE t ADD COLUMN note TEXT NOT NULL DEFAULT 'v2'"])
    await again.open()
    assert await again.run(lambda tx: tx.query("SELECT v, note FROM t")) == [{"v": "old row", "note": "v2"}]
    await again.close()

    old_code = _reopen(engine)
    old_code.migrate("t", SCHEMA)  # an older qunbot started on the upgraded database
    with pytest.raises(StorageError, match="newer than this qunbot"):
        await old_code.open()


async def test_a_schema_added_after_open_is_applied_at_once(engine: Engine) -> None:
    await engine.open()
    try:
        await engine.ensure("late", ["CREATE TABLE late (v TEXT)"])
        await engine.ensure("late", ["CREATE TABLE late (v TEXT)"])  # a plugin set up twice: nothing new
        assert await engine.run(lambda tx: tx.execute("SELECT count(*) FROM late").fetchone()[0]) == 0
    finally:
        await engine.close()


async def test_a_notification_reaches_listeners_after_the_commit_only(engine: Engine) -> None:
    heard: list[str] = []
    engine.subscribe("reminders", heard.append)
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        def rolled_back(tx: Tx) -> None:
            tx.notify("reminders", "never")
            raise RuntimeError("no commit")

        with pytest.raises(RuntimeError):
            await engine.transaction(rolled_back)
        await engine.transaction(lambda tx: tx.notify("reminders", "added 7"))
        for _ in range(200):
            if heard:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert heard == ["added 7"]
    finally:
        await engine.close()


async def test_notifications_cross_processes_on_postgresql(pg_url: str) -> None:
    one, two = PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)
    heard: list[str] = []
    two.subscribe("reminders", heard.append)
    await one.open()
    await two.open()
    try:
        await one.run(lambda tx: tx.notify("reminders", "deleted 3"))
        for _ in range(300):
            if heard:
                break
            await asyncio.sleep(0.01)
        assert heard == ["deleted 3"]
    finally:
        await one.close()
        await two.close()


async def test_a_gap_in_notifications_is_announced_once_listening_again(pg_url: str) -> None:
    # A notification sent while the LISTEN connection is down (a server restart, a network cut) is
    # lost for good: the engine says so once it listens again, so caches and timers re-read.
    from robot.storage.pgtesting import cut_listeners, listeners

    one, two = PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)
    heard: list[str] = []
    gaps: list[str] = []
    two.subscribe("reminders", heard.append)
    two.after_gap(lambda: gaps.append(f"after {len(heard)} heard"))
    await one.open()
    await two.open()
    try:
        two.listen_retry_s = one.listen_retry_s = 2.0  # a gap long enough to speak into
        await one.transaction(lambda tx: tx.notify("reminders", "before"))
        async with asyncio.timeout(10):
            while not heard:
                await asyncio.sleep(0.01)
        assert gaps == []  # opening is no gap
        await asyncio.to_thread(cut_listeners, pg_url)
        await one.transaction(lambda tx: tx.notify("reminders", "into the gap"))
        assert await asyncio.to_thread(listeners, pg_url) == 0  # nobody could have heard it
        async with asyncio.timeout(20):
            while not gaps:
                await asyncio.sleep(0.02)
        assert gaps == ["after 1 heard"]
        await one.transaction(lambda tx: tx.notify("reminders", "after"))
        async with asyncio.timeout(10):
            while len(heard) < 2:
                await asyncio.sleep(0.01)
        assert heard == ["before", "after"] and gaps == ["after 1 heard"]
    finally:
        await one.close()
        await two.close()


async def test_a_process_that_started_before_it_could_listen_re_reads_once_it_can(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # open() waits a while for the LISTEN connection, then goes on without it: whatever other processes
    # announced until it is up was missed, as after any gap.
    import psycopg

    real, tries = psycopg.AsyncConnection.connect, []

    async def refused_twice(*args: Any, **kwargs: Any) -> Any:
        tries.append(1)
        if len(tries) <= 2:
            raise psycopg.OperationalError("connection refused (for the test)")
        return await real(*args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refused_twice)
    db = PostgresDatabase(pg_url, max_size=2)
    db.listen_wait_s, db.listen_retry_s = 0.05, 0.2
    gaps: list[int] = []
    db.after_gap(lambda: gaps.append(len(tries)))
    await db.open()
    try:
        assert gaps == []  # started without listening
        async with asyncio.timeout(10):
            while not gaps:
                await asyncio.sleep(0.02)
        assert gaps == [3]  # the third attempt listens, and says what may have been missed
    finally:
        await db.close()


async def test_every_process_keeps_the_database_s_time_whatever_its_machine_s_clock_says(
        pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    from datetime import UTC, datetime, timedelta

    monkeypatch.setattr("robot.storage.postgres._SKEW_EVERY_S", 0.1)  # measured again every 0.1 s, not 5 min
    off = [40.0]
    ahead = PostgresDatabase(pg_url, max_size=2)
    ahead.local = lambda: datetime.now(UTC) + timedelta(seconds=off[0])  # a machine without NTP
    with caplog.at_level(logging.WARNING, logger="robot.storage.postgres"):
        await ahead.open()
    try:
        assert abs(ahead.skew + timedelta(seconds=40)) < timedelta(seconds=1)
        assert abs(ahead.now() - datetime.now(UTC)) < timedelta(seconds=1)
        assert "clock is 40.0 s ahead of the database's" in caplog.text
        off[0] = -5.0  # someone set the machine's clock (badly): the next measure follows
        async with asyncio.timeout(10):
            while abs(ahead.skew - timedelta(seconds=5)) > timedelta(seconds=1):
                await asyncio.sleep(0.02)
        assert abs(ahead.now() - datetime.now(UTC)) < timedelta(seconds=1)
    finally:
        await ahead.close()


async def test_an_unreachable_postgresql_is_one_clear_line_without_the_password() -> None:
    db = PostgresDatabase("postgresql://qunbot:hunter2-secret@127.0.0.1:1/qunbot?connect_timeout=1", max_size=1)
    with pytest.raises(StorageError) as caught:
        await asyncio.wait_for(db.open(), 30)
    text = str(caught.value)
    assert "hunter2" not in text and "127.0.0.1" in text and "***" in text


def _reopen(engine: Engine) -> Engine:
    if isinstance(engine, PostgresDatabase):
        return PostgresDatabase(engine.url, max_size=2)
    from robot.storage import SQLiteDatabase

    return SQLiteDatabase(engine.where)


async def test_pooled_connections_the_server_dropped_are_replaced_without_an_error(pg_url: str) -> None:
    import psycopg

    db = PostgresDatabase(pg_url, max_size=8)  # as many dead ones as the README's pool size (5 failed a unit)
    db.migrate("t", SCHEMA)
    await db.open()
    try:
        await asyncio.gather(*(db.run(lambda tx: tx.execute("SELECT pg_sleep(0.1)").fetchone()) for _ in range(8)))
        # An administrator (or an idle timeout, or a failover) closes every session of the bot's pool.
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                          "AND datname = current_database() AND query NOT LIKE 'LISTEN%'")
        await asyncio.sleep(0.2)
        added = await db.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES ('after') RETURNING v").fetchone()[0])
        assert added == "after"
    finally:
        await db.close()


async def test_text_with_a_nul_character_is_stored_and_found_on_both_engines(engine: Engine) -> None:
    # A peer's message or a model's answer may carry NUL (0x00); PostgreSQL's text cannot hold it.
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        await engine.run(lambda tx: tx.executemany("INSERT INTO t (v) VALUES (?)", [["a\x00b"], ["c\x00"]]))
        await engine.run(lambda tx: tx.execute("UPDATE t SET n = 1 WHERE v = ?", ["a\x00b"]))  # found again
        rows = await engine.run(lambda tx: tx.query("SELECT v, n FROM t WHERE v = ?", ["a\x00b"]))
        kept = "a\x00b" if engine.dialect == "sqlite" else "a\ufffdb"  # PostgreSQL: the replacement character
        assert rows == [{"v": kept, "n": 1}]
    finally:
        await engine.close()


async def test_text_with_a_lone_surrogate_is_stored_on_both_engines(engine: Engine) -> None:
    # Half an emoji ("\\ud83d" in a peer's JSON) cannot be UTF-8: it becomes U+FFFD instead of failing.
    engine.migrate("t", SCHEMA)
    await engine.open()
    try:
        await engine.run(lambda tx: tx.execute("INSERT INTO t (v) VALUES (?)", ["hi \ud83d"]))
        await engine.run(lambda tx: tx.executemany("INSERT INTO t (v) VALUES (?)", [["ok"], ["\udc00 there"]]))
        rows = await engine.run(lambda tx: tx.query("SELECT v FROM t ORDER BY id"))
        assert [r["v"] for r in rows] == ["hi \ufffd", "ok", "\ufffd there"]
    finally:
        await engine.close()


def test_arrays_reach_postgresql_as_psycopg_itself_would_send_them(pg_url: str) -> None:
    """Property: a list parameter (a burst's column for ``unnest``) arrives element for element, in
    order, as psycopg's own array adaptation delivers it (the reference): any text, quotes,
    backslashes, braces, commas, the word NULL, NUL characters and lone surrogates (both made
    U+FFFD), None, integers of any size, and the empty list."""
    import psycopg
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from robot.storage.pgtx import PostgresTx, _clean

    tricky = st.sampled_from(['"', "\\", "{", "}", ",", " ", "NULL", "null", "\x00", "\ud83d", "\t\n", "提醒"])
    anything = st.characters(codec=None, categories=None, exclude_categories=())
    texts = st.lists(st.none() | st.text(anything) | st.lists(tricky).map("".join), max_size=40)
    numbers = st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=40)

    with psycopg.connect(pg_url, autocommit=True) as conn:
        tx = PostgresTx(conn)

        def reference(sql: str, values: list[object]) -> object:  # psycopg's own list adaptation
            return conn.execute(sql.replace("?", "%s"), [[_clean(v) for v in values]]).fetchall()

        @settings(max_examples=150, deadline=None)
        @given(words=texts, counts=numbers)
        def check(words: list[str | None], counts: list[int | None]) -> None:
            sql = "SELECT v FROM unnest(?::text[]) WITH ORDINALITY AS u(v, i) ORDER BY i"
            got = tx.execute(sql, [words]).fetchall()
            assert got == reference(sql, words)
            assert [v for (v,) in got] == [None if w is None else _clean(w) for w in words]
            assert tx.execute("SELECT ?::bigint[]", [counts]).fetchone() == ((counts or []),)

        check()
