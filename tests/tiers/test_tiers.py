"""Model tiers: deep_think (M0) and plan (M2) on a local OpenAI-compatible server through the real SDK.

The bot's own model (M1) is a ScriptedModel; each tier is a FakeOpenAIServer named in
``[llm.think]`` / ``[llm.plan]``, so configuration, the SDK and the accounting are all real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import memory
import tiers
import tiers.tools
from function_calls import ModelRequest, ModelResponse, Toolset, Usage
from function_calls.testing import Call, Delay, FakeOpenAIServer, Fault, Reply, ScriptedModel, call, text
from function_calls.testing.server import Usage as ServerUsage
from robot.bot import Bot
from robot.config import Settings
from robot.config_file import load_settings
from robot.plugin import Plugin
from robot.testing import MemoryChannel
from tests.robot.conftest import admin_transfer
from tiers import strip_reasoning

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def tier(server: FakeOpenAIServer, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "base_url": server.base_url, "api_key": "sk-tier", **extra}


@asynccontextmanager
async def running(tmp_path: Path, model: Any, limits: dict[str, Any] | None = None,
                  **llm: Any) -> AsyncIterator[tuple[Bot, MemoryChannel]]:
    ch = MemoryChannel(clock=lambda: NOW)
    settings = Settings(bot={"data_dir": tmp_path}, llm=llm, limits=limits or {"user_burst": 50, "chat_burst": 50})
    bot = Bot(settings, model=model, channels=[ch], plugins=[memory.plugin, tiers.plugin], clock=lambda: NOW)
    await bot.start()
    try:
        yield bot, ch
    finally:
        await bot.stop()


async def ask(ch: MemoryChannel, message: str, **kw: Any) -> str:
    before = len(ch.sent)
    await ch.inject(message, **kw)
    return (await ch.wait_sent(before + 1))[before].text


def tool_result(request: ModelRequest) -> str | None:
    last = request.messages[-1]
    return str(last["content"]) if last["role"] == "tool" else None


async def test_without_tiers_the_tools_are_not_offered(tmp_path: Path) -> None:
    model = ScriptedModel([text("好")])
    async with running(tmp_path, model) as (bot, ch):
        assert "deep_think" not in bot.offered_tools().names() and "plan" not in bot.offered_tools().names()
        await ask(ch, "你好", chat=ch.chat("u1", kind="private"))
        assert not {"deep_think", "plan"} & {t["function"]["name"] for t in model.requests[0].tools}
        assert "没有配置 [llm.think]" in await ask(ch, "/deep_think 1+1", chat=ch.chat("u1", kind="private"))


def test_reasoning_is_stripped() -> None:
    assert strip_reasoning("<think>先算 6×7……</think>\n答案是 42") == "答案是 42"
    assert strip_reasoning("答案<reasoning>x</reasoning>是 42") == "答案是 42"
    assert strip_reasoning("<think>没有写完的推理") == ""


async def test_deep_think_answers_with_its_own_model_and_only_memory_tools(tmp_path: Path) -> None:
    def parent(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(f"思考结果：{result}") if result else call("deep_think", {"question": "6 乘 7 是多少"})

    async with FakeOpenAIServer() as think_server:
        think_server.script(Reply("<think>6×7，先算 6×5=30，再加 12</think>答案是 42"))
        model = ScriptedModel(parent)
        async with running(tmp_path, model, think=tier(think_server, max_run_tokens=5000)) as (bot, ch):
            reply = await ask(ch, "帮我认真想想 6 乘 7", chat=ch.chat("u1", kind="private"))
            assert reply == "思考结果：答案是 42"  # the reasoning never reaches the chat
            sent = think_server.requests[0].body
            assert "一步一步" in sent["messages"][0]["content"]
            assert sorted(t["function"]["name"] for t in sent["tools"]) == ["recall", "remember"]
            assert sent["model"] == "fake-model"
            assert think_server.requests[0].headers["authorization"] == "Bearer sk-tier"
            end = next(e for e in ch.events if e.get("type") == "run_end")
            tiers_used: dict[str, int] = end["tiers"]  # type: ignore[assignment]
            assert tiers_used["think"] > 0 and tiers_used["execute"] > 0
            assert end["tokens"] == tiers_used["think"] + tiers_used["execute"]
            used = await bot.budget.used("user:memory:u1")  # the user's day counts both tiers
            assert used == end["tokens"]


async def test_a_tier_sends_its_requests_as_llm_says_unless_it_says_otherwise(tmp_path: Path) -> None:
    # [llm] token_param = "max_completion_tokens" never reached the think tier: a reasoning model there
    # refused max_tokens with HTTP 400.
    def parent(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(f"思考结果：{result}") if result else call("deep_think", {"question": "6 乘 7 是多少"})

    async with FakeOpenAIServer() as think_server:
        think_server.script(Reply("答案是 42"), Reply("答案是 42"))
        async with running(tmp_path, ScriptedModel(parent), think=tier(think_server, max_run_tokens=1000),
                           token_param="max_completion_tokens", reasoning_pass_back=True) as (bot, ch):
            assert await ask(ch, "想想 6 乘 7", chat=ch.chat("u1", kind="private")) == "思考结果：答案是 42"
            sent = think_server.requests[0].body
            assert "max_completion_tokens" in sent and "max_tokens" not in sent
            assert bot.deps_for(tiers.tools.deep_think).think.model.reasoning_pass_back is True
    async with FakeOpenAIServer() as think_server:
        think_server.script(Reply("答案是 42"))
        async with running(tmp_path / "own", ScriptedModel(parent), token_param="max_completion_tokens",
                           think=tier(think_server, token_param="max_tokens", max_run_tokens=1000)) as (_bot, ch):
            await ask(ch, "想想 6 乘 7", chat=ch.chat("u1", kind="private"))
            assert "max_tokens" in think_server.requests[0].body  # the tier's own setting wins


async def test_a_plan_asks_nobody_when_approvals_ask_user_is_off(tmp_path: Path) -> None:
    def bot_model(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(result or "") if result else call("plan", {"goal": "团建定在周几"})

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Reply("周六。"))
        settings = Settings(bot={"data_dir": tmp_path}, llm={"plan": tier(plan_server)}, approvals={"ask_user": False},
                            limits={"user_burst": 50, "chat_burst": 50})
        bot = Bot(settings, model=ScriptedModel(bot_model), channels=[ch := MemoryChannel(clock=lambda: NOW)],
                  plugins=[memory.plugin, tiers.plugin], clock=lambda: NOW)
        await bot.start()
        try:
            assert await ask(ch, "安排团建", at_bot=True) == "周六。"
        finally:
            await bot.stop()
        assert {t["function"]["name"] for t in plan_server.requests[0].body["tools"]} == {"execute", "recall",
                                                                                           "remember"}


async def test_plan_executes_steps_with_the_chat_tools_and_reports_each_tier(tmp_path: Path) -> None:
    def bot_model(request: ModelRequest) -> ModelResponse:
        names = {t["function"]["name"] for t in request.tools}
        if "plan" in names:  # the chat run
            result = tool_result(request)
            return text(result or "") if result else call("plan", {"goal": "记住周会改到周四并确认"})
        # execute (M1 inside the plan): no recursion into plan/deep_think
        assert not {"plan", "deep_think", "execute"} & names
        if tool_result(request):
            return text("已记住")
        return call("remember", {"content": "周会改到周四", "scope": "group"})

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Reply(tool_calls=[Call("execute", {"task": "记住：周会改到周四"})]),
                           Reply("<think>都做完了</think>周会已改到周四，并已记住。"))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server)) as (bot, ch):
            reply = await ask(ch, "帮我把周会改期这件事办了", at_bot=True)
            assert reply == "周会已改到周四，并已记住。"
            assert "周会改到周四" in await ask(ch, "/recall 周会")
            tools = {t["function"]["name"] for t in plan_server.requests[0].body["tools"]}
            assert tools == {"execute", "ask_user", "recall", "remember"}  # no deep_think without a think tier
            end = next(e for e in ch.events if e.get("type") == "run_end")
            tiers_used: dict[str, int] = end["tiers"]  # type: ignore[assignment]
            assert tiers_used["plan"] > 0 and tiers_used["execute"] > 0
            assert sum(tiers_used.values()) == end["tokens"]
            # Recorded once: the execute step's tokens were charged twice (its hold passed them to the plan's,
            # which then spent the plan's whole usage, the step's included, again)
            assert await bot.budget.used("user:memory:u1") == end["tokens"]


async def test_a_scheduled_plan_executes_with_only_the_tools_the_schedule_allows(tmp_path: Path) -> None:
    """A prompt reminder allowed ``plan`` and ``recall`` cannot reach ``remember`` through the plan's steps."""
    from function_calls import Caller

    execute_tools: list[set[str]] = []

    def bot_model(request: ModelRequest) -> ModelResponse:
        names = {t["function"]["name"] for t in request.tools}
        if "plan" in names:  # the scheduled run
            result = tool_result(request)
            return text(result or "") if result else call("plan", {"goal": "记住周会改到周四"})
        execute_tools.append(names)
        return text("做不到") if tool_result(request) is None else text("好")

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Reply(tool_calls=[Call("execute", {"task": "记住：周会改到周四"})]), Reply("没能记住。"))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server)) as (bot, _ch):
            caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group")
            result = await bot.run_scheduled("安排周会", caller, allow=["plan", "recall"])
            assert result is not None and result.stop.value == "completed"
            assert execute_tools == [{"recall"}]  # not remember, not every chat tool
            tools = {t["function"]["name"] for t in plan_server.requests[0].body["tools"]}
            assert tools == {"execute", "recall"}
        assert "remember" in {t.name for t in bot.offered_tools()}  # chats still have it


