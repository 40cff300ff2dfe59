"""What a run that stops short tells the person once a tool call took effect: the call, and no bare "try again"."""

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from function_calls import (
    Caller,
    Limits,
    LoopConfig,
    ModelAPIError,
    ModelResponse,
    Runner,
    StopReason,
    ToolCall,
    ToolError,
    ToolResult,
    Toolset,
    ToolTrace,
    Usage,
    tool_function,
)
from function_calls.stops import told_text
from function_calls.testing import ScriptedModel, call, text

USER = [{"role": "user", "content": "给 bob 转 5 块"}]
PAID = '已执行：pay（to="bob", amount=5）'
PAY = call("pay", {"to": "bob", "amount": 5})


class Pay(BaseModel):
    to: str
    amount: int
    memo: str = ""


def pay_tool(paid: list[tuple[str, int]], *, receipt: str = "", fail: bool = False, tell: bool = False,
             **options: Any) -> Toolset:
    async def pay(args: Pay) -> ToolResult:
        """Pay someone an amount."""
        if fail:
            raise ToolError("the bank refused")
        paid.append((args.to, args.amount))
        said = (f"已向 {args.to} 转账 {args.amount} 元",) if tell else ()
        return ToolResult(content=f"paid {args.amount} to {args.to}{receipt}", user_messages=said)

    return Toolset("s", [tool_function(**options)(pay)])


class Budget:
    """A daily budget whose later reads come from ``later`` (a number, or an exception raised)."""

    def __init__(self, later: int | Exception) -> None:
        self.reads = 0
        self.later = later

    async def remaining(self, caller: Caller) -> int | None:
        self.reads += 1
        if self.reads == 1:
            return 100_000
        if isinstance(self.later, Exception):
            raise self.later
        return self.later

    async def charge(self, caller: Caller, usage: Usage) -> None:
        return None


async def no_wait(seconds: float) -> None:
    return None


def error(status: int, **kw: Any) -> ModelAPIError:
    return ModelAPIError(f"HTTP {status}", status=status, **kw)


BAD_ARGS = call("pay", {"to": "bob", "amount": "five"})
#: label -> (the model's turns after the payment, the runner's options, the stop)
STOPS: dict[str, tuple[list[ModelResponse | ModelAPIError], dict[str, Any], StopReason]] = {
    "HTTP 400": ([error(400, code="context_length_exceeded")], {}, StopReason.MODEL_ERROR),
    "HTTP 500 after retries": ([error(500, retryable=True)] * 4, {}, StopReason.MODEL_ERROR),
    "busy for an hour": ([error(429, retryable=True, retry_after=3600)], {}, StopReason.MODEL_ERROR),
    "blank answer": ([text("  ")], {}, StopReason.EMPTY_ANSWER),
    "argument retries used up": ([BAD_ARGS] * 3, {}, StopReason.TOOL_RETRIES_EXHAUSTED),
    "daily budget spent": ([], {"budget": Budget(0)}, StopReason.DAILY_BUDGET),
    "budget unreadable": ([], {"budget": Budget(ConnectionError("db down"))}, StopReason.DAILY_BUDGET),
    "turn limit, last answer failed": ([error(400)], {"limits": Limits(max_iterations=1)}, StopReason.ITERATION_LIMIT),
    "request too large": ([], {"limits": Limits(max_run_tokens=150)}, StopReason.TOKEN_BUDGET),
}


@pytest.mark.parametrize("label", list(STOPS))
async def test_a_stop_after_a_call_took_effect_names_it_and_asks_not_to_just_retry(label: str) -> None:
    after, options, stop = STOPS[label]
    paid: list[tuple[str, int]] = []
    receipt = " " + "receipt " * 200 if label == "request too large" else ""
    result = await Runner(ScriptedModel([PAY, *after]), sleep=no_wait, **options).run(
        USER, pay_tool(paid, receipt=receipt))
    assert paid == [("bob", 5)] and result.stop is stop
    told = result.replies[-1]
    assert PAID in told and "请勿直接重复请求" in told, told
    assert not any(again in told for again in ("再试", "再来", "再问")), told  # asking again would pay twice
    assert told == result.text


