"""Scheduled prompts: the stored zone, failed tool calls reported once, bounded concurrent model runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

import reminders
from function_calls import (
    Caller,
    ModelRequest,
    ModelResponse,
    RunResult,
    RunState,
    StopReason,
    ToolContext,
    ToolError,
    Toolset,
    ToolTrace,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text
from reminders.prompts import run_failure
from reminders.schedule import parse_schedule
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, ReminderStore
from robot.config import ConfigError
from robot.plugin import Plugin

SH, BERLIN = "Asia/Shanghai", "Europe/Berlin"
FAILURE = "⚠️ 定时任务「天气」这次没能执行，之后仍会按时尝试（连续失败不再重复通知）。"


def at(zone: str, wall: str) -> datetime:
    return datetime.fromisoformat(wall).replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)


class SearchArgs(BaseModel):
    query: str


class Weather:
    """A search tool whose backend is down until ``up`` is set."""

    up = False


@tool_function(aliases=["weather"])
async def weather_search(ctx: ToolContext[object], args: SearchArgs) -> str:
    """Search the weather."""
    if not Weather.up:
        raise ToolError("weather backend unavailable (HTTP 503)")
    return "晴，-3°C"


WEATHER: Plugin[object] = Plugin("fake_weather", Toolset("fake_weather", [weather_search]))


# ``rig_factory`` wraps the conftest one: ``add``, ``fire`` and ``texts`` come from its Rig.
Factory = Callable[..., Awaitable[Any]]


@pytest.fixture
async def rig_factory(rig_factory: Factory) -> AsyncIterator[Factory]:
    """Rigs with the fake weather plugin and the bot's zone pinned to Shanghai."""

    async def make(now: datetime, model: Any, cfg: dict[str, Any] | None = None) -> Any:
        return await rig_factory(now, model=model, cfg=cfg, plugins=(WEATHER,), timezone=SH)

    yield make
    Weather.up = False


def search_then_answer(request: ModelRequest) -> ModelResponse:
    """Call the search tool, then answer with whatever came back (an apology after an error)."""
    last = request.messages[-1]
    if last["role"] == "user":
        return call("weather_search", {"query": "北京天气"})
    return text(last["content"] if "晴" in last["content"] else "抱歉，天气服务暂时不可用。")


async def test_a_prompt_runs_with_the_reminders_stored_zone_not_the_chats_current_one(rig_factory: Factory) -> None:
    model = ScriptedModel([text("柏林今天多云")])
    rig = await rig_factory(at(SH, "2030-01-07 16:00"), model)  # 09:00 in Berlin: Tuesday's 08:00 is the first
    # The chat itself has no [bot] zones entry: Shanghai.
    await rig.add("daily", "08:00", "天气", zone=BERLIN, mode="prompt")
    await rig.fire(at(BERLIN, "2030-01-08 08:00"))
    assert await rig.texts() == ["柏林今天多云"]
    assert "现在是 2030-01-08 08:00 星期二（时区 Europe/Berlin）" in model.requests[0].messages[0]["content"]


async def test_a_prompt_whose_tool_fails_is_reported_once_not_delivered_daily(rig_factory: Factory) -> None:
    model = ScriptedModel(search_then_answer)
    rig = await rig_factory(at(SH, "2030-01-07 07:00"), model, {"prompt_tools": ["weather_search"]})
    r = await rig.add("daily", "08:00", "天气", mode="prompt")
    for day in (7, 8, 9):
        await rig.fire(at(SH, f"2030-01-{day:02d} 08:00"))
    assert await rig.texts() == [FAILURE]  # not "抱歉，天气服务暂时不可用。" three times
    assert len(model.requests) == 6  # it did try every day
    row = await rig.service.store.get(r.id)
    assert row is not None and row.failure_reported and row.status == "active"
    Weather.up = True
    await rig.fire(at(SH, "2030-01-10 08:00"))
    Weather.up = False
    await rig.fire(at(SH, "2030-01-11 08:00"))
    assert await rig.texts() == [FAILURE, "晴，-3°C", FAILURE]  # a success resets the once-only report


