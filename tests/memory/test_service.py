"""The memory service on both engines (SQLite and a real PostgreSQL): remember, recall, forget,
decay, sleep and dreams, embeddings, and the v0.1 SQLite file the first migration adopts."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from function_calls import Caller, ToolError
from memory import EmbeddingClient, MemoryService, MemorySettings
from memory.store import MIGRATIONS
from memory.testing import FakeEmbeddingServer, HashingModel
from robot import Engine, Tx
from robot.storage import SQLiteDatabase

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def person(user: str, chat: str = "g1", kind: str = "group", **kw: object) -> Caller:
    fields: dict[str, object] = {"user_name": user.upper(), **kw}
    return Caller(platform="t", user_id=user, chat_id=chat, chat_kind=kind, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def service(engine: Engine) -> AsyncIterator[MemoryService]:
    svc = MemoryService(engine, MemorySettings(sleep_time="21:00"), clock=Clock())
    await engine.open()
    await svc.prepare()
    yield svc
    await engine.close()


def texts(rows: list[object]) -> list[str]:
    return [r.text for r in rows]  # type: ignore[attr-defined]


async def test_two_character_words_and_questions_recall_and_strengthen(service: MemoryService) -> None:
    u1 = person("u1")
    await service.remember(u1, "我对花生过敏", "me")
    assert texts(await service.recall(u1, "过敏")) == ["我对花生过敏"]
    assert texts(await service.recall(u1, "我对什么过敏？")) == ["我对花生过敏"]
    assert await service.recall(u1, "周会") == []
    await service.remember(u1, "我们组周会改到周四了", "group")
    assert texts(await service.recall(person("u2"), "周会")) == ["我们组周会改到周四了"]
    levels = {r.text: r.strength.level for r in await service.listing(u1)}
    assert levels == {"我对花生过敏": 1, "我们组周会改到周四了": 1}


async def test_a_memory_is_seen_only_in_its_chat_and_by_its_author(service: MemoryService) -> None:
    u1, dm = person("u1"), person("u1", chat="u1", kind="private")
    await service.remember(u1, "我对花生过敏", "me")
    await service.remember(u1, "本群的年会在三亚", "group")
    await service.remember(dm, "我的银行卡尾号是1234", "me")
    assert texts(await service.recall(person("u2"), "过敏")) == []
    assert texts(await service.recall(person("u1", chat="g2"), "过敏")) == []
    assert texts(await service.recall(dm, "过敏")) == []
    assert texts(await service.recall(person("u2"), "年会")) == ["本群的年会在三亚"]
    assert texts(await service.recall(dm, "银行卡")) == ["我的银行卡尾号是1234"]
    assert texts(await service.listing(person("u2"))) == ["本群的年会在三亚"]


async def test_delete_by_id_follows_who_may_and_leaves_no_index_entry(service: MemoryService) -> None:
    mine = (await service.remember(person("u1"), "我对花生过敏", "me")).id
    group = (await service.remember(person("u1"), "周会改到周四", "group")).id
    assert await service.delete(person("u2", is_admin=True), mine) is None  # (no memory here: the core answers)
    assert "只有保存者和群管理员" in await service.delete(person("u2"), group)
    assert f"已删除记忆 #{group}" in await service.delete(person("u3", is_admin=True), group)
    assert await service.delete(person("u1", chat="g2"), mine) is None
    assert f"已删除记忆 #{mine}" in await service.delete(person("u1"), mine)
    found = await service.db.run(lambda db: service.store.lexical_search(db, "t:group:g1", "u1", "花生 周会", 10))
    assert found == [] and await service.listing(person("u1")) == []


async def test_forget_a_person_and_the_chats_dreams(service: MemoryService) -> None:
    await service.remember(person("u1"), "我对花生过敏", "me")
    await service.remember(person("u1", chat="g2"), "我住在杭州", "me")
    await service.remember(person("u1", chat="u1", kind="private"), "我的猫叫年糕", "me")
    await service.remember(person("u2"), "我对猫过敏", "me")
    await service.db.run(lambda db: service.store.add_dream(db, "t:group:g1", T0, 1, "梦见花生"))
    assert await service.forget_person("other", "u1", None) == 0
    assert await service.forget_person("t", "u1", ["t:group:g2"]) == 1
    assert await service.forget_person("t", "u1", None) == 2
    assert await service.db.run(lambda db: service.store.dreams(db, "t:group:g1")) == []
    assert texts(await service.recall(person("u2"), "过敏")) == ["我对猫过敏"]


async def test_forget_person_takes_the_dreams_quoting_their_memories_wherever_asked(service: MemoryService) -> None:
    """A dream records whose memories it quotes: found without any other trace of them in its chat."""
    clock = service.clock
    assert isinstance(clock, Clock)
    await service.remember(person("u1"), "老王的手机号是一三八", "group")
    await service.remember(person("u2", chat="g2"), "阳台的花要浇水", "group")
    clock.now = T0 + timedelta(hours=8)
    for group in ("g1", "g2"):
        assert (await service.sleep(f"t:group:{group}")).dream
    dreamt = lambda chat: service.db.run(lambda db: service.store.dreams(db, chat))  # noqa: E731
    assert await service.forget_person("t", "u1", ["t:group:g3"]) == 0
    assert len(await dreamt("t:group:g1")) == 1  # not among the chats asked for
    assert await service.forget_person("t", "u1", None) == 0
    assert await dreamt("t:group:g1") == [] and len(await dreamt("t:group:g2")) == 1


async def test_misses_decay_and_sleep_deletes_and_dreams(service: MemoryService) -> None:
    clock = service.clock
    assert isinstance(clock, Clock)
    u1 = person("u1")
    await service.remember(u1, "每天的站会在九点", "me")
    await service.remember(u1, "站会以前在十点", "me")
    await service.remember(u1, "阳台的花要浇水", "group")
    clock.now = T0 + timedelta(hours=2)
    service.settings.top_n = 1
    top = await service.recall(u1, "九点的站会")  # the other match is missed: idle 2 h > 1 h at level 0
    assert texts(top) == ["每天的站会在九点"]
    assert sorted(texts(await service.listing(u1))) == ["每天的站会在九点", "阳台的花要浇水"]
    report = await service.sleep("t:group:g1")  # level 1 (3 h) survives, the untouched one goes
    assert (report.sampled, report.deleted) == (2, 1) and report.dream and "浇水" in report.dream
    dreams = await service.db.run(lambda db: service.store.dreams(db, "t:group:g1"))
    assert len(dreams) == 1 and "浇水" in dreams[0][1]


async def test_nightly_sleep_once_a_night(service: MemoryService) -> None:
    clock = service.clock
    assert isinstance(clock, Clock)
    await service.remember(person("u1"), "阳台的花要浇水", "group")
    assert await service.nightly() == []  # 12:00 UTC, before 21:00
    clock.now = T0.replace(hour=21, minute=5)
    assert [r.deleted for r in await service.nightly()] == [1]
    assert await service.nightly() == []


async def test_a_sleep_time_just_before_midnight_is_slept_by_the_first_check_after_it(service: MemoryService) -> None:
    """sleep_time "23:55" with checks every ten minutes at 23:53 and 00:03: the one after midnight sleeps
    the night before (it compared "00:03" with "23:55" and never slept); still once a night."""
    clock = service.clock
    assert isinstance(clock, Clock)
    service.settings = MemorySettings(sleep_time="23:55")
    await service.remember(person("u1"), "阳台的花要浇水", "group")
    clock.now = T0.replace(hour=23, minute=53)
    assert await service.nightly() == []
    clock.now += timedelta(minutes=10)  # 00:03 the next day
    assert [r.chat for r in await service.nightly()] == ["t:group:g1"]
    clock.now += timedelta(minutes=10)
    assert await service.nightly() == []
    await service.remember(person("u1"), "阳台的花要浇水", "group")
    clock.now = T0.replace(day=3, hour=12)  # midday: last night is done and tonight's is not due
    assert await service.nightly() == []
    clock.now = T0.replace(day=3, hour=23, minute=57)
    assert [r.chat for r in await service.nightly()] == ["t:group:g1"]


async def test_two_processes_sleep_a_chat_once_a_night(service: MemoryService, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process runs the nightly check: the night is claimed in the database, so one sleeps it."""
    engine = service.db
    other_db = engine if engine.dialect == "sqlite" else type(engine)(engine.url)  # type: ignore[call-arg,attr-defined]
    other = MemoryService(other_db, service.settings, clock=service.clock)
    if other_db is not engine:
        await other_db.open()
    for i in range(3):
        await service.remember(person("u1", chat=f"g{i}"), "阳台的花要浇水", "group")
    clock = service.clock
    assert isinstance(clock, Clock)
    clock.now = T0.replace(hour=21, minute=5)
    failing = ["t:group:g0"]

    async def flaky(chat: str, **kw: bool) -> object:
        if chat in failing:
            failing.remove(chat)
            raise RuntimeError("the model fell over")
        return await MemoryService.sleep(service, chat, **kw)

    monkeypatch.setattr(service, "sleep", flaky)
    monkeypatch.setattr(other, "sleep", flaky)
    first, second = await asyncio.gather(service.nightly(), other.nightly())
    slept = sorted(r.chat for r in [*first, *second])
    assert slept in (["t:group:g1", "t:group:g2"], ["t:group:g0", "t:group:g1", "t:group:g2"])
    retried = await service.nightly() + await other.nightly()  # a failed night is tried again, once
    assert sorted(slept + [r.chat for r in retried]) == ["t:group:g0", "t:group:g1", "t:group:g2"]
    assert await service.nightly() + await other.nightly() == []
    if other_db is not engine:
        await other_db.close()


