"""``deep_think`` (M0) and ``plan`` (M2), and ``execute`` (M1), the plan's hand.

* ``deep_think(question, context)``: the think tier with a step-by-step system prompt; its only
  tools are ``recall`` and ``remember`` (when the memory plugin is loaded). It returns the final
  answer only: ``<think>``/``<reasoning>`` blocks are stripped.
* ``plan(goal, context)``: the plan tier in a loop bounded by ``[llm.plan]`` (iterations, tool
  calls, tokens; sub-calls included). Its tools: ``recall``, ``remember``, ``deep_think`` (when
  the think tier exists) and ``execute(task, context)``, which is the bot's own model (M1) with
  the chat's tools (not ``plan``/``deep_think``: no recursion; not the chat's ``ask_user``; a call that
  needs someone's approval is refused, saying it must be asked for directly), and ``ask_user`` (the question goes
  to the chat; the asker's next message there is the answer), unless nobody waits on the plan (a
  scheduled run). When the plan takes longer than
  ``reply_within_s`` (at most nine tenths of the tool's timeout), the chat gets a short note now and
  the result later, through the outbox (or, if the bot stops first, that the plan was interrupted).
  A person who typed the command reads a failure in Chinese.

Accounting: every sub-run's usage comes back as the tool's ``usage`` (so the calling run and the
user's and chat's daily budgets count it) and per tier in ``data["tiers"]`` (the trace shows it).
A tier refuses to start when the caller's daily budget is spent (fail closed), or what the calling run
has left for its tools (:class:`~function_calls.Allowance`, shared by the calls of one turn).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from function_calls import (
    Caller,
    ChatModel,
    Limits,
    LoopConfig,
    Runner,
    RunResult,
    StopReason,
    Tool,
    ToolCall,
    ToolContext,
    ToolError,
    ToolResult,
    Toolset,
    Usage,
    time_line,
    tool_function,
)
from robot import AskUserArgs, BudgetExceeded, ChatRef, Reservation

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["ExecuteArgs", "PlanArgs", "ThinkArgs", "Tier", "TierDeps", "deep_think", "execute", "plan",
           "strip_reasoning", "toolset"]

log = logging.getLogger(__name__)
MEMORY_TOOLS = ("recall", "remember")
THINK_PROMPT = ("你是深度思考的助手。请一步一步仔细推理，检查每一步；需要时用 recall 查已保存的记忆，"
                "得出值得保留的结论时可以用 remember 记下。最后只输出最终答案，不要输出推理过程。")
PLAN_PROMPT = ("你是规划助手。把目标拆成几个步骤，逐步完成：用 execute(task, context) 让执行模型完成具体任务"
               "（它能使用聊天中的工具），需要深入推理时用 deep_think，需要时用 recall/remember 读写记忆。"
               "全部完成后，用简洁的中文给出最终结果。")
EXECUTE_PROMPT = "你是执行助手：用可用的工具完成下面这个具体任务，然后简要报告结果。"
_OWN = frozenset({"execute", "deep_think", "plan", "ask_user"})
#: A tier run's answer to a call that needs someone's yes: nobody can be asked from inside it (the bot's
#: approvals pause and resume a chat run; a tier's run lives only in this process), so it never runs.
NEEDS_APPROVAL = ("「{name}」需要确认（批准）才能执行，但计划中的步骤无法请求确认，所以没有执行。"
                  "请如实告诉用户：需要的话请直接（不通过计划）向我提出这个操作。")
INTERRUPTED = "这个计划因为机器人停止运行被中断了，没有完成；需要的话请重新发起。"
_NAMES = {"think": "深度思考", "plan": "计划", "execute": "执行"}
_REASONING = re.compile(r"<(think|thinking|reasoning)>.*?(</\1>|\Z)", re.S | re.I)


def strip_reasoning(text: str) -> str:
    """The answer without ``<think>`` / ``<reasoning>`` blocks (an unclosed one runs to the end)."""
    return _REASONING.sub("", text).strip()


@dataclass
class Tier:
    """A configured tier: its model and its bounds."""

    model: ChatModel
    limits: Limits
    reply_within_s: float = 20.0


@dataclass
class TierDeps:
    """What the tier tools use; built by :func:`tiers.setup`."""

    bot: Bot
    think: Tier | None
    plan: Tier | None
    execute_limits: Limits
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class ThinkArgs(BaseModel):
    """A question worth thinking hard about."""

    question: str = Field(min_length=1, max_length=4000, description="the question, self-contained")
    context: str = Field(default="", max_length=8000, description="facts the thinker needs")


class PlanArgs(BaseModel):
    """A goal that needs several steps."""

    goal: str = Field(min_length=1, max_length=2000, description="what to achieve")
    context: str = Field(default="", max_length=8000, description="facts the planner needs")


class ExecuteArgs(BaseModel):
    """One concrete step for the execute tier."""

    task: str = Field(min_length=1, max_length=2000, description="the step to carry out")
    context: str = Field(default="", max_length=8000, description="what the executor needs to know")


async def _budget(deps: TierDeps, ctx: ToolContext[Any], cap: int) -> int:
    """The token cap for a sub-run: the tier's, within what is left of the caller's day and of the calling
    run's (taken from it: calls run at once share it; four deep_thinks sized by the day spent 2.9 times it)."""
    try:
        left = await deps.bot.budget.remaining(ctx.caller)
    except Exception:  # a budget that cannot be checked refuses
        log.exception("budget check failed")
        raise ToolError("budget unavailable", user_message="暂时无法核对今天的 AI 用量，请稍后再试。") from None
    if left is not None and left <= 0:
        raise ToolError("the daily AI budget is spent", user_message="今天的 AI 用量已达上限。")
    cap = cap if left is None else min(cap, left)
    if ctx.allowance is not None and (cap := ctx.allowance.take(cap)) <= 0:
        raise ToolError("this request's token budget is spent", user_message="这次请求的 AI 用量已达上限。")
    return cap


