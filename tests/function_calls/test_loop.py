"""The invoke loop: concurrency, ordering, action tools, streaming, state and approvals."""

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from function_calls import (
    Caller,
    Limits,
    ModelResponse,
    OpenAIChatModel,
    Runner,
    RunState,
    StopReason,
    Tool,
    ToolCall,
    ToolContext,
    ToolError,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import Call, FakeOpenAIServer, Reply, ScriptedModel, call, text

USER = [{"role": "user", "content": "go"}]


class Job(BaseModel):
    n: int = 0
    delay: float = 0.0


class Gauge:
    """Counts how many handlers run at once."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.log: list[tuple[str, int]] = []

    async def hold(self, name: str, n: int, delay: float) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.log.append((f"start {name}", self.active))
        await asyncio.sleep(delay)
        self.log.append((f"end {name}", n))
        self.active -= 1


def work_tool(gauge: Gauge, name: str = "work", **options: Any) -> Tool:
    async def work(job: Job) -> str:
        """Do a job."""
        await gauge.hold(name, job.n, job.delay)
        return f"{name} {job.n} done"

    return tool_function(name=name, **options)(work)


def calls(name: str, first: dict[str, Any], *rest: dict[str, Any]) -> ModelResponse:
    """One model turn calling ``name`` once per argument dict."""
    return call(name, first, *[(name, job) for job in rest])


def tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["role"] == "tool"]


async def test_six_calls_run_concurrently_up_to_the_cap_of_four() -> None:
    gauge = Gauge()
    model = ScriptedModel([calls("work", *[{"n": i, "delay": 0.03} for i in range(6)]), text("all done")])
    result = await Runner(model).run(USER, Toolset("s", [work_tool(gauge)]))
    assert result.stop is StopReason.COMPLETED
    assert gauge.peak == 4
    assert len(tool_messages(result.messages)) == 6


async def test_parallel_cap_is_configurable() -> None:
    gauge = Gauge()
    model = ScriptedModel([calls("work", *[{"n": i, "delay": 0.02} for i in range(5)]), text("ok")])
    await Runner(model, limits=Limits(parallel_tools=2)).run(USER, Toolset("s", [work_tool(gauge)]))
    assert gauge.peak == 2


async def test_a_sequential_tool_runs_alone() -> None:
    gauge = Gauge()
    tools = Toolset("s", [work_tool(gauge), work_tool(gauge, "seq", sequential=True)])
    turn = call("work", {"n": 1, "delay": 0.02}, ("work", {"n": 2, "delay": 0.02}), ("seq", {"n": 3, "delay": 0.02}),
                ("work", {"n": 4, "delay": 0.02}), ("work", {"n": 5, "delay": 0.02}))
    await Runner(ScriptedModel([turn, text("ok")])).run(USER, tools)
    events = [e for e, _ in gauge.log]
    seq_start, seq_end = events.index("start seq"), events.index("end seq")
    assert dict(gauge.log)["start seq"] == 1  # nothing else was running when it started
    assert events[seq_start + 1] == "end seq"  # and nothing started while it ran
    assert {"end work"} == {e for e in events[:seq_start] if e.startswith("end")}
    assert events[:seq_start].count("end work") == 2
    assert events[seq_end + 1:].count("start work") == 2


async def test_a_failing_call_does_not_cancel_its_siblings_and_hides_internals() -> None:
    gauge = Gauge()

    async def boom() -> str:
        """Always fails."""
        raise RuntimeError("db password=hunter2 leaked")

    tools = Toolset("s", [work_tool(gauge), tool_function(boom)])
    model = ScriptedModel([call("boom", {}, ("work", {"n": 7, "delay": 0.02})), text("partial")])
    result = await Runner(model).run(USER, tools)
    assert result.stop is StopReason.COMPLETED
    first, second = (m["content"] for m in tool_messages(result.messages))
    assert first == "`boom` failed internally (RuntimeError)."
    assert "hunter2" not in str(result.model_dump())
    assert second == "work 7 done"


async def test_a_call_past_its_timeout_is_stopped_and_told_while_its_sibling_finishes() -> None:
    gauge, stopped = Gauge(), asyncio.Event()

    async def slow() -> str:
        """Never finishes in time."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "late"

    for turn in (call("slow", {}), call("slow", {}, ("work", {"n": 3, "delay": 0.01}))):  # alone, then with another
        stopped.clear()
        tools = Toolset("s", [work_tool(gauge), tool_function(timeout_s=0.05)(slow)])
        result = await Runner(ScriptedModel([turn, text("sorry")])).run(USER, tools)
        assert result.stop is StopReason.COMPLETED and result.text == "sorry"
        contents = [m["content"] for m in tool_messages(result.messages)]
        assert contents[0] == "`slow` timed out after 0.05s." and contents[1:] in ([], ["work 3 done"])
        assert stopped.is_set()


async def test_each_run_has_its_own_id() -> None:
    ids = {(await Runner(ScriptedModel([text("hi")])).run(USER, Toolset("s", []))).state.run_id for _ in range(20)}
    assert len(ids) == 20 and all(len(i) == 12 and int(i, 16) >= 0 for i in ids)


async def test_results_come_back_in_call_order_whatever_finishes_first() -> None:
    gauge = Gauge()
    turn = calls("work", *[{"n": i, "delay": 0.05 * (4 - i)} for i in range(4)])
    result = await Runner(ScriptedModel([turn, text("ok")])).run(USER, Toolset("s", [work_tool(gauge)]))
    assert [n for e, n in gauge.log if e.startswith("end")] == [3, 2, 1, 0]  # finished in reverse
    msgs = tool_messages(result.messages)
    assert [m["tool_call_id"] for m in msgs] == [c.id for c in turn.tool_calls]
    assert [m["content"] for m in msgs] == [f"work {i} done" for i in range(4)]


def action_and_data_tools(runs: list[str]) -> Toolset:
    async def set_alarm(c: ToolContext[str], job: Job) -> ToolResult:
        """Set an alarm."""
        runs.append(f"alarm for {c.caller.user_id} via {c.deps}")
        return ToolResult.reply(f"已设置闹钟 {job.n}")

    async def lookup(job: Job) -> str:
        """Look something up."""
        runs.append("lookup")
        return f"value {job.n}"

    return Toolset("s", [tool_function(set_alarm), tool_function(lookup)])


async def test_an_action_tool_reply_ends_the_run_without_another_model_call() -> None:
    runs: list[str] = []
    model = ScriptedModel([call("set_alarm", {"n": 7}), text("unused")])
    result = await Runner(model).run(USER, action_and_data_tools(runs), caller=Caller(user_id="alice"),
                                     deps_for=lambda tool: f"deps:{tool.name}")
    assert result.stop is StopReason.ANSWERED_BY_TOOL
    assert len(model.requests) == 1
    assert result.replies == ["已设置闹钟 7"]
    assert runs == ["alarm for alice via deps:set_alarm"]
    assert tool_messages(result.messages)[0]["content"] == "已设置闹钟 7"


async def test_a_data_tool_result_goes_back_to_the_model() -> None:
    runs: list[str] = []
    model = ScriptedModel([call("lookup", {"n": 3}), text("the value is 3")])
    result = await Runner(model).run(USER, action_and_data_tools(runs))
    assert result.stop is StopReason.COMPLETED
    assert len(model.requests) == 2
    assert model.requests[1].messages[-1]["content"] == "value 3"
    assert result.replies == ["the value is 3"]


async def test_action_and_data_in_one_turn_still_asks_the_model_and_keeps_both_replies() -> None:
    model = ScriptedModel([call("set_alarm", {"n": 1}, ("lookup", {"n": 2})), text("and the value is 2")])
    result = await Runner(model).run(USER, action_and_data_tools([]))
    assert len(model.requests) == 2
    assert result.replies == ["已设置闹钟 1", "and the value is 2"]


async def test_streamed_text_deltas_reach_on_text_end_to_end() -> None:
    deltas: list[str] = []

    async def on_text(delta: str) -> None:
        deltas.append(delta)

    async with FakeOpenAIServer() as server:
        server.script(Reply(tool_calls=[Call("lookup", {"n": 5}, id="k1")]), Reply("the answer is five", chunk_size=4))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="k")
        result = await Runner(model).run(USER, action_and_data_tools([]), on_text=on_text)
        await model.aclose()
    assert result.stop is StopReason.COMPLETED and result.text == "the answer is five"
    assert len(deltas) > 1 and "".join(deltas) == "the answer is five"
    second = server.requests[1].messages
    assert second[-2]["tool_calls"][0]["id"] == "k1"
    assert second[-1] == {"role": "tool", "tool_call_id": "k1", "content": "value 5"}
    assert result.usage.requests == 2 and result.usage.prompt_tokens > 0