async def test_bad_input_is_refused_clearly_and_a_nul_is_no_crash(service: MemoryService) -> None:
    with pytest.raises(ToolError, match="empty"):
        await service.remember(person("u1"), " \n ", "me")
    with pytest.raises(ToolError, match="group"):
        await service.remember(person("u1", chat="u1", kind="private"), "周会", "group")
    row = await service.remember(person("u1", user_name="U\x00ONE"), "我对\x00花生过敏", "me")  # PostgreSQL: no NUL
    assert texts(await service.recall(person("u1"), "花生")) == ["我对 花生过敏"] == [row.text]
    assert [r.user_name for r in await service.listing(person("u1"))] == ["UONE"]
    word = "д" * 1500  # one 3,000-byte term: longer than a PostgreSQL lexeme may be (2,047 bytes)
    await service.remember(person("u2"), word, "me")
    await service.remember(person("u2"), "д" * 1400, "me")
    assert texts(await service.recall(person("u2"), word)) == [word]


async def test_vectors_round_trip_and_find_a_paraphrase(engine: Engine) -> None:
    concepts = {"allergic": "ALLERGY", "过敏": "ALLERGY", "peanuts": "PEANUT", "花生": "PEANUT"}
    async with FakeEmbeddingServer(HashingModel(concepts=concepts)) as server:
        embedder = EmbeddingClient("fake-embed", server.base_url, "k")
        svc = MemoryService(engine, MemorySettings(), clock=Clock(), embedder=embedder)
        await engine.open()
        try:
            await svc.prepare()
            await svc.remember(person("u1"), "I am allergic to peanuts", "me")
            await svc.remember(person("u1"), "周会改到周四", "me")
            stored = await engine.run(lambda db: svc.store.vectors(db, "t:group:g1"))
            assert [len(v[3]) for v in stored] == [256 * 4, 256 * 4]  # float32 bytes, as written
            assert texts(await svc.recall(person("u1"), "花生过敏")) == ["I am allergic to peanuts"]
            assert await svc.recall(person("u2"), "花生过敏") == []
        finally:
            await svc.stop()
            await engine.close()


