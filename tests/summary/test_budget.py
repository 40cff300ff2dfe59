"""Summaries reserve their cost before spending it: concurrency cannot overspend a budget."""

from __future__ import annotations

import asyncio
from pathlib import Path

import summary
from function_calls import ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel


async def test_ten_concurrent_summaries_cannot_exceed_a_small_daily_budget(tmp_path: Path) -> None:
    async def slow(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0.05)  # every run is in flight before the first one is charged
        return text("要点：周五下午三点开会，小王订会议室。" * 8)

    model = ScriptedModel(slow)
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path},
                        limits={"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 3000})
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin])
    await bot.start()
    try:
        for n in range(30):
            await ch.inject(f"第 {n} 条：我们周五下午三点在三楼会议室讨论下个季度的发布计划，记得带电脑。", user=str(n % 4))
        await asyncio.gather(*(ch.inject("/summary", user="9") for _ in range(10)))
        sent = await ch.wait_sent(10)
        used = await bot.budget.used("user:memory:9")
    finally:
        await bot.stop()
    assert used <= 3000
    llm = [m for m in sent if "用量已达上限" not in m.text]
    assert llm and len(model.requests) >= 1  # the budget bought at least one real summary
    assert sum("今天的 AI 用量已达上限" in m.text for m in sent) == 10 - len(llm)


async def test_a_summary_is_charged_exactly_once_on_the_command_and_the_model_paths(tmp_path: Path) -> None:
    spent: list[int] = []
    inner = ScriptedModel(lambda r: call("summary", {}) if r.tools else text("模型总结"))

    async def counting(request: ModelRequest) -> ModelResponse:
        response = await inner.complete(request)
        spent.append(response.usage.total_tokens)
        return response.model_copy(update={"usage": response.usage.model_copy(update={"requests": 1})})

    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path}, limits={"user_burst": 50, "chat_burst": 50})
    bot = Bot(settings, model=ScriptedModel(counting), channels=[ch], plugins=[summary.plugin])
    await bot.start()
    try:
        for n in range(5):
            await ch.inject(f"消息 {n}", user=str(n))
        await ch.inject("/summary messages=5", user="9")
        await ch.wait_sent(1)
        assert await bot.budget.used("user:memory:9") == sum(spent) > 0
        before = sum(spent)
        await ch.inject("总结一下", user="8", at_bot=True)
        await ch.wait_sent(2)
        assert await bot.budget.used("user:memory:8") == sum(spent) - before > 0
        assert await bot.budget.used("bot") == sum(spent)
    finally:
        await bot.stop()
