"""Scheduled digests (command-mode reminders) and digests sent to an admin in private, through the real pipeline."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

import reminders
import summary
from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.config import Settings
from robot.message import OutgoingMessage, Role
from robot.testing import MemoryChannel
from summary.digest import gaps
from summary.tools import SummaryArgs
from summary.window import read_mark

SH = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)  # Monday 12:00 in Shanghai


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def sh(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=SH).astimezone(UTC)


@asynccontextmanager
async def running(tmp_path: Path, clock: Clock, model: Any = None,
                  admins: tuple[str, ...] = ()) -> AsyncIterator[tuple[Bot, MemoryChannel]]:
    ch = MemoryChannel(clock=clock)
    settings = Settings(bot={"data_dir": tmp_path, "timezone": "Asia/Shanghai", "admins": list(admins)},
                        limits={"user_burst": 50, "chat_burst": 50}, summary={"user_cooldown_s": 60})
    bot = Bot(settings, model=model, channels=[ch], plugins=[reminders.plugin, summary.plugin], clock=clock)
    await bot.start()
    try:
        yield bot, ch
    finally:
        await bot.stop()


async def say(ch: MemoryChannel, line: str, *, user: str = "a1", role: Role = "member", private: bool = False,
              at: datetime | None = None) -> list[OutgoingMessage]:
    """Send ``line`` and return every message the bot sent because of it."""
    before = len(ch.sent)
    chat = ch.chat(user, "private") if private else ch.chat("g1")
    await ch.inject(line, user=user, name=user, chat=chat, role=role, at=at or ch.clock(), at_bot=not private,
                    message_id=uuid.uuid4().hex)  # a restarted channel counts ids from 1 again
    return (await ch.wait_sent(before + 1))[before:]


def test_schedule_words_and_gaps() -> None:
    args = SummaryArgs(period="daily 9:05 22:00 to me")
    assert (args.daily_at, args.to_me, args.period) == (["09:05", "22:00"], True, None)
    assert SummaryArgs(period="#g7 每天 22:00").group == "g7"
    assert SummaryArgs(period="昨天 私信我").period == "昨天"
    for bad in ("daily", "daily 25:00", "daily 22:00 昨天", "#a#b daily 22:00"):
        with pytest.raises(ValidationError):
            SummaryArgs(period=bad)
    with pytest.raises(ValidationError, match="daily 不能再带"):
        SummaryArgs(period="daily 22:00", hours=3)
    assert gaps(["22:00"]) == {"22:00": 24}
    assert gaps(["22:00", "12:00", "18:30"]) == {"12:00": 14, "18:30": 6.5, "22:00": 3.5}


async def test_a_bad_schedule_is_explained_in_chinese(tmp_path: Path) -> None:
    # [bot] language defaults to "zh": the line saying what is wrong is Chinese, like its frame.
    async with running(tmp_path, Clock()) as (_bot, ch):
        for line, why in [("/summary daily 25:00", "时间「25:00」不对：请写 HH:MM，例如 22:00"),
                          ("/summary daily", "daily 后面要写时间，例如 /summary daily 22:00"),
                          ("/summary daily 1:00 2:00 3:00 4:00 5:00 6:00 7:00", "每天最多 6 个时间"),
                          ("/summary #a#b daily 22:00", "群号「#a#b」不对")]:
            reply = (await say(ch, line, role="admin"))[0].text
            assert reply.startswith("参数有误：\n- 参数：") and why in reply, reply


async def test_a_daily_digest_survives_a_restart_lists_as_a_reminder_and_is_cancelled(tmp_path: Path) -> None:
    clock = Clock()
    model = ScriptedModel(lambda r: text("今天的总结：周六爬山"))
    async with running(tmp_path, clock, model) as (bot, ch):
        refused = await say(ch, "/summary daily 22:00", user="m1")
        assert "只有群主、群管理员" in refused[0].text
        made = await say(ch, "/summary daily 22:00", role="admin")
        assert "已设置定时总结，在本群发送" in made[0].text and "每天 22:00" in made[0].text
        listed = await say(ch, "/reminders", role="admin")
        assert "[定时命令] /summary" in listed[0].text
        await ch.inject("结论：周六去爬山", user="m1", at=sh(23, 15))
    # The bot is down from 15:00 to 22:00:30; the digest fires when it comes back.
    clock.now = sh(23, 22) + timedelta(seconds=30)
    model.requests.clear()
    async with running(tmp_path, clock, model) as (bot, ch):
        sent = await ch.wait_sent(1)
        digest = sent[0]
        assert digest.chat == ch.chat("g1") and digest.mention == ("a1",)
        assert digest.text.startswith("【群聊总结】") and digest.text.endswith("今天的总结：周六爬山")
        assert any("周六去爬山" in str(r.messages) for r in model.requests)
        assert await read_mark(bot.db, ch.chat("g1")) is not None  # the group's own digest moves its mark
        short = (await say(ch, "/reminders", role="admin"))[0].text.split("#", 1)[1].split(" ", 1)[0]
        gone = await say(ch, f"/unremind {short}", role="admin")
        assert "已删除提醒" in gone[0].text
        await ch.inject("结论：周日去游泳", user="m1", at=sh(24, 15), message_id="later")
        deps = bot.deps_for(reminders.reminder_set)
        count = len(ch.sent)
        clock.now = sh(24, 22, 1)
        report = await deps.service.fire_due(clock.now)
        await bot.outbox.flush()
        assert report.delivered == 0 and len(ch.sent) == count


async def test_the_same_digest_scheduled_again_is_the_one_already_set(tmp_path: Path) -> None:
    clock = Clock()
    model = ScriptedModel(lambda r: text("今天的总结：周六爬山"))
    async with running(tmp_path, clock, model) as (bot, ch):
        await ch.inject("结论：周六去爬山", user="m1", at=sh(23, 15))
        first = (await say(ch, "/summary daily 22:00", role="admin"))[0].text
        again = (await say(ch, "/summary daily 22:00", role="admin"))[0].text
        other = (await say(ch, "/summary daily 22:00", user="a2", role="owner"))[0].text  # another admin
        short = first.split("#", 1)[1].split(" ", 1)[0]
        assert f"#{short} 每天 22:00" in again and f"#{short} 每天 22:00" in other
        mine = [(await say(ch, "/summary daily 22:00 to me", role="admin"))[0].text for _ in range(2)]
        assert mine[0] == mine[1] and "私信发给你（群 g1）：\n#" in mine[0]  # the same id twice
        store = bot.deps_for(reminders.reminder_set).store
        assert len(await store.for_chat("memory:group:g1")) == 1
        assert len(await store.for_chat("memory:private:a1")) == 1
        before = len(ch.sent)
        clock.now = sh(23, 22)
        report = await bot.deps_for(reminders.reminder_set).service.fire_due(clock.now)
        await bot.outbox.flush()
        in_group = [m for m in ch.sent[before:] if m.chat == ch.chat("g1")]
        assert report.delivered == 2 and len(in_group) == 1 and "周六爬山" in in_group[0].text


async def test_a_group_admin_gets_the_digest_in_private_without_moving_the_groups_mark(tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock) as (bot, ch):
        await ch.inject("结论：v2.3 推迟到 6 月 18 日", user="m1", at=NOW - timedelta(minutes=5))
        refused = await say(ch, "/summary to me", user="m1")
        assert "只有群主、群管理员" in refused[0].text and len(refused) == 1
        before = len(ch.sent)
        await say(ch, "/summary to me", user="a1", role="owner")
        out = (await ch.wait_sent(before + 2))[before:]  # the private summary and the group's ack, in any order
        assert len(out) == 2
        private = next(m for m in out if m.chat == ch.chat("a1", "private"))
        ack = next(m for m in out if m.chat == ch.chat("g1"))
        assert ack.text.startswith("已把本群的总结私信发给你") and "v2.3" not in ack.text
        assert private.text.startswith("【群聊总结】群 g1") and "v2.3 推迟到 6 月 18 日" in private.text
        assert await read_mark(bot.db, ch.chat("g1")) is None
        # In private, a group's admin (by their newest message there) may ask for it too; a member may not.
        assert "v2.3" in (await say(ch, "/summary #g1", user="a1", private=True))[0].text
        assert "只有机器人管理员或该群的群主/管理员" in (await say(ch, "/summary #g1", user="m1", private=True))[0].text


async def test_scheduled_private_digests_cover_the_time_since_the_previous_one_and_recheck_the_role(
        tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock) as (bot, ch):
        made = await say(ch, "/summary daily 21:00 22:00 to me", role="admin")
        assert "私信发给你（群 g1）" in made[0].text and "每天 21:00" in made[0].text and "每天 22:00" in made[0].text
        assert len(await bot.deps_for(reminders.reminder_set).store.for_owner("memory:a1")) == 2
        listed = await say(ch, "/reminders", user="a1", private=True)
        assert "[定时命令] /summary #g1 hours=23" in listed[0].text and "hours=1" in listed[0].text
        await ch.inject("决定：周五发版本", user="m1", at=sh(23, 20, 30))
        await ch.inject("我来写测试用例", user="m2", at=sh(23, 21, 30))
        service = bot.deps_for(reminders.reminder_set).service
        before = len(ch.sent)
        clock.now = sh(23, 22)
        report = await service.fire_due(clock.now)
        await bot.outbox.flush()
        new = ch.sent[before:]
        assert report.delivered == 2 and {m.chat for m in new} == {ch.chat("a1", "private")}
        at_22 = next(m for m in new if "最近 1 小时" in m.text)
        assert "我来写测试用例" in at_22.text and "周五发版本" not in at_22.text
        assert await read_mark(bot.db, ch.chat("g1")) is None
        # The owner is demoted: their newest message in the group says "member"; the next run refuses.
        await ch.inject("我不是管理员了", user="a1", role="member", at=sh(24, 9))
        before = len(ch.sent)
        clock.now = sh(24, 21)
        report = await service.fire_due(clock.now)
        await bot.outbox.flush()
        assert report.failed == 1 and report.delivered == 0
        notice = ch.sent[before:]
        assert len(notice) == 1 and "这次没能执行" in notice[0].text and "周五" not in notice[0].text


async def test_command_mode_runs_only_allowed_commands(tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock) as (_bot, ch):
        refused = await say(ch, '/remind daily 08:00 "/unremind all" mode=command', role="admin")
        assert "定时命令只能是 /summary" in refused[0].text
        plain = await say(ch, "/remind daily 08:00 喝水 mode=command", role="admin")
        assert "定时命令只能是 /summary" in plain[0].text


async def test_without_the_reminders_plugin_a_digest_cannot_be_scheduled(tmp_path: Path) -> None:
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path}, limits={"user_burst": 50, "chat_burst": 50})
    bot = Bot(settings, channels=[ch], plugins=[summary.plugin])
    await bot.start()
    try:
        refused = await say(ch, "/summary daily 22:00", role="admin")
    finally:
        await bot.stop()
    assert "定时总结需要启用提醒插件" in refused[0].text
