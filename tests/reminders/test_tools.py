"""The reminder tools through a real bot: commands, the model's calls, limits, ids and permissions."""

from __future__ import annotations

import itertools
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

import reminders
import reminders.service
import summary
from function_calls import ArgumentError, ToolContext, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot import iso
from robot.plugin import Plugin

# ``start`` and ``Chat`` live in conftest.py: the clock starts at Monday 2030-01-07 12:00 in Asia/Shanghai.
Start = Callable[..., Awaitable[Any]]


def short_id(reply: str) -> str:
    found = re.search(r"#([0-9a-f]{4,32})", reply)
    assert found, reply
    return found[1]


async def test_set_by_command_confirms_the_next_fire_time(start: Start) -> None:
    chat = await start()
    once = await chat.say('/remind once "2030-01-07 15:00" 开会')
    assert re.fullmatch(r"好的，已设置提醒 #[0-9a-f]{4}：2030-01-07 15:00 \(Asia/Shanghai\)，下次: 2030-01-07 15:00 周一"
                        r"\n内容：开会", once)
    daily = await chat.say("/remind daily 8:00 喝水")
    assert "每天 08:00 (Asia/Shanghai)，下次: 2030-01-08 08:00 周二\n内容：喝水" in daily
    weekly = await chat.say("/remind weekly 09:30 交周报 weekday=4")
    assert "每周五 09:30 (Asia/Shanghai)，下次: 2030-01-11 09:30 周五" in weekly
    assert chat.ch.sent[-1].mention == ("u1",)


async def test_a_past_time_error_gives_the_model_the_current_time_so_it_corrects_itself(start: Start) -> None:
    model = ScriptedModel([
        call("reminder_set", {"type": "once", "time": "2030-01-06 15:00", "content": "开会"}),
        call("reminder_set", {"type": "once", "time": "2030-01-07 15:00", "content": "开会"}),
    ])
    chat = await start(model=model)
    reply = await chat.say("提醒我今天下午3点开会")
    assert reply.startswith("好的，已设置提醒 #") and "2030-01-07 15:00" in reply
    tool_answer = model.requests[1].messages[-1]
    assert tool_answer["role"] == "tool"
    assert ("that time (2030-01-06 15:00 Asia/Shanghai) is in the past; the current time is "
            "2030-01-07 12:00 (Monday) Asia/Shanghai") in tool_answer["content"]
    assert len(model.requests) == 2  # the confirmation answered the user: no third model turn


@pytest.mark.parametrize(("line", "expected"), [
    ("/remind weekly 09:30 周会", "设置提醒失败：每周提醒需要指定星期几"),
    ("/remind daily 08:00 喝水 weekday=2", "设置提醒失败：只有每周提醒需要星期几；每天提醒请去掉 weekday"),
    ("/remind weekly 09:30 周会 weekday=7", "weekday"),
    ("/remind daily 25:00 喝水", "设置提醒失败：时间 '25:00' 无效（小时应为 00-23）"),
    ("/remind once 08:00 开会", "一次性提醒请写“年-月-日 时:分”"),
    ("/remind hourly 08:00 喝水", "类型有 once、daily、weekly、weekdays"),
])
async def test_bad_schedules_are_refused_with_the_fix(start: Start, line: str, expected: str) -> None:
    chat = await start()
    assert expected in await chat.say(line)
    assert await chat.deps.store.for_owner("memory:u1") == []


async def test_limits_per_user_per_chat_and_content_length(start: Start) -> None:
    chat = await start(cfg={"max_per_user": 2, "max_per_chat": 3, "max_content": 10})
    assert "最多 10 字" in await chat.say("/remind daily 08:00 " + "长" * 11)
    for i in range(2):
        assert (await chat.say(f"/remind daily 08:0{i} 喝水")).startswith("好的")
    assert "上限 2 个" in await chat.say("/remind daily 09:00 喝水", chat="g2")  # per user, in any chat
    assert (await chat.say("/remind daily 08:00 喝水", user="u2")).startswith("好的")
    assert "这个聊天已经有 3 个提醒了" in await chat.say("/remind daily 08:00 喝水", user="u3")
    assert (await chat.say("/remind daily 08:00 喝水", user="u3", chat="g2")).startswith("好的")


