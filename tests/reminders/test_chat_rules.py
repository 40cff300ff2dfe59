"""Per-chat rules through a real bot: the chat's time zone, "/unremind all", Chinese replies."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from function_calls import ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, call, text
from robot.message import Role

G1 = "memory:group:g1"
# ``start`` and ``Chat`` live in conftest.py; the clock starts at Monday 2030-01-07 12:00 in
# Shanghai (05:00 in Berlin).
Start = Callable[..., Awaitable[Any]]


# --- the chat's zone comes from [bot] zones ------------------------------------------------------
async def test_reminder_set_reads_times_in_the_chats_configured_zone(start: Start) -> None:
    model = ScriptedModel([call("reminder_set", {"type": "once", "time": "2030-01-07 04:30", "content": "开会"}),
                           text("好的，请换个时间。")])
    chat = await start(model=model, zones={G1: "Europe/Berlin"})
    # 10:00 has passed in Shanghai (12:00) but not in Berlin (05:00).
    assert (await chat.say('/remind once "2030-01-07 10:00" 开会')).startswith("好的，已设置提醒")
    [stored] = await chat.deps.store.for_chat(G1)
    assert stored.zone == "Europe/Berlin" and stored.next_fire == datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
    refused = await chat.say('/remind once "2030-01-07 04:30" 开会')
    assert refused == ("设置提醒失败：这个时间（2030-01-07 04:30，Europe/Berlin）已经过去了；"
                       "现在是 2030-01-07 05:00 周一（Europe/Berlin）。")
    await chat.say("提醒我今天早上4点半开会")
    told_model = model.requests[1].messages[-1]["content"]
    assert ("that time (2030-01-07 04:30 Europe/Berlin) is in the past; the current time is "
            "2030-01-07 05:00 (Monday) Europe/Berlin") in told_model


# --- "/unremind all" -------------------------------------------------------------------------------
async def test_unremind_all_as_a_member_deletes_only_their_own_reminders_here(start: Start) -> None:
    chat = await start()
    await chat.say("/remind daily 08:00 甲")
    await chat.say("/remind daily 09:00 乙")
    await chat.say("/remind daily 08:00 丙", user="u2")
    await chat.say("/remind daily 08:00 丁", chat="g2")
    assert await chat.say("/unremind all") == "已删除你在本群的全部 2 个提醒。"
    assert await chat.active() == ["丙"] and await chat.active("memory:group:g2") == ["丁"]
    assert await chat.say("/unremind all") == "你在本群没有可删除的提醒。"


@pytest.mark.parametrize(("user", "role"), [("mod", "admin"), ("founder", "owner"), ("boss", "member")])
async def test_unremind_all_by_a_group_admin_or_bot_admin_clears_the_chat_and_nothing_fires_later(
    start: Start, user: str, role: Role
) -> None:
    chat = await start(admins=("memory:boss",))
    await chat.say('/remind once "2030-01-07 12:30" 开会')  # armed: due within the timer's horizon
    await chat.say("/remind daily 08:00 喝水", user="u2")
    await chat.say("/remind daily 08:00 别的群", chat="g2")
    [soon] = [r for r in await chat.deps.store.for_chat(G1) if r.content == "开会"]
    scheduler = chat.deps.service.scheduler
    assert scheduler is not None and chat.deps.service.armed_at(soon.id) is not None
    assert await chat.say("/unremind all", user=user, role=role) == "已删除本群的全部 2 个提醒。"
    assert await chat.active() == [] and chat.deps.service.armed_at(soon.id) is None
    before = len(chat.ch.sent)
    chat.clock.now = datetime(2030, 1, 8, 0, 0, tzinfo=UTC)  # 08:00 the next day in Shanghai
    report = await chat.deps.service.fire_due()
    await chat.bot.outbox.flush()
    assert report.delivered == 1 and [m.text for m in chat.ch.sent[before:]] == ["⏰ 提醒：别的群"]


async def test_unremind_all_while_a_prompt_is_running_sends_no_ghost_answer(start: Start) -> None:
    asked, release = asyncio.Event(), asyncio.Event()

    async def script(request: ModelRequest) -> ModelResponse:
        asked.set()
        await release.wait()
        return text("北京今天晴")

    chat = await start(model=ScriptedModel(script))
    assert (await chat.say("/remind daily 12:30 北京天气 mode=prompt")).startswith("好的，已设置定时任务")
    chat.clock.now += timedelta(minutes=30)  # 12:30 in Shanghai
    firing = asyncio.create_task(chat.deps.service.fire_due())
    await asyncio.wait_for(asked.wait(), 5)
    assert await chat.say("/unremind all", role="admin") == "已删除本群的全部 1 个提醒。"
    before = len(chat.ch.sent)
    release.set()
    report = await asyncio.wait_for(firing, 5)
    await chat.bot.outbox.flush()
    assert report.delivered == 0 and chat.ch.sent[before:] == []


async def test_all_is_not_mistaken_for_an_id_prefix_in_a_private_chat(start: Start) -> None:
    chat = await start()
    await chat.say("/remind daily 08:00 私事", chat="u1", kind="private")
    await chat.say("/remind daily 08:00 群事")
    assert await chat.say("/unremind ALL", chat="u1", kind="private") == "已删除你在本聊天的全部 1 个提醒。"
    assert [r.content for r in await chat.deps.store.for_owner("memory:u1")] == ["群事"]


# --- Chinese for people, English for the model ------------------------------------------------------
async def test_an_empty_list_answers_the_person_in_chinese_without_another_model_turn(start: Start) -> None:
    model = ScriptedModel([call("reminder_list")])
    chat = await start(model=model)
    assert await chat.say("我有哪些提醒？") == "你在本群没有任何提醒。"
    assert model.requests[0].messages[-1]["content"] == "我有哪些提醒？" and len(model.requests) == 1


async def test_command_errors_carry_no_english(start: Start) -> None:
    chat = await start()
    replies = [await chat.say(line) for line in (
        '/remind once "2030-01-07 10:00" 开会', "/remind daily 25:61 喝水", "/remind weekly 09:00 周会",
        "/remind daily 2030-01-08T08:00 喝水", "/remind once 8点 开会", "/unremind 1234")]
    keywords = re.compile(r"Asia/Shanghai|weekday|once|daily|weekly")  # what the person types themselves
    for reply in replies:
        assert not re.search(r"[A-Za-z]{3,}", keywords.sub("", reply)), reply


async def test_a_model_cannot_clear_a_whole_chat_only_the_typed_command_can() -> None:
    from function_calls import Caller, ToolContext, ToolError
    from reminders.tools import DeleteArgs, reminder_delete

    admin = Caller(platform="memory", user_id="boss", chat_id="g1", chat_kind="group", is_admin=True)
    ctx: ToolContext[object] = ToolContext(deps=object(), caller=admin, via="model")
    with pytest.raises(ToolError) as raised:
        await reminder_delete.invoke(ctx, DeleteArgs(reminder_id="all"))
    assert "/unremind all" in (raised.value.user_message or "")


async def test_a_bot_admin_deletes_by_id_but_never_reads_another_persons_private_reminders(start: Any) -> None:
    """A one-character prefix listed up to 20 reminders of everyone's private chats, content and all."""
    from collections import Counter

    chat = await start(admins=("memory:boss",))
    for user in ("u1", "u2"):  # 20 ids over 16 first hex digits: two share one
        for i in range(10):
            await chat.say(f"/remind daily 08:{i:02d} 吃抗抑郁药{i}", user=user, chat=user, kind="private")
    ids = [r.id for u in ("memory:u1", "memory:u2") for r in await chat.deps.store.for_owner(u)]
    prefix, _ = Counter(i[0] for i in ids).most_common(1)[0]
    answer = await chat.say(f"/unremind {prefix}", user="boss", chat="boss", kind="private")
    assert "不唯一" in answer and "别人的提醒" in answer and "吃抗抑郁药" not in answer
    target = next(r for r in await chat.deps.store.for_owner("memory:u1"))
    deleted = await chat.say(f"/unremind {target.id}", user="boss", chat="boss", kind="private")
    assert "已删除" in deleted and "memory:u1" in deleted and "吃抗抑郁药" not in deleted
    assert len(await chat.deps.store.for_owner("memory:u1")) == 9
