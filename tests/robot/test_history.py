"""Chat history: per-chat windows, ranges, forgetting a person, retention, summary marks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from robot.history import HistoryStore
from robot.message import ChatRef, Message, Sender
from robot.storage import Engine, SQLiteDatabase, Tx

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")


@pytest.fixture
async def store(engine: Engine) -> AsyncIterator[HistoryStore]:
    db = engine  # SQLite and a real PostgreSQL
    history = HistoryStore(db, max_messages=3, max_age=timedelta(days=1))
    await db.open()
    yield history
    await db.close()


def msg(text: str, minute: int, *, chat: ChatRef = G1, user: str = "u1", name: str = "",
        from_bot: bool = False) -> Message:
    return Message(chat=chat, sender=Sender(user_id=user, name=name), message_id=f"{chat.chat_id}-{minute}",
                   text=text, timestamp=T0 + timedelta(minutes=minute), from_bot=from_bot)


async def test_recent_is_oldest_first_newest_n_and_per_chat(store: HistoryStore) -> None:
    for i in range(5):
        await store.record(msg(f"g1 #{i}", i))
    await store.record(msg("other chat", 2, chat=G2))
    recent = await store.recent(G1, limit=3)
    assert [e.text for e in recent] == ["g1 #2", "g1 #3", "g1 #4"]
    assert all(e.chat == G1.key for e in recent)
    before = await store.recent(G1, before=T0 + timedelta(minutes=2))
    assert [e.text for e in before] == ["g1 #0", "g1 #1"]


async def test_what_was_said_in_the_same_second_before_a_message_is_its_context(store: HistoryStore) -> None:
    # Platforms stamp whole seconds: "moved to 3pm" and "@bot when is it?" often share one.
    first = msg("the meeting moved to 3pm", 5, user="u1")
    asking = Message(chat=G1, sender=Sender(user_id="u2"), message_id="ask", text="@bot when is it?",
                     timestamp=first.timestamp)
    later = Message(chat=G1, sender=Sender(user_id="u3"), message_id="later", text="after the ask",
                    timestamp=first.timestamp)
    for m in (first, asking, later):
        await store.record(m)
    context = await store.recent(G1, before=asking.timestamp, before_message="ask")
    assert [e.text for e in context] == ["the meeting moved to 3pm"]
    assert await store.recent(G1, before=asking.timestamp) == []


async def test_entry_keeps_sender_and_becomes_a_history_turn(store: HistoryStore) -> None:
    await store.record(msg("hi", 0, user="20002", name="小明"))
    await store.record(msg("hello", 1, user="bot", name="qunbot", from_bot=True))
    first, second = await store.recent(G1)
    assert (first.user_id, first.name, first.message_id, first.from_bot) == ("20002", "小明", "g1-0", False)
    assert first.at == T0
    assert second.from_bot and second.turn().from_bot
    assert first.turn().name == "小明" and first.turn().text == "hi"


async def test_a_window_read_again_shows_rows_changed_or_deleted_since(store: HistoryStore) -> None:
    # Windows are kept between reads (the next message reads the same rows): what another process
    # changed or deleted in between must show, never what was kept.
    for i in range(3):
        await store.record(msg(f"g1 #{i}", i, user=f"u{i}"))
    first = await store.recent(G1)
    assert [e.text for e in first] == ["g1 #0", "g1 #1", "g1 #2"]
    await store.db.run(lambda db: db.execute("UPDATE history SET text = ? WHERE message_id = ?", ["edited", "g1-1"]))
    await store.db.run(lambda db: db.execute("DELETE FROM history WHERE message_id = ?", ["g1-0"]))
    again = await store.recent(G1)
    assert [(e.text, e.user_id) for e in again] == [("edited", "u1"), ("g1 #2", "u2")]
    assert again[1] is first[2]  # unchanged rows are not built again
    await store.db.run(lambda db: db.execute("UPDATE history SET chat = ? WHERE chat = ?", [G2.key, G1.key]))
    assert await store.recent(G1) == []
    assert [(e.chat, e.text) for e in await store.recent(G2)] == [(G2.key, "edited"), (G2.key, "g1 #2")]


async def test_a_sender_without_a_name_is_stored_under_the_id(store: HistoryStore) -> None:
    await store.record(msg("x", 0, user="20003"))
    (entry,) = await store.recent(G1)
    assert entry.name == "20003"


async def test_since_is_a_half_open_range(store: HistoryStore) -> None:
    for i in range(4):
        await store.record(msg(f"#{i}", i * 10))
    got = await store.since(G1, T0 + timedelta(minutes=10), end=T0 + timedelta(minutes=30))
    assert [e.text for e in got] == ["#1", "#2"]


async def test_forget_user_deletes_one_persons_messages_in_one_chat(store: HistoryStore) -> None:
    await store.record(msg("mine", 0, user="u1"))
    await store.record(msg("theirs", 1, user="u2"))
    await store.record(msg("mine elsewhere", 2, user="u1", chat=G2))
    assert await store.forget_user(G1, "u1") == 1
    assert [e.text for e in await store.recent(G1)] == ["theirs"]
    assert [e.text for e in await store.recent(G2)] == ["mine elsewhere"]


async def test_forget_message_deletes_one_recalled_message_of_its_sender_only(store: HistoryStore) -> None:
    """A message recalled on its platform: its row goes, and no other (the same id in another chat,
    another person's message under that id, a bot message)."""
    await store.record(msg("recalled", 0, user="u1"))
    await store.record(msg("kept", 1, user="u1"))
    await store.record(msg("same id, other chat", 0, user="u1", chat=G2))
    assert await store.forget_message(G1, "g1-0", "u2") == 0  # not u2's message: a notice naming them takes nothing
    assert await store.forget_message(G1, "") == 0
    assert await store.forget_message(G1, "g1-0", "u1") == 1
    assert [e.text for e in await store.recent(G1)] == ["kept"]
    assert [e.text for e in await store.recent(G2)] == ["same id, other chat"]
    assert await store.forget_message(G2, "g2-0") == 1  # sender unknown (an anonymous member): by id alone


async def test_retention_drops_old_and_excess_messages(store: HistoryStore) -> None:
    await store.record(msg("ancient", -3000))
    for i in range(5):
        await store.record(msg(f"#{i}", i))
    removed = await store.apply_retention(T0 + timedelta(hours=1))
    assert removed == 3  # one too old, two beyond max_messages=3
    assert [e.text for e in await store.recent(G1)] == ["#2", "#3", "#4"]




async def test_a_v01_sqlite_file_keeps_its_messages_and_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:  # as v0.1 left it: no schema_version, no reply_to/to_user/role
        conn.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, chat TEXT NOT NULL, user_id TEXT NOT NULL, "
                     "name TEXT NOT NULL, text TEXT NOT NULL, ts TEXT NOT NULL, from_bot INTEGER NOT NULL "
                     "DEFAULT 0, message_id TEXT)")
        conn.execute("INSERT INTO history (chat, user_id, name, text, ts, message_id) VALUES "
                     "('memory:group:g1', 'u1', 'Ann', 'kept', '2026-03-01T07:59:00.000000Z', 'm0')")
    conn.close()
    db = SQLiteDatabase(path)
    history = HistoryStore(db)
    await db.open()
    try:
        await history.record(msg("new", 1))
        assert [e.text for e in await history.recent(G1)] == ["kept", "new"]
        assert await history.last_role(G1, "u1") == "member"  # the role column was added

        def version(tx: Tx) -> int:
            return int(tx.execute("SELECT version FROM schema_version WHERE component = 'history'").fetchone()[0])

        assert await db.run(version) == 3  # step 2: history_to (every person a bot message addresses); 3: chat_moves
    finally:
        await db.close()