def _messages(system: str, ctx: ToolContext[Any], body: str, context: str) -> list[dict[str, Any]]:
    """A tier's first messages; its system prompt tells the time as the chat model's does ("明天下午3点"
    becomes a reminder's 'YYYY-MM-DD HH:MM' only with today's date and the chat's zone)."""
    user = body if not context.strip() else f"{body}\n\n背景信息：\n{context}"
    system = f"{system}\n{time_line(ctx.zone, ctx.clock())}。"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def _no_approvals(call: ToolCall, tool: Tool, caller: Caller) -> str:
    """Refuse a ``confirm`` call in a tier's run, saying why (not "approvals are not enabled": they may be)."""
    return NEEDS_APPROVAL.format(name=tool.name)


async def _sub_run(deps: TierDeps, ctx: ToolContext[Any], model: ChatModel, limits: Limits,
                   messages: list[dict[str, Any]], tools: Toolset, held: list[Reservation] | None = None) -> RunResult:
    cap = await _budget(deps, ctx, limits.max_run_tokens)

    def deps_for(tool: Tool) -> Any:  # ``execute`` is no plugin's tool: its deps are these
        return deps if tool.name in _OWN else deps.bot.deps_for(tool)

    # Held, not just checked: concurrent tier runs cannot each spend what is left of the day. Each
    # turn is charged into the hold as it ends (one cut short by its timeout too), and the hold's spend
    # passes to the calling run's reservation (which records it once), or, for a plan that outlived
    # its request, is recorded when this hold closes.
    try:
        async with deps.bot.budget.for_run(ctx.caller, cap) as hold:
            if held is not None:
                held.append(hold)
            bounded = Limits(max_iterations=limits.max_iterations, max_tool_calls=limits.max_tool_calls,
                             max_run_tokens=max(hold.held, 1))
            llm = deps.bot.settings.llm
            runner = Runner(model, limits=bounded, budget=hold.hook(), strict_tools=llm.strict_tools,
                            approver=_no_approvals,
                            loop_config=LoopConfig(warn=llm.loop_warn, critical=llm.loop_critical, breaker=llm.loop_breaker))
            result = await runner.run(messages, tools, caller=ctx.caller, deps_for=deps_for, zone=ctx.zone,
                                      clock=ctx.clock)
    except BudgetExceeded as exc:
        if ctx.allowance is not None:
            ctx.allowance.give_back(cap)
        raise ToolError(f"the daily AI budget is spent ({exc.scope})", user_message=exc.user_message) from None
    if ctx.allowance is not None:  # (cancelled, it keeps what it took: what it spent is not known here)
        ctx.allowance.give_back(cap - result.usage.total_tokens)
    return result


def _answer(result: RunResult) -> str:
    return strip_reasoning("\n".join(part for part in (result.replies or [result.text]) if part.strip()))