async def test_plan_is_bounded_by_its_own_limits(tmp_path: Path) -> None:
    def bot_model(request: ModelRequest) -> ModelResponse:
        if "plan" in {t["function"]["name"] for t in request.tools}:
            result = tool_result(request)
            return text("计划失败：" + result[:40]) if result else call("plan", {"goal": "无穷无尽"})
        return text("做了")

    def forever(body: dict[str, Any]) -> Reply:
        return Reply(tool_calls=[Call("execute", {"task": f"第 {len(body['messages'])} 步"})])

    async with FakeOpenAIServer(responder=forever) as plan_server, \
            running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server, max_iterations=3,
                                                                  max_tool_calls=2)) as (_, ch):
        reply = await ask(ch, "做个计划", chat=ch.chat("u1", kind="private"))
        assert reply.startswith("计划失败：the plan tier stopped early")
        assert len(plan_server.requests) <= 3


async def test_a_long_plan_reports_back_through_the_outbox(tmp_path: Path) -> None:
    def bot_model(request: ModelRequest) -> ModelResponse:
        return call("plan", {"goal": "慢慢做"})

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Delay(0.6, Reply("全部完成")))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server, reply_within_s=0.1)) as (bot, ch):
            first = await ask(ch, "做个慢计划", at_bot=True)
            assert "完成后我会在这里汇报" in first
            sent = await ch.wait_sent(2, timeout=5)
            assert sent[1].text == "计划完成：\n全部完成" and sent[1].mention == ("u1",)
            assert await bot.budget.used("user:memory:u1") > 0  # the background work is charged too