CONCEPTS = {"allergic": "ALLERGY", "过敏": "ALLERGY", "peanuts": "PEANUT", "花生": "PEANUT", "cat": "CAT",
            "猫": "CAT", "named": "NAME", "名字": "NAME"}


async def two_processes(pg_url: str, server: FakeEmbeddingServer, listen_retry_s: float = 0.5) -> list[MemoryService]:
    """Two memory services, each on its own engine (pool and LISTEN connection), on one PostgreSQL."""
    from robot.storage.postgres import PostgresDatabase

    procs: list[MemoryService] = []
    for _ in range(2):
        db = PostgresDatabase(pg_url, max_size=2)
        procs.append(MemoryService(db, MemorySettings(), clock=Clock(),
                                   embedder=EmbeddingClient("fake-embed", server.base_url, "k")))
        await db.open()
        db.listen_retry_s = listen_retry_s
        await procs[-1].prepare()
    return procs


async def test_another_process_sees_new_and_deleted_vectors_at_once(pg_url: str) -> None:
    """Each process caches a chat's vectors: a write in one makes the others reload that chat."""
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server:
        procs = await two_processes(pg_url, server)
        a, b = procs
        peanuts = await a.remember(person("u1"), "I am allergic to peanuts", "me")
        assert texts(await b.recall(person("u1"), "花生过敏")) == ["I am allergic to peanuts"]  # b caches g1
        await a.remember(person("u1"), "My cat is named Mochi", "me")
        for _ in range(1000):  # the notification crosses over LISTEN/NOTIFY (up to 10 s on a loaded machine)
            if not b.index.loaded("t:group:g1"):
                break
            await asyncio.sleep(0.01)
        assert texts(await b.recall(person("u1"), "猫的名字")) == ["My cat is named Mochi"]
        assert texts(await a.recall(person("u1"), "猫的名字")) == ["My cat is named Mochi"]  # a's own write
        await a.delete(person("u1"), peanuts.id)
        for _ in range(1000):
            if not b.index.loaded("t:group:g1"):
                break
            await asyncio.sleep(0.01)
        assert not b.index.loaded("t:group:g1")
        for svc in procs:
            await svc.stop()
            await svc.db.close()