def _tiers(result: RunResult, own: str) -> dict[str, int]:
    """Tokens per tier in a sub-run: its tools' reports, the rest its own."""
    out: dict[str, int] = {}
    for trace in result.trace:
        for tier, tokens in ((trace.data or {}).get("tiers") or {}).items():
            out[tier] = out.get(tier, 0) + int(tokens)
    out[own] = out.get(own, 0) + result.usage.total_tokens - sum(out.values())
    return out


def _the_models(result: RunResult) -> bool:
    """Whether the run's text is the model's own last answer, not the runner's notice (a provider
    failure, a loop: "AI 服务暂时不可用……")."""
    said = next((m.get("content") for m in reversed(result.messages) if m.get("role") == "assistant"), None)
    return result.text == said


def _partial(result: RunResult) -> str:
    """What the model answered before a bound stopped it; "" when the text is the runner's own notice."""
    return strip_reasoning(result.text) if result.text.strip() and _the_models(result) else ""


def _stopped(result: RunResult, own: str) -> str:
    """What the person reads of a tier that stopped early (the stop reasons and details are English)."""
    name = _NAMES.get(own, own)
    if partial := _partial(result):
        return f"{name}没能在限额内完成，已有的结果：\n{partial}"
    notice = "" if _the_models(result) else result.text.strip()  # the runner's words, never the model's thinking
    return f"{name}没能完成：{notice}" if notice else f"{name}没能完成，请稍后再试。"


def _result(result: RunResult, own: str, via: str = "model") -> ToolResult:
    answer = _answer(result)
    data: dict[str, object] = {"tier": own, "stop": result.stop.value, "tiers": _tiers(result, own)}
    if result.stop in (StopReason.COMPLETED, StopReason.ANSWERED_BY_TOOL) and answer:
        return ToolResult(content=answer, usage=result.usage, data=data)
    # Stopped by a bound or a provider failure: say so, and still count what it used. A person who
    # typed the command reads it in Chinese; the model gets the note.
    note = f"the {own} tier stopped early ({result.stop.value}: {result.detail})"
    partial = _partial(result)
    return ToolResult(content=f"{note}. Partial result: {partial}" if partial else note, is_error=True,
                      user_messages=(_stopped(result, own),) if via != "model" else (), usage=result.usage, data=data)


def _memory_tools(deps: TierDeps) -> list[Any]:
    # offered_tools: what the calling run may use (a scheduled run's allow list limits these too)
    return [t for t in deps.bot.offered_tools() if t.name in MEMORY_TOOLS]


@tool_function(timeout_s=300, examples=["/deep_think 这道题的最优解是什么"])
async def deep_think(ctx: ToolContext[TierDeps], args: ThinkArgs) -> ToolResult:
    """深度思考 (deep think): 把需要仔细推理的难题交给思考模型，返回它的最终答案。"""
    deps = ctx.deps
    if deps.think is None:
        raise ToolError("no think tier is configured", user_message="没有配置深度思考模型（[llm.think]）。")
    tools = Toolset("think", _memory_tools(deps))
    result = await _sub_run(deps, ctx, deps.think.model, deps.think.limits,
                            _messages(THINK_PROMPT, ctx, args.question, args.context), tools)
    return _result(result, "think", ctx.via)


@tool_function(timeout_s=600)
async def execute(ctx: ToolContext[TierDeps], args: ExecuteArgs) -> ToolResult:
    """执行一个具体步骤 (execute): 由执行模型使用聊天中的工具完成 task，返回结果。"""
    deps = ctx.deps
    model = deps.bot.model
    if model is None:
        raise ToolError("the bot has no execute model")
    # Not the chat's ask_user either (confirm="input": it could only be refused here; the plan asks itself)
    tools = deps.bot.offered_tools().filter(lambda t: t.name not in ("plan", "deep_think", "execute")
                                            and t.confirm != "input")
    messages = _messages(EXECUTE_PROMPT, ctx, args.task, args.context)
    result = await _sub_run(deps, ctx, model, deps.execute_limits, messages, tools)
    return _result(result, "execute")


