"""The reminders table: limits, short ids, prefix matching, deletion, the timer window, settings."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import reminders
from reminders.record import COLUMNS
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, LimitError, Reminder, ReminderStore, new_id
from reminders.timer import CHANNEL, parse_note
from robot.config import ConfigError, Settings
from robot.storage.postgres import PostgresDatabase
from robot.store import Database, Engine, Tx, iso

NOW = datetime(2030, 1, 7, 1, 0, tzinfo=UTC)
GROUP = "memory:group:g1"


def make(rid: str | None = None, *, owner: str = "memory:u1", chat: str = GROUP, at: datetime = NOW,
         next_fire: datetime | None = NOW + timedelta(hours=1), status: str = "active") -> Reminder:
    return Reminder(id=rid or new_id(), owner=owner, owner_name=owner.split(":")[1], chat=chat, type="daily",
                    wall="09:00:00", zone="Asia/Shanghai", weekday=None, content="喝水", mode="text",
                    created_at=at, updated_at=at, next_fire=next_fire, status=status)  # type: ignore[arg-type]


@pytest.fixture
async def store(engine: Engine) -> AsyncIterator[ReminderStore]:
    """The store on each engine (SQLite, and a fresh database of the real PostgreSQL)."""
    engine.migrate("reminders", SCHEMA)
    await engine.open()
    yield ReminderStore(engine)
    await engine.close()


@pytest.mark.parametrize("name", ["reminders", "reminders.record", "reminders.store", "reminders.service", "reminders.tools",
                                  "reminders.settings", "reminders.schedule", "reminders.timer"])
def test_exports_are_complete(name: str) -> None:
    module = importlib.import_module(name)
    assert len(set(module.__all__)) == len(module.__all__)
    assert all(hasattr(module, n) for n in module.__all__)
    defined = {n for n, obj in vars(module).items() if not n.startswith("_")
               and (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == name}
    assert defined <= set(module.__all__)


def test_plugin_shape() -> None:
    assert reminders.plugin.name == "reminders"
    assert reminders.plugin.tools.names() == ["reminder_set", "reminder_list", "reminder_delete"]
    tools = reminders.plugin.tools
    assert tools.resolve("remind") is reminders.reminder_set and reminders.reminder_set.require_at
    assert tools.resolve("reminders") is reminders.reminder_list
    assert tools.resolve("unremind") is reminders.reminder_delete


async def test_round_trip_keeps_aware_utc_instants(store: ReminderStore) -> None:
    original = make(next_fire=NOW + timedelta(hours=3, microseconds=250))
    await store.create(original, ReminderSettings(), NOW)
    loaded = await store.get(original.id)
    assert loaded == original
    assert loaded is not None and loaded.next_fire is not None and loaded.next_fire.tzinfo is not None
    assert loaded.owner_id == "u1" and loaded.chat_ref.kind == "group"


async def test_per_user_limit_counts_active_reminders_in_every_chat(store: ReminderStore) -> None:
    limits = ReminderSettings(max_per_user=2)
    await store.create(make(chat="memory:group:a"), limits, NOW)
    await store.create(make(chat="memory:private:u1"), limits, NOW)
    with pytest.raises(LimitError, match=r"already have 2 active reminders \(limit 2\)"):
        await store.create(make(chat="memory:group:b"), limits, NOW)
    await store.create(make(owner="memory:u2"), limits, NOW)  # someone else is not affected
    finished = (await store.for_owner("memory:u1"))[0]
    assert await store.delete(finished.id, NOW)
    await store.create(make(chat="memory:group:b"), limits, NOW)  # deleting frees a slot


async def test_per_chat_limit(store: ReminderStore) -> None:
    limits = ReminderSettings(max_per_chat=2)
    for user in ("u1", "u2"):
        await store.create(make(owner=f"memory:{user}"), limits, NOW)
    with pytest.raises(LimitError, match=r"this chat already has 2 active reminders"):
        await store.create(make(owner="memory:u3"), limits, NOW)
    await store.create(make(owner="memory:u3", chat="memory:group:other"), limits, NOW)


async def test_creation_rate_is_per_ten_minutes_and_counts_deleted_ones(store: ReminderStore) -> None:
    limits = ReminderSettings(create_per_10min=3)
    made = [make(at=NOW + timedelta(minutes=i)) for i in range(3)]
    for i, r in enumerate(made):
        await store.create(r, limits, NOW + timedelta(minutes=i))
    await store.delete(made[0].id, NOW)
    with pytest.raises(LimitError, match=r"created 3 reminders in the last 10 minutes"):
        await store.create(make(), limits, NOW + timedelta(minutes=5))
    await store.create(make(), limits, NOW + timedelta(minutes=10, seconds=1))


async def test_short_ids_are_the_shortest_unique_prefix_of_at_least_four(store: ReminderStore) -> None:
    ids = ["abcdef00" + "0" * 24, "abcdef11" + "0" * 24, "abd00000" + "0" * 24, "ff000000" + "0" * 24]
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [make(i) for i in ids]))
    short = await store.short_ids(ids)
    assert short == {ids[0]: "abcdef0", ids[1]: "abcdef1", ids[2]: "abd0", ids[3]: "ff00"}


async def test_match_by_prefix_is_scoped_to_the_owner(store: ReminderStore) -> None:
    mine = make("abc1" + "0" * 28)
    theirs = make("abc2" + "0" * 28, owner="memory:u2", chat="memory:group:g2")
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [mine, theirs]))
    assert [r.id for r in await store.match("ABC", owner="memory:u1")] == [mine.id]
    assert [r.id for r in await store.match("#abc1", owner="memory:u1")] == [mine.id]
    assert [r.id for r in await store.match("＃ＡＢＣ１", owner="memory:u1")] == [mine.id]  # typed full-width
    assert await store.match("abc2", owner="memory:u1") == []
    assert {r.id for r in await store.match("abc", owner=None)} == {mine.id, theirs.id}
    assert await store.match("x'; DROP TABLE reminders; --", owner=None) == []
    assert await store.match("", owner=None) == []
    # A bot admin's short prefix in a group: 25 of another chat's reminders due sooner crowded this chat's out
    others = [make(f"abc3{i:028x}", chat="memory:group:g9", next_fire=NOW + timedelta(minutes=1)) for i in range(25)]
    await store.db.run(lambda db: ReminderStore.insert_sync(db, others))
    assert [r.id for r in await store.match("abc", owner=None, chat=GROUP)] == [mine.id]


async def test_delete_and_delete_chat_only_touch_active_reminders(store: ReminderStore) -> None:
    a, b, c = make(), make(), make(chat="memory:group:g2")
    d, e = make(owner="memory:u2"), make(owner="memory:u2", chat="memory:group:g2")
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [a, b, c, d, e]))
    assert await store.delete(a.id, NOW)
    assert not await store.delete(a.id, NOW)  # already gone
    assert await store.delete_chat(GROUP, NOW, owner="memory:u2") == [d.id]  # only theirs, only here
    assert await store.delete_chat(GROUP, NOW) == [b.id]
    assert {r.id for r in await store.for_chat("memory:group:g2")} == {c.id, e.id}
    gone = await store.get(b.id)
    assert gone is not None and gone.status == "deleted" and gone.next_fire is None


async def test_upcoming_window_is_sorted_and_excludes_inactive(store: ReminderStore) -> None:
    soon = make(next_fire=NOW + timedelta(minutes=5))
    sooner = make(next_fire=NOW + timedelta(minutes=1))
    later = make(next_fire=NOW + timedelta(hours=5))
    done = make(next_fire=NOW + timedelta(minutes=2), status="done")
    due = make(next_fire=NOW)
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [soon, sooner, later, done, due]))
    window = await store.upcoming(NOW, NOW + timedelta(hours=1), 10)
    assert [(rid, zone) for rid, _, zone in window] == [(sooner.id, "Asia/Shanghai"), (soon.id, "Asia/Shanghai")]
    assert [rid for rid, _, _ in await store.upcoming(NOW, NOW + timedelta(hours=1), 1)] == [sooner.id]
    assert await store.next_due() == due.next_fire


async def test_the_timer_window_and_the_next_due_count_every_mode(store: ReminderStore) -> None:
    # (Both read the firing index, which leads with the mode: a mode left out would never be armed.)
    prompt = make(next_fire=NOW + timedelta(minutes=3)).evolve(mode="prompt")
    command = make(next_fire=NOW + timedelta(minutes=2)).evolve(mode="command")
    text = make(next_fire=NOW + timedelta(minutes=4))
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [prompt, command, text]))
    window = await store.upcoming(NOW, NOW + timedelta(hours=1), 10)
    assert [rid for rid, _, _ in window] == [command.id, prompt.id, text.id]
    assert await store.next_due() == command.next_fire


def test_a_reminder_is_read_back_from_its_columns_in_its_fields_order() -> None:
    assert [f.name for f in dataclasses.fields(Reminder)] == list(COLUMNS)
    one = make(next_fire=None).evolve(last_fired=NOW, failure_reported=True, account="bot1", source="digest")
    assert Reminder.from_values([iso(v) if isinstance(v, datetime) else v for v in one.row()]) == one


async def test_prune_forgets_only_old_finished_reminders(store: ReminderStore) -> None:
    old_done = make(status="done", at=NOW - timedelta(days=40))
    old_active = make(at=NOW - timedelta(days=40))
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [old_done, old_active]))
    assert await store.prune(NOW - timedelta(days=30)) == 1
    assert await store.get(old_done.id) is None and await store.get(old_active.id) is not None


def test_settings_from_toml_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(reminders={"grace_hours": 2, "prompt_concurrency": 3})
    section = settings.section("reminders", ReminderSettings)
    assert section.grace_hours == 2 and section.prompt_concurrency == 3
    assert section.max_per_user == 50 and section.prompt_tools == ["perplexity_search"]
    monkeypatch.setenv("QUNBOT_REMINDERS__PROMPT_TOOLS", '["a", "b"]')
    monkeypatch.setenv("QUNBOT_REMINDERS__MAX_PER_CHAT", "7")
    section = settings.section("reminders", ReminderSettings)
    assert section.prompt_tools == ["a", "b"] and section.max_per_chat == 7
    with pytest.raises(ConfigError, match=r"zones moved to the \[bot\] table"):  # an old config says where
        Settings(reminders={"zones": {GROUP: "Europe/Berlin"}}).section("reminders", ReminderSettings)
    monkeypatch.setenv("QUNBOT_REMINDERS__GRACE_HOURS", "-1")
    with pytest.raises(ConfigError, match=r"\[reminders\] grace_hours"):
        settings.section("reminders", ReminderSettings)


# --- the timer window (APScheduler jobs built from the table) -------------------------------------
async def test_timer_jobs_are_armed_from_the_table_within_the_horizon(store: ReminderStore) -> None:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from function_calls import Toolset
    from reminders.service import ReminderService

    class FakeBot:  # what the service reads from a bot when it only arms timers
        clock = staticmethod(lambda: NOW)
        tools = Toolset("none")  # the allowed commands and prompt tools are looked up in it

    soon = [make(next_fire=NOW + timedelta(minutes=m)) for m in (1, 2, 3)]
    berlin = make(next_fire=NOW + timedelta(minutes=4)).evolve(zone="Europe/Berlin")
    far, due = make(next_fire=NOW + timedelta(hours=2)), make(next_fire=NOW)
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [*soon, berlin, far, due]))
    scheduler = AsyncIOScheduler(timezone=ZoneInfo("UTC"))
    scheduler.start(paused=True)  # nothing may really run: the instants are in 2030 anyway
    try:
        service = ReminderService(store, FakeBot(), ReminderSettings(), scheduler=scheduler,  # type: ignore[arg-type]
                                  max_armed=3)
        assert await service.arm_window() == 3
        jobs = {job.id: job for job in scheduler.get_jobs()}
        assert set(jobs) == {f"rem:at:{iso(r.next_fire)}" for r in soon if r.next_fire} | {"rem:refill-next"}
        assert all(service.armed_at(r.id) == r.next_fire for r in soon)
        first = jobs[f"rem:at:{iso(NOW + timedelta(minutes=1))}"]
        assert first.next_run_time == soon[0].next_fire and first.misfire_grace_time is None and first.coalesce
        assert jobs["rem:refill-next"].next_run_time == soon[2].next_fire  # arms the next ones then
        assert await service.arm_window() == 0  # idempotent
        service.max_armed = 10
        assert await service.arm_window() == 1  # Berlin; `far` is beyond the horizon, `due` is for a pass
        assert service.armed_at(berlin.id) == berlin.next_fire
        assert service.armed_at(far.id) is None and service.armed_at(due.id) is None
        same = make(next_fire=soon[0].next_fire)  # a second reminder at the same instant shares its job
        service.arm(same)
        assert len(scheduler.get_jobs()) == 5 and service.armed_at(same.id) == soon[0].next_fire
        service.disarm(soon[0].id)
        service.disarm(soon[0].id)  # already gone: fine
        assert service.armed_at(soon[0].id) is None and scheduler.get_job(first.id) is not None  # `same` needs it
        service.disarm(same.id)
        assert scheduler.get_job(first.id) is None and len(scheduler.get_jobs()) == 4
    finally:
        scheduler.shutdown(wait=False)


async def test_a_database_at_an_earlier_schema_version_is_brought_up_to_date(engine: Engine) -> None:
    engine.migrate("reminders", ReminderStore.migrations()[:1])  # the first release of these steps
    await engine.open()
    await engine.run(lambda db: ReminderStore.insert_sync(db, [make("a" * 32)]))
    await engine.close()
    again = (PostgresDatabase(engine.url, max_size=4) if isinstance(engine, PostgresDatabase)
             else Database(engine.path))  # type: ignore[attr-defined]
    again.migrate("reminders", ReminderStore.migrations())
    await again.open()
    try:
        store = ReminderStore(again)
        assert await store.claim_run("a" * 32, NOW + timedelta(hours=1), "p1", NOW, timedelta(minutes=5))
        assert [r.id for r in await store.for_chat(GROUP)] == ["a" * 32]
    finally:
        await again.close()


async def test_a_database_from_before_accounts_gains_the_column(tmp_path: Path) -> None:
    db = Database(tmp_path / "old.sqlite3")
    await db.open()
    old = ("CREATE TABLE reminders (id TEXT PRIMARY KEY, owner TEXT NOT NULL, owner_name TEXT NOT NULL, "
           "chat TEXT NOT NULL, type TEXT NOT NULL, wall TEXT NOT NULL, zone TEXT NOT NULL, weekday INTEGER, "
           "content TEXT NOT NULL, mode TEXT NOT NULL DEFAULT 'text', created_at TEXT NOT NULL, "
           "updated_at TEXT NOT NULL, next_fire TEXT, last_fired TEXT, status TEXT NOT NULL, "
           "failure_reported INTEGER NOT NULL DEFAULT 0)")
    await db.run(lambda d: d.execute(old))
    await db.run(lambda d: d.execute(
        "INSERT INTO reminders VALUES ('a1b2c3d4', 'memory:u1', 'u1', 'memory:group:g1', 'daily', '09:00:00', "
        "'Asia/Shanghai', NULL, '喝水', 'text', '2030-01-07T01:00:00.000000Z', '2030-01-07T01:00:00.000000Z', "
        "'2030-01-07T02:00:00.000000Z', NULL, 'active', 0)"))
    await db.ensure("reminders", SCHEMA)
    await db.ensure("reminders", SCHEMA)  # idempotent
    store = ReminderStore(db)
    (old_row,) = await store.for_chat(GROUP)
    assert old_row.account == "" and old_row.content == "喝水"
    await store.create(make(rid="f" * 32).evolve(account="10002"), ReminderSettings(), NOW)
    assert (await store.get("f" * 32)).account == "10002"  # type: ignore[union-attr]
    await db.close()


# --- the contract on both engines: races, the claim, notifications -------------------------------
async def test_concurrent_creates_cannot_overrun_the_limits(store: ReminderStore) -> None:
    # On PostgreSQL the creates run at once on several connections (as from several processes).
    limits = ReminderSettings(max_per_user=3, max_per_chat=100, create_per_10min=100)
    results = await asyncio.gather(*(store.create(make(), limits, NOW) for _ in range(8)), return_exceptions=True)
    assert sum(isinstance(r, Reminder) for r in results) == 3
    assert all(isinstance(r, LimitError) for r in results if not isinstance(r, Reminder))
    assert len(await store.for_owner("memory:u1")) == 3


async def test_the_same_request_twice_stores_one_reminder(store: ReminderStore) -> None:
    first, again = make().evolve(source="req-1"), make().evolve(source="req-1")
    stored = await asyncio.gather(store.create(first, ReminderSettings(), NOW),
                                  store.create(again, ReminderSettings(), NOW))
    assert stored[0].id == stored[1].id and len(await store.for_chat(GROUP)) == 1


async def test_the_same_command_at_the_same_time_in_a_chat_is_stored_once(store: ReminderStore) -> None:
    # "/summary daily 22:00" typed twice, or by two of the group's admins at once (on PostgreSQL on
    # several connections, as from several processes): the group would get its digest twice.
    def digest(owner: str = "memory:u1", **changes: object) -> Reminder:
        return dataclasses.replace(make(owner=owner), **{"mode": "command", "content": "/summary", **changes})

    limits = ReminderSettings()
    stored = await asyncio.gather(*(store.create(digest(f"memory:a{i % 2}"), limits, NOW) for i in range(4)))
    assert len({r.id for r in stored}) == 1 and len(await store.for_chat(GROUP)) == 1
    # Another time, day, command or chat, or a plain text reminder, is another reminder.
    for other in (digest(wall="10:00:00"), digest(type="weekly", weekday=0), digest(content="/summary #g2 hours=24"),
                  digest(chat="memory:group:g2"), digest(mode="text"), digest(mode="text")):
        assert (await store.create(other, limits, NOW)).id == other.id
    assert (await store.create(digest(), limits, NOW)).id == stored[0].id
    await store.delete(stored[0].id, NOW)  # once deleted, it may be set again
    again = digest()
    assert (await store.create(again, limits, NOW)).id == again.id


async def test_a_claimed_occurrence_is_skipped_by_a_second_claim(store: ReminderStore) -> None:
    due = [make(next_fire=NOW - timedelta(seconds=s)) for s in (3, 2, 1)]
    await store.db.run(lambda db: ReminderStore.insert_sync(db, due))
    if store.db.dialect == "sqlite":  # one writer: a pass's transaction holds every due row
        assert [r.id for r in await store.db.run(lambda db: ReminderStore.due_sync(
            db, NOW, "text", 10, claim=True))] == [r.id for r in due]
        return
    held = threading.Event()
    release = threading.Event()

    def first(db: Tx) -> list[str]:
        mine = [r.id for r in ReminderStore.due_sync(db, NOW, "text", 2, claim=True)]
        held.set()
        release.wait(10)
        return mine

    task = asyncio.ensure_future(store.db.transaction(first))
    await asyncio.to_thread(held.wait, 10)
    other = await store.db.transaction(lambda db: [r.id for r in ReminderStore.due_sync(db, NOW, "text", 10,
                                                                                          claim=True)])
    release.set()
    assert await task == [due[0].id, due[1].id]
    assert other == [due[2].id]  # the first two are being fired elsewhere: not waited for, not doubled


async def test_deletions_are_announced_to_every_process(store: ReminderStore) -> None:
    heard: list[str] = []
    got = asyncio.Event()

    def listener(payload: str) -> None:
        heard.append(payload)
        got.set()

    store.db.subscribe(CHANNEL, listener)
    a, b, c = make(), make(), make()
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [a, b, c]))
    assert await store.delete(a.id, NOW)
    assert sorted(await store.delete_chat(GROUP, NOW)) == sorted([b.id, c.id])
    assert not await store.delete(a.id, NOW)  # nothing deleted: nothing announced
    async with asyncio.timeout(10):
        while len(heard) < 2:
            got.clear()
            await got.wait()
    assert parse_note(heard[0]) == ([], [a.id])
    assert parse_note(heard[1])[0] == [] and sorted(parse_note(heard[1])[1]) == sorted([b.id, c.id])
    with pytest.raises(ValueError):
        parse_note("launch everything")


async def test_erasing_with_no_chat_named_erases_nothing(store: ReminderStore) -> None:
    mine = make()
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [mine]))
    assert await store.erase_owner("memory:u1", [], "memory") == []
    assert await store.erase_owner("memory:u1", None, "memory") == [mine.id]
    assert await store.get(mine.id) is None


async def test_one_holder_runs_a_due_prompt_until_its_claim_expires(store: ReminderStore) -> None:
    lease = timedelta(minutes=15)
    prompt, other = make(next_fire=NOW).evolve(mode="prompt"), make(next_fire=NOW).evolve(mode="prompt")
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [prompt, other]))
    assert await store.claim_run(prompt.id, NOW, "p1", NOW, lease)
    assert not await store.claim_run(prompt.id, NOW, "p2", NOW + timedelta(minutes=1), lease)
    assert await store.claim_run(prompt.id, NOW, "p1", NOW + timedelta(minutes=1), lease)  # its own retry
    assert await store.claim_run(prompt.id, NOW, "p2", NOW + timedelta(minutes=17), lease)  # p1 died
    assert not await store.claim_run(prompt.id, NOW - timedelta(days=1), "p3", NOW + timedelta(hours=1), lease)
    done = prompt.evolve(next_fire=NOW + timedelta(days=1), last_fired=NOW)
    await store.db.run(lambda db: ReminderStore.save_sync(db, done))  # fired: the claim goes with it
    assert await store.claim_run(prompt.id, NOW + timedelta(days=1), "p3", NOW + timedelta(days=1), lease)
    wins = await asyncio.gather(*(store.claim_run(other.id, NOW, f"q{i}", NOW, lease) for i in range(6)))
    assert sum(wins) == 1  # at once, from several connections: one runs the model


async def test_saving_many_reminders_writes_each_ones_state_and_the_last_of_one_given_twice(
        store: ReminderStore) -> None:
    rows = [make(next_fire=NOW) for _ in range(3)]
    await store.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    fired = rows[0].evolve(next_fire=NOW + timedelta(days=1), last_fired=NOW, failure_reported=True)
    done = rows[1].evolve(next_fire=None, last_fired=NOW, status="done")
    again = fired.evolve(next_fire=NOW + timedelta(days=2))
    await store.db.run(lambda db: ReminderStore.save_sync(db, fired, done, again))  # PostgreSQL: one statement
    got = {r.id: await store.get(r.id) for r in rows}
    first, second, third = (got[r.id] for r in rows)
    assert first is not None and (first.next_fire, first.last_fired, first.failure_reported) == (
        NOW + timedelta(days=2), NOW, True)
    assert second is not None and (second.status, second.next_fire, second.last_fired) == ("done", None, NOW)
    assert third == rows[2]  # not named: untouched


async def test_saving_a_fired_reminder_deleted_meanwhile_leaves_it_deleted(store: ReminderStore) -> None:
    # save_sync writes rows its transaction read as active; one deleted since (by a caller that did not
    # hold the row) must not come back, whether it would stay active or finish.
    stays, ends = make(next_fire=NOW), make(next_fire=NOW)
    await store.db.run(lambda db: ReminderStore.insert_sync(db, [stays, ends]))
    assert await store.delete(stays.id, NOW) and await store.delete(ends.id, NOW)
    fired = stays.evolve(next_fire=NOW + timedelta(days=1), last_fired=NOW, updated_at=NOW)
    done = ends.evolve(next_fire=None, last_fired=NOW, status="done", updated_at=NOW)
    for saved in ([fired], [done], [fired, done]):
        await store.db.run(lambda db, saved=saved: ReminderStore.save_sync(db, *saved))  # type: ignore[misc]
        for r in (stays, ends):
            got = await store.get(r.id)
            assert got is not None and (got.status, got.next_fire) == ("deleted", None)