async def test_a_process_that_missed_a_change_while_its_notifications_were_cut_finds_it(pg_url: str) -> None:
    """A memory saved elsewhere while this process heard nothing (a database restart, a network cut):
    its cached vectors are dropped once it listens again, so its next recall finds the memory."""
    from robot.storage.pgtesting import cut_listeners, listeners

    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server:
        procs = await two_processes(pg_url, server, listen_retry_s=3.0)  # a gap long enough to write into
        a, b = procs
        try:
            await a.remember(person("u1"), "I am allergic to peanuts", "me")
            assert texts(await b.recall(person("u1"), "花生过敏")) == ["I am allergic to peanuts"]  # b caches g1
            await asyncio.to_thread(cut_listeners, pg_url)
            await a.remember(person("u1"), "My cat is named Mochi", "me")
            assert await asyncio.to_thread(listeners, pg_url) == 0  # b cannot have heard of it
            for _ in range(2000):  # b listens again after 3 s, then drops what it cached
                if not b.index.loaded("t:group:g1"):
                    break
                await asyncio.sleep(0.01)
            assert texts(await b.recall(person("u1"), "猫的名字")) == ["My cat is named Mochi"]
        finally:
            for svc in procs:
                await svc.stop()
                await svc.db.close()


async def test_memories_indexed_by_an_older_version_are_indexed_anew(service: MemoryService) -> None:
    """Schema step 1 indexed CJK right after a letter as one word with it: a database at step 1 is
    re-indexed at start, so its old memories are found like new ones."""
    row = await service.remember(person("u1"), "ABC公司的周会改到周四", "group")
    old = "abc公司的周会改到周四"  # step 1's terms for it

    def at_step_one(db: Tx) -> None:
        db.execute("UPDATE schema_version SET version = 1 WHERE component = 'memory'")
        if db.dialect == "postgresql":
            db.execute("UPDATE memories SET terms = ?::tsvector, n_terms = 1 WHERE id = ?", [f"'{old}':1", row.id])
        else:
            db.execute("DELETE FROM memory_terms WHERE rowid = ?", [row.id])
            db.execute("INSERT INTO memory_terms (rowid, terms) VALUES (?, ?)", [row.id, old])

    await service.db.transaction(at_step_one)
    assert await service.recall(person("u2"), "周会") == []
    restarted = MemoryService(service.db, MemorySettings(), clock=Clock())
    await restarted.prepare()
    assert texts(await restarted.recall(person("u2"), "周会")) == ["ABC公司的周会改到周四"]


def test_a_v01_sqlite_file_is_adopted_with_its_memories(tmp_path: Path) -> None:
    """v0.1 made the tables without a version row: step 1 keeps them and their rows."""
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE memories (id INTEGER PRIMARY KEY, chat TEXT NOT NULL, kind TEXT NOT NULL
            CHECK (kind IN ('user', 'group', 'private')), user_id TEXT NOT NULL, user_name TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL, created TEXT NOT NULL, time TEXT NOT NULL, level INTEGER NOT NULL DEFAULT 0,
            long_term INTEGER NOT NULL DEFAULT 0, decayed_at TEXT, vector BLOB);
        CREATE VIRTUAL TABLE memory_terms USING fts5(terms, tokenize = 'unicode61');
        CREATE VIRTUAL TABLE memory_trigrams USING fts5(text, tokenize = 'trigram');
        CREATE TABLE memory_dreams (id INTEGER PRIMARY KEY, chat TEXT NOT NULL, created TEXT NOT NULL,
            fragments INTEGER NOT NULL, text TEXT NOT NULL);
        CREATE TABLE memory_sleeps (chat TEXT PRIMARY KEY, local_date TEXT NOT NULL);
        INSERT INTO memories (chat, kind, user_id, text, created, time)
            VALUES ('t:group:g1', 'group', 'u1', '周会改到周四', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z');
        INSERT INTO memory_terms (rowid, terms) VALUES (1, '周 会 改 到 周 四 周会 会改 改到 到周 周四');
    """)
    conn.commit()
    conn.close()

    async def main() -> None:
        db = SQLiteDatabase(path)
        svc = MemoryService(db, MemorySettings(), clock=Clock())
        await db.open()
        await svc.prepare()
        assert texts(await svc.recall(person("u2"), "周会")) == ["周会改到周四"]
        assert await db.run(lambda tx: tx.execute(
            "SELECT version FROM schema_version WHERE component = 'memory'").fetchone()[0]) == len(MIGRATIONS)
        await db.close()

    asyncio.run(main())