@pytest.fixture
def short_plan_timeout() -> Iterator[None]:
    """The plan tool's 600 s timeout as 0.5 s (a frozen Tool: set in place, put back after)."""
    before = tiers.tools.plan.timeout_s
    object.__setattr__(tiers.tools.plan, "timeout_s", 0.5)
    yield
    object.__setattr__(tiers.tools.plan, "timeout_s", before)


@pytest.mark.usefixtures("short_plan_timeout")
async def test_a_plan_allowed_longer_than_its_tool_timeout_still_reports_back(tmp_path: Path) -> None:
    """reply_within_s at or past the tool's timeout: /plan was answered "执行超时" while its work went on,
    spending, unsupervised and never reported."""
    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Delay(0.8, Reply("全部完成：已经订好会议室")))
        async with running(tmp_path, ScriptedModel([text("x")]), plan=tier(plan_server, reply_within_s=1.0)) as (_, ch):
            assert "完成后我会在这里汇报" in await ask(ch, "/plan 订会议室", chat=ch.chat("u1", kind="private"))
            assert (await ch.wait_sent(2, timeout=5))[1].text == "计划完成：\n全部完成：已经订好会议室"


async def test_a_cancelled_plan_takes_its_work_with_it(tmp_path: Path) -> None:
    """The plan tool cancelled (its timeout, its run's end): the plan's work went on calling models and tools."""
    from function_calls import Caller

    model = ScriptedModel([text("订好了")])
    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Delay(0.3, Reply(tool_calls=[Call("execute", {"task": "订会议室"})])), Reply("完成"))
        async with running(tmp_path, model, plan=tier(plan_server, reply_within_s=30)) as (bot, _ch):
            caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="u1", chat_kind="private")
            started = asyncio.ensure_future(bot.invoke_tool(tiers.tools.plan, tiers.PlanArgs(goal="订会议室"), caller,
                                                            ZoneInfo("UTC"), via="command", run_id="r", call_id="c"))
            async with asyncio.timeout(5):
                while not plan_server.requests:
                    await asyncio.sleep(0.01)
            started.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await started
            await asyncio.sleep(0.5)
            assert len(plan_server.requests) == 1 and model.requests == []
            assert not bot.deps_for(tiers.tools.plan).tasks


