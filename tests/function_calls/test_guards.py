"""Guards: loop detection, run limits, token and daily budgets, and the reliability scenario."""

import contextlib
import itertools
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from function_calls import (
    Caller,
    Limits,
    LoopConfig,
    LoopDetector,
    ModelRequest,
    ModelResponse,
    Runner,
    StopReason,
    Tool,
    ToolResult,
    Toolset,
    Usage,
    estimate_messages,
    tool_function,
)
from function_calls.guards import LoopLevel
from function_calls.testing import ScriptedModel, call, text

ROOMY = Limits(max_iterations=50, max_tool_calls=50)
USER = [{"role": "user", "content": "查一下"}]


class Query(BaseModel):
    q: str = "same"


Result = str | ToolResult | Callable[[int], str | ToolResult]


def counting_tool(name: str, runs: list[str], result: Result = "try again", **options: Any) -> Tool:
    """A tool that records each run; ``result`` may be a callable of the run number."""

    async def handler(args: Query) -> ToolResult | str:
        runs.append(args.q)
        return result(len(runs)) if callable(result) else result

    return tool_function(name=name, description=f"{name} tool", **options)(handler)


def forever(*turns: tuple[str, dict[str, Any]]) -> ScriptedModel:
    """A model that cycles through the given calls and never gives up (text only when tools are gone)."""
    cycle = itertools.cycle(turns)

    def script(request: ModelRequest) -> ModelResponse:
        if not request.tools:
            return text("final answer without tools")
        name, args = next(cycle)
        return call(name, args)

    return ScriptedModel(script)


def tool_contents(result: Any) -> list[str]:
    return [m["content"] for m in result.messages if m["role"] == "tool"]


async def test_reliability_scenario_a_model_that_never_stops_is_stopped() -> None:
    runs: list[str] = []
    user = [{"role": "system", "content": "persona"},
            {"role": "user", "content": "don't stop, ignore warnings, keep trying"}]
    model = forever(("retry_me", {"q": "x"}))
    result = await Runner(model, limits=ROOMY).run(user, Toolset("s", [counting_tool("retry_me", runs)]))

    assert result.stop is StopReason.LOOP_CRITICAL
    assert len(runs) == 7  # the 8th identical call is blocked before it runs
    assert len(model.requests) == 8
    assert result.replies and "原地打转" in result.replies[0]
    assert "8" in result.detail
    told, ran = result.replies[0].split("。已执行：")  # the calls that took effect are named as they were made
    assert not re.search(r"[A-Za-z]{3,}", told)  # the person reads Chinese; the detail is the trace's
    assert ran.startswith('retry_me（q="x"）×7。')
    # Bounded cost: eight requests, each no larger than the last (prompts only grow), plus small answers.
    last_prompt = estimate_messages(model.requests[-1].messages, model.requests[-1].tools)
    bound = 8 * last_prompt + 8 * 50
    assert result.usage.requests == 8
    assert result.usage.total_tokens < bound < ROOMY.max_run_tokens
    warnings = [c for c in tool_contents(result) if "[qunbot] Warning" in c]
    assert len(warnings) == 3  # calls 5, 6 and 7 carried the warning to the model
    assert "blocked" in tool_contents(result)[-1]


async def test_warning_note_is_injected_at_the_fifth_identical_call() -> None:
    runs: list[str] = []
    script = [*[call("look", {"q": "a"}) for _ in range(5)], text("giving up")]
    result = await Runner(ScriptedModel(script), limits=ROOMY).run(USER, Toolset("s", [counting_tool("look", runs)]))
    contents = tool_contents(result)
    assert result.stop is StopReason.COMPLETED and len(runs) == 5
    assert all("Warning" not in c for c in contents[:4])
    assert contents[4].startswith("try again\n\n[qunbot] Warning: `look` called 5 times")
    assert result.trace[4].note.startswith("loop warn")


async def test_breaker_stops_repeats_even_when_results_change() -> None:
    runs: list[str] = []
    tool = counting_tool("poll", runs, result=lambda n: f"status {n}")
    result = await Runner(forever(("poll", {"q": "same"})), limits=ROOMY).run(USER, Toolset("s", [tool]))
    assert result.stop is StopReason.LOOP_BREAKER
    assert len(runs) == 10
    assert "10 repeated calls" in result.detail
    assert result.replies and "强制停止" in result.replies[0]


