"""Summaries reserve their cost before spending it: concurrency cannot overspend a budget."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import summary
from function_calls import Caller, ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel
from summary import SummaryArgs


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


# -- the ceiling holds whatever the estimate said, a summary cut short is charged, a cap too small fails ----

async def test_a_summary_never_spends_past_the_days_cap_even_when_its_estimate_fell_short(tmp_path: Path) -> None:
    """Long names and ids on short messages: the estimate undercounted the real chunks, the hold covered
    the estimate, and the summary ran with no ceiling (it spent 126,177 tokens of a 100,000 cap)."""
    from robot.history import Said
    from tests.summary.test_tools import G1, NOW, run_tool, running, summariser

    name, uid, cap = "张三李四王五赵六钱七孙八周九吴十郑十一王十二", "wxid_abcdefghijklmnopqrstuv", 100_000
    async with running(tmp_path, summariser(), limits={"user_daily_tokens": cap}) as (bot, _):
        said = [Said(G1, uid, name, "收到了谢谢", NOW - timedelta(seconds=3000 - i)) for i in range(3000)]
        await bot.db.run(lambda db: bot.history.insert_many_sync(db, said))
        result = await run_tool(bot, SummaryArgs())
        assert result.usage is not None and 0 < result.usage.total_tokens <= cap


async def test_a_summary_cut_short_is_charged_for_the_calls_it_made(tmp_path: Path) -> None:
    """The tool's timeout (600 s) cancels a long map-reduce: what its finished calls spent is charged."""
    from function_calls import Usage
    from tests.summary.test_tools import ago, run_tool, running

    class Slow:
        name, spent = "slow", 0

        async def complete(self, request: Any, *, on_text: Any = None) -> ModelResponse:
            await asyncio.sleep(0.05)
            Slow.spent += 1100
            return ModelResponse(text="要点", usage=Usage(requests=1, prompt_tokens=1000, completion_tokens=100),
                                 finish_reason="stop")

    cap = 1_000_000
    async with running(tmp_path, Slow(), limits={"user_daily_tokens": cap},
                       summary={"max_request_tokens": 900, "chunk_output_tokens": 100}) as (bot, ch):
        for i in range(200):
            await ch.inject(f"第{i}条：" + "讨论内容" * 40, user=str(i % 4), at=ago(300 - i))
        task = asyncio.create_task(run_tool(bot, SummaryArgs(), user="1"))
        await asyncio.sleep(0.6)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        caller = Caller(platform="memory", user_id="1", user_name="1", chat_id="g1", chat_kind="group")
        left = await bot.budget.remaining(caller)
        assert Slow.spent > 0 and left is not None and cap - left >= Slow.spent


async def test_an_owners_prompt_that_leaves_no_room_fails_clearly_instead_of_freezing_the_bot(tmp_path: Path) -> None:
    """A small max_request_tokens and a long owner's prompt: the merge rounds found no two pieces to
    merge and looped without ever awaiting; every chat stopped."""
    from tests.summary.test_tools import ago, run_tool, running, summariser

    sections = {"summary": {"max_request_tokens": 800, "chunk_output_tokens": 200, "prompt": "用正式的语气。" * 70}}
    async with running(tmp_path, summariser(), **sections) as (bot, ch):
        for i in range(3):
            await ch.inject(f"第{i}条消息", user=str(i), at=ago(10 - i))
        async with asyncio.timeout(10):  # (it never returned)
            result = await run_tool(bot, SummaryArgs())
        assert "AI 总结暂时失败" in result.user_messages[0] and (result.data or {})["mode"] == "fallback"


async def test_a_budget_that_cannot_be_read_keeps_the_mark(tmp_path: Path) -> None:
    """The budget store down: an extractive summary, and the messages stay to be summarised by the model
    later (the mark moved, and they never got their AI summary)."""
    from summary.window import read_mark
    from tests.summary.test_tools import G1, ago, run_tool, running, summariser

    async with running(tmp_path, summariser()) as (bot, ch):
        await ch.inject("周六去爬山", user="1", at=ago(5))

        async def down(caller: Caller) -> int:
            raise ConnectionError("the database is restarting")

        real, bot.budget.remaining = bot.budget.remaining, down  # type: ignore[method-assign]
        result = await run_tool(bot, SummaryArgs())
        assert (result.data or {})["mode"] == "budget" and await read_mark(bot.db, G1) is None
        bot.budget.remaining = real  # type: ignore[method-assign]
        assert (await run_tool(bot, SummaryArgs())).data["mode"] == "llm"  # type: ignore[index]


# -- a summary the model calls keeps to what its request has left ([llm] max_run_tokens) ---------------------

async def test_a_summary_the_model_calls_keeps_to_the_requests_token_cap(tmp_path: Path) -> None:
    """The request's cap was ignored: one request spent 16,745 tokens with max_run_tokens = 6000 (at most
    twice that, the README says); deep_think and plan take theirs from what the request has left."""
    from tests.summary.test_tools import ago, running

    spent: list[int] = []
    inner = ScriptedModel(lambda r: call("summary", {"hours": 24}) if r.tools else text("要点：周五发版，小王订会议室。" * 5))

    async def counting(request: ModelRequest) -> ModelResponse:
        response = await inner.complete(request)
        spent.append(response.usage.total_tokens)
        return response.model_copy(update={"usage": response.usage.model_copy(update={"requests": 1})})

    cap = 9000  # the summary's part: about 4000 (the run reads its answer and may write one more)
    async with running(tmp_path, ScriptedModel(counting), llm={"max_run_tokens": cap},
                       summary={"max_request_tokens": 1000, "chunk_output_tokens": 200}) as (_bot, ch):
        for n in range(150):
            await ch.inject(f"第{n}条：我们周五下午三点在三楼会议室讨论下个季度的发布计划，记得带电脑和充电器。",
                            user=f"m{n % 7}", at=ago(200 - n))
        await ch.inject("帮我总结一下最近24小时的群聊", user="u9", at_bot=True)
        reply = (await ch.wait_sent(1))[0].text
    assert sum(spent) <= cap, spent
    assert "这次请求剩余的 AI 用量只够总结" in reply and "的消息没有总结" in reply, reply


async def test_a_summary_the_request_cannot_afford_is_extractive_and_gives_back_what_it_took(
        tmp_path: Path) -> None:
    from function_calls import Allowance, ToolContext
    from tests.summary.test_tools import G1, ago, running, summariser

    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        for n in range(5):
            await ch.inject(f"第{n}条：周六去爬山，记得带水。", user=str(n), at=ago(10 - n))
        caller = Caller(platform="memory", user_id="9", user_name="9", chat_id=G1.chat_id, chat_kind="group")
        results = []
        for left in (50, 20_000):
            allowance = Allowance(left)
            ctx: ToolContext[Any] = ToolContext(deps=bot.deps_for(summary.summary), caller=caller, zone=bot.zone,
                                                clock=bot.clock, allowance=allowance, via="model")
            result = await summary.summary.invoke(ctx, SummaryArgs(hours=1))
            used = result.usage.total_tokens if result.usage is not None else 0
            results.append(((result.data or {}).get("mode"), result.user_messages[0], allowance.left, used))
    (mode, reply, after, used), (mode2, _, after2, used2) = results
    assert mode == "budget" and "这次请求剩余的 AI 用量不够总结这些消息" in reply and after == 50 and used == 0, results
    assert mode2 == "llm" and used2 > 0 and after2 == 20_000 - used2, results