async def test_the_per_person_limit_says_where_the_reminders_are_and_how_to_see_them(start: Start) -> None:
    """The limit counts every chat, but a group's /reminders shows only that group's: the refusal says
    how many are here and elsewhere, and that /reminders in private lists them all."""
    chat = await start(cfg={"max_per_user": 3})
    for i in range(3):
        assert (await chat.say(f"/remind daily 08:0{i} 喝水", chat="g1")).startswith("好的")
    refused = await chat.say("/remind daily 09:00 开会", chat="g2")
    assert "上限 3 个" in refused and "本聊天 0 个" in refused and "其他聊天 3 个" in refused
    assert "私聊" in refused and "/reminders" in refused and "/unremind" in refused
    listed = await chat.say("/reminders", chat="u1", kind="private")  # what the refusal points at
    assert "共 3 个" in listed


async def test_creation_rate_limit_recovers_after_ten_minutes(start: Start) -> None:
    chat = await start(cfg={"create_per_10min": 2})
    r1 = await chat.say("/remind daily 08:00 a")
    await chat.say("/remind daily 08:00 b")
    assert "10 分钟内已经设置了 2 个提醒" in await chat.say("/remind daily 08:00 c")
    await chat.say(f"/unremind {short_id(r1)}")
    assert "已经设置了 2 个提醒" in await chat.say("/remind daily 08:00 c")  # deleting does not reset it
    chat.clock.now += timedelta(minutes=10, seconds=1)
    assert (await chat.say("/remind daily 08:00 c")).startswith("好的")


async def test_a_chat_can_have_its_own_time_zone(start: Start) -> None:
    chat = await start(zones={"memory:group:g1": "Europe/Berlin"})
    assert "每天 08:00 (Europe/Berlin)，下次: 2030-01-07 08:00 周一" in await chat.say("/remind daily 08:00 x")
    assert "(Asia/Shanghai)" in await chat.say("/remind daily 08:00 x", chat="g2")


async def test_list_in_a_group_shows_only_this_chats_reminders_in_private_all_marked(start: Start) -> None:
    chat = await start()
    await chat.say("/remind daily 08:00 喝水")
    await chat.say("/remind once 2030-01-08T09:00 体检", chat="u1", kind="private")
    await chat.say("/remind daily 06:00 游泳", chat="g2")
    await chat.say("/remind daily 07:00 跑步", user="u2")
    in_group = await chat.say("/reminders")
    assert "喝水" in in_group and "[本群]" in in_group
    assert "体检" not in in_group and "游泳" not in in_group and "跑步" not in in_group  # nothing from elsewhere
    lines = (await chat.say("/reminders", chat="u1", kind="private")).splitlines()
    assert lines[0] == "你的提醒（共 3 个）："
    assert any(re.fullmatch(r"#[0-9a-f]{4} \[群 g1\] 每天 08:00 \(Asia/Shanghai\)，下次: 2030-01-08 08:00 周二 — 喝水", x)
               for x in lines)
    assert any(re.fullmatch(r"#[0-9a-f]{4} \[本聊天\] 2030-01-08 09:00 .* — 体检", x) for x in lines)
    assert any("[群 g2]" in x and "游泳" in x for x in lines)
    assert await chat.say("/reminders", user="u3") == "你在本群没有任何提醒。"
    assert await chat.say("/reminders", chat="g3") == "你在本群没有任何提醒。"


async def test_unknown_id_in_a_group_lists_only_this_chats_reminders(start: Start) -> None:
    chat = await start()
    secret = short_id(await chat.say("/remind once 2030-01-08T09:00 看心理医生", chat="u1", kind="private"))
    await chat.say("/remind daily 08:00 喝水")
    unknown = await chat.say("/unremind 1234")
    assert "喝水" in unknown and "心理医生" not in unknown
    refused = await chat.say(f"/unremind {secret}", chat="g2")  # another chat's id: neither deleted nor shown
    assert "心理医生" not in refused and refused.startswith(f"没有找到编号为 {secret} 的提醒")
    assert len(await chat.deps.store.for_owner("memory:u1")) == 2