async def test_a_background_plan_stopped_by_a_restart_tells_the_chat(tmp_path: Path) -> None:
    """The bot stopped (a deploy) while a plan it had promised to report on ("完成后我会在这里汇报结果") worked:
    the plan was cancelled and the chat heard nothing, then or after the restart."""
    def bot_model(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(result) if result is not None else call("plan", {"goal": "安排下周团建"})

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Delay(5, Reply("计划：周五爬山")))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server, reply_within_s=0.1)) as (bot, ch):
            assert "完成后我会在这里汇报" in await ask(ch, "帮我们安排团建", at_bot=True)
            assert bot.deps_for(tiers.tools.plan).tasks  # still working as the bot stops
        # Queued through the outbox before it stopped (what it could not deliver goes out at the next start)
        assert [m.text for m in ch.sent][1:] == ["这个计划因为机器人停止运行被中断了，没有完成；需要的话请重新发起。"]
        assert ch.sent[1].mention == ("u1",)


TRANSFERS: list[int] = []
transfer = admin_transfer(TRANSFERS)


async def test_a_plans_step_says_honestly_that_it_cannot_ask_for_approval(tmp_path: Path) -> None:
    """A plan's execute step reached a tool an admin must approve, approvals configured: it was refused with
    "审批功能尚未启用" (approvals are not enabled), relayed as such, and the step was offered the chat's
    ask_user, which can only fail the same way."""
    offered: list[set[str]] = []
    results: list[str] = []

    def bot_model(request: ModelRequest) -> ModelResponse:
        names = {t["function"]["name"] for t in request.tools}
        result = tool_result(request)
        if "plan" in names:  # the chat run
            return text(result) if result is not None else call("plan", {"goal": "给张三转 42"})
        offered.append(names)
        if result is not None:
            results.append(result)
            return text(f"没有执行：{result}")
        return call("transfer", {"amount": 42})

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Reply(tool_calls=[Call("execute", {"task": "转 42"})]), Reply("转账需要你直接找我办。"))
        settings = Settings(bot={"data_dir": tmp_path, "admins": ["memory:9"]}, llm={"plan": tier(plan_server)},
                            limits={"user_burst": 50, "chat_burst": 50})
        bot = Bot(settings, model=ScriptedModel(bot_model), channels=[ch := MemoryChannel(clock=lambda: NOW)],
                  plugins=[tiers.plugin, Plugin("risky", Toolset("risky", [transfer]))], clock=lambda: NOW)
        await bot.start()
        try:
            assert await ask(ch, "帮我规划并给张三转 42", at_bot=True) == "转账需要你直接找我办。"
        finally:
            await bot.stop()
    assert TRANSFERS == [] and offered[0] == {"transfer"}  # not ask_user: nobody can answer it there
    assert len(results) == 1 and "尚未启用" not in results[0]
    assert "计划" in results[0] and "直接" in results[0]  # why, and what the person can do instead


