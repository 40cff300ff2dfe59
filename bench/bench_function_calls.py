"""Figures for the function-calling core; prints, asserts nothing.

Run: ``.venv/bin/python bench/bench_function_calls.py``

1. decoration cost per tool and validation cost per call (JSON parse + JSON Schema + Pydantic);
2. tool-definition tokens of five built-in-like tools: our compact definitions vs plain
   ``model_json_schema()``;
3. invoke-loop overhead per iteration with a scripted model (no HTTP);
4. model calls per request saved by action tools (``ToolResult.reply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from function_calls import (
    ArgumentError,
    Runner,
    Tool,
    ToolContext,
    ToolResult,
    Toolset,
    estimate_tokens,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text

__all__ = ["main"]


class ReminderArgs(BaseModel):
    type: Literal["once", "daily", "weekly"] = Field(description="once = one time; daily; weekly")
    time: str = Field(description="once: 'YYYY-MM-DD HH:MM[:SS]' in the chat's zone; daily/weekly: 'HH:MM'")
    content: str = Field(description="text sent to the user when it fires", max_length=500)
    weekday: int | None = Field(default=None, ge=0, le=6, description="weekly only: 0=Monday ... 6=Sunday")


class NoArgs(BaseModel):
    pass  # what a plain rendering needs for a tool without arguments (no docstring: it would be rendered)


class DeleteArgs(BaseModel):
    reminder_id: int = Field(ge=1, description="the id shown by reminder_list")


class SearchArgs(BaseModel):
    query: str = Field(description="what to search the web for, in the user's language", max_length=300)


class SummaryArgs(BaseModel):
    hours: int | None = Field(default=None, ge=1, le=72, description="summarise the last N hours")
    messages: int | None = Field(default=None, ge=1, le=500, description="or the last N messages")


async def reminder_set(ctx: ToolContext[None], args: ReminderArgs) -> ToolResult:
    """设置提醒 (set a reminder)."""
    return ToolResult.reply(f"好的，{args.time} 提醒你：{args.content}")


async def reminder_list(ctx: ToolContext[None]) -> str:
    """列出本聊天里我设置的提醒 (list my reminders in this chat)."""
    return "1. 每天 09:00 喝水"


async def reminder_delete(ctx: ToolContext[None], args: DeleteArgs) -> ToolResult:
    """删除一个提醒 (delete a reminder by id)."""
    return ToolResult.reply(f"已删除提醒 {args.reminder_id}")


async def perplexity_search(ctx: ToolContext[None], args: SearchArgs) -> str:
    """联网搜索最新信息 (search the web for current information)."""
    return "search results"


async def summary(ctx: ToolContext[None], args: SummaryArgs) -> str:
    """总结最近的群聊内容 (summarise recent chat messages)."""
    return "summary"


HANDLERS: list[tuple[Callable[..., Any], type[BaseModel]]] = [
    (reminder_set, ReminderArgs),
    (reminder_list, NoArgs),
    (reminder_delete, DeleteArgs),
    (perplexity_search, SearchArgs),
    (summary, SummaryArgs),
]


def _best_us(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Best-of-``repeat`` mean microseconds per call."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number * 1e6)
    return min(runs)


def bench_decoration_and_validation() -> None:
    print("1. Decoration and validation (ReminderArgs, best of 5)")
    decorate_us = _best_us(lambda: tool_function(reminder_set), 100)
    tool = tool_function(reminder_set)
    good = json.dumps({"type": "weekly", "time": "09:30", "content": "周会，带上周报", "weekday": 0},
                      ensure_ascii=False)
    bad = json.dumps({"type": "monthly", "time": 930, "content": "x" * 600})
    valid_us = _best_us(lambda: tool.parse_arguments(good), 5000)
    strict_us = _best_us(lambda: tool.parse_arguments(good, strict=True), 5000)  # all fields present

    def invalid() -> None:
        with contextlib.suppress(ArgumentError):  # the error path is what is being measured
            tool.parse_arguments(bad)

    invalid_us = _best_us(invalid, 2000)
    print(f"   decoration per tool:              {decorate_us:9.1f} µs")
    print(f"   validation per call (valid):      {valid_us:9.1f} µs  (JSON parse + schema + pydantic)")
    print(f"   validation per call (strict):     {strict_us:9.1f} µs")
    print(f"   validation per call (3 errors):   {invalid_us:9.1f} µs  (includes building the message)")


def _tokens(definitions: list[dict[str, Any]]) -> int:
    return estimate_tokens(json.dumps(definitions, ensure_ascii=False, separators=(",", ":")))


def bench_definition_tokens() -> None:
    """The five built-in tools as shipped, against a plain model_json_schema() rendering of their models."""
    import reminders.tools
    import search.tools
    import summary.tools

    builtins: list[Tool] = [reminders.tools.reminder_set, reminders.tools.reminder_list,
                            reminders.tools.reminder_delete, search.tools.perplexity_search, summary.tools.summary]
    print("2. Tool-definition tokens, the five built-in tools (estimate_tokens on compact JSON)")
    ours: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    print(f"   {'tool':<18}{'compact':>9}{'plain':>9}")
    for tool in builtins:
        ours.append(tool.definition())
        schema = tool.args_model.model_json_schema() if tool.args_model else {"type": "object", "properties": {}}
        fn = {"name": tool.name, "description": tool.description, "parameters": schema}
        plain.append({"type": "function", "function": fn})
        print(f"   {tool.name:<18}{_tokens(ours[-1:]):>9}{_tokens(plain[-1:]):>9}")
    a, b = _tokens(ours), _tokens(plain)
    strict = _tokens([t.definition(strict=True) for t in builtins])
    print(f"   {'total':<18}{a:>9}{b:>9}   compact/plain = {a / b:.2f} ({(1 - a / b) * 100:.0f}% fewer)")
    print(f"   strict variant total: {strict}")


async def bench_loop_overhead(runs: int = 2000) -> None:
    print(f"3. Invoke-loop overhead, ScriptedModel, {runs} runs of call -> reply")

    async def noop(ctx: ToolContext[None], args: SearchArgs) -> str:
        """No-op."""
        return "ok"

    tools = Toolset("bench", [tool_function(noop)])
    runner = Runner(ScriptedModel())
    turn, answer = call("noop", {"query": "天气"}), text("晴")
    messages = [{"role": "system", "content": "你是助手。"}, {"role": "user", "content": "今天天气？"}]
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(runs):
            runner.model = ScriptedModel([turn, answer])
            await runner.run(messages, tools)
        samples.append((time.perf_counter() - start) / runs * 1e6)
    per_run = min(samples)
    print(f"   per run (2 model turns, 1 tool):  {per_run:9.1f} µs   (median of 3: {statistics.median(samples):.1f})")
    print(f"   per iteration:                    {per_run / 2:9.1f} µs")


async def bench_round_trips(requests: int = 200) -> None:
    print(f"4. Model calls per request, {requests} requests ('remind me at 09:30')")

    async def as_action(ctx: ToolContext[None], args: ReminderArgs) -> ToolResult:
        """Set a reminder; answers the user itself."""
        return ToolResult.reply(f"好的，{args.time} 提醒你：{args.content}")

    async def as_data(ctx: ToolContext[None], args: ReminderArgs) -> ToolResult:
        """Set a reminder; the model phrases the answer."""
        return ToolResult(content=json.dumps({"ok": True, "time": args.time, "content": args.content}))

    args = {"type": "daily", "time": "09:30", "content": "喝水"}
    messages = [{"role": "user", "content": "每天早上9点半提醒我喝水"}]
    print(f"   {'tool returns':<28}{'calls/request':>14}{'tokens/request':>16}")
    for label, handler in (("ToolResult.reply (action)", as_action), ("plain content (data)", as_data)):
        tools = Toolset("bench", [tool_function(name="reminder_set")(handler)])
        model_calls = tokens = 0
        for _ in range(requests):
            model = ScriptedModel([call("reminder_set", args), text("好的，每天 09:30 提醒你喝水。")])
            result = await Runner(model).run(messages, tools)
            model_calls += len(model.requests)
            tokens += result.usage.total_tokens
        print(f"   {label:<28}{model_calls / requests:>14.2f}{tokens / requests:>16.1f}")


def main() -> None:
    bench_decoration_and_validation()
    print()
    bench_definition_tokens()
    print()
    asyncio.run(bench_loop_overhead())
    print()
    asyncio.run(bench_round_trips())


if __name__ == "__main__":
    main()
