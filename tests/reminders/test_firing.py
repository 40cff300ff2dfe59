"""Firing: on time, DST, late and missed occurrences, deletion, idempotency, prompts, the real timer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

import reminders
from function_calls import (
    Caller,
    ModelAPIError,
    ModelRequest,
    ModelResponse,
    ToolContext,
    Toolset,
    tool_function,
)
from function_calls.testing import ScriptedModel, text
from reminders.firing import MERGE_MAX
from reminders.store import Reminder, ReminderStore, new_id
from robot.bot import Bot
from robot.config import Settings
from robot.plugin import Plugin
from robot.testing import MemoryChannel

SH, BERLIN = "Asia/Shanghai", "Europe/Berlin"
# The conftest Rig adds reminders as this same Alice unless told otherwise.
ALICE = Caller(platform="memory", user_id="u1", user_name="Alice", chat_id="g1", chat_kind="group")


def at(zone: str, text_: str) -> datetime:
    return datetime.fromisoformat(text_).replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)


# ``rig_factory(now, model=, cfg=, plugins=)`` (conftest.py) gives a Rig: add, fire, texts, row.
Factory = Callable[..., Awaitable[Any]]


async def test_once_fires_at_its_instant_exactly_once_and_mentions_the_owner(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 08:00"))
    r = await rig.add("once", "2030-01-07 09:00")
    assert await rig.fire(at(SH, "2030-01-07 08:59:59")) == 0
    assert await rig.fire(at(SH, "2030-01-07 09:00")) == 1
    assert await rig.fire(at(SH, "2030-01-07 09:00:30")) == 0
    sent = rig.ch.sent
    assert [m.text for m in sent] == ["⏰ 提醒：交周报"]
    assert sent[0].mention == ("u1",) and sent[0].chat.key == "memory:group:g1"
    assert sent[0].key == f"rem:{r.id}:2030-01-07T01:00:00.000000Z"
    assert (await rig.row(r)).status == "done"


async def test_private_chat_reminders_mention_nobody(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 08:00"))
    await rig.add("once", "2030-01-07 09:00", caller=ALICE.model_copy(update={"chat_kind": "private", "chat_id": "u1"}))
    await rig.fire(at(SH, "2030-01-07 09:00"))
    assert [(m.chat.kind, m.mention) for m in rig.ch.sent] == [("private", ())]


async def test_daily_in_shanghai_fires_each_day_at_the_same_wall_time(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))
    r = await rig.add("daily", "08:00", "喝水")
    for day in (8, 9, 10):
        assert (await rig.row(r)).next_fire == datetime(2030, 1, day - 1, 0, 0, tzinfo=UTC) + timedelta(days=1)
        assert await rig.fire(at(SH, f"2030-01-{day:02d} 07:59:59")) == 0
        assert await rig.fire(at(SH, f"2030-01-{day:02d} 08:00")) == 1
    assert await rig.texts() == ["⏰ 提醒：喝水"] * 3


async def test_weekly_fires_only_on_its_weekday(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))  # a Monday, after 09:30
    r = await rig.add("weekly", "09:30", weekday=0)
    assert (await rig.row(r)).next_fire == at(SH, "2030-01-14 09:30")
    assert await rig.fire(at(SH, "2030-01-13 09:30")) == 0
    assert await rig.fire(at(SH, "2030-01-14 09:30")) == 1
    assert (await rig.row(r)).next_fire == at(SH, "2030-01-21 09:30")


async def test_berlin_spring_forward_fires_at_the_first_valid_instant(rig_factory: Factory) -> None:
    rig = await rig_factory(datetime(2030, 3, 30, 12, tzinfo=UTC))
    r = await rig.add("daily", "02:30", zone=BERLIN)
    gap_end = datetime(2030, 3, 31, 1, 0, tzinfo=UTC)  # 02:30 does not exist; 03:00 CEST is next
    assert (await rig.row(r)).next_fire == gap_end
    assert await rig.fire(gap_end - timedelta(seconds=1)) == 0
    assert await rig.fire(gap_end) == 1
    assert (await rig.row(r)).next_fire == datetime(2030, 4, 1, 0, 30, tzinfo=UTC)  # 02:30 CEST again


async def test_berlin_fall_back_fires_a_repeated_hour_once(rig_factory: Factory) -> None:
    rig = await rig_factory(datetime(2030, 10, 26, 12, tzinfo=UTC))
    r = await rig.add("daily", "02:30", zone=BERLIN)
    first, second = datetime(2030, 10, 27, 0, 30, tzinfo=UTC), datetime(2030, 10, 27, 1, 30, tzinfo=UTC)
    assert await rig.fire(first) == 1
    assert await rig.fire(second) == 0  # the second 02:30 (CET) of that night
    assert (await rig.row(r)).next_fire == datetime(2030, 10, 28, 1, 30, tzinfo=UTC)
    assert len(await rig.texts()) == 1


async def test_late_within_grace_fires_with_a_note_and_continues(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))
    r = await rig.add("daily", "08:00", "喝水")
    assert await rig.fire(at(SH, "2030-01-08 13:59")) == 1  # bot was down 08:00-13:59
    assert await rig.texts() == ["⏰ 提醒：喝水\n（迟到提醒：原定 2030-01-08 08:00）"]
    assert (await rig.row(r)).next_fire == at(SH, "2030-01-09 08:00")


async def test_down_for_days_sends_one_late_message_counting_the_missed_ones(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))
    await rig.add("daily", "08:00", "喝水")
    assert await rig.fire(at(SH, "2030-01-11 09:00")) == 1
    assert await rig.texts() == [
        "⏰ 提醒：喝水\n（迟到提醒：原定 2030-01-11 08:00）\n（另有 3 次在机器人离线期间错过）"]


async def test_back_just_after_an_occurrence_still_reports_the_ones_missed_before(rig_factory: Factory) -> None:
    """Restarted 30 s after today's 08:00 (on time): the three days missed before are still told,
    and that reminder keeps its own message rather than merging with one due at the same instant."""
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))
    await rig.add("daily", "08:00", "喝水")
    rig.clock.now = at(SH, "2030-01-10 20:00")  # Bob's was set last night: nothing of his was missed
    await rig.add("daily", "08:00", "早会", caller=ALICE.model_copy(update={"user_id": "u2", "user_name": "Bob"}))
    assert await rig.fire(at(SH, "2030-01-11 08:00:30")) == 2
    assert sorted(await rig.texts()) == ["⏰ 提醒：喝水\n（另有 3 次在机器人离线期间错过）", "⏰ 提醒：早会"]


async def test_reminders_held_up_by_their_channel_say_they_are_late_when_they_go_out(rig_factory: Factory) -> None:
    """Due while the chat's channel was down (the bot running: a bridge offline, a session expired), they went
    out when it came back, hours later, as if on time: three identical "⏰ 提醒：吃药" after three days."""
    rig = await rig_factory(at(SH, "2030-01-07 12:00"))
    await rig.add("once", "2030-01-07 12:10", "去接孩子")
    await rig.add("daily", "08:00", "吃药")
    rig.ch.down = True
    for when in ("2030-01-07 12:10", "2030-01-08 08:00", "2030-01-09 08:00"):
        rig.clock.now = at(SH, when)
        assert (await rig.service.fire_due(rig.clock.now)).delivered == 1  # on time: queued, not sent
    rig.clock.now = at(SH, "2030-01-09 20:10")
    rig.ch.down = False
    assert await rig.texts() == ["⏰ 提醒：去接孩子\n（迟到提醒：原定 2030-01-07 12:10）",
                                 "⏰ 提醒：吃药\n（迟到提醒：原定 2030-01-08 08:00）",
                                 "⏰ 提醒：吃药\n（迟到提醒：原定 2030-01-09 08:00）"]


async def test_beyond_grace_the_owner_is_told_it_was_missed(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 07:00"))
    once = await rig.add("once", "2030-01-07 08:00", "开会")
    daily = await rig.add("daily", "08:00", "喝水")
    assert await rig.fire(at(SH, "2030-01-09 14:30")) == 2  # 6.5 h after the last 08:00
    texts = await rig.texts()
    assert "⚠️ 错过的提醒：开会\n机器人离线，没能按时发出（原定 2030-01-07 08:00，共错过 1 次）。" in texts
    assert ("⚠️ 错过的提醒：喝水\n机器人离线，没能按时发出（原定 2030-01-09 08:00，共错过 3 次）。\n"
            "下次：2030-01-10 08:00") in texts
    assert [m.mention for m in rig.ch.sent] == [("u1",), ("u1",)]
    assert (await rig.row(once)).status == "missed"
    assert (await rig.row(daily)).next_fire == at(SH, "2030-01-10 08:00")
    assert await rig.fire(at(SH, "2030-01-09 14:31")) == 0


async def test_grace_window_is_configurable(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 07:00"), cfg={"grace_hours": 1})
    await rig.add("once", "2030-01-07 08:00", "开会")
    await rig.fire(at(SH, "2030-01-07 09:30"))
    assert (await rig.texts())[0].startswith("⚠️ 错过的提醒：开会")


async def test_deleted_reminders_never_fire(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 07:00"))
    one = await rig.add("once", "2030-01-07 08:00", "一")
    await rig.add("daily", "08:00", "二")
    other_chat = ALICE.model_copy(update={"chat_id": "g2"})
    await rig.add("daily", "08:00", "三", caller=other_chat)
    assert await rig.service.delete(one.id)
    assert await rig.service.delete_chat(rig.ch.chat("g1")) == 1
    assert await rig.fire(at(SH, "2030-01-07 08:00")) == 1
    assert await rig.texts() == ["⏰ 提醒：三"]


async def test_refiring_an_occurrence_is_idempotent(rig_factory: Factory) -> None:
    rig = await rig_factory(at(SH, "2030-01-07 07:00"))
    r = await rig.add("once", "2030-01-07 08:00")
    await rig.fire(at(SH, "2030-01-07 08:00"))
    # Pretend the state change was lost: the same occurrence is due again.
    await rig.bot.db.run(lambda db: db.execute(
        "UPDATE reminders SET status = 'active', next_fire = ? WHERE id = ?",
        [(rig.clock.now).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), r.id]))
    await rig.fire(at(SH, "2030-01-07 08:00:10"))
    rows = await rig.bot.outbox.rows()
    assert [row["key"] for row in rows] == [f"rem:{r.id}:2030-01-07T00:00:00.000000Z"]
    assert await rig.texts() == ["⏰ 提醒：交周报"]


@pytest.mark.parametrize("merge_chat", [False, True])
async def test_many_due_together_fire_in_batches_each_exactly_once(rig_factory: Factory, merge_chat: bool) -> None:
    now = at(SH, "2030-01-07 08:00")
    rig = await rig_factory(now - timedelta(hours=1), cfg={"merge_chat": merge_chat})
    rows = [Reminder(id=new_id(), owner=f"memory:u{i % 40}", owner_name="x", chat=f"memory:group:g{i % 30}",
                     type="daily", wall="08:00:00", zone=SH, weekday=None, content=f"#{i}", mode="text",
                     created_at=now, updated_at=now, next_fire=now) for i in range(1201)]
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    assert await rig.fire(now) == 1201
    await rig.bot.outbox.flush()
    # A person's (merge_chat: a chat's) reminders due together share messages (at most MERGE_MAX each).
    lines: list[str] = []
    for sent in rig.ch.sent:
        if sent.text.startswith("⏰ 提醒："):  # alone in its chat at a batch's edge
            items = [sent.text.removeprefix("⏰ 提醒：")]
        else:
            head, *items = sent.text.split("\n")
            assert head == f"⏰ 提醒（{len(items)} 条）：" and 2 <= len(items) <= MERGE_MAX
            items = [item.removeprefix("· x：") for item in items]
        lines += items
        owners = {rows[int(item[1:])].owner_id for item in items}
        assert set(sent.mention) == owners and len(sent.mention) == len(owners)
        assert merge_chat or len(owners) == 1  # merge_chat off: a message is about one person
    assert sorted(lines) == sorted(f"#{i}" for i in range(1201))  # each exactly once
    # 30 chats of about 40 reminders from 4 people each: a message per chat (merge_chat) or per person
    # there, plus one where a batch's edge cuts a chat.
    assert len(rig.ch.sent) <= (30 if merge_chat else 120) + 2
    assert await rig.fire(now + timedelta(seconds=1)) == 0


async def test_a_lone_or_late_reminder_keeps_its_own_message(rig_factory: Factory) -> None:
    now = at(SH, "2030-01-07 08:00")
    rig = await rig_factory(now - timedelta(hours=1))
    base = Reminder(id=new_id(), owner="memory:u1", owner_name="Alice", chat="memory:group:g1", type="daily",
                    wall="08:00:00", zone=SH, weekday=None, content="早会", mode="text", created_at=now,
                    updated_at=now, next_fire=now)
    late = base.evolve(id=new_id(), wall="07:55:00", content="迟到的", next_fire=now - timedelta(minutes=5))
    other = base.evolve(id=new_id(), chat="memory:group:g2", content="别的群")
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, [base, late, other]))
    assert await rig.fire(now) == 3
    assert sorted(await rig.texts()) == ["⏰ 提醒：别的群", "⏰ 提醒：早会", "⏰ 提醒：迟到的\n（迟到提醒：原定 2030-01-07 07:55）"]


async def test_a_corrupted_row_does_not_block_the_others(rig_factory: Factory) -> None:
    now = at(SH, "2030-01-07 08:00")
    rig = await rig_factory(now - timedelta(hours=1))
    good = await rig.add("once", "2030-01-07 08:00", "好的")
    bad = good.evolve(id=new_id(), zone="Mars/Olympus")
    await rig.bot.db.run(lambda db: ReminderStore.insert_sync(db, [bad]))
    assert await rig.fire(now) == 1
    assert await rig.texts() == ["⏰ 提醒：好的"]
    assert (await rig.row(bad)).status == "broken"


# --- scheduled prompts ---------------------------------------------------------------------------
class SearchArgs(BaseModel):
    query: str


@tool_function
async def perplexity_search(ctx: ToolContext[object], args: SearchArgs) -> str:
    """Search the web."""
    return "晴"


@tool_function
async def other_tool(ctx: ToolContext[object], args: SearchArgs) -> str:
    """Something a scheduled prompt may not use."""
    return "no"


SEARCH: Plugin[object] = Plugin("fake_search", Toolset("fake_search", [perplexity_search, other_tool]))


async def test_prompt_answer_is_sent_and_runs_with_only_the_allowed_tools(rig_factory: Factory) -> None:
    model = ScriptedModel([text("北京今天晴，-3°C")])
    rig = await rig_factory(at(SH, "2030-01-07 07:00"), model=model, plugins=(SEARCH,))
    await rig.add("daily", "08:00", "告诉我北京的天气", mode="prompt")
    assert await rig.fire(at(SH, "2030-01-07 08:00")) == 1
    assert await rig.texts() == ["北京今天晴，-3°C"]
    assert rig.ch.sent[0].mention == ("u1",)
    request = model.requests[0]
    assert [t["function"]["name"] for t in request.tools] == ["perplexity_search"]
    assert request.messages[-1] == {"role": "user", "content": "告诉我北京的天气"}


async def test_prompt_failure_is_reported_once_until_it_succeeds_again(rig_factory: Factory) -> None:
    outcomes = iter(["fail", "fail", "ok", "fail"])

    def script(request: ModelRequest) -> ModelResponse | ModelAPIError:
        if next(outcomes) == "fail":
            return ModelAPIError("upstream 500", status=500, retryable=False)
        return text("晴")

    rig = await rig_factory(at(SH, "2030-01-07 07:00"), model=ScriptedModel(script))
    r = await rig.add("daily", "08:00", "天气", mode="prompt")
    for day in (7, 8, 9, 10):
        await rig.fire(at(SH, f"2030-01-{day:02d} 08:00"))
    texts = await rig.texts()
    failure = "⚠️ 定时任务「天气」这次没能执行，之后仍会按时尝试（连续失败不再重复通知）。"
    assert texts == [failure, "晴", failure]
    assert (await rig.row(r)).failure_reported


async def test_a_one_time_prompt_that_fails_does_not_promise_another_try(rig_factory: Factory) -> None:
    # It said "之后仍会按时尝试" and was done: the person did not set it again.
    rig = await rig_factory(at(SH, "2030-01-07 07:00"),
                            model=ScriptedModel(lambda r: ModelAPIError("upstream 500", status=500)))
    r = await rig.add("once", "2030-01-07 08:00", "天气", mode="prompt")
    await rig.fire(at(SH, "2030-01-07 08:00"))
    assert await rig.texts() == ["⚠️ 定时任务「天气」没能执行（一次性任务，不会再试），请重新设置。"]
    assert (await rig.row(r)).status == "done"


async def test_deleting_while_the_prompt_runs_sends_nothing(rig_factory: Factory) -> None:
    called, release = asyncio.Event(), asyncio.Event()

    async def script(request: ModelRequest) -> ModelResponse:
        called.set()
        await release.wait()
        return text("太迟了")

    rig = await rig_factory(at(SH, "2030-01-07 07:00"), model=ScriptedModel(script))
    r = await rig.add("once", "2030-01-07 08:00", "天气", mode="prompt")
    rig.clock.now = at(SH, "2030-01-07 08:00")
    firing = asyncio.create_task(rig.service.fire_due())
    await asyncio.wait_for(called.wait(), 5)
    assert await rig.service.delete(r.id)
    release.set()
    await firing
    assert await rig.texts() == []
    assert (await rig.row(r)).status == "deleted"


# --- through the plugin: start-up catch-up and the real timer ------------------------------------
async def test_restart_fires_what_fell_due_while_down_exactly_once(launch: Any) -> None:
    async def run(now: datetime, command: str | None = None) -> list[str]:
        bot, ch, _ = await launch(now, plugins=[reminders.plugin])  # same data_dir every time
        if command:
            await ch.inject(command, at_bot=True)
        await bot.outbox.flush()
        await bot.stop()
        return [m.text for m in ch.sent]

    assert (await run(at(SH, "2030-01-07 12:00"), "/remind daily 08:00 喝水"))[0].startswith("好的，已设置提醒")
    assert await run(at(SH, "2030-01-09 10:00")) == [
        "⏰ 提醒：喝水\n（迟到提醒：原定 2030-01-09 08:00）\n（另有 1 次在机器人离线期间错过）"]
    assert await run(at(SH, "2030-01-09 10:05")) == []


async def test_the_real_scheduler_fires_a_reminder_due_in_a_second(tmp_path: Path) -> None:
    ch = MemoryChannel()
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[ch], plugins=[reminders.plugin])
    await bot.start()
    try:
        due = (datetime.now(UTC) + timedelta(seconds=1.2)).replace(microsecond=0)
        local = due.astimezone(ZoneInfo(SH)).strftime("%Y-%m-%dT%H:%M:%S")
        await ch.inject(f"/remind once {local} 站起来活动一下", at_bot=True)
        sent = await ch.wait_sent(2, timeout=10)
        arrived = datetime.now(UTC)
        assert sent[0].text.startswith("好的，已设置提醒")
        assert sent[1].text == "⏰ 提醒：站起来活动一下" and sent[1].mention == ("u1",)
        assert arrived >= due
    finally:
        await bot.stop()


async def test_a_reminder_leaves_through_the_account_that_owns_its_chat(rig_factory: Factory) -> None:
    # Two bot accounts share a platform: the reminder set through account "bot-b" must fire from it.
    rig = await rig_factory(at(SH, "2030-01-07 08:00"))
    r = await rig.add("once", "2030-01-07 09:00", caller=ALICE.model_copy(update={"account": "bot-b"}))
    assert (await rig.row(r)).account == "bot-b" and r.chat_ref.account == "bot-b"
    await rig.fire(at(SH, "2030-01-07 09:00"))
    (sent,) = rig.ch.sent
    assert sent.chat.account == "bot-b" and sent.chat.key == "memory:group:g1"


async def test_a_chat_the_gate_ignores_gets_nothing_but_its_reminders_move_on_and_resume_when_allowed(
        rig_factory: Factory) -> None:
    """The owner put g1 in ``[gate] never`` after its reminders were set: nothing is posted there, no
    model runs for it and nothing is recorded, but the schedules move on; allowed again, they fire."""
    model = ScriptedModel(lambda request: text("北京晴"))
    rig = await rig_factory(at(SH, "2030-01-07 08:00"), model=model, gate={"never": ["memory:g1"]})
    daily = await rig.add("daily", "09:00", "打卡")
    prompt = await rig.add("daily", "09:00", "北京天气", mode="prompt")
    once = await rig.add("once", "2030-01-07 09:00", "开会")
    await rig.add("once", "2030-01-07 09:00", "别的群", caller=ALICE.model_copy(update={"chat_id": "g2"}))
    rig.clock.now = at(SH, "2030-01-07 09:00")
    report = await rig.service.fire_due(rig.clock.now)
    assert [(m.chat.key, m.text) for m in await rig.texts_sent()] == [("memory:group:g2", "⏰ 提醒：别的群")]
    assert model.requests == [] and (report.delivered, report.skipped) == (1, 3)
    assert await rig.bot.history.recent(rig.ch.chat("g1")) == []
    assert [(await rig.row(r)).next_fire for r in (daily, prompt)] == [at(SH, "2030-01-08 09:00")] * 2
    # A one-time reminder's moment has passed unannounced: kept active it would be due at every pass.
    assert (await rig.row(once)).status == "missed"
    await rig.bot.stop()
    allowed = await rig_factory(at(SH, "2030-01-08 08:00"), model=model)  # same database, g1 no longer ignored
    await allowed.fire(at(SH, "2030-01-08 09:00"))
    assert sorted(m.text for m in allowed.ch.sent) == ["⏰ 提醒：打卡", "北京晴"]