async def test_delete_by_short_id_full_id_and_the_reminder_never_fires(start: Start) -> None:
    chat = await start()
    first = await chat.say('/remind once "2030-01-07 12:30" 开会')
    await chat.say("/remind daily 08:00 喝水")
    gone = await chat.say(f"/unremind {short_id(first)}")
    assert gone.startswith(f"已删除提醒 #{short_id(first)} [本群] 2030-01-07 12:30")
    [left] = await chat.deps.store.for_owner("memory:u1")
    assert (await chat.say(f"/unremind {left.id.upper()}")).startswith("已删除提醒")
    chat.clock.now += timedelta(days=2)
    report = await chat.deps.service.fire_due()
    assert report.delivered == report.missed == 0


def full_width(text: str) -> str:
    """``text`` as a Chinese IME types it: every ASCII character in its full-width form (＃７ｂ...)."""
    return text.translate({i: i + 0xFEE0 for i in range(0x21, 0x7F)})


async def test_an_id_typed_full_width_is_read_as_the_id(start: Start) -> None:
    chat = await start()
    first = short_id(await chat.say("/remind daily 08:00 喝水"))
    second = short_id(await chat.say("/remind daily 09:00 跑步"))
    assert (await chat.say(f"/unremind ＃{first}")).startswith(f"已删除提醒 #{first} [本群] 每天 08:00")
    assert (await chat.say(f"/unremind {full_width('#' + second)}")).startswith(f"已删除提醒 #{second} [本群]")
    await chat.say("/remind daily 10:00 游泳")
    assert await chat.say(f"/unremind {full_width('all')}") == "已删除你在本群的全部 1 个提醒。"
    assert await chat.deps.store.for_owner("memory:u1") == []