def result(stop: StopReason, errors: tuple[bool, ...], reply: str = "好") -> RunResult:
    trace = [ToolTrace(call_id=str(i), name="t", arguments="{}", result="x", is_error=e) for i, e in enumerate(errors)]
    return RunResult(stop=stop, replies=[reply] if reply else [], trace=trace, state=RunState(messages=[]))


@pytest.mark.parametrize(("run", "failed"), [
    (result(StopReason.COMPLETED, ()), False),
    (result(StopReason.COMPLETED, (False,)), False),
    (result(StopReason.COMPLETED, (True, False)), False),  # a retry that worked
    (result(StopReason.ANSWERED_BY_TOOL, (False,)), False),
    (result(StopReason.COMPLETED, (True,)), True),
    (result(StopReason.COMPLETED, (True, True)), True),
    (result(StopReason.TOOL_RETRIES_EXHAUSTED, (True, True, True), ""), True),
    (result(StopReason.ITERATION_LIMIT, (False,)), True),
    (result(StopReason.COMPLETED, (), ""), True),
    (None, True),
])
def test_which_runs_count_as_failed(run: RunResult | None, failed: bool) -> None:
    assert (run_failure(run) is not None) == failed


async def test_due_prompts_run_the_model_at_most_n_at_a_time(rig_factory: Factory) -> None:
    running = peak = 0
    third, release = asyncio.Event(), asyncio.Event()

    async def script(request: ModelRequest) -> ModelResponse:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running >= 3:
            third.set()
        await release.wait()
        running -= 1
        return text("好")

    rig = await rig_factory(at(SH, "2030-01-07 07:00"), ScriptedModel(script), {"prompt_concurrency": 3})
    for i in range(10):
        await rig.add("daily", "08:00", f"任务{i}", mode="prompt")
    rig.clock.now = at(SH, "2030-01-07 08:00")
    firing = asyncio.create_task(rig.service.fire_due())
    await asyncio.wait_for(third.wait(), 5)
    for _ in range(20):  # let every other due prompt get as far as it can (DB round trips included)
        await asyncio.sleep(0)
        await rig.bot.db.run(lambda db: None)
    assert running == 3
    release.set()
    report = await asyncio.wait_for(firing, 10)
    assert report.delivered == 10 and peak == 3
    assert len(await rig.texts()) == 10



@tool_function(confirm="admin")
async def open_door(ctx: ToolContext[object]) -> str:
    """Open the office door (an admin approves)."""
    return "门开了"