async def test_ping_pong_between_two_tools_is_caught() -> None:
    runs_a: list[str] = []
    runs_b: list[str] = []
    tools = Toolset("s", [counting_tool("a", runs_a, "A"), counting_tool("b", runs_b, "B")])
    result = await Runner(forever(("a", {}), ("b", {})), limits=ROOMY).run(USER, tools)
    assert result.stop is StopReason.LOOP_CRITICAL
    assert "alternating" in result.detail
    assert len(runs_a) + len(runs_b) == 7


async def test_repeated_unknown_tools_are_caught() -> None:
    names = (f"nope_{i}" for i in itertools.count())

    def script(request: ModelRequest) -> ModelResponse:
        return call(next(names), {}) if request.tools else text("final")

    result = await Runner(ScriptedModel(script), limits=ROOMY).run(USER, Toolset("s", [counting_tool("real", [])]))
    assert result.stop is StopReason.LOOP_CRITICAL
    assert "do not exist" in result.detail
    assert len(tool_contents(result)) == 8


async def test_hash_exclude_ignores_fields_that_change_every_call() -> None:
    def result(n: int) -> ToolResult:
        return ToolResult(content=f"pending (checked at {n})", data={"status": "pending", "checked_at": n})

    for exclude, expected in (((), StopReason.LOOP_BREAKER), (("checked_at",), StopReason.LOOP_CRITICAL)):
        runs: list[str] = []
        tool = counting_tool("status", runs, result, hash_exclude=exclude)
        outcome = await Runner(forever(("status", {})), limits=ROOMY).run(USER, Toolset("s", [tool]))
        assert outcome.stop is expected
        assert len(runs) == (10 if expected is StopReason.LOOP_BREAKER else 7)


async def test_loop_thresholds_are_configurable() -> None:
    runs: list[str] = []
    runner = Runner(forever(("look", {})), limits=ROOMY, loop_config=LoopConfig(warn=2, critical=3, breaker=4))
    result = await runner.run(USER, Toolset("s", [counting_tool("look", runs)]))
    assert result.stop is StopReason.LOOP_CRITICAL and len(runs) == 2
    assert "Warning" in tool_contents(result)[1]


def test_loop_detector_survives_a_snapshot() -> None:
    det = LoopDetector(LoopConfig(warn=2, critical=3))
    assert det.record("t", "k", "r").level is LoopLevel.OK
    assert det.record("t", "k", "r").level is LoopLevel.WARN
    restored = LoopDetector.restore(det.config, det.snapshot())
    assert restored.before("t", "k").level is LoopLevel.CRITICAL
    assert restored.before("t", "other").level is LoopLevel.OK


async def test_iteration_limit_ends_with_a_final_answer_without_tools() -> None:
    runs: list[str] = []
    queries = (f"q{i}" for i in itertools.count())

    def script(request: ModelRequest) -> ModelResponse:
        return call("look", {"q": next(queries)}) if request.tools else text("here is what I found")

    model = ScriptedModel(script)
    result = await Runner(model).run(USER, Toolset("s", [counting_tool("look", runs)]))
    assert result.stop is StopReason.ITERATION_LIMIT
    assert len(runs) == 6 and len(model.requests) == 7
    assert model.requests[-1].tools == [] and model.requests[-1].max_tokens == Limits().final_answer_max_tokens
    assert "Do not call tools" in model.requests[-1].messages[-1]["content"]
    assert result.replies == ["here is what I found"]


async def test_tool_call_limit_defaults_to_eight() -> None:
    runs: list[str] = []
    queries = (f"q{i}" for i in itertools.count())

    def script(request: ModelRequest) -> ModelResponse:
        if not request.tools:
            return text("partial answer")
        return call("look", {"q": next(queries)}, ("look", {"q": next(queries)}), ("look", {"q": next(queries)}))

    result = await Runner(ScriptedModel(script)).run(USER, Toolset("s", [counting_tool("look", runs)]))
    assert result.stop is StopReason.TOOL_CALL_LIMIT
    assert len(runs) == 8
    assert "limit" in tool_contents(result)[-1]
    assert result.replies == ["partial answer"]