class Positive(BaseModel):
    to: str
    amount: int

    @field_validator("amount")
    @classmethod
    def positive(cls, amount: int) -> int:
        if amount <= 0:
            raise ValueError("must be positive")
        return amount


async def decline(call: ToolCall, tool: Any, caller: Caller) -> bool:
    return False


def refused_pay(paid: list[tuple[str, int]], **options: Any) -> Toolset:
    async def pay(args: Positive) -> str:
        """Pay someone an amount."""
        paid.append((args.to, args.amount))
        return "paid"

    return Toolset("s", [tool_function(**options)(pay)])


#: label -> (the refused turn, the tools, the runner's options): none of these calls ran.
REFUSALS: dict[str, tuple[ModelResponse, dict[str, Any], dict[str, Any]]] = {
    "JSON Schema": (BAD_ARGS, {}, {}),
    "Pydantic": (call("pay", {"to": "bob", "amount": -5}), {}, {}),
    "no approver": (PAY, {"confirm": "admin"}, {}),
    "declined": (PAY, {"confirm": "admin"}, {"approver": decline}),
    "admin only": (PAY, {"admin_only": True}, {}),
}


@pytest.mark.parametrize("label", list(REFUSALS))
async def test_the_stop_texts_stay_as_they_were_when_nothing_took_effect(label: str) -> None:
    turn, tool_options, options = REFUSALS[label]
    paid: list[tuple[str, int]] = []
    result = await Runner(ScriptedModel([turn, error(400)]), **options).run(USER, refused_pay(paid, **tool_options))
    assert result.replies == ["AI 服务暂时不可用（接口返回 HTTP 400），请稍后再试。"] and paid == []
    blank = await Runner(ScriptedModel([turn, text("")]), **options).run(USER, refused_pay(paid, **tool_options))
    assert blank.replies == ["我这次没能给出回答（回答是空的），请换个说法再试。"] and paid == []


MAYBE = '可能已执行：pay（to="bob", amount=5）'


def failing_pay(how: str, started: list[str]) -> Toolset:
    async def pay(args: Pay) -> str:
        """Pay someone an amount."""
        started.append(args.to)
        if args.to != "bob":
            return "paid"
        if how == "timed out":
            await asyncio.sleep(30)  # the bank never answers: cut by the 0.05 s timeout
        if how == "raised":
            raise ConnectionResetError("the bank hung up")
        raise ToolError("the bank did not confirm the payment")

    return Toolset("s", [tool_function(timeout_s=0.05)(pay)])


@pytest.mark.parametrize("how", ["timed out", "raised", "ToolError"])
async def test_a_call_that_failed_after_it_started_is_named_as_maybe_run(how: str) -> None:
    # A payment whose HTTP answer timed out may well have gone through: asked again, it could go twice.
    started: list[str] = []
    result = await Runner(ScriptedModel([PAY, error(400)])).run(USER, failing_pay(how, started))
    assert started == ["bob"]
    assert result.text == f"AI 服务暂时不可用（接口返回 HTTP 400）。{MAYBE}。请勿直接重复请求，以免重复执行。"


async def test_calls_that_finished_and_calls_that_may_have_run_are_told_apart() -> None:
    started: list[str] = []
    turn = call("pay", {"to": "carol", "amount": 7}, ("pay", {"to": "bob", "amount": 5}))
    result = await Runner(ScriptedModel([turn, error(400)])).run(USER, failing_pay("timed out", started))
    assert sorted(started) == ["bob", "carol"]
    assert result.text == ('AI 服务暂时不可用（接口返回 HTTP 400）。已执行：pay（to="carol", amount=7）。'
                           f"{MAYBE}。请勿直接重复请求，以免重复执行。")