async def test_a_prompt_that_reaches_a_confirm_tool_asks_in_its_chat_and_answers_once_approved(
        launch: Any) -> None:
    def door_then_answer(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        return call("open_door") if last["role"] == "user" else text(f"早上好，{last['content']}")

    bot, ch, clock = await launch(at(SH, "2030-01-07 07:00"), model=ScriptedModel(door_then_answer),
                                  plugins=[Plugin("door", Toolset("door", [open_door]))],
                                  cfg={"prompt_tools": ["open_door"]}, timezone=SH, admins=["memory:boss"])
    await bot.db.ensure("reminders", SCHEMA)
    service = ReminderService(ReminderStore(bot.db), bot, bot.settings.section("reminders", ReminderSettings))
    alice = Caller(platform="memory", user_id="alice", user_name="Alice", chat_id="g1", chat_kind="group")
    await service.create(alice, parse_schedule("daily", "08:00", SH, None), "开门", "prompt")
    clock.now = at(SH, "2030-01-07 08:00")
    await service.fire_due(clock.now)
    await bot.outbox.flush()
    [request, notice] = [m.text for m in ch.sent]
    assert "需要管理员批准" in request and "open_door()" in request and "/approve" in notice  # no ⚠️ failure
    code = request.split("/approve ", 1)[1][:5]
    await ch.inject(f"/approve {code}", user="boss")
    await bot.approvals.idle()
    await bot.outbox.flush()
    assert [m.text for m in ch.sent][2:] == ["已批准，正在执行。", "早上好，门开了"]


async def test_allowed_commands_and_prompt_tools_may_be_named_as_users_type_them(launch: Any) -> None:
    """``command_tools`` / ``prompt_tools`` take a tool's /command too: ``/weather`` is accepted as a command
    reminder and runs at its time, and a scheduled prompt is offered the tool behind it."""
    model = ScriptedModel(search_then_answer)
    bot, ch, clock = await launch(at(SH, "2030-01-07 07:00"), model=model, plugins=[reminders.plugin, WEATHER],
                                  cfg={"command_tools": ["weather"], "prompt_tools": ["/weather"]}, timezone=SH)
    Weather.up = True
    try:
        await ch.inject("/remind daily 08:00 /weather 北京 mode=command", at_bot=True)
        await ch.inject("/remind daily 08:00 北京天气 prompt", at_bot=True)
        made = [m.text for m in await ch.wait_sent(2)]
        assert all(t.startswith("好的，已设置定时") for t in made), made
        service = bot.deps_for(reminders.reminder_set).service
        clock.now = at(SH, "2030-01-07 08:00")
        await service.fire_due(clock.now)
        await bot.outbox.flush()
    finally:
        Weather.up = False
    assert [m.text for m in ch.sent[2:]].count("晴，-3°C") == 2  # the command's reply and the prompt's answer
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["weather_search"]


async def test_allowed_commands_naming_no_tool_fail_the_start(launch: Any) -> None:
    with pytest.raises(ConfigError, match=r"\[reminders\] command_tools: 'no_such'"):
        await launch(at(SH, "2030-01-07 07:00"), plugins=[reminders.plugin, WEATHER],
                     cfg={"command_tools": ["weather", "no_such"]})
    with pytest.raises(ConfigError, match=r"\[reminders\] prompt_tools: 'weather'"):
        await launch(at(SH, "2030-01-07 07:00"), plugins=[reminders.plugin], cfg={"prompt_tools": ["weather"]})
    # The default, as `qunbot init` writes it out, with the search plugin left out: dropped, the bot starts.
    await launch(at(SH, "2030-01-07 07:00"), plugins=[reminders.plugin], cfg={"prompt_tools": ["perplexity_search"]})


async def test_a_prompt_running_as_the_bot_stops_cleanly_runs_again_at_once(launch: Any) -> None:
    # Its run claim outlived the clean stop by 15 minutes: neither another process nor this one
    # restarted could run the digest before then.
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(request: Any) -> Any:
        started.set()
        await release.wait()
        return text("今天的摘要")

    bot, ch, clock = await launch(at(SH, "2030-01-07 07:00"), model=ScriptedModel(slow), plugins=[reminders.plugin],
                                  timezone=SH)
    await ch.inject("/remind daily 08:00 总结今天 prompt", at_bot=True)
    await ch.wait_sent(1)
    service = bot.deps_for(reminders.reminder_set).service
    clock.now = at(SH, "2030-01-07 08:00")
    firing = asyncio.create_task(service.fire_due(clock.now))
    await asyncio.wait_for(started.wait(), 5)
    await bot.stop(flush_timeout_s=0.2)
    firing.cancel()
    again, ch2, clock2 = await launch(at(SH, "2030-01-07 08:00"), model=ScriptedModel([text("今天的摘要")]),
                                      plugins=[reminders.plugin], timezone=SH)
    await again.deps_for(reminders.reminder_set).service.fire_due(clock2.now)
    await again.outbox.flush()
    assert [m.text for m in ch2.sent] == ["今天的摘要"]