async def test_a_reply_that_cannot_be_read_is_not_told_as_a_network_failure() -> None:
    """An instant HTTP 200 with no JSON read "连接不上或超时" to the person: the admin looked at the network."""
    from function_calls.guards import RetryPolicy
    from function_calls.testing import Raw

    async with FakeOpenAIServer() as server:
        server.script(Raw(body="<html>gateway says hi</html>", headers={"Content-Type": "application/json"}))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="k", stream=False)
        broken = await Runner(model, retry=RetryPolicy(max_retries=0)).run(USER, Toolset("t"))
        await model.aclose()
    gone = OpenAIChatModel(model="fake-model", base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k")
    refused = await Runner(gone, retry=RetryPolicy(max_retries=0)).run(USER, Toolset("t"))
    await gone.aclose()
    assert broken.stop is refused.stop is StopReason.MODEL_ERROR
    assert "返回的内容无法读取" in broken.text and "连接不上或超时" in refused.text


async def test_tool_errors_and_timeouts_go_back_to_the_model() -> None:
    async def picky() -> str:
        """Refuses."""
        raise ToolError("no such city")

    async def slow() -> str:
        """Hangs."""
        await asyncio.sleep(5)
        return "late"

    tools = Toolset("s", [tool_function(picky), tool_function(timeout_s=0.05)(slow)])
    model = ScriptedModel([call("picky", {}, ("slow", {})), text("sorry")])
    result = await Runner(model).run(USER, tools)
    assert [m["content"] for m in tool_messages(result.messages)] == ["no such city", "`slow` timed out after 0.05s."]
    assert result.stop is StopReason.COMPLETED


async def test_admin_only_tools_are_neither_offered_nor_run_for_others() -> None:
    runs: list[str] = []

    async def wipe() -> str:
        """Wipe everything."""
        runs.append("wiped")
        return "wiped"

    tools = Toolset("s", [tool_function(admin_only=True)(wipe), *action_and_data_tools([])])
    model = ScriptedModel([call("wipe"), text("no")])
    await Runner(model).run(USER, tools, caller=Caller(is_admin=False))
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["set_alarm", "lookup"]
    assert runs == []


def confirm_tool(runs: list[str]) -> Toolset:
    async def kick(job: Job) -> ToolResult:
        """Remove a member (needs approval)."""
        runs.append(f"kicked {job.n}")
        return ToolResult(content=f"member {job.n} removed")

    return Toolset("s", [tool_function(confirm=True)(kick)])


async def test_approval_pause_serialises_and_resumes_after_a_restart() -> None:
    runs: list[str] = []
    asked: list[str] = []

    async def undecided(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        asked.append(tool.name)
        return None

    async def approve(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        return True

    turn = call("kick", {"n": 42})
    first = await Runner(ScriptedModel([turn]), approver=undecided).run(USER, confirm_tool(runs))
    assert first.stop is StopReason.AWAITING_APPROVAL
    assert asked == ["kick"] and runs == []
    assert [c.name for c in first.state.pending] == ["kick"]
    assert first.replies and "kick" in first.replies[0]

    stored = first.state.model_dump_json()
    state = RunState.model_validate_json(stored)
    assert state == first.state

    model = ScriptedModel([text("removed member 42")])
    resumed = await Runner(model, approver=approve).run(state, confirm_tool(runs))
    assert resumed.stop is StopReason.COMPLETED
    assert runs == ["kicked 42"]
    assert resumed.replies == ["removed member 42"]
    answers = [m for m in tool_messages(model.requests[0].messages) if m["tool_call_id"] == turn.tool_calls[0].id]
    assert [m["content"] for m in answers] == ["member 42 removed"]  # one answer per call id, the real one
    assert resumed.state.pending == []


async def test_only_the_calls_waiting_for_approval_are_pending() -> None:
    """A call that ran out of argument retries beside a paused one is reported to the model, not
    listed for approval and not run again on resume."""
    runs: list[str] = []

    async def count(job: Job) -> str:
        """Count."""
        runs.append(f"count {job.n}")
        return "counted"

    tools = Toolset("s", [*confirm_tool(runs), tool_function(retries=0)(count)])

    async def undecided(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        return None

    first = await Runner(ScriptedModel([call("kick", {"n": 7}, ("count", {"n": "x"}))]),
                         approver=undecided).run(USER, tools)
    assert first.stop is StopReason.AWAITING_APPROVAL
    assert [c.name for c in first.state.pending] == ["kick"] and "count" not in first.replies[0]

    async def approve(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        return True

    model = ScriptedModel([text("removed member 7")])
    resumed = await Runner(model, approver=approve).run(first.state, tools)
    assert resumed.stop is StopReason.COMPLETED and runs == ["kicked 7"]


async def test_a_declined_call_is_reported_to_the_model() -> None:
    runs: list[str] = []

    async def decline(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        return False

    model = ScriptedModel([call("kick", {"n": 1}), text("the admin said no")])
    result = await Runner(model, approver=decline).run(USER, confirm_tool(runs))
    assert runs == [] and result.replies == ["the admin said no"]
    assert "declined" in model.requests[1].messages[-1]["content"]


async def test_events_are_emitted_and_a_broken_observer_cannot_break_the_run() -> None:
    events: list[dict[str, Any]] = []

    async def observer(event: dict[str, Any]) -> None:
        events.append(event)
        raise RuntimeError("observer bug")

    model = ScriptedModel([call("lookup", {"n": 1}), text("ok")])
    result = await Runner(model).run(USER, action_and_data_tools([]), on_event=observer)
    assert result.stop is StopReason.COMPLETED
    assert [(e["type"], e["name"], e["result"]) for e in events] == [("tool", "lookup", "value 1")]


async def test_a_failing_approver_neither_crashes_the_run_nor_runs_the_tool() -> None:
    runs: list[str] = []

    async def broken(c: ToolCall, tool: Tool, caller: Caller) -> bool | None:
        raise ConnectionError("approval store down")

    model = ScriptedModel([call("kick", {"n": 1}), text("could not get approval")])
    result = await Runner(model, approver=broken).run(USER, confirm_tool(runs))
    assert runs == [] and result.stop is StopReason.COMPLETED
    assert "not run" in model.requests[1].messages[-1]["content"]


async def test_a_tools_own_model_usage_counts_in_the_run() -> None:
    from function_calls import Runner, ToolResult, Toolset, Usage, tool_function
    from function_calls.testing import ScriptedModel, call

    @tool_function
    async def digest() -> ToolResult:
        """Summarise with the model behind the scenes."""
        return ToolResult.reply("摘要", usage=Usage(prompt_tokens=1000, completion_tokens=50, requests=3))

    model = ScriptedModel([call("digest")])
    result = await Runner(model).run([{"role": "user", "content": "总结"}], Toolset("t", [digest]))
    assert result.usage.requests == 4  # one turn of the loop + the tool's three
    assert result.usage.prompt_tokens >= 1000 and result.usage.completion_tokens >= 50


async def test_a_tool_cancelled_from_inside_is_an_error_result_and_every_call_is_answered() -> None:
    """A handler awaiting a future someone else cancelled raises CancelledError: that is the tool's
    failure, not the run's (which went on raising it, or lost the call's answer beside a sibling)."""

    async def flaky(job: Job) -> str:
        """Awaits a shared future another request cancelled."""
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        return str(await future)

    async def fine(job: Job) -> str:
        """Fine."""
        return "ok"

    tools = Toolset("s", [tool_function(flaky), tool_function(fine)])
    for turn in (call("flaky", {"n": 1}), call("flaky", {"n": 1}, ("fine", {"n": 2}))):
        model = ScriptedModel([turn, text("done")])
        result = await Runner(model).run(USER, tools)
        assert result.stop is StopReason.COMPLETED and result.replies == ["done"]
        asked = {c.id for c in turn.tool_calls}
        answered = {m["tool_call_id"] for m in tool_messages(model.requests[1].messages)}
        assert answered == asked and "cancelled" in tool_messages(model.requests[1].messages)[0]["content"]


async def test_a_run_cancelled_from_outside_stops_with_its_tool() -> None:
    started = asyncio.Event()

    async def slow(job: Job) -> str:
        """Takes long."""
        started.set()
        await asyncio.sleep(30)
        return "late"

    run = asyncio.create_task(Runner(ScriptedModel([call("slow", {"n": 1}), text("x")])).run(
        USER, Toolset("s", [tool_function(slow)])))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def test_thinking_sent_back_counts_in_the_estimate_of_a_request() -> None:
    # DeepSeek's thinking mode gets its reasoning back (reasoning_pass_back): the run's token cap and
    # its final-answer guard read this estimate, and spent three times the cap when it left it out.
    from function_calls.tokens import estimate_messages

    thought = {"role": "assistant", "content": "晴", "reasoning_content": "先查北京的天气，再查上海的。" * 200}
    assert estimate_messages([thought]) >= 2800
