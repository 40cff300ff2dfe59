"""A bot message addressed to several people (a reminder message shared by a chat) is theirs each:
``/forget me`` by any of them removes it, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.privacy import ForgetRequest, forget_sync, traces_sync
from robot.snapshots import SnapshotStore
from robot.storage import Engine, SQLiteDatabase, Tx
from robot.storage.postgres import PostgresDatabase

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
G1 = ChatRef(platform="memory", chat_id="g1", kind="group")


def twin(engine: Engine) -> Engine:
    """Another engine on the same database (a previous release's process)."""
    if isinstance(engine, SQLiteDatabase):
        return SQLiteDatabase(engine.path)
    assert isinstance(engine, PostgresDatabase)
    return PostgresDatabase(engine.url, max_size=2)


@pytest.mark.parametrize("together", [False, True], ids=["queued-alone", "queued-together"])
async def test_forget_me_by_the_second_person_of_a_shared_message_removes_it(engine: Engine, together: bool) -> None:
    history = HistoryStore(engine)
    SnapshotStore(engine).secret = b"k" * 32
    outbox = Outbox(engine, clock=lambda: T0)
    await engine.open()
    try:
        shared = OutgoingMessage(key="rem:1:+2", chat=G1, text="⏰ 提醒（3 条）：Ann Bob Cat", mention=("u1", "u2", "u3"))
        alone = OutgoingMessage(key="rem:9", chat=G1, text="⏰ 提醒：Dan's own", mention=("u4",))

        def fill(tx: Tx) -> None:
            if together:  # a firing pass's way: one statement per table (PostgreSQL: arrays of rows)
                assert outbox.enqueue_many_sync(tx, [shared, alone, shared]) == [True, True, False]
            else:
                assert outbox.enqueue_sync(tx, shared) and outbox.enqueue_sync(tx, alone)
            # The shared message failed for good: its row keeps the text until someone forgets.
            tx.execute("UPDATE outbox SET status = 'failed' WHERE key = ?", [shared.key])

        await engine.run(fill)
        chats = await engine.run(lambda tx: traces_sync(tx, "memory", "u2"))
        assert G1.key in {c.key for c in chats}  # /forget me all finds the chat through the shared message
        request = ForgetRequest("memory", "u2", (G1,))
        assert await engine.transaction(lambda tx: forget_sync(tx, request)) == (0, 1)
        assert [e.text for e in await history.recent(G1)] == ["⏰ 提醒：Dan's own"]
        rows = await engine.run(lambda tx: {r["key"]: (r["text"], json.loads(r["mention"]))
                                            for r in tx.query("SELECT key, text, mention FROM outbox")})
        assert rows[shared.key] == ("", [])
        assert rows[alone.key] == (alone.text, ["u4"])  # pending, and someone else's
        # Nothing names them any more: the side rows went with the message.
        left = await engine.run(lambda tx: tx.query("SELECT user_id FROM history_to"))
        assert left == []
        # The other people of the shared message find nothing left either.
        for person in ("u1", "u3"):
            again = ForgetRequest("memory", person, (G1,))
            assert await engine.transaction(lambda tx, r=again: forget_sync(tx, r)) == (0, 0)
    finally:
        await engine.close()


async def test_retention_drops_the_addressees_with_their_message(engine: Engine) -> None:
    history = HistoryStore(engine, max_messages=1)
    await engine.open()
    try:
        def fill(tx: Tx) -> None:
            HistoryStore.insert_sync(tx, G1, "bot", "bot", "old shared", T0, from_bot=True, to_user="u1",
                                     to_users=("u1", "u2"))
            HistoryStore.insert_sync(tx, G1, "u5", "Eve", "newer", T0.replace(minute=5))

        await engine.run(fill)
        assert await engine.run(lambda tx: tx.query("SELECT user_id FROM history_to")) == [{"user_id": "u2"}]
        assert await history.apply_retention(T0.replace(minute=6)) == 1
        assert await engine.run(lambda tx: tx.query("SELECT user_id FROM history_to")) == []
        assert [e.text for e in await history.recent(G1)] == ["newer"]
    finally:
        await engine.close()


async def test_a_history_at_schema_version_1_gains_the_addressees_table(engine: Engine) -> None:
    old = twin(engine)
    old.migrate("history", [HistoryStore._schema])  # what the previous release registered
    await old.open()
    try:
        await old.run(lambda tx: HistoryStore.insert_sync(tx, G1, "bot", "bot", "before", T0, from_bot=True,
                                                          to_user="u1"))
    finally:
        await old.close()
    history = HistoryStore(engine)
    SnapshotStore(engine).secret = b"k" * 32
    Outbox(engine)  # /forget me touches their tables too
    await engine.open()
    try:
        version = await engine.run(lambda tx: tx.execute(
            "SELECT version FROM schema_version WHERE component = 'history'").fetchone())
        assert version is not None and version[0] == 3  # (3: chat_moves)
        await engine.run(lambda tx: HistoryStore.insert_sync(tx, G1, "bot", "bot", "after", T0, from_bot=True,
                                                             to_user="u1", to_users=("u1", "u2")))
        assert [e.text for e in await history.recent(G1)] == ["before", "after"]
        request = ForgetRequest("memory", "u2", (G1,))
        assert await engine.transaction(lambda tx: forget_sync(tx, request)) == (0, 1)
        assert [e.text for e in await history.recent(G1)] == ["before"]
    finally:
        await engine.close()


async def test_many_messages_queued_at_once_keep_their_order_and_each_its_own_addressees(engine: Engine) -> None:
    """A firing pass queues hundreds of messages with a few statements: each row must still name the
    people of its own message (``/forget me`` removes the right one), in the order they were queued."""
    history = HistoryStore(engine)
    SnapshotStore(engine).secret = b"k" * 32  # /forget me touches its table too
    outbox = Outbox(engine, clock=lambda: T0)
    await engine.open()
    try:
        before = OutgoingMessage(key="rem:old", chat=G1, text="queued earlier", mention=("u0",))
        await engine.run(lambda tx: outbox.enqueue_sync(tx, before))
        batch = [OutgoingMessage(key=f"rem:{i}", chat=G1, text=f"message {i}",
                                 mention=tuple(f"p{i}-{j}" for j in range(i % 5 + 1))) for i in range(40)]
        batch.insert(7, before)  # queued before: not again
        batch.insert(20, batch[3])  # twice in the batch: the first counts
        added = await engine.run(lambda tx: outbox.enqueue_many_sync(tx, batch))
        assert added == [m.key != "rem:old" and i != 20 for i, m in enumerate(batch)]
        expected = ["queued earlier", *(f"message {i}" for i in range(40))]
        assert [str(r["text"]) for r in await outbox.rows("pending")] == expected
        assert [e.text for e in await history.recent(G1, limit=100)] == expected
        named = await engine.run(lambda tx: {(str(r["text"]), str(r["user_id"])) for r in tx.query(
            "SELECT h.text, t.user_id FROM history_to t JOIN history h ON h.id = t.history_id")})
        assert named == {(f"message {i}", f"p{i}-{j}") for i in range(40) for j in range(1, i % 5 + 1)}
        # The one-at-a-time path still finds free ids after a batch took its own.
        await engine.run(lambda tx: outbox.enqueue_sync(tx, OutgoingMessage(key="rem:late", chat=G1, text="late",
                                                                             mention=("a", "b"))))
        request = ForgetRequest("memory", "p33-3", (G1,))
        assert await engine.transaction(lambda tx: forget_sync(tx, request)) == (0, 1)
        texts = [e.text for e in await history.recent(G1, limit=100)]
        assert "message 33" not in texts and texts[-1] == "late" and len(texts) == 41
    finally:
        await engine.close()


@pytest.mark.unrehearsed  # bare SQLiteTx transactions, no engine: a rehearsed run would repeat it as is
def test_any_batch_queues_like_one_message_at_a_time() -> None:
    """Property: whatever the batch (sizes across the chunk bounds, keys queued before or repeated,
    addressee lists of any length), queueing it at once leaves the same rows, the same flags and
    the same people per message as queueing its messages one by one."""
    import sqlite3

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from robot.history import ADDRESSEES
    from robot.outbox_store import SCHEMA, queue_sync
    from robot.storage.base import render_step
    from robot.storage.sqlite import SQLiteTx

    def fresh() -> SQLiteTx:
        tx = SQLiteTx(sqlite3.connect(":memory:"))
        for step in [*SCHEMA, HistoryStore._schema, ADDRESSEES]:
            if callable(step):
                step(tx)
            else:
                for statement in render_step(step, "sqlite").split(";"):
                    tx.execute(statement)
        return tx

    def state(tx: SQLiteTx) -> tuple[object, ...]:
        rows = tx.query("SELECT key, text, mention FROM outbox ORDER BY created_at, rowid")
        said = tx.query("SELECT text, to_user FROM history ORDER BY ts, id")
        named = {(r["text"], r["user_id"]) for r in tx.query(
            "SELECT h.text, t.user_id FROM history_to t JOIN history h ON h.id = t.history_id")}
        return rows, said, named

    def sized(n: int, of: st.SearchStrategy[object]) -> st.SearchStrategy[list[object]]:
        return st.lists(of, min_size=n, max_size=n)  # lengths drawn evenly, not mostly short ones

    # Who a message names: a drawn count, the people derived from a few draws (a step of 0 repeats
    # one person), so that a batch of long lists stays small to generate.
    message = st.builds(lambda k, n, first, step: OutgoingMessage(
        key=f"k{k}", chat=G1, text=f"text of k{k}", mention=tuple(f"p{(first + j * step) % 201}" for j in range(n))),
        st.integers(0, 150), st.integers(0, 140), st.integers(0, 200), st.integers(0, 3))

    @settings(max_examples=60, deadline=None)
    @given(earlier=st.lists(message, max_size=5), batch=st.integers(0, 140).flatmap(lambda n: sized(n, message)))
    def check(earlier: list[OutgoingMessage], batch: list[OutgoingMessage]) -> None:
        one, many = fresh(), fresh()
        for tx in (one, many):
            for m in earlier:
                queue_sync(tx, [m], T0, "bot", "qunbot")
        flags_one = [queue_sync(one, [m], T0, "bot", "qunbot")[0] for m in batch]
        assert queue_sync(many, batch, T0, "bot", "qunbot") == flags_one
        assert state(many) == state(one)

    check()