async def test_a_failing_tier_is_explained_in_chinese_and_its_error_is_no_partial_result(tmp_path: Path) -> None:
    """A tier whose endpoint fails: /deep_think showed the person the model's English note, and the
    runner's own error reply labelled "Partial result" (the model read that too; a late plan's report alike)."""
    def parent(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(f"思考结果：{result}") if result else call("deep_think", {"question": "6 乘 7 是多少"})

    failed = "AI 服务暂时不可用（接口返回 HTTP 400），请稍后再试。"
    async with FakeOpenAIServer() as think_server, FakeOpenAIServer() as plan_server:
        think_server.script(Fault(400), Fault(400))
        plan_server.script(Delay(0.2, Fault(400)))
        async with running(tmp_path, ScriptedModel(parent), think=tier(think_server),
                           plan=tier(plan_server, reply_within_s=0.05)) as (_, ch):
            private = ch.chat("u1", kind="private")
            assert await ask(ch, "/deep_think 6*7", chat=private) == f"深度思考没能完成：{failed}"
            told = await ask(ch, "帮我认真想想 6 乘 7", chat=private)
            assert "stopped early" in told and "Partial result" not in told and failed not in told
            assert "完成后我会在这里汇报" in await ask(ch, "/plan 订会议室", chat=private)
            assert (await ch.wait_sent(4, timeout=5))[3].text == f"计划没能完成：{failed}"


async def test_a_tier_cut_off_while_thinking_shows_none_of_its_thinking(tmp_path: Path) -> None:
    # Its whole text an unclosed <think>: "深度思考没能完成：<think>用户问的是……" went to the chat.
    thought = "<think>用户问的是内部事情，群里的张三昨天私聊说"
    async with FakeOpenAIServer() as think_server, FakeOpenAIServer() as plan_server:
        think_server.script(Reply(thought))
        plan_server.script(Delay(0.2, Reply(thought)))
        async with running(tmp_path, ScriptedModel([text("x")]), think=tier(think_server),
                           plan=tier(plan_server, reply_within_s=0.05)) as (_, ch):
            private = ch.chat("u1", kind="private")
            # (the model reads an unclosed leading <think> as thinking: no answer, and the runner says so)
            empty = "我这次没能给出回答（只有思考过程，没有回答），请换个说法再试。"
            assert await ask(ch, "/deep_think 6*7", chat=private) == f"深度思考没能完成：{empty}"
            await ask(ch, "/plan 订会议室", chat=private)
            assert (await ch.wait_sent(3, timeout=5))[2].text == f"计划没能完成：{empty}"


async def test_a_tier_sized_to_what_is_left_today_asks_no_last_answer_past_it(tmp_path: Path) -> None:
    # Its hook said nothing of the day: a long context made the sub-run ask for a last answer allowed
    # twice its cap, and 5,348 tokens were recorded against a day's cap of 4,000.
    context = "会议纪要：" + "项目进度讨论，预算调整。" * 400
    async with FakeOpenAIServer() as think_server:
        reported = ServerUsage(prompt_tokens=4_500, completion_tokens=500)  # as a provider counts that prompt
        think_server.script(Reply("结论：……", usage=reported), Reply("结论：……", usage=reported))
        async with running(tmp_path, ScriptedModel([text("x")]), think=tier(think_server),
                           limits={"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 4_000,
                                   "chat_daily_tokens": None}) as (bot, ch):
            await ask(ch, f"/deep_think 总结要点 context={context}", chat=ch.chat("u1", kind="private"))
            assert await bot.budget.used("user:memory:u1") <= 4_000


async def test_two_plans_one_message_started_both_report_back(tmp_path: Path) -> None:
    """Both reports were keyed by the message alone: the outbox took the second for the first's
    duplicate, and that plan's work (already paid for) was never told."""
    turns = iter([call("plan", {"goal": "订会议室"}, ("plan", {"goal": "发通知"})), text("好的")])
    model = ScriptedModel(lambda r: next(turns))

    def plan_reply(body: dict[str, Any]) -> Delay:
        return Delay(0.3, Reply(f"完成：{body['messages'][1]['content']}"))

    async with FakeOpenAIServer(plan_reply) as plan_server, \
            running(tmp_path, model, plan=tier(plan_server, reply_within_s=0.05)) as (_bot, ch):
        await ch.inject("帮我订会议室并发通知", user="u1", at_bot=True)
        async with asyncio.timeout(10):
            while sum(m.text.startswith("计划完成") for m in ch.sent) < 2:
                await asyncio.sleep(0.05)


async def test_a_plan_gone_to_the_background_spends_the_askers_model_rate(tmp_path: Path) -> None:
    """A typed /plan that goes on in the background called a model all the same: it counts against
    the person's model requests per minute (with a burst of 1, their next question waits)."""
    model = ScriptedModel([text("不该这么快")])
    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Delay(0.6, Reply("全部完成")))
        async with running(tmp_path, model, limits={"user_burst": 1, "user_per_minute": 0.1},
                           plan=tier(plan_server, reply_within_s=0.1)) as (_bot, ch):
            private = ch.chat("u1", kind="private")
            assert "完成后我会在这里汇报" in await ask(ch, "/plan 慢慢做", chat=private)
            await ask(ch, "你好", chat=private)
            assert model.requests == []


