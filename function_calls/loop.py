"""The invoke loop: model turn -> validated tool calls run concurrently -> results -> repeat.

A run always ends in a typed :class:`StopReason` with its messages kept; nothing here raises
for a provider failure, a bad argument or a runaway model. The run's state is JSON, so a
paused run (an approval) resumes after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from function_calls.context import Allowance, Caller
from function_calls.errors import ModelAPIError
from function_calls.executor import CallExecutor
from function_calls.guards import BudgetHook, Limits, LoopConfig, LoopDetector, RetryPolicy
from function_calls.model import (
    ChatModel,
    ModelRequest,
    ModelResponse,
    TextCallback,
    ToolCall,
    Usage,
    failed_usage,
)
from function_calls.run import Approver, EventCallback, RunResult, RunState, StopReason, ToolTrace
from function_calls.stops import STOP_TEXTS, TOO_COMPLEX, TOO_LARGE, UNREADABLE, busy, told_text
from function_calls.tokens import estimate_messages
from function_calls.tool import Tool, Toolset

__all__ = ["EventCallback", "RunResult", "RunState", "Runner", "StopReason", "ToolTrace"]

log = logging.getLogger(__name__)


#: Below this many tokens left in the run's cap, the cap on a turn's output is sent as ``max_tokens``; above,
#: none is (a model refuses one above its own limit, and every model takes this many) and a streamed turn
#: is left once it passes what is left (``ModelRequest.output_limit``; half as much again once it was sent).
_OUTPUT_CAP = 4096
_FINAL_NOTE = (
    "[qunbot] The budget for this request is used up ({why}). Do not call tools. "
    "Answer the user now with what you already know, and say briefly what is left undone."
)


@dataclass
class Runner:
    """Drives one conversation to a terminal state under the configured guards."""

    model: ChatModel
    limits: Limits = field(default_factory=Limits)
    loop_config: LoopConfig = field(default_factory=LoopConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: BudgetHook | None = None
    approver: Approver | None = None
    strict_tools: bool = False
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def run(
        self,
        messages: list[dict[str, Any]] | RunState,
        tools: Toolset,
        *,
        caller: Caller | None = None,
        deps_for: Callable[[Tool], Any] = lambda tool: None,
        zone: ZoneInfo | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_text: TextCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> RunResult:
        """Run until a terminal state. Pass a :class:`RunState` to resume a paused run."""
        caller = caller or Caller()
        if isinstance(messages, RunState):
            state = messages
        else:  # the list copied, not validated: with a long history window validation was a hot spot
            state = RunState(messages=[])
            state.messages = list(messages)  # the loop never changes a message, it appends or replaces
        detector = LoopDetector.restore(self.loop_config, state.loop) if state.loop else LoopDetector(self.loop_config)
        offered = tools.filter(lambda t: t.allowed_for(caller))
        env = CallExecutor(offered, caller, deps_for, zone or ZoneInfo("UTC"), clock, on_event, detector, state,
                           limits=self.limits, approver=self.approver, strict_tools=self.strict_tools,
                           charged=state.usage)
        token_cap = self.limits.max_run_tokens
        daily_cap = False
        if self.budget is not None:
            try:
                left = await self.budget.remaining(caller)
            except Exception:  # fail closed: what is left may be far below the run cap (a hold of 300 tokens)
                log.exception("budget hook failed; the run is refused")
                return self._finish(state, StopReason.DAILY_BUDGET, detector, detail="the budget could not be read",
                                    told=UNREADABLE)
            if left is not None and left <= 0:
                return self._finish(state, StopReason.DAILY_BUDGET, detector)
            if left is not None and state.usage.total_tokens + left < token_cap:  # (a resumed run's is spent)
                token_cap, daily_cap = state.usage.total_tokens + left, True
        try:
            return await self._drive(env, token_cap, daily_cap, on_text)
        finally:
            await self._charge(env, tools=True)  # the rest: the last tools' usage, failed requests

    async def _charge(self, env: CallExecutor, *, tools: bool = False) -> None:
        """Charge the budget what the run used since it last did: each turn as it ends, so that a tool
        the run calls sees what the run has spent (a deep_think may spend what is left of its hold).
        ``tools``: what the tools reported, charged through the hook's ``charge_tools`` if it has one."""
        used, before = env.state.usage, env.charged
        if self.budget is None or (used.requests == before.requests and used.total_tokens == before.total_tokens):
            return
        env.charged = used
        rest = Usage.model_construct(prompt_tokens=used.prompt_tokens - before.prompt_tokens,
                                     completion_tokens=used.completion_tokens - before.completion_tokens,
                                     requests=used.requests - before.requests, estimated=used.estimated - before.estimated)
        try:
            await (getattr(self.budget, "charge_tools", self.budget.charge) if tools else self.budget.charge)(
                env.caller, rest)
        except Exception:
            log.exception("budget hook failed to record %s tokens", rest.total_tokens)

    async def _recheck(self, env: CallExecutor, token_cap: int, daily_cap: bool) -> tuple[int, bool] | None:
        """After tools ran: the run's cap lowered to what is left today (a tool that went on in the background
        spends from what the run held); None when the budget cannot be read (the run stops)."""
        try:
            left = await self.budget.remaining(env.caller) if self.budget is not None else None
        except Exception:
            log.exception("budget hook failed; the run stops")
            return None
        if left is not None and env.state.usage.total_tokens + left < token_cap:
            return env.state.usage.total_tokens + left, True
        return token_cap, daily_cap

    async def _drive(self, env: CallExecutor, token_cap: int, daily_cap: bool, on_text: TextCallback | None) -> RunResult:
        state = env.state
        defs = [_definition(t, self.strict_tools) for t in env.tools]  # the same every turn and run
        defs_tokens = sum(_definition_tokens(t, self.strict_tools) for t in env.tools)
        if calls := state.pending:
            state.pending = []
            state.tool_calls = max(0, state.tool_calls - len(calls))  # a paused call counts once
            share = self._share(env, token_cap, estimate_messages(state.messages) + defs_tokens, len(calls))
            stop = await self._run_calls(env, calls, share, resume=True)
            if stop is not None:
                return stop
            await self._charge(env, tools=True)
        while True:
            why = ""
            # What is left after this turn's prompt (an estimate was a hot spot: once per turn)
            asked = estimate_messages(state.messages) + defs_tokens
            left = token_cap - state.usage.total_tokens - asked
            if state.iterations >= self.limits.max_iterations:
                why, reason = f"{state.iterations} model turns", StopReason.ITERATION_LIMIT
            elif state.tool_calls >= self.limits.max_tool_calls:
                why, reason = f"{state.tool_calls} tool calls", StopReason.TOOL_CALL_LIMIT
            elif left < 0:
                why, reason = f"{state.usage.total_tokens} of {token_cap} tokens", StopReason.TOKEN_BUDGET
            if why and reason is StopReason.TOKEN_BUDGET and daily_cap:
                # The cap is what is left of today's budget: a final answer would overspend it.
                return self._finish(state, StopReason.DAILY_BUDGET, env.detector, detail=why)
            if why:
                return await self._final_answer(env, reason, why, on_text, token_cap)
            # The output is capped too: a turn must not spend past the cap (see _OUTPUT_CAP).
            try:
                response = await self._call_model(env, _request(state.messages, defs, left), on_text, token_cap)
            except ModelAPIError as exc:
                # The person reads Chinese; the trace and the logs keep the provider's English detail.
                shown = f"接口返回 HTTP {exc.status}" if exc.status else "连接不上或超时" if exc.network else "返回的内容无法读取"
                head, tail = STOP_TEXTS[StopReason.MODEL_ERROR]
                told = busy(exc.retry_after) if isinstance(exc, _TooLongToWait) else (head.format(detail=shown), tail)
                return self._finish(state, StopReason.MODEL_ERROR, env.detector, detail=str(exc), told=told)
            state.messages.append(response.as_message())
            if not response.tool_calls:
                if not response.text.strip() and not state.user_messages:
                    # Reasoning models can think until the cap and answer nothing: say so, never reply blank.
                    why = "只有思考过程，没有回答" if response.reasoning else "回答是空的"
                    return self._finish(state, StopReason.EMPTY_ANSWER, env.detector, detail=why)
                return self._finish(state, StopReason.COMPLETED, env.detector, text=response.text)
            read = asked + estimate_messages(state.messages[-1:])  # (the turn's own message: the rest is counted)
            stop = await self._run_calls(env, response.tool_calls,
                                         self._share(env, token_cap, read, len(response.tool_calls)))
            if stop is not None:
                return stop
            await self._charge(env, tools=True)
            capped = await self._recheck(env, token_cap, daily_cap)
            if capped is None:
                return self._finish(state, StopReason.DAILY_BUDGET, env.detector, detail="the budget could not be read",
                                    told=UNREADABLE)
            token_cap, daily_cap = capped

    def _share(self, env: CallExecutor, token_cap: int, read: int, calls: int) -> Allowance:
        """What a turn's tools may spend of the run's cap: what is left less what the run needs to read their
        answers (``read``: its messages and tools so far) and write its own (four deep_thinks, each sized by
        the day, spent 2.9 times the cap)."""
        need = read + self.limits.final_answer_max_tokens
        return Allowance(max(0, token_cap - env.state.usage.total_tokens - need), calls)

    async def _run_calls(self, env: CallExecutor, calls: list[ToolCall], share: Allowance, *,
                         resume: bool = False) -> RunResult | None:
        state = env.state
        env.allowance = share
        outcomes = await env.execute(calls)
        # On resume a call already has a "waiting for approval" answer: replace it (one answer per id).
        answered = {m.get("tool_call_id"): i for i, m in enumerate(state.messages) if resume and m["role"] == "tool"}
        for outcome in outcomes:
            message = {"role": "tool", "tool_call_id": outcome.call.id, "content": outcome.result.content}
            if outcome.call.id in answered:
                state.messages[answered[outcome.call.id]] = message
            else:
                state.messages.append(message)
            state.trace.append(outcome.trace)
            state.user_messages.extend(outcome.result.user_messages)
            if outcome.result.usage is not None:
                state.usage = state.usage + outcome.result.usage
        stops = [o for o in outcomes if o.stop is not None]
        if stops:
            first = stops[0]
            if first.stop is StopReason.AWAITING_APPROVAL:
                # only the calls waiting for a person (one that ran out of retries beside them is no request)
                state.pending = [o.call for o in stops if o.stop is StopReason.AWAITING_APPROVAL]
            return self._finish(state, first.stop or StopReason.COMPLETED, env.detector, detail=first.detail)
        if all(not o.result.continue_ for o in outcomes):
            return self._finish(state, StopReason.ANSWERED_BY_TOOL, env.detector)
        return None

    async def _call_model(self, env: CallExecutor, request: ModelRequest, on_text: TextCallback | None,
                          cap: int) -> ModelResponse:
        """One turn's request, retried as the policy allows while the run's usage stays within ``cap``."""
        state = env.state
        prompt = 0  # the request's estimate, made only when an attempt fails (a hot spot on every turn else)
        while True:
            try:
                try:
                    response = await self.model.complete(request, on_text=on_text)
                except (ModelAPIError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # any ChatModel: a bug in it ends the run typed, never raised
                    log.exception("chat model %s raised", getattr(self.model, "name", "?"))
                    raise ModelAPIError(f"the model call failed ({type(exc).__name__})") from None
            except asyncio.CancelledError as exc:
                # Cancelled in flight (a tier's tool timeout, a stop): the provider has the prompt and bills
                # it, with what it streamed by then. It was charged nothing.
                prompt = prompt or estimate_messages(request.messages, request.tools)
                state.usage = state.usage + failed_usage(exc, prompt)
                await self._charge(env)
                raise
            except ModelAPIError as exc:
                # A request the provider may have billed (it timed out, its stream broke off) is charged
                # its estimate: 4 timed-out tries and a 7,800-character stream cut short were charged 0.
                prompt = prompt or estimate_messages(request.messages, request.tools)
                state.usage = state.usage + failed_usage(exc, prompt)
                await self._charge(env)  # now: a retry, or a tool after it, sees what is left
                if not exc.retryable or exc.text_shown or state.api_retries >= self.retry.max_retries:
                    raise
                if (room := cap - state.usage.total_tokens - prompt) <= 0:
                    # 4 attempts of 2,700 tokens each were charged 11,808 against 3,000 left
                    log.warning("model call failed (%s); not retried: the request's tokens are spent", exc)
                    raise
                request = _lowered(request, room)
                left = self.retry.patience_s - state.retry_wait_s
                asked = exc.retry_after
                if asked is not None and (asked > self.retry.max_retry_after_s or asked > left):
                    # Waiting that long would leave the user staring at nothing: tell them when to come back.
                    raise _TooLongToWait(f"the provider asked to wait {asked:.0f}s, longer than this request waits",
                                         status=exc.status, code=exc.code, retry_after=asked) from None
                wait = self.retry.delay(state.api_retries + 1, asked)
                if wait > left:
                    raise
                state.api_retries += 1
                state.retry_wait_s += wait
                log.warning("model call failed (%s); retry %d in %.2fs", exc, state.api_retries, wait)
                await env.emit({"type": "retry", "error": str(exc), "delay_s": wait})
                await self.sleep(wait)
                continue
            state.iterations += 1
            state.usage = state.usage + response.usage
            await self._charge(env)
            return response

    async def _final_answer(self, env: CallExecutor, reason: StopReason, why: str, on_text: TextCallback | None,
                            token_cap: int) -> RunResult:
        """Budgets end with an answer, not an exception: one last turn without tools, capped."""
        state = env.state
        messages = [*state.messages, {"role": "system", "content": _FINAL_NOTE.format(why=why)}]
        final = self.limits.final_answer_max_tokens
        cost = estimate_messages(messages) + final
        if state.usage.total_tokens + cost > 2 * token_cap:
            # The run with its last answer never spends more than twice its cap (a pasted novel, a
            # tool's huge page): past that the person is told, the model not asked again.
            return self._finish(state, reason, env.detector, detail=why, told=TOO_LARGE)
        try:  # nor more than is left today (42,203 were recorded against a cap of 30,000)
            day = await self.budget.remaining(env.caller) if self.budget is not None else None
        except Exception:
            log.exception("budget hook failed; no last answer")
            day = 0
        if day is not None and cost > day:
            return self._finish(state, StopReason.DAILY_BUDGET, env.detector, detail=why)
        request = ModelRequest(messages=messages, max_tokens=final)
        cap = 2 * token_cap if day is None else min(2 * token_cap, state.usage.total_tokens + day)
        try:
            response = await self._call_model(env, request, on_text, cap)
            text = response.text if response.text.strip() else ""  # a blank answer is no answer
        except ModelAPIError as exc:
            log.warning("final answer after %s failed: %s", reason, exc)
            text = ""
        if text:
            state.messages.append({"role": "assistant", "content": text})
        return self._finish(state, reason, env.detector, text=text, detail=why,
                            told=None if text or state.user_messages else TOO_COMPLEX)

    def _finish(self, state: RunState, stop: StopReason, detector: LoopDetector, *, text: str = "",
                detail: str = "", told: tuple[str, str] | None = None) -> RunResult:
        """The run's result. ``text``: the model's answer; without one the person is ``told`` (by default
        the stop's text), and, unless the run only paused, which of its calls took effect."""
        state.loop = detector.snapshot()
        if told is None and (template := STOP_TEXTS.get(stop)):
            told = template[0].format(detail=detail), template[1]
        if told is not None and not text.strip():
            text = told_text(told, () if stop is StopReason.AWAITING_APPROVAL else state.trace)
        replies = [*state.user_messages, *([text] if text.strip() else [])]
        return RunResult(stop=stop, text=text, replies=replies, detail=detail, usage=state.usage,
                         trace=list(state.trace), state=state)


class _TooLongToWait(ModelAPIError):
    """The provider's Retry-After is beyond the run's patience: the user is told when to retry."""


_DEFINITION_TOKENS: weakref.WeakKeyDictionary[Tool, dict[bool, int]] = weakref.WeakKeyDictionary()
_DEFINITIONS: weakref.WeakKeyDictionary[Tool, dict[bool, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _definition(tool: Tool, strict: bool) -> dict[str, Any]:
    """A tool's definition, built once per tool (requests only read it)."""
    built = _DEFINITIONS.setdefault(tool, {})
    if strict not in built:
        built[strict] = tool.definition(strict=strict)
    return built[strict]


def _definition_tokens(tool: Tool, strict: bool) -> int:
    """A tool's definition in tokens, counted once per tool (it was a JSON dump per tool and run)."""
    counts = _DEFINITION_TOKENS.setdefault(tool, {})
    if strict not in counts:
        counts[strict] = estimate_messages((), [tool.definition(strict=strict)])
    return counts[strict]


def _request(messages: list[dict[str, Any]], defs: list[dict[str, Any]], left: int) -> ModelRequest:
    """The turn's request: a snapshot of the message list (a model reads the messages, never changes them)."""
    return ModelRequest.model_construct(messages=list(messages), tools=defs, tool_choice="auto" if defs else None,
                                        max_tokens=max(1, left) if left < _OUTPUT_CAP else None,
                                        output_limit=max(1, left))


def _lowered(request: ModelRequest, left: int) -> ModelRequest:
    """``request`` writing at most ``left`` tokens (a retry after attempts that were charged)."""
    limit = min(left, request.output_limit or request.max_tokens or left)
    sent = min(limit, request.max_tokens) if request.max_tokens is not None else limit if limit < _OUTPUT_CAP else None
    return request.model_copy(update={"max_tokens": sent, "output_limit": limit})