async def test_a_call_the_stop_cuts_in_flight_is_reported_as_maybe_run() -> None:
    started = asyncio.Event()

    async def pay(args: Pay) -> str:
        """Pay someone an amount."""
        started.set()
        await asyncio.sleep(30)
        return "paid"

    events: list[dict[str, Any]] = []

    async def on_event(event: dict[str, Any]) -> None:
        events.append(event)

    run = asyncio.create_task(Runner(ScriptedModel([PAY, text("x")])).run(
        USER, Toolset("s", [tool_function(pay)]), on_event=on_event))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    trace = [ToolTrace.model_validate(e) for e in events if e["type"] == "tool"]
    assert told_text(("机器人正在停止，这条消息没能处理完", ""), trace) == (
        f"机器人正在停止，这条消息没能处理完。{MAYBE}。请勿直接重复请求，以免重复执行。")


class Who(BaseModel):
    who: str


def lookup_tool(*, slow: bool = False) -> Any:
    async def balance(args: Who) -> str:
        """Look up someone's balance."""
        if slow:
            await asyncio.sleep(30)
        return "12"

    return tool_function(read_only=True, timeout_s=0.05)(balance)


@pytest.mark.parametrize("slow", [False, True])
async def test_calls_to_read_only_tools_are_neither_named_nor_warned_about(slow: bool) -> None:
    look = call("balance", {"who": "bob"})
    result = await Runner(ScriptedModel([look, error(400)])).run(USER, Toolset("s", [lookup_tool(slow=slow)]))
    assert result.text == "AI 服务暂时不可用（接口返回 HTTP 400），请稍后再试。"
    paid: list[tuple[str, int]] = []
    both = Toolset("s", [lookup_tool(slow=slow), *pay_tool(paid)])
    result = await Runner(ScriptedModel([call("balance", {"who": "bob"}, ("pay", {"to": "bob", "amount": 5})),
                                         error(400)])).run(USER, both)
    assert result.text == f"AI 服务暂时不可用（接口返回 HTTP 400）。{PAID}。请勿直接重复请求，以免重复执行。"


async def test_the_calls_are_named_even_beside_what_a_tool_told_the_person() -> None:
    paid: list[tuple[str, int]] = []
    result = await Runner(ScriptedModel([PAY, error(400)])).run(USER, pay_tool(paid, tell=True))
    assert result.replies == ["已向 bob 转账 5 元",
                              f"AI 服务暂时不可用（接口返回 HTTP 400）。{PAID}。请勿直接重复请求，以免重复执行。"]


async def test_calls_repeated_by_a_looping_model_are_counted() -> None:
    paid: list[tuple[str, int]] = []
    runner = Runner(ScriptedModel([PAY] * 3), loop_config=LoopConfig(warn=2, critical=3, breaker=5))
    result = await runner.run(USER, pay_tool(paid))
    assert result.stop is StopReason.LOOP_CRITICAL and paid == [("bob", 5)] * 2
    assert f"{PAID}×2。" in result.text and "再试" not in result.text


async def test_the_list_of_calls_is_short_whatever_the_model_sent() -> None:
    paid: list[tuple[str, int]] = []
    memo = "\ud83d" + "付款备注" * 500  # half an emoji, then a long value
    turn = call("pay", {"to": "p0", "amount": 1, "memo": memo}, *[("pay", {"to": f"p{i}", "amount": i + 1})
                                                                  for i in range(1, 8)])
    result = await Runner(ScriptedModel([turn, error(400)]), limits=Limits(max_tool_calls=20)).run(USER, pay_tool(paid))
    assert len(paid) == 8
    told = result.text
    assert len(told) < 300 and "（共 " in told and "等 8 次调用" in told, told
    told.encode("utf-8")  # sendable: no lone surrogate
    assert "p0" in told and "p2" in told and "p7" not in told