async def test_ambiguous_and_unknown_ids_list_the_callers_candidates(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = itertools.chain(["abcd1" + "0" * 27, "abcd2" + "0" * 27], ["f" * 32])
    monkeypatch.setattr(reminders.service, "new_id", lambda: next(ids))
    chat = await start()
    await chat.say("/remind daily 08:00 甲")
    await chat.say("/remind daily 09:00 乙")
    ambiguous = await chat.say("/unremind abc")
    assert ambiguous.startswith("编号 abc 不唯一：")
    assert "#abcd1 [本群] 每天 08:00" in ambiguous and "#abcd2 [本群] 每天 09:00" in ambiguous
    unknown = await chat.say("/unremind 1234")
    assert unknown.startswith("没有找到编号为 1234 的提醒。你的提醒：") and "#abcd1" in unknown and "#abcd2" in unknown
    assert await chat.say("/unremind 1234", user="u2") == "没有找到编号为 1234 的提醒；你在本群没有任何提醒。"
    assert len(await chat.deps.store.for_owner("memory:u1")) == 2


async def test_only_the_owner_or_a_bot_admin_can_delete_by_id(start: Start) -> None:
    chat = await start(admins=("memory:boss",))
    mine = short_id(await chat.say("/remind daily 08:00 甲"))
    other_group = short_id(await chat.say("/remind daily 08:00 乙", chat="g2"))
    assert (await chat.say(f"/unremind {mine}", user="u2")).startswith("没有找到编号")
    for role in ("admin", "owner"):  # a group's owner/admins cannot delete a member's reminder by id
        assert (await chat.say(f"/unremind {mine}", user="mod", role=role)).startswith("没有找到编号")
    assert len(await chat.deps.store.for_owner("memory:u1")) == 2
    assert (await chat.say(f"/unremind {mine}", user="boss")).startswith("已删除提醒")
    assert (await chat.say(f"/unremind {other_group}", user="boss", chat="u9", kind="private")).startswith("已删除")
    assert await chat.deps.store.for_owner("memory:u1") == []


async def test_no_argument_can_name_another_user() -> None:
    good = {"type": "once", "time": "2030-01-07 15:00", "content": "x"}
    for extra in ({"user_id": "u2"}, {"owner": "u2"}, {"chat_id": "g2"}):
        with pytest.raises(ArgumentError, match="unknown field"):
            reminders.reminder_set.parse_arguments({**good, **extra})
    assert list(reminders.reminder_delete.parameters["properties"]) == ["reminder_id"]
    assert reminders.reminder_list.parameters["properties"] == {}


async def test_prompt_mode_needs_an_llm(start: Start) -> None:
    chat = await start()
    refused = await chat.say("/remind daily 08:00 告诉我北京的天气 mode=prompt")
    assert "没有接入大模型" in refused and await chat.deps.store.for_owner("memory:u1") == []


async def test_prompt_mode_set_by_the_model(start: Start) -> None:
    args = {"type": "daily", "time": "08:00", "content": "告诉我北京的天气", "mode": "prompt"}
    chat = await start(model=ScriptedModel([call("reminder_set", args), text("unused")]))
    reply = await chat.say("每天早上8点告诉我北京的天气")
    assert reply.startswith("好的，已设置定时任务 #")
    [stored] = await chat.deps.store.for_owner("memory:u1")
    assert stored.mode == "prompt" and stored.content == "告诉我北京的天气"


async def test_list_through_the_model_and_the_side_panel(start: Start) -> None:
    model = ScriptedModel([call("reminder_list"), text("你有一个提醒：每天 8 点喝水。")])
    chat = await start(model=model)
    await chat.say("/remind daily 08:00 喝水")
    assert await chat.say("我有哪些提醒？") == "你有一个提醒：每天 8 点喝水。"
    assert "— 喝水" in model.requests[1].messages[-1]["content"]
    panel = await chat.bot.panels["reminders"](chat.ch.chat("g1"))
    assert [(row["谁的"], row["内容"]) for row in panel] == [("u1", "喝水")]
    assert panel[0]["时间"].startswith("每天 08:00") and panel[0]["编号"].startswith("#") and len(panel[0]["编号"]) >= 5


async def test_a_new_reminder_gets_its_timer_job_and_deleting_removes_it(start: Start) -> None:
    chat = await start()
    scheduler = chat.deps.service.scheduler
    assert scheduler is not None and scheduler.running
    soon = short_id(await chat.say('/remind once "2030-01-07 12:30" 开会'))
    later = short_id(await chat.say("/remind daily 08:00 喝水"))  # tomorrow: beyond the 1 h horizon
    [first] = await chat.deps.store.match(soon, owner=None)
    service = chat.deps.service
    assert first.next_fire is not None and service.armed_at(first.id) == first.next_fire
    job = scheduler.get_job(f"rem:at:{iso(first.next_fire)}")
    assert job is not None and job.next_run_time == first.next_fire
    [second] = await chat.deps.store.match(later, owner=None)
    assert service.armed_at(second.id) is None
    await chat.say(f"/unremind {soon}")
    assert service.armed_at(first.id) is None and scheduler.get_jobs() == [scheduler.get_job("rem:refill")]


@tool_function(admin_only=True)
async def restart_service(ctx: ToolContext[object]) -> str:
    """Restart the service (bot admins only)."""
    return "restarted"


ADMIN_TOOL: Plugin[object] = Plugin("fake_admin", Toolset("fake_admin", [restart_service]))


async def test_a_command_reminder_needs_the_permissions_the_command_itself_needs(start: Start) -> None:
    """A scheduled command runs as the person who set it: what they may not run, they may not schedule."""
    chat = await start(plugins=[ADMIN_TOOL], cfg={"command_tools": ["restart_service"]}, admins=("memory:boss",))
    refused = await chat.say("/remind daily 08:00 /restart_service mode=command")
    assert refused.startswith("设置提醒失败") and "只有机器人管理员" in refused, refused
    assert await chat.active() == []
    assert (await chat.say("/remind daily 08:00 /restart_service mode=command", user="boss")).startswith(
        "好的，已设置定时命令")


@pytest.mark.parametrize("ask", ["/remind 每天 22:00 /summary mode=command", "/remind daily 22:00 /summary hours=24 mode=command"])
async def test_only_a_groups_admins_schedule_its_digest_as_summary_daily_requires(start: Start, ask: str) -> None:
    """``/summary daily`` in a group is for its admins; a command reminder storing ``/summary`` is that
    same daily digest (posted to everyone, moving the group's summary mark), so the same rule holds."""
    chat = await start(plugins=[summary.plugin])
    assert (await chat.say("/summary daily 22:00")).startswith("只有群主")
    refused = await chat.say(ask)
    assert refused.startswith("设置提醒失败") and "只有群主、群管理员或机器人管理员" in refused, refused
    assert await chat.active() == []
    assert (await chat.say(ask, user="mod", role="admin")).startswith("好的，已设置定时命令")
    # In private the digest is of the person's own chat with the bot: anyone's to schedule.
    assert (await chat.say(ask, chat="u1", kind="private")).startswith("好的，已设置定时命令")
