"""Issue #15 through the running bot: noise never reaches the model, every other message does,
activity counts leave out stickers and the bot, and a budget that cannot cover the window says so."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import summary
from function_calls import Caller, ToolContext, ToolResult
from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.config import Settings
from robot.history import HistoryStore
from robot.message import ChatRef
from robot.testing import MemoryChannel
from summary import SummaryArgs
from summary.signals import is_noise

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "group_day.json").read_text(encoding="utf-8"))


@asynccontextmanager
async def running(tmp_path: Path, model: Any = None, **sections: Any) -> AsyncIterator[Bot]:
    settings = Settings(bot={"data_dir": tmp_path}, **sections)
    bot = Bot(settings, model=model, channels=[MemoryChannel()], plugins=[summary.plugin], clock=lambda: NOW)
    await bot.start()
    try:
        yield bot
    finally:
        await bot.stop()


async def store(bot: Bot, rows: list[tuple[str, str, str, datetime, bool]]) -> None:
    def work(db: Any) -> None:
        for user, name, said, at, from_bot in rows:
            HistoryStore.insert_sync(db, G1, user, name, said, at, from_bot=from_bot)
    await bot.db.run(work)


async def run_tool(bot: Bot, args: SummaryArgs) -> ToolResult:
    caller = Caller(platform="memory", user_id="asker", user_name="asker", chat_id="g1", chat_kind="group")
    ctx: ToolContext[Any] = ToolContext(deps=bot.deps_for(summary.summary), caller=caller, zone=bot.zone,
                                        clock=bot.clock)
    return await summary.summary.invoke(ctx, args)


def fixture_rows() -> list[tuple[str, str, str, datetime, bool]]:
    day = datetime.fromisoformat(FIXTURE["messages"][-1]["at"])
    shift = NOW - timedelta(minutes=5) - day  # the fixture's day, ending just before now
    return [(m["user_id"], m["name"], m["text"], datetime.fromisoformat(m["at"]) + shift, m["from_bot"])
            for m in FIXTURE["messages"]]


def bodies(model: ScriptedModel) -> str:
    return "\n".join(str(r.messages[-1]["content"]) for r in model.requests)


async def test_every_meaningful_message_of_the_day_reaches_the_model_and_no_noise_does(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: text("结论/决定：……"))
    async with running(tmp_path, model) as bot:
        await store(bot, fixture_rows())
        result = await run_tool(bot, SummaryArgs(hours=24))
    sent = bodies(model)
    # the bot's own messages are not summarised (its replies only echo what people asked)
    meaningful = [m for m in FIXTURE["messages"] if not is_noise(m["text"]) and not m["from_bot"]]
    names = {m["user_id"]: m["name"] for m in FIXTURE["messages"]}
    for m in meaningful:  # every one, with @<id> shown as @<name>
        shown = m["text"]
        for user_id, name in names.items():
            shown = shown.replace(f"@{user_id}", f"@{name}")
        assert shown in sent, shown
    assert all(key in sent for key in FIXTURE["facts"].values())  # links whole, facts all there
    assert "[动画表情]" not in sent and "哈哈哈" not in sent and "+1" not in sent
    data = result.data or {}
    assert data["messages_used"] == len(meaningful) and data["noise"] == 231
    assert "· 9 人发言" in result.user_messages[0].splitlines()[0]


async def test_people_who_only_sent_stickers_are_not_counted_as_speakers(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: text("总结"))
    rows = [("1", "甲", "周五聚餐定在海底捞", NOW - timedelta(minutes=9), False),
            ("2", "乙", "[动画表情]", NOW - timedelta(minutes=8), False),
            ("3", "丙", "+1", NOW - timedelta(minutes=7), False),
            ("bot", "qunbot", "好的，已记下", NOW - timedelta(minutes=6), True)]
    async with running(tmp_path, model) as bot:
        await store(bot, rows)
        result = await run_tool(bot, SummaryArgs(hours=1))
    assert result.user_messages[0].splitlines()[0].endswith("· 1 人发言")


async def test_a_window_of_only_noise_costs_no_model_call(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: text("总结"))
    rows = [(str(i), f"人{i}", "哈哈哈", NOW - timedelta(minutes=9 - i), False) for i in range(5)]
    async with running(tmp_path, model) as bot:
        await store(bot, rows)
        result = await run_tool(bot, SummaryArgs(hours=1))
    assert model.requests == [] and (result.data or {})["mode"] == "noise"
    assert "0 人发言" in result.user_messages[0] and "不计" not in result.user_messages[0].splitlines()[0]


async def test_when_the_budget_cannot_cover_the_window_the_reply_names_the_period_left_out(tmp_path: Path) -> None:
    rows = [(str(i % 5), f"成员{i % 5}", f"第{i}条：关于项目进度的讨论，" + "细节" * 30,
             NOW - timedelta(hours=20) + timedelta(minutes=2 * i), False) for i in range(400)]
    model = ScriptedModel(lambda r: text("要点"))
    async with running(tmp_path, model, limits={"user_daily_tokens": 12_000}) as bot:
        await store(bot, rows)
        result = await run_tool(bot, SummaryArgs(hours=24))
    reply = result.user_messages[0]
    data = result.data or {}
    assert data["mode"] == "llm" and 0 < int(str(data["messages_used"])) < 400
    assert "只够总结" in reply and "的消息没有总结" in reply and "周" in reply
    assert int(str(data["prompt_tokens"])) + int(str(data["completion_tokens"])) <= 12_000
    assert "第399条" in bodies(model) and "第0条" not in bodies(model)  # the newest part, not a sample


async def test_a_budget_too_small_for_any_chunk_gives_the_extractive_summary(tmp_path: Path) -> None:
    rows = [("1", "甲", "结论：周五上线，" + "说明" * 200, NOW - timedelta(minutes=5), False)]
    model = ScriptedModel(lambda r: text("要点"))
    async with running(tmp_path, model, limits={"user_daily_tokens": 100}) as bot:
        await store(bot, rows)
        result = await run_tool(bot, SummaryArgs(hours=1))
    assert model.requests == []
    assert "剩余的 AI 用量不够" in result.user_messages[0] and "结论：周五上线" in result.user_messages[0]