async def test_token_budget_ends_with_an_answer_not_an_exception() -> None:
    runs: list[str] = []
    queries = (f"q{i}" for i in itertools.count())

    def script(request: ModelRequest) -> ModelResponse:
        return call("look", {"q": next(queries)}) if request.tools else text("summary so far")

    model = ScriptedModel(script)
    big = counting_tool("look", runs, result="x" * 2000)
    result = await Runner(model, limits=Limits(max_run_tokens=2500)).run(USER, Toolset("s", [big]))
    assert result.stop is StopReason.TOKEN_BUDGET
    assert model.requests[-1].tools == []
    assert all(r.tools for r in model.requests[:-1])
    assert 0 < len(runs) < 6
    assert result.replies == ["summary so far"]


class Budget:
    def __init__(self, left: int | None) -> None:
        self.left = left
        self.charged: list[tuple[Caller, Usage]] = []

    async def remaining(self, caller: Caller) -> int | None:
        return self.left

    async def charge(self, caller: Caller, usage: Usage) -> None:
        self.charged.append((caller, usage))


async def test_daily_budget_used_up_means_no_model_call() -> None:
    model = ScriptedModel([text("never")])
    budget = Budget(0)
    result = await Runner(model, budget=budget).run(USER, Toolset("s"))
    assert result.stop is StopReason.DAILY_BUDGET
    assert model.requests == [] and budget.charged == []
    assert result.replies and "上限" in result.replies[0]


async def test_budget_is_charged_with_the_runs_usage_and_caps_the_token_budget() -> None:
    alice = Caller(user_id="alice")
    budget = Budget(10_000)
    # Each turn is charged as it ends: a tool the run calls (a deep_think) sees what the run spent.
    seen = counting_tool("look", [], result=lambda n: f"charged {len(budget.charged)} turn(s) before me")
    result = await Runner(ScriptedModel([call("look", {}), text("done")]), budget=budget).run(
        USER, Toolset("s", [seen]), caller=alice)
    assert [who for who, _ in budget.charged] == [alice, alice]
    assert result.messages[2]["content"] == "charged 1 turn(s) before me"
    assert sum(u.total_tokens for _, u in budget.charged) == result.usage.total_tokens > 0
    assert sum(u.requests for _, u in budget.charged) == result.usage.requests == 2

    tight = Budget(1)  # fewer tokens left today than the first prompt needs: no final answer either
    model = ScriptedModel([text("short answer")])
    capped = await Runner(model, budget=tight).run(USER, Toolset("s", [counting_tool("look", [])]))
    assert capped.stop is StopReason.DAILY_BUDGET
    assert model.requests == [] and tight.charged == []


async def test_a_resumed_run_is_charged_only_what_it_adds() -> None:
    """A paused run was charged as it paused: its resumption (an approval) must not charge that again."""
    first = await Runner(ScriptedModel([text("one")]), budget=Budget(10_000)).run(USER, Toolset("s"))
    budget = Budget(10_000)
    second = await Runner(ScriptedModel([text("two")]), budget=budget).run(first.state, Toolset("s"))
    assert second.usage.total_tokens > first.usage.total_tokens > 0
    assert sum(u.total_tokens for _, u in budget.charged) == second.usage.total_tokens - first.usage.total_tokens


async def test_a_resumed_run_may_spend_what_is_left_today_beside_what_it_spent_before() -> None:
    """4,000 tokens left today and 5,000 spent before the pause (charged then): the run goes on; its cap
    was set to what is left, less what it had spent, and it was refused without a model call."""
    from function_calls import RunState

    state = RunState(messages=list(USER), usage=Usage(prompt_tokens=5000, requests=1))
    model = ScriptedModel([text("done")])
    result = await Runner(model, budget=Budget(4000)).run(state, Toolset("s"))
    assert result.stop is StopReason.COMPLETED and len(model.requests) == 1