@tool_function(name="ask_user", sequential=True, timeout_s=3700)
async def plan_ask_user(ctx: ToolContext[TierDeps], args: AskUserArgs) -> ToolResult:
    """向用户提问并等待回答 (ask the user and wait): use only when the plan cannot go on without the user's
    answer; after timeout_s you get "用户暂未回复"."""
    caller, bot = ctx.caller, ctx.deps.bot
    mention = (caller.user_id,) if caller.chat_kind == "group" else ()
    await bot.send(ChatRef.of(caller), args.tip, key=f"plan-ask:{ctx.run_id}:{ctx.tool_call_id}", mention=mention)
    return ToolResult(content=await bot.questions.ask(ChatRef.of(caller).key, caller.qualified_user, args.timeout_s))


def _plan_tools(deps: TierDeps, caller: Caller) -> Toolset:
    # Only a plan someone is waiting on may ask them: a scheduled run has nobody at the keyboard.
    asking = caller.message_id and deps.bot.settings.approvals.ask_user  # ([approvals] ask_user = false hides it)
    tools = [execute, *([plan_ask_user] if asking else []), *_memory_tools(deps)]
    if deps.think is not None:
        tools.append(deep_think)
    return Toolset("plan", tools)


@tool_function(require_at=True, timeout_s=600, examples=["/plan 帮我们组安排下周的团建"])
async def plan(ctx: ToolContext[TierDeps], args: PlanArgs) -> ToolResult:
    """规划并完成多步骤目标 (plan): 规划模型拆分步骤，调用执行模型和工具逐步完成，最后汇报结果。"""
    deps = ctx.deps
    tier = deps.plan
    if tier is None:
        raise ToolError("no plan tier is configured", user_message="没有配置规划模型（[llm.plan]）。")
    messages = _messages(PLAN_PROMPT, ctx, args.goal, args.context)
    held: list[Reservation] = []
    work = asyncio.ensure_future(_sub_run(deps, ctx, tier.model, tier.limits, messages,
                                          _plan_tools(deps, ctx.caller), held))
    # Answered before this tool's own timeout, whatever reply_within_s says: past it the call is cancelled
    # (reported as timed out), and so is the work, which nobody would report on.
    try:
        done, _ = await asyncio.wait({work}, timeout=min(tier.reply_within_s, 0.9 * plan.timeout_s))
    except asyncio.CancelledError:
        work.cancel()
        raise
    if work in done:
        return _result(work.result(), "plan", ctx.via)
    for hold in held:  # its spend is no longer the run's, which returns without it: recorded on its own
        hold.detach()
    # Its own key: one message may start two plans, and another chat's message may bear the same id
    key = f"plan:{ChatRef.of(ctx.caller).key}:{ctx.caller.message_id or uuid.uuid4().hex}:{ctx.run_id}:{ctx.tool_call_id}"
    report = asyncio.create_task(_report_later(deps, ctx.caller, work, key), name="qunbot-plan-report")
    deps.tasks.add(report)
    report.add_done_callback(deps.tasks.discard)
    text = "这个计划需要一些时间，完成后我会在这里汇报结果。"
    return ToolResult.reply(text, data={"tier": "plan", "background": True})


async def _report_later(deps: TierDeps, caller: Caller, work: asyncio.Future[RunResult], key: str) -> None:
    """Send the plan's outcome to the chat through the outbox, and charge what it used."""
    mention = (caller.user_id,) if caller.chat_kind == "group" else ()
    try:
        result = await work
    except asyncio.CancelledError:  # the bot stops (tiers.teardown): the chat was promised a report
        work.cancel()
        try:  # queued in the outbox before it stops (what it cannot deliver now goes out at the next start)
            await deps.bot.send(ChatRef.of(caller), INTERRUPTED, key=f"{key}:interrupted", mention=mention)
        except Exception:
            log.exception("could not tell %s that its plan was interrupted", ChatRef.of(caller).key)
        raise
    except ToolError as exc:
        text = exc.user_message or "计划没能开始。"
        usage = Usage()
    except Exception:
        log.exception("a background plan failed")
        text, usage = "计划执行失败了，请稍后再试。", Usage()
    else:
        usage = result.usage
        answer = _answer(result)
        done = result.stop in (StopReason.COMPLETED, StopReason.ANSWERED_BY_TOOL) and answer
        text = f"计划完成：\n{answer}" if done else _stopped(result, "plan")
    if usage.requests:  # recorded by the sub-run's hold; the trace still shows it
        log.info("background plan for %s used %d tokens", caller.qualified_user, usage.total_tokens)
    await deps.bot.send(ChatRef.of(caller), text, key=key, mention=mention)


toolset = Toolset("tiers", [deep_think, plan])
