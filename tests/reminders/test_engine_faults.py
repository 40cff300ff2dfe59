"""The engine under faults: no reminder without a timer, failed passes retried, a locked or full DB.

These run the real APScheduler with a hand-set clock for "now": a reminder that has no job and is
never kicked would wait for the 30-minute refill, so waiting a few seconds for it tells them apart.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from function_calls import ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, text
from reminders.schedule import parse_schedule
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, ReminderStore
from tests.reminders.conftest import ALICE, SH, Clock, Launch

T0 = datetime(2030, 1, 7, 4, 0, tzinfo=UTC)


def local(instant: datetime) -> str:
    return instant.astimezone(ZoneInfo(SH)).strftime("%Y-%m-%d %H:%M:%S")


Build = Callable[..., Awaitable[tuple[ReminderService, Any, Clock]]]


@pytest.fixture
async def build(launch: Launch) -> AsyncIterator[Build]:
    """A started bot plus a ReminderService with a real scheduler; the service is stopped at teardown."""
    services: list[ReminderService] = []

    async def make(now: datetime = T0, *, start: bool = True, model: Any = None) -> tuple[ReminderService, Any, Clock]:
        bot, ch, clock = await launch(now, model=model)
        await bot.db.ensure("reminders", SCHEMA)
        settings = bot.settings.section("reminders", ReminderSettings)
        service = ReminderService(ReminderStore(bot.db), bot, settings,
                                  scheduler=AsyncIOScheduler(timezone=ZoneInfo("UTC")))
        services.append(service)
        if start:
            await service.start()
        return service, ch, clock

    yield make
    for service in services:
        await service.stop()


async def test_a_reminder_whose_time_passed_while_the_db_thread_was_busy_fires_at_once(build: Build) -> None:
    service, ch, clock = await build()
    due = T0 + timedelta(seconds=2)
    busy = asyncio.ensure_future(service.store.db.run_raw(lambda _tx: time.sleep(0.3)))
    creating = asyncio.ensure_future(service.create(ALICE, parse_schedule("once", local(due), SH, None), "开会", "text"))
    await asyncio.sleep(0.05)
    clock.now = due + timedelta(seconds=1)  # the insert is still queued behind the busy DB thread
    await busy
    await creating
    sent = await ch.wait_sent(1, timeout=5)
    assert [m.text for m in sent] == ["⏰ 提醒：开会"]


async def test_arming_a_reminder_that_is_already_due_fires_it(build: Build) -> None:
    service, ch, clock = await build()
    made = await service.create(ALICE, parse_schedule("once", local(T0 + timedelta(minutes=5)), SH, None),
                                "喝水", "text")
    service.disarm(made.id)
    clock.now = T0 + timedelta(minutes=6)
    service.arm(made)  # due now: a job in the past would never run, so a pass must
    assert [m.text for m in await ch.wait_sent(1, timeout=5)] == ["⏰ 提醒：喝水"]


async def test_a_reminder_due_between_the_start_up_pass_and_arming_the_window_fires(build: Build) -> None:
    service, ch, clock = await build(start=False)
    due = T0 + timedelta(seconds=1)
    await service.create(ALICE, parse_schedule("once", local(due), SH, None), "起来活动", "text")
    real_fire = service.fire_due

    async def slow_fire(*args: Any, **kwargs: Any) -> Any:
        report = await real_fire(*args, **kwargs)
        clock.now = due + timedelta(seconds=1)  # start-up's pass took a while
        return report

    service.fire_due = slow_fire  # type: ignore[method-assign]
    await service.start()
    assert [m.text for m in await ch.wait_sent(1, timeout=5)] == ["⏰ 提醒：起来活动"]


async def test_a_failed_pass_is_retried_soon_and_fires_once_the_lock_is_released(build: Build,
                                                                                 tmp_path: Path) -> None:
    service, ch, clock = await build()
    await service.create(ALICE, parse_schedule("once", local(T0 + timedelta(minutes=1)), SH, None), "交周报", "text")
    await service.store.db.run(lambda db: db.execute("PRAGMA busy_timeout = 100"))
    other = sqlite3.connect(tmp_path / "qunbot.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        clock.now = T0 + timedelta(minutes=1)
        service.kick()
        await asyncio.sleep(0.6)  # a few passes fail meanwhile
        assert ch.sent == []
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert [m.text for m in await ch.wait_sent(1, timeout=5)] == ["⏰ 提醒：交周报"]


def fill_disk(db: Any) -> None:
    """Make the database full the way a full disk does: SQLite answers SQLITE_FULL to any write that
    needs a new page. Every table a message path writes is packed with finished rows first."""
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    rows = {
        "reminders": ("INSERT INTO reminders (id, owner, owner_name, chat, type, wall, zone, content, mode, "
                      "created_at, updated_at, status) VALUES (?, 'memory:x', 'x', 'memory:group:x', 'once', "
                      "'2000-01-01 00:00:00', 'UTC', ?, 'text', '2000', '2000', 'done')"),
        "outbox": ("INSERT INTO outbox (key, platform, chat, text, status, next_at, created_at) "
                   "VALUES (?, 'memory', 'memory:group:x', ?, 'sent', '2000', '2000')"),
        "history": "INSERT INTO history (chat, user_id, name, text, ts, from_bot, message_id) "
                   "VALUES ('memory:group:x', ?, 'x', ?, '2000', 0, '')",
        "seen": "INSERT INTO seen (platform, message_id, seen_at) VALUES ('x', ?, ?)",
    }
    for size in (2000, 200, 20, 1):
        for sql in rows.values():
            for n in range(100_000):
                try:
                    db.execute(sql, [f"ballast-{size}-{n}", "x" * size])
                except sqlite3.OperationalError as exc:
                    assert "full" in str(exc)
                    break


async def test_due_reminders_fire_once_a_full_disk_has_room_again(build: Build) -> None:
    service, ch, clock = await build()
    await service.create(ALICE, parse_schedule("once", local(T0 + timedelta(minutes=1)), SH, None), "吃药", "text")
    db = service.store.db
    await db.run_raw(fill_disk)
    clock.now = T0 + timedelta(minutes=1)
    service.kick()
    await asyncio.sleep(0.6)
    assert ch.sent == []
    await db.run(lambda d: d.execute("PRAGMA max_page_count = 1073741823"))  # room again
    assert [m.text for m in await ch.wait_sent(1, timeout=5)] == ["⏰ 提醒：吃药"]


async def test_remind_with_the_disk_full_answers_try_later_and_stores_nothing(start: Any) -> None:
    chat = await start()
    await chat.bot.db.run_raw(fill_disk)
    reply = await chat.say('/remind once "2030-01-07 15:00" 开会')
    assert "暂时无法保存，请稍后再试" in reply
    await chat.bot.db.run(lambda d: d.execute("PRAGMA max_page_count = 1073741823"))
    assert await chat.active() == []
    # Room again: the same request now works (the failed message left nothing half-done).
    assert (await chat.say('/remind once "2030-01-07 15:00" 开会')).startswith("好的，已设置提醒")


async def test_remind_while_another_process_holds_the_lock_answers_try_later(start: Any, tmp_path: Path) -> None:
    chat = await start()
    await chat.bot.db.run(lambda d: d.execute("PRAGMA busy_timeout = 200"))  # stands for the 30 s wait
    other = sqlite3.connect(tmp_path / "qunbot.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        reply = await chat.say('/remind once "2030-01-07 15:00" 开会')
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert "暂时无法保存，请稍后再试" in reply
    assert await chat.active() == []


@pytest.mark.unrehearsed(reason="lists the statements run")
@pytest.mark.parametrize("durable", [True, False])
async def test_creating_and_deleting_a_reminder_commits_with_a_disk_sync_unless_turned_off(
        start: Any, durable: bool) -> None:
    chat = await start(cfg={"durable_writes": durable})
    statements: list[str] = []
    await chat.bot.db.run(lambda d: d.conn.set_trace_callback(statements.append))
    try:
        reply = await chat.say('/remind once "2030-01-07 15:00" 开会')
        assert (await chat.say(f"/unremind {reply.split('#')[1][:4]}")).startswith("已删除提醒")
    finally:
        await chat.bot.db.run(lambda d: d.conn.set_trace_callback(None))
    synced: list[str] = []  # the writes made while synchronous=FULL was in force
    full = False
    for sql in statements:
        if sql.upper().startswith("PRAGMA SYNCHRONOUS"):
            full = sql.upper().endswith("FULL")
        elif full and sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
            synced.append(sql.split("(")[0].split(" SET")[0].strip())
    expected = ["INSERT INTO reminders", "INSERT INTO outbox", "INSERT INTO history",
                "UPDATE reminders"] if durable else []
    assert synced == expected


async def test_a_scheduled_prompt_whose_answer_could_not_be_saved_runs_again_soon(build: Any, tmp_path: Path) -> None:
    lock: list[sqlite3.Connection] = []

    def answer(request: ModelRequest) -> ModelResponse:
        if not lock:  # the first run's answer meets a database locked by another process for a moment
            other = sqlite3.connect(tmp_path / "qunbot.sqlite3", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            lock.append(other)
            asyncio.get_running_loop().call_later(0.5, other.rollback)
        return text("北京：晴，-3°C")

    service, ch, clock = await build(model=ScriptedModel(answer))
    await service.store.db.run(lambda db: db.execute("PRAGMA busy_timeout = 100"))
    await service.create(ALICE, parse_schedule("once", local(T0 + timedelta(minutes=1)), SH, None), "北京天气",
                         "prompt")
    clock.now = T0 + timedelta(minutes=1)
    service.kick()
    try:
        assert [m.text for m in await ch.wait_sent(1, timeout=8)] == ["北京：晴，-3°C"]
    finally:
        for conn in lock:
            conn.close()
