"""``/remind`` without a model: time phrases, the structured form, weekday names and sets, errors.

The clock (conftest ``start``) is Monday 2030-01-07 12:00 in Asia/Shanghai.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import reminders
from function_calls.testing import ScriptedModel, call
from reminders.phrases import EXAMPLES
from reminders.schedule import next_fire

Start = Callable[..., Awaitable[Any]]


@pytest.mark.parametrize(("line", "expected"), [
    ("/remind 10分钟后 喝水", "2030-01-07 12:10 (Asia/Shanghai)，下次: 2030-01-07 12:10 周一\n内容：喝水"),
    ("/remind 半小时后 开会", "2030-01-07 12:30 (Asia/Shanghai)"),
    ("/remind 明天8点 开会", "2030-01-08 08:00 (Asia/Shanghai)，下次: 2030-01-08 08:00 周二\n内容：开会"),
    ("/remind 明早8:30 跑步", "2030-01-08 08:30 (Asia/Shanghai)"),
    ("/remind 后天下午3点 开会", "2030-01-09 15:00 (Asia/Shanghai)"),
    ("/remind 今晚9点 看书", "2030-01-07 21:00 (Asia/Shanghai)"),
    ("/remind 下周一 9:30 交周报", "2030-01-14 09:30 (Asia/Shanghai)"),
    ("/remind 每天 8:00 起床", "每天 08:00 (Asia/Shanghai)，下次: 2030-01-08 08:00 周二\n内容：起床"),
    ("/remind 每周五 18:00 交周报", "每周五 18:00 (Asia/Shanghai)，下次: 2030-01-11 18:00 周五"),
    ("/remind 工作日 9:00 站会", "工作日（周一至周五） 09:00 (Asia/Shanghai)，下次: 2030-01-08 09:00 周二"),
    ("/remind in 10 minutes stretch", "2030-01-07 12:10 (Asia/Shanghai)"),
    ("/remind tomorrow 8am standup", "2030-01-08 08:00 (Asia/Shanghai)"),
    ('/remind once "2030-01-08 08:00" 开会', "2030-01-08 08:00 (Asia/Shanghai)"),
    ("/remind weekly 09:30 周报 weekday=周一", "每周一 09:30 (Asia/Shanghai)，下次: 2030-01-14 09:30 周一"),
    ("/remind weekly 周三 09:30 周报", "每周三 09:30 (Asia/Shanghai)，下次: 2030-01-09 09:30 周三"),
    ("/remind weekdays 周末 10:00 爬山", "周末 10:00 (Asia/Shanghai)，下次: 2030-01-12 10:00 周六"),
    ("/remind daily 08:00 don't forget the pills", "内容：don't forget the pills"),  # shlex: "No closing quotation"
    ("/remind 5pm tomorrow call mom", "2030-01-08 17:00 (Asia/Shanghai)，下次: 2030-01-08 17:00 周二\n内容：call mom"),
    ("/remind at 3.30pm call", "2030-01-07 15:30 (Asia/Shanghai)，下次: 2030-01-07 15:30 周一\n内容：call"),
    ("/remind in 2 hours 30 minutes stretch", "2030-01-07 14:30 (Asia/Shanghai)，下次: 2030-01-07 14:30 周一\n内容：stretch"),
    ("/remind 明天8点1刻 开会", "2030-01-08 08:15 (Asia/Shanghai)，下次: 2030-01-08 08:15 周二\n内容：开会"),
    ("/remind in 10 minutes 3d printer", "2030-01-07 12:10 (Asia/Shanghai)，下次: 2030-01-07 12:10 周一\n内容：3d printer"),
    ("/remind in 10 minutes and call mom", "2030-01-07 12:10 (Asia/Shanghai)，下次: 2030-01-07 12:10 周一\n内容：and call mom"),
    ("/remind 8am sat exam", "2030-01-08 08:00 (Asia/Shanghai)，下次: 2030-01-08 08:00 周二\n内容：sat exam"),
])
async def test_time_phrases_set_reminders_without_a_model(start: Start, line: str, expected: str) -> None:
    chat = await start()
    reply = await chat.say(line)
    assert reply.startswith("好的，已设置提醒 #") and expected in reply, reply


async def test_what_cannot_be_read_gets_three_examples_that_work(start: Start) -> None:
    chat = await start()
    reply = await chat.say("/remind 改天 开会")
    assert reply.startswith("没有看懂提醒时间") and "content" not in reply
    shown = [line for line in reply.splitlines() if line.startswith("/remind")]
    assert shown == list(EXAMPLES)
    assert '/remind once "2030-01-08 08:00" 开会' in reply  # the explicit form, with tomorrow's date
    for example in [*shown, '/remind once "2030-01-08 08:00" 开会']:
        assert (await chat.say(example)).startswith("好的，已设置提醒 #")
    assert "请写上提醒内容" in await chat.say("/remind 明天8点")


@pytest.mark.parametrize(("line", "left"), [("/remind 3点 明天开会", "明天开会"), ("/remind 明天8点4刻 开会", "4刻"),
                                          ("/remind tomorrow 5pm friday review", "friday")])
async def test_more_of_the_time_left_in_the_content_is_refused_not_guessed(start: Start, line: str, left: str) -> None:
    """These were confirmed for a time the person did not mean, the rest of the time kept as the content."""
    chat = await start()
    reply = await chat.say(line)
    assert reply.startswith(f"没有看懂提醒时间：“{left}”是时间的一部分吗？"), reply
    assert await chat.active() == []


async def test_a_trailing_prompt_is_the_mode_not_the_content(start: Start) -> None:
    chat = await start(model=ScriptedModel([]))
    reply = await chat.say("/remind daily 08:00 查天气 prompt")
    assert "已设置定时任务" in reply and "内容：查天气" in reply and "查天气 prompt" not in reply
    assert "已设置定时任务" in await chat.say("/remind 每天 8:00 告诉我北京的天气 prompt")
    rows = await chat.deps.store.for_chat("memory:group:g1")
    assert sorted((r.content, r.mode) for r in rows) == [("告诉我北京的天气", "prompt"), ("查天气", "prompt")]


async def test_without_a_model_prompt_mode_is_refused_not_stored_as_text(start: Start) -> None:
    chat = await start()
    assert "不能设置定时任务" in await chat.say("/remind daily 08:00 查天气 prompt")
    assert await chat.active() == []


async def test_a_bad_weekday_name_is_explained(start: Start) -> None:
    chat = await start()
    reply = await chat.say("/remind weekly 09:30 周报 weekday=周八")
    assert "weekday=周八 不对" in reply and "周一、周二 … 周日" in reply


async def test_a_workday_reminder_fires_on_weekdays_only(start: Start) -> None:
    chat = await start()
    await chat.say("/remind 工作日 9:00 站会")
    (row,) = await chat.deps.store.for_chat("memory:group:g1")
    fires = []
    after = chat.clock.now
    for _ in range(6):
        nxt = next_fire(row.schedule, after)
        assert nxt is not None
        fires.append(nxt.strftime("%a"))
        after = nxt
    assert fires == ["Tue", "Wed", "Thu", "Fri", "Mon", "Tue"]
    assert row.next_fire == datetime(2030, 1, 8, 1, 0, tzinfo=UTC)


async def test_help_shows_examples_that_work_in_this_mode(start: Start) -> None:
    chat = await start()
    bare = await chat.say("/help")
    assert "/remind <时间> <内容> — 设置提醒" in bare and "例：/remind 明天8点 开会" in bare
    assert "提醒我明天下午3点开会" not in bare  # plain language needs a model
    assert "还没有接入大模型" in bare
    assert "不认识的 /命令 会被忽略，除非同时 @我" in bare


async def test_help_with_a_model_shows_plain_language_examples_too(start: Start) -> None:
    with_model = await (await start(model=ScriptedModel([]))).say("/help")
    assert "例：/remind 明天8点 开会" in with_model and "例：@我 提醒我明天下午3点开会" in with_model


async def test_a_long_value_is_never_echoed_back(start: Start) -> None:
    chat = await start()
    long = "长" * 600
    reply = await chat.say(f'/remind once "2030-01-08 08:00" {long}')
    assert "长长长长长长长长长长长长长长长长长长长长长长长长长" not in reply
    assert "- content：最多 500 个字（收到 600 个字）" in reply and reply.startswith("参数有误")
    assert "用法：/remind <时间> <内容>" in reply


async def test_every_remind_command_the_readme_shows_works(launch: Any) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    shown = re.findall(r"`(/remind [^`]+)`", readme)
    assert len(shown) >= 5
    _bot, ch, _clock = await launch(datetime(2026, 11, 23, 3, 0, tzinfo=UTC), plugins=[reminders.plugin],
                                   timezone="Asia/Shanghai", limits={"user_burst": 100, "chat_burst": 100},
                                   cfg={"create_per_10min": 50})
    for i, line in enumerate(shown):
        await ch.inject(line, at_bot=True)
        assert (await ch.wait_sent(i + 1))[i].text.startswith("好的，已设置提醒 #"), line


async def test_a_model_can_set_a_workday_reminder_too(start: Start) -> None:
    model = ScriptedModel([call("reminder_set", {"type": "weekdays", "time": "09:00", "days": [0, 1, 2, 3, 4],
                                                 "content": "站会"})])
    chat = await start(model=model)
    reply = await chat.say("工作日每天9点提醒我站会")
    assert "工作日（周一至周五） 09:00" in reply


async def test_days_belong_to_weekdays_reminders_only(start: Start) -> None:
    chat = await start()
    assert "只有每周几天的提醒（weekdays）需要 days" in await chat.say("/remind weekly 09:00 x weekday=0 days=0")
    assert "days=每周 不对" in await chat.say("/remind weekdays 09:00 x days=每周")
    assert "周一、三、五 09:00" in await chat.say("/remind weekdays 周一三五 09:00 晨跑")


async def test_in_a_dst_zone_a_relative_reminder_is_never_set_in_the_past(launch: Any) -> None:
    # New York, 2026-11-01 06:00 UTC = 01:00 EST, the second pass of the repeated hour.
    _bot, ch, _clock = await launch(datetime(2026, 11, 1, 6, 0, tzinfo=UTC), plugins=[reminders.plugin],
                                   zones={"memory:group:g1": "America/New_York"})
    await ch.inject("/remind 10分钟后 喝水", at_bot=True)
    reply = (await ch.wait_sent(1))[0].text
    assert reply.startswith("好的，已设置提醒 #") and "(America/New_York)" in reply, reply


async def test_a_redelivered_relative_remind_finds_the_reminder_it_made(start: Start) -> None:
    """The platform redelivers "/remind 10分钟后 喝水" two minutes later (the first try crashed before
    it was marked handled): the phrase now reads 12:12, but it is the same request, and one reminder."""
    from datetime import timedelta

    from function_calls import Caller

    chat = await start()
    bot, tool = chat.bot, chat.bot.tools.get("reminder_set")
    caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group",
                    message_id="m-77")
    zone = bot.zone_for(chat.ch.chat("g1"))
    made = []
    for _ in range(2):
        args = tool.parse_arguments(bot.command_arguments(tool, "10分钟后 喝水", zone))
        made.append(await bot.invoke_tool(tool, args, caller, zone, via="command", run_id="command",
                                          call_id="cmd-reminder_set"))
        chat.clock.now += timedelta(minutes=2)
    assert made[0].data["id"] == made[1].data["id"] and made[1].data["next_fire"].startswith("2030-01-07T04:10")
    assert await chat.active() == ["喝水"]


async def test_a_time_phrase_counts_from_when_the_message_was_sent(start: Start) -> None:
    # Sent Monday 23:58, handled Tuesday 00:05 (kept while the bot restarted, or behind a burst):
    # "明天8点" was Wednesday, a day late, and "10分钟后" counted from 00:05.
    from datetime import timedelta
    from zoneinfo import ZoneInfo

    chat = await start()
    sent = datetime(2030, 1, 7, 23, 58, tzinfo=ZoneInfo("Asia/Shanghai"))
    chat.clock.now = sent + timedelta(minutes=7)
    for line, expected in (("/remind 明天8点 开会", "2030-01-08 08:00"), ("/remind 10分钟后 喝水", "2030-01-08 00:08")):
        before = len(chat.ch.sent)
        await chat.ch.inject(line, chat=chat.ch.chat("g1"), at_bot=True, at=sent.astimezone(UTC))
        reply = (await chat.ch.wait_sent(before + 1))[before].text
        assert expected in reply, reply


async def test_a_stamp_from_a_wrong_clock_does_not_move_a_time_phrase(start: Start) -> None:
    # A bridge whose clock is wrong (OneBot "time": 1 is 1970): no message is kept a day, so "10分钟后"
    # counts from now, not from 1970 (which was refused as a time already past).
    chat = await start()
    chat.clock.now = datetime(2030, 1, 7, 16, 0, tzinfo=UTC)
    await chat.ch.inject("/remind 10分钟后 喝水", chat=chat.ch.chat("g1"), at_bot=True,
                         at=datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC))
    reply = (await chat.ch.wait_sent(1))[0].text
    assert "2030-01-08 00:10" in reply, reply


@pytest.mark.parametrize("line", ["/remind 10分钟后 喝水", '/remind once "2030-01-07 12:10" 喝水'])
async def test_a_remind_handled_after_its_time_is_kept_and_fires_at_once_as_late(start: Start, line: str) -> None:
    """Sent 12:00, handled 12:15 (a backlog after a restart, a message kept at a stop): its time was
    ahead when it was said, so it is not refused as past: set, and sent at once with a late note."""
    from datetime import timedelta
    from zoneinfo import ZoneInfo

    chat = await start()
    sent = datetime(2030, 1, 7, 12, 0, tzinfo=ZoneInfo("Asia/Shanghai"))
    chat.clock.now = (sent + timedelta(minutes=15)).astimezone(UTC)
    await chat.ch.inject(line, chat=chat.ch.chat("g1"), at_bot=True, at=sent.astimezone(UTC))
    reply = (await chat.ch.wait_sent(1))[0].text
    assert reply.startswith("好的，已设置提醒 #") and "已过" in reply, reply
    texts = [m.text for m in await chat.ch.wait_sent(2)]
    assert texts[1] == "⏰ 提醒：喝水\n（迟到提醒：原定 2030-01-07 12:10）", texts
    assert await chat.active() == []


@pytest.mark.parametrize("line", ["/remind once \"2030-01-07 11:50\" 喝水", "/remind 今天11:50 喝水"])
async def test_a_remind_whose_time_had_passed_when_it_was_sent_is_still_refused(start: Start, line: str) -> None:
    from datetime import timedelta
    from zoneinfo import ZoneInfo

    chat = await start()
    sent = datetime(2030, 1, 7, 12, 0, tzinfo=ZoneInfo("Asia/Shanghai"))
    chat.clock.now = (sent + timedelta(minutes=15)).astimezone(UTC)
    await chat.ch.inject(line, chat=chat.ch.chat("g1"), at_bot=True, at=sent.astimezone(UTC))
    reply = (await chat.ch.wait_sent(1))[0].text
    assert "已经过去" in reply, reply
    assert await chat.deps.store.for_owner("memory:u1") == []