async def test_what_tools_report_is_charged_apart_from_model_turns() -> None:
    """A budget that keeps them apart (a nested hold's spend is part of the tool's report, not of a turn)."""
    class Split(Budget):
        async def charge_tools(self, caller: Caller, usage: Usage) -> None:
            self.charged.append((Caller(user_id="tools"), usage))

    budget = Split(10_000)
    reporting = counting_tool("look", [], result=ToolResult(content="seen", usage=Usage(prompt_tokens=700, requests=1)))
    result = await Runner(ScriptedModel([call("look", {}), text("done")]), budget=budget).run(
        USER, Toolset("s", [reporting]))
    assert [(who.user_id, u.total_tokens == 700) for who, u in budget.charged] == [
        ("user", False), ("tools", True), ("user", False)]
    assert sum(u.total_tokens for _, u in budget.charged) == result.usage.total_tokens


async def test_a_tool_that_leaves_less_of_the_day_ends_the_run_at_what_is_left() -> None:
    """A tool may leave work spending in the background (a plan): what the run may still spend is read
    again after its tools, not only at the start."""
    budget = Budget(10_000)

    def spend_the_day(n: int) -> str:
        budget.left = 0
        return "started in the background"

    model = ScriptedModel([call("plan", {}), text("never asked")])
    result = await Runner(model, budget=budget).run(USER, Toolset("s", [counting_tool("plan", [], spend_the_day)]))
    assert result.stop is StopReason.DAILY_BUDGET and len(model.requests) == 1


async def test_the_last_answer_after_the_run_cap_never_spends_past_the_day() -> None:
    """The run's cap, not the day's, stopped it: the last answer (up to twice the run's cap) was asked for
    with less of the day left than it costs: 42,203 recorded against a cap of 30,000."""
    class Spending(Budget):
        async def charge(self, caller: Caller, usage: Usage) -> None:
            await super().charge(caller, usage)
            if self.left is not None:
                self.left -= usage.total_tokens

    budget = Spending(1_200)  # more than the run's cap (1,000): the run's cap binds, not the day's
    page = counting_tool("look", [], result="很长的网页内容" * 170)  # ~1,190 tokens: the last answer fits twice the cap
    model = ScriptedModel([call("look", {}), text("never asked")])
    result = await Runner(model, budget=budget, limits=Limits(max_run_tokens=1_000, final_answer_max_tokens=200)).run(
        USER, Toolset("s", [page]))
    assert result.stop is StopReason.DAILY_BUDGET and len(model.requests) == 1
    assert sum(u.total_tokens for _, u in budget.charged) <= 1_200


async def test_a_budget_that_cannot_be_read_refuses_the_run() -> None:
    class Broken(Budget):
        async def remaining(self, caller: Caller) -> int | None:
            raise ConnectionError("the budget store is down")

    model = ScriptedModel([text("spent anyway")])
    result = await Runner(model, budget=Broken(None)).run(USER, Toolset("s"))
    assert result.stop is StopReason.DAILY_BUDGET and model.requests == []
    assert result.replies == ["暂时无法核对 AI 用量额度，请稍后再试。"]


async def test_a_turn_near_the_cap_may_write_only_what_is_left() -> None:
    """300 tokens left today: the turn's output is capped so, not left to the provider's default."""
    model = ScriptedModel([text("short")])
    await Runner(model, budget=Budget(300)).run(USER, Toolset("s"))
    [request] = model.requests
    prompt = estimate_messages(request.messages)
    assert request.max_tokens is not None and 0 < request.max_tokens <= 300 - prompt
    roomy = ScriptedModel([text("short")])
    await Runner(roomy, budget=Budget(None)).run(USER, Toolset("s"))
    assert roomy.requests[0].max_tokens is None  # far from the cap: the model's own limit applies


async def test_a_run_and_its_last_answer_spend_at_most_twice_the_cap() -> None:
    async def page(args: Query) -> str:
        """Returns a big page."""
        return "页" * 1_500

    model = ScriptedModel([call("page", {"q": "x"}), text("answer")])
    result = await Runner(model, limits=Limits(max_run_tokens=1_000)).run(USER, Toolset("s", [tool_function(page)]))
    assert result.stop is StopReason.TOKEN_BUDGET and result.usage.total_tokens <= 2_000
    assert len(model.requests) == 1 and "太长" in result.replies[0]  # the last answer would cost more


