"""A busy instant's messages composed ahead (reminders.ahead): the same messages as an ordinary
pass, and nothing composed ahead outlives a deletion, a move, a late start or another process."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

import reminders
from reminders.ahead import AT_LEAST, LEAD
from reminders.firing import ON_TIME
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import Reminder, ReminderStore, new_id
from robot import iso
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel

SH = "Asia/Shanghai"
AT = datetime(2030, 1, 7, 0, 0, tzinfo=UTC)  # 08:00 in Shanghai
Factory = Callable[..., Awaitable[Any]]


def burst(count: int, at: datetime = AT, *, chats: int = 7) -> list[Reminder]:
    """``count`` daily 08:00 reminders of 40 people over ``chats`` chats, all due at ``at``."""
    return [Reminder(id=new_id(), owner=f"memory:u{i % 40}", owner_name=f"p{i % 40}", chat=f"memory:group:g{i % chats}",
                     type="daily", wall="08:00:00", zone=SH, weekday=None, content=f"#{i}", mode="text",
                     created_at=at - timedelta(days=1), updated_at=at - timedelta(days=1), next_fire=at)
            for i in range(count)]


def sent(rig: Any) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The messages the chats got: (key, chat, text, mentions), in key order."""
    return sorted((m.key, m.chat.key, m.text, m.mention) for m in rig.ch.sent)


def items(messages: list[tuple[str, str, str, tuple[str, ...]]]) -> list[str]:
    """Every reminder content the messages carry (one per line of a merged message)."""
    return [line.rsplit("：", 1)[-1] for _, _, text, _ in messages for line in text.split("\n") if "#" in line]


def composing(service: ReminderService) -> set[str]:
    """The ids of the reminders the service composes from now on (a rehearsed unit composes twice)."""
    ids: set[str] = set()
    compose = service._compose

    def spy(r: Reminder, now: datetime, **kwargs: Any) -> Any:
        ids.add(r.id)
        return compose(r, now, **kwargs)

    service._compose = spy  # type: ignore[method-assign]
    return ids


@pytest.mark.parametrize("merge_chat", [True, False])
async def test_a_burst_composed_ahead_sends_what_an_ordinary_pass_would(rig_factory: Factory, tmp_path: Path,
                                                                         merge_chat: bool) -> None:
    rows = burst(450)
    plain, ahead = [await rig_factory(AT - LEAD, cfg={"merge_chat": merge_chat}, data_dir=tmp_path / name)
                    for name in ("plain", "ahead")]
    for rig in (plain, ahead):
        await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    assert await ahead.service.ahead.prepare(AT) == 450
    composed = composing(ahead.service)
    fired_at = AT + timedelta(seconds=0.4)
    assert await plain.fire(fired_at) == 450 and await ahead.fire(fired_at) == 450
    assert not composed  # at the instant nothing was read and composed again
    assert sent(ahead) == sent(plain)
    assert sorted(items(sent(ahead))) == sorted(f"#{i}" for i in range(450))
    for rig in (plain, ahead):  # tomorrow's occurrence, written as of the firing (not of the composing)
        row = await rig.row(rows[0])
        assert row.next_fire == AT + timedelta(days=1) and row.last_fired == AT and row.updated_at == fired_at
    assert await ahead.fire(fired_at + timedelta(seconds=1)) == 0


async def test_batches_composed_ahead_keep_a_chats_reminders_together(rig_factory: Factory) -> None:
    rig = await rig_factory(AT - LEAD)
    rig.service.batch = 100  # 450 reminders in 7 chats: an ordinary pass cuts chats at its batches' edges
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, burst(450)))
    assert await rig.service.ahead.prepare(AT) == 450
    assert await rig.fire(AT) == 450
    messages = sent(rig)
    assert sorted(items(messages)) == sorted(f"#{i}" for i in range(450))
    per_chat = Counter(chat for _, chat, _, _ in messages)
    assert per_chat == {f"memory:group:g{c}": 2 for c in range(7)}  # 64-65 each: MERGE_MAX, then the rest