def test_tier_tables_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "qunbot.toml"
    path.write_text('[llm.think]\nmodel = "o-think"\nmax_iterations = 3\n\n[llm.plan]\nmodel = "o-plan"\n',
                    encoding="utf-8")
    settings, _ = load_settings(path)
    assert settings.llm.think is not None and settings.llm.think.model == "o-think"
    assert settings.llm.think.max_iterations == 3
    assert settings.llm.plan is not None and settings.llm.plan.model == "o-plan"
    assert json.dumps(settings.llm.model_dump(mode="json")["think"]["api_key"]) == "null"


def test_exports() -> None:
    import tiers.tools

    for module in (tiers, tiers.tools):
        assert [n for n in module.__all__ if not hasattr(module, n)] == []


async def test_concurrent_tier_runs_reserve_the_daily_budget(tmp_path: Path) -> None:
    """Two /deep_think at once cannot both spend what is left of the day: the first holds it."""
    from function_calls.testing.server import Usage as WireUsage

    async with FakeOpenAIServer(lambda body: Delay(0.5, Reply("答案", usage=WireUsage(700, 100, 800)))) as server:
        ch = MemoryChannel(clock=lambda: NOW)
        settings = Settings(bot={"data_dir": tmp_path}, llm={"think": tier(server, max_run_tokens=5000)},
                            limits={"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 1000})
        bot = Bot(settings, model=ScriptedModel([text("好")]), channels=[ch], plugins=[memory.plugin, tiers.plugin],
                  clock=lambda: NOW)
        await bot.start()
        try:
            await asyncio.gather(ch.inject("/deep_think 第一题", chat=ch.chat("u1", kind="private")),
                                 ch.inject("/deep_think 第二题", user="u1"))
            replies = [m.text for m in await ch.wait_sent(2)]
            assert len(server.requests) == 1  # the second found the day held by the first
            assert "答案" in replies and any("用量已达上限" in r for r in replies)
            assert await bot.budget.used("user:memory:u1") == 800
        finally:
            await bot.stop()


async def test_a_plan_asks_the_user_and_goes_on_with_the_answer(tmp_path: Path) -> None:
    answers: list[str] = []

    def plan_responder(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] != "tool":
            return Reply(tool_calls=[Call("ask_user", {"tip": "团建定在周几？", "timeout_s": 60})])
        answers.append(str(last["content"]))
        return Reply(f"好的，定在{last['content']}")

    def bot_model(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(result) if result is not None else call("plan", {"goal": "安排团建"})

    async with FakeOpenAIServer(plan_responder) as plan_server, \
            running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server, reply_within_s=0.1)) as (_bot, ch):
        await ch.inject("帮我安排团建", at_bot=True)
        sent = await ch.wait_sent(2, timeout=5)  # the question and "this takes a while", in either order
        assert {m.text for m in sent} == {"团建定在周几？", "这个计划需要一些时间，完成后我会在这里汇报结果。"}
        assert all(m.mention == ("u1",) for m in sent)
        await ch.inject("周五", user="u2")  # another member's message is not the answer
        await ch.inject("周五下午", user="u1")  # not addressed to the bot: still the answer
        sent = await ch.wait_sent(3, timeout=5)
        assert answers == ["周五下午"] and sent[2].text == "计划完成：\n好的，定在周五下午"


async def test_an_unanswered_question_gives_no_reply_after_its_timeout() -> None:
    from robot.ask_user import NO_REPLY, Questions

    questions = Questions()
    assert await questions.ask("memory:group:g1", "memory:u1", 0.05) == NO_REPLY
    assert not questions.answer("memory:group:g1", "memory:u1", "迟到的回答")  # nobody waits any more


async def test_deep_think_may_spend_what_the_days_last_run_holds(tmp_path: Path) -> None:
    """3,000 tokens left today and the chat run holds them all: a deep_think the model calls borrows from
    that hold (it found no fresh room and was refused as "budget spent"), and the day is not overspent."""
    from function_calls import Caller, Usage
    from function_calls.testing.server import Usage as WireUsage

    def parent(request: ModelRequest) -> ModelResponse:
        result = tool_result(request)
        return text(f"思考结果：{result}") if result else call("deep_think", {"question": "6 乘 7 是多少"})

    async with FakeOpenAIServer(lambda body: Reply("答案是 42", usage=WireUsage(600, 100, 700))) as server:
        limits = {"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 10_000}
        async with running(tmp_path, ScriptedModel(parent), limits, think=tier(server, max_run_tokens=5000),
                           max_run_tokens=4000) as (bot, ch):
            await bot.budget.charge(Caller(platform="memory", user_id="u1"), Usage(prompt_tokens=7000))
            reply = await ask(ch, "帮我认真想想 6 乘 7", chat=ch.chat("u1", kind="private"))
            assert reply == "思考结果：答案是 42"
            end = next(e for e in ch.events if e.get("type") == "run_end")
            assert end["tiers"]["think"] == 700  # type: ignore[index]
            used = await bot.budget.used("user:memory:u1")
            assert used == 7000 + int(end["tokens"]) <= 10_000  # type: ignore[call-overload]
            assert await bot.budget.remaining(Caller(platform="memory", user_id="u1")) == 10_000 - used


async def test_two_deep_thinks_at_once_cannot_both_spend_what_the_run_holds(tmp_path: Path) -> None:
    """Each may write as much as its cap lets it (the worst case): each borrows its part of what the run has
    not spent, less what the run needs to read their answers, and the day is not overspent."""
    from function_calls import Caller, Usage
    from function_calls.testing.server import Usage as WireUsage

    def parent(request: ModelRequest) -> ModelResponse:
        if tool_result(request):
            return text("好了")
        return call("deep_think", {"question": "第一题"}, ("deep_think", {"question": "第二题"}))

    def greedy(body: dict[str, Any]) -> Reply:
        out = int(body.get("max_tokens") or 100_000)
        return Reply("答案", usage=WireUsage(1, out, out + 1))

    async with FakeOpenAIServer(greedy) as server:
        limits = {"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 10_000}
        async with running(tmp_path, ScriptedModel(parent), limits, think=tier(server, max_run_tokens=5000),
                           max_run_tokens=4000) as (bot, ch):
            await bot.budget.charge(Caller(platform="memory", user_id="u1"), Usage(prompt_tokens=7000))
            # They left the run what it needs to read their answers (they spent the whole day: the answers
            # were thrown away)
            assert await ask(ch, "两道题", chat=ch.chat("u1", kind="private")) == "好了"
            assert len(server.requests) == 2 and server.requests[0].body["max_tokens"] > 100
            results = sorted(str(e["result"]) for e in ch.events if e.get("type") == "tool")
            assert results == ["答案", "答案"]
            assert 8000 < await bot.budget.used("user:memory:u1") <= 10_000


def honest(body: dict[str, Any]) -> Reply:
    """A think model that writes as much as its request lets it (its cap honoured, 5,000 without one)."""
    out = int(body.get("max_tokens") or 5000)
    return Reply("想好了", usage=ServerUsage(300, out, 300 + out))


async def test_deep_thinks_at_once_share_what_the_calling_run_has_left(tmp_path: Path) -> None:
    """Four deep_thinks in one turn, each tier run capped at 5,000, in a request capped at 6,000: each was sized
    by the day, and the request spent 2.9 times its cap (its answers then thrown away)."""
    def parent(request: ModelRequest) -> ModelResponse:
        if tool_result(request):
            return text("综合结论")
        return call("deep_think", {"question": "方面 0"}, *[("deep_think", {"question": f"方面 {i}"}) for i in range(1, 4)])

    async with FakeOpenAIServer(honest) as think_server:
        limits = {"user_burst": 50, "chat_burst": 50, "user_daily_tokens": 200_000}
        async with running(tmp_path, ScriptedModel(parent), limits, think=tier(think_server, max_run_tokens=5000),
                           max_run_tokens=6000) as (bot, ch):
            assert await ask(ch, "全面想想", chat=ch.chat("u1", kind="private")) == "综合结论"  # answered
            end = next(e for e in ch.events if e.get("type") == "run_end")
            think = end["tiers"]["think"]  # type: ignore[index]
            assert think > 1000 and int(end["tokens"]) <= 6000  # type: ignore[call-overload]
            assert await bot.budget.used("user:memory:u1") == end["tokens"]
            caps = sorted(r.body["max_tokens"] for r in think_server.requests)  # an even part each
            assert len(caps) == 4 and caps[0] == caps[-1] and 4 * caps[0] < 6000


async def test_a_plans_steps_share_what_the_plan_has_left(tmp_path: Path) -> None:
    """[llm.plan] max_run_tokens counts its sub-calls: four execute steps at once, each sized by the day, spent
    4.9 times it."""
    def bot_model(request: ModelRequest) -> ModelResponse:
        names = {t["function"]["name"] for t in request.tools}
        if "plan" in names:  # the chat run
            result = tool_result(request)
            return text(result or "") if result else call("plan", {"goal": "安排团建"})
        cap = request.max_tokens or request.output_limit or 0  # a step that writes all it may
        return ModelResponse(text="步骤完成", usage=Usage(prompt_tokens=100, completion_tokens=max(0, cap), requests=1))

    async with FakeOpenAIServer() as plan_server:
        plan_server.script(Reply(tool_calls=[Call("execute", {"task": f"第 {i} 步"}) for i in range(4)],
                                 usage=ServerUsage(400, 60, 460)), Reply("全部完成", usage=ServerUsage(900, 20, 920)))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server, max_run_tokens=5000)) as (_b, ch):
            await ask(ch, "帮我安排团建", chat=ch.chat("u1", kind="private"))
            used = next(e for e in ch.events if e.get("type") == "tool" and e.get("name") == "plan")["data"]["tiers"]
            assert sum(used.values()) <= 5000 and used["execute"] > 1000  # type: ignore[union-attr]


def refuses_to_stream(body: dict[str, Any]) -> Fault | Reply:
    """OpenAI's o3 for an organisation not verified: HTTP 400 to a streamed request, an answer otherwise."""
    if body.get("stream"):
        return Fault(400, "Your organization must be verified to stream this model.", code="unsupported_value")
    return Reply("答案是 42")


@pytest.mark.parametrize("setting", ["[llm.think] stream = false", "none"])
async def test_deep_think_on_a_model_its_provider_will_not_stream(tmp_path: Path, setting: str) -> None:
    """Tiers follow [llm] stream: /deep_think failed every time on such a model, and [llm.think] had no
    stream key of its own. With one it is not streamed; without, the refused stream is asked again unstreamed."""
    async with FakeOpenAIServer(refuses_to_stream) as server:
        think = tier(server, **({"stream": False} if setting != "none" else {}))
        async with running(tmp_path, ScriptedModel([text("好")]), think=think) as (_bot, ch):
            for _ in range(2):
                assert await ask(ch, "/deep_think 6×7 等于几", chat=ch.chat("u1", kind="private")) == "答案是 42"
        streamed = [bool(r.body.get("stream")) for r in server.requests]
        assert streamed == ([False, False] if setting != "none" else [True, False, False])  # refused once, not again


async def test_every_tier_is_told_the_date_time_and_zone(tmp_path: Path) -> None:
    """"/plan 明天下午3点提醒我开会": the execute model sets the reminder ('YYYY-MM-DD HH:MM'), so it (and the
    plan and think models) must know today's date and the chat's zone, as the chat model is told them."""
    clock = "现在是 2026-03-02 20:00 星期一（时区 Asia/Shanghai）"
    executed: list[str] = []

    def bot_model(request: ModelRequest) -> ModelResponse:  # only the execute step reaches it (a /plan)
        executed.append(str(request.messages[0]["content"]))
        return text("提醒已设好") if tool_result(request) else call("remember", {"content": "开会", "scope": "me"})

    async with FakeOpenAIServer() as plan_server, FakeOpenAIServer() as think_server:
        plan_server.script(Reply(tool_calls=[Call("deep_think", {"question": "明天是几号"}),
                                             Call("execute", {"task": "明天下午3点提醒用户开会"})]), Reply("好了"))
        think_server.script(Reply("3 月 3 日"))
        async with running(tmp_path, ScriptedModel(bot_model), plan=tier(plan_server),
                           think=tier(think_server)) as (_bot, ch):
            assert await ask(ch, "/plan 明天下午3点提醒我开会", at_bot=True) == "好了"
    assert clock in plan_server.requests[0].body["messages"][0]["content"]
    assert clock in think_server.requests[0].body["messages"][0]["content"]
    assert executed and clock in executed[0]