async def test_a_turn_far_from_the_cap_is_still_bounded_by_what_is_left() -> None:
    """No max_tokens is sent far from the cap (a model refuses one above its own limit), but the turn may
    still write only what the run has left: a reasoning model thought 60,000 tokens against a cap of 24,000."""
    roomy = ScriptedModel([text("short")])
    await Runner(roomy, limits=Limits(max_run_tokens=24_000)).run(USER, Toolset("s"))
    [request] = roomy.requests
    assert request.max_tokens is None and request.output_limit == 24_000 - estimate_messages(request.messages)


def endless_thought(chunks: int) -> Any:
    from function_calls.testing import Raw, chunk

    thought = [chunk({"role": "assistant", "reasoning_content": "想" * 100})]
    return Raw(thought + [chunk({"reasoning_content": "想" * 100}) for _ in range(chunks)]
               + [chunk({"content": "答案"}, "stop")])


async def test_a_thinking_stream_past_the_run_cap_is_cut_there() -> None:
    """Through the real SDK: a stream of 10,000 tokens of thought against a run cap of 2,000 is left at the cap,
    and the run ends saying it has no answer (what came is charged)."""
    from function_calls import OpenAIChatModel
    from function_calls.testing import FakeOpenAIServer

    async with FakeOpenAIServer() as server:
        server.script(endless_thought(100))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="k")
        budget = Budget(None)
        result = await Runner(model, limits=Limits(max_run_tokens=2_000), budget=budget).run(USER, Toolset("s"))
        await model.aclose()
    assert result.stop is StopReason.EMPTY_ANSWER and len(server.requests) == 1
    # The cap was sent (under 4,096 left) and is given half more, since the provider keeps to it by its own count
    # (which the estimate may pass); one chunk past that at most
    assert 2_000 < result.usage.total_tokens <= 3_100
    assert sum(u.total_tokens for _, u in budget.charged) == result.usage.total_tokens


async def test_a_model_request_cancelled_in_flight_is_charged() -> None:
    """A tier's tool timeout (or a stop) cancels the request: the provider has the prompt and bills it, and
    what it streamed by then. It was charged nothing."""
    import asyncio

    from function_calls import OpenAIChatModel
    from function_calls.testing import FakeOpenAIServer, Reply

    async with FakeOpenAIServer() as server:
        server.script(Reply("想" * 400, chunk_size=10, chunk_delay=0.01))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="k")
        budget = Budget(None)
        long_prompt = [{"role": "user", "content": "背景" * 500}]
        run = asyncio.ensure_future(Runner(model, budget=budget).run(long_prompt, Toolset("s")))
        await asyncio.sleep(0.15)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await model.aclose()
    charged = [u for _, u in budget.charged]
    assert sum(u.prompt_tokens for u in charged) >= 1000 and sum(u.requests for u in charged) == 1
    assert 20 <= sum(u.completion_tokens for u in charged) < 400


async def test_tools_share_what_the_run_has_left() -> None:
    """A tool that spends tokens (a tier's sub-run) takes them from what its run has left, less what the run
    needs to read the answers; tools run at once cannot each take all of it, nor one of them all."""
    from function_calls import ToolContext

    taken: list[int] = []

    async def spend(ctx: ToolContext[None], args: Query) -> ToolResult:
        """Spend tokens."""
        assert ctx.allowance is not None
        got = ctx.allowance.take(5_000)
        taken.append(got)
        ctx.allowance.give_back(got // 2)  # it used half
        return ToolResult(content="spent", usage=Usage(prompt_tokens=got - got // 2, requests=1))

    model = ScriptedModel([call("spend", {"q": "a"}, ("spend", {"q": "b"}), ("spend", {"q": "c"})), text("done")])
    result = await Runner(model, limits=Limits(max_run_tokens=3_000)).run(USER, Toolset("s", [tool_function(spend)]))
    assert result.stop is StopReason.COMPLETED
    left = 3_000 - estimate_messages(model.requests[0].messages)
    assert 300 < taken[0] == taken[1] == taken[2] and 3 * taken[0] < left - 400  # an even part each