async def test_what_changed_after_composing_ahead_is_fired_as_it_is_now(rig_factory: Factory) -> None:
    rig = await rig_factory(AT - LEAD)
    rig.service.batch = 100
    rows = burst(300)
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    assert await rig.service.ahead.prepare(AT) == 300
    # Between the composing and the instant: one deleted, a chat renamed, one added for the same instant.
    assert await rig.service.delete(rows[5].id)
    assert await rig.service.store.move_chat("memory:group:g3", "memory:group:g3-new") > 0
    late_comer = burst(1)[0].evolve(id=new_id(), content="#new", chat="memory:group:g0")
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, [late_comer]))
    assert await rig.fire(AT + timedelta(seconds=0.3)) == 300
    messages = sent(rig)
    assert sorted(items(messages)) == sorted([f"#{i}" for i in range(300) if i != 5] + ["#new"])  # once each
    moved = {f"#{i}" for i in range(300) if i % 7 == 3}
    assert set(items([m for m in messages if m[1] == "memory:group:g3-new"])) == moved
    assert not [m for m in messages if m[1] == "memory:group:g3"]
    assert (await rig.row(rows[5])).status == "deleted"


async def test_a_burst_fired_later_than_on_time_is_composed_again_with_its_late_note(rig_factory: Factory) -> None:
    rig = await rig_factory(AT - LEAD)
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, burst(AT_LEAST)))
    assert await rig.service.ahead.prepare(AT) == AT_LEAST
    composed = composing(rig.service)
    assert await rig.fire(AT + ON_TIME + timedelta(seconds=5)) == AT_LEAST
    assert len(composed) == AT_LEAST
    texts = [text for _, _, text, _ in sent(rig)]
    assert texts and all("迟到提醒：原定 2030-01-07 08:00" in text for text in texts)
    assert len(items(sent(rig))) == AT_LEAST


async def test_a_quiet_instant_is_not_composed_ahead(rig_factory: Factory) -> None:
    rig = await rig_factory(AT - LEAD)
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, burst(AT_LEAST - 1)))
    assert await rig.service.ahead.prepare(AT) == 0
    composed = composing(rig.service)
    assert await rig.fire(AT) == AT_LEAST - 1 and len(composed) == AT_LEAST - 1


async def test_the_timer_composes_a_busy_instant_ahead_and_drops_the_job_with_its_reminders(
        rig_factory: Factory) -> None:
    rig = await rig_factory(AT - timedelta(minutes=10))
    scheduler = AsyncIOScheduler(timezone=ZoneInfo("UTC"))
    scheduler.start(paused=True)  # jobs are only looked at
    try:
        service = ReminderService(rig.service.store, rig.bot, ReminderSettings(), scheduler=scheduler,
                                  clock=rig.clock)
        busy, quiet = burst(AT_LEAST), burst(AT_LEAST - 1, AT + timedelta(minutes=1))
        await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, busy + quiet))
        assert await service.arm_window() == 2 * AT_LEAST - 1
        jobs = {job.id: job for job in scheduler.get_jobs()}
        assert jobs[f"rem:ahead:{iso(AT)}"].next_run_time == AT - LEAD
        assert f"rem:ahead:{iso(AT + timedelta(minutes=1))}" not in jobs  # too few to be worth it
        for r in busy:
            service.disarm(r.id)
        assert not {f"rem:ahead:{iso(AT)}", f"rem:at:{iso(AT)}"} & {job.id for job in scheduler.get_jobs()}
    finally:
        scheduler.shutdown(wait=False)


async def test_the_real_timer_composes_ahead_and_every_reminder_arrives_once(tmp_path: Path) -> None:
    ch = MemoryChannel()
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[ch], plugins=[reminders.plugin])
    await bot.start()
    try:
        deps = bot.deps_for(reminders.reminder_set)
        service: ReminderService = deps.service  # type: ignore[attr-defined]
        service.timer.lead = timedelta(seconds=1)  # (the real lead is a few seconds: the test would wait them)
        prepared: list[datetime] = []
        prepare = service.ahead.prepare

        async def noted(at: datetime) -> int:
            prepared.append(datetime.now(UTC))
            return await prepare(at)

        service.ahead.prepare = noted  # type: ignore[method-assign]
        due = (datetime.now(UTC) + timedelta(seconds=2.5)).replace(microsecond=0)
        rows = [r.evolve(type="once", wall=due.astimezone(ZoneInfo(SH)).strftime("%Y-%m-%d %H:%M:%S"))
                for r in burst(AT_LEAST + 20, due, chats=3)]
        await bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
        await service.arm_window()
        sent = await ch.wait_sent(3, timeout=15)  # a message per chat
        assert datetime.now(UTC) >= due
        assert len(prepared) == 1 and due - timedelta(seconds=1) <= prepared[0] < due
        contents = sorted(line.rsplit("：", 1)[-1] for m in sent for line in m.text.split("\n") if "#" in line)
        assert contents == sorted(r.content for r in rows)
        await asyncio.sleep(0.5)
        assert len(ch.sent) == 3  # and nothing more
    finally:
        await bot.stop()
