"""Executing one model turn's tool calls: validation, guards, concurrency, approvals.

One turn's calls run under structured concurrency (``asyncio.TaskGroup``): every call ends
in an outcome, whatever its validator or handler raises, and none outlives the turn. A
``confirm`` tool runs only with an approver's yes; with no approver wired it is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from function_calls.context import Allowance, Caller, ToolContext, ToolResult
from function_calls.errors import ArgumentError, FieldProblem, ToolError
from function_calls.guards import Limits, LoopDetector, LoopLevel, args_key, result_key
from function_calls.model import ToolCall, Usage
from function_calls.problems import mend_text
from function_calls.run import Approver, EventCallback, RunState, StopReason, ToolTrace
from function_calls.tool import Tool, Toolset

__all__ = ["CallExecutor", "Outcome"]

log = logging.getLogger(__name__)

#: What the model hears for a ``confirm`` tool while no approver is wired (it relays it to the user).
NO_APPROVALS = "「{name}」需要管理员批准才能执行，但审批功能尚未启用，所以没有执行。请如实告诉用户。"


@dataclass
class Outcome:
    """One call's result, its trace, and whether it stops the run."""

    call: ToolCall
    result: ToolResult
    trace: ToolTrace
    stop: StopReason | None = None
    detail: str = ""


@dataclass
class CallExecutor:
    """Runs one turn's tool calls for one run: which tools, for whom, under which guards."""

    tools: Toolset
    caller: Caller
    deps_for: Callable[[Tool], Any]
    zone: ZoneInfo
    clock: Callable[[], datetime]
    on_event: EventCallback | None
    detector: LoopDetector
    state: RunState
    limits: Limits
    approver: Approver | None = None
    strict_tools: bool = False
    #: The run's usage charged to its budget so far (a resumed run's earlier part was, as it paused).
    charged: Usage = field(default_factory=Usage)
    #: Tools whose arguments failed in this turn: several bad calls of one turn are one failed try (the
    #: model sees all their errors at once, and corrects them together).
    turn_failed: set[str] = field(default_factory=set)
    #: What this turn's calls may spend of the run's tokens (see :class:`Allowance`), set for each turn.
    allowance: Allowance | None = None

    async def emit(self, event: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                await self.on_event(event)
            except Exception:  # an observer must never break a run
                log.exception("run event callback failed")

    async def execute(self, calls: Sequence[ToolCall]) -> list[Outcome]:
        """Run one turn's calls: concurrent up to the cap, ``sequential`` tools alone, order kept."""
        sem = asyncio.Semaphore(self.limits.parallel_tools)
        outcomes: list[Outcome | None] = [None] * len(calls)
        self.turn_failed.clear()

        async def one(i: int, call: ToolCall) -> None:
            async with sem:
                outcomes[i] = await self.guarded(call)

        async def together(batch: list[tuple[int, ToolCall]]) -> None:
            if len(batch) <= 1:  # nothing to run beside it: no task (the usual turn has one call)
                for i, call in batch:
                    outcomes[i] = await self.guarded(call)
                return
            async with asyncio.TaskGroup() as group:
                for i, call in batch:
                    group.create_task(one(i, call))

        batch: list[tuple[int, ToolCall]] = []
        for i, call in enumerate(calls):
            tool = self.tools.get(call.name)
            if tool is not None and tool.sequential:
                await together(batch)
                batch = []
                outcomes[i] = await self.guarded(call)
            else:
                batch.append((i, call))
        await together(batch)
        # Every call gets its answer (strict providers refuse a request with a call left unanswered)
        return [o if o is not None else self._refuse(c, f"`{c.name}` was not run.", note="lost")
                for c, o in zip(calls, outcomes, strict=True)]

    async def guarded(self, call: ToolCall) -> Outcome:
        """:meth:`call_one`, with any failure of ours turned into a tool error (siblings keep running)."""
        try:
            return await self.call_one(call)
        except Exception as exc:
            log.exception("tool call %s failed in the executor", call.name)
            # (it may have failed after the handler ran: not told as refused, it is named as maybe run)
            return self._refuse(call, f"`{call.name}` failed internally ({type(exc).__name__}); it may have run.",
                                note="internal error", refused=False)

    async def call_one(self, call: ToolCall) -> Outcome:
        start = time.perf_counter()
        outcome = await self._call_one(call)
        outcome.trace.duration_ms = round((time.perf_counter() - start) * 1000, 2)
        await self.emit({"type": "tool", **outcome.trace.model_dump()})
        return outcome

    def _refuse(self, call: ToolCall, content: str, stop: StopReason | None = None, detail: str = "",
                note: str = "", *, refused: bool = True) -> Outcome:
        result = ToolResult(content=content, is_error=True)
        trace = ToolTrace(call_id=call.id, name=call.name, arguments=call.arguments, result=content,
                          is_error=True, note=note or (stop.value if stop else ""), refused=refused)
        return Outcome(call, result, trace, stop, detail)

    async def _call_one(self, call: ToolCall) -> Outcome:
        state = self.state
        tool = self.tools.get(call.name)
        akey = args_key(call.arguments)
        signal = self.detector.before(call.name, akey, unknown=tool is None)
        if signal.level in (LoopLevel.CRITICAL, LoopLevel.BREAKER):
            stop = StopReason.LOOP_BREAKER if signal.level is LoopLevel.BREAKER else StopReason.LOOP_CRITICAL
            return self._refuse(call, f"[qunbot] blocked: {signal.reason}. Stop calling tools.", stop, signal.reason)
        if state.tool_calls >= self.limits.max_tool_calls:
            return self._refuse(call, "[qunbot] tool-call limit for this request reached; not run.", note="limit")
        state.tool_calls += 1
        if tool is None:
            names = ", ".join(self.tools.names()) or "(none)"
            content = f"Unknown tool `{call.name}`. The tools that exist here are: {names}."
            self.detector.record(call.name, akey, "unknown", unknown=True)
            return self._refuse(call, content, note="unknown tool")
        try:
            try:
                args = tool.parse_arguments(call.arguments, strict=self.strict_tools)
            except ArgumentError:
                raise
            except Exception as exc:  # a validator that raises KeyError/TypeError is still bad arguments
                log.warning("argument check of %s raised %s", tool.name, type(exc).__name__, exc_info=True)
                problem = FieldProblem("", f"the argument check failed ({type(exc).__name__})")
                raise ArgumentError(tool.name, "validation", [problem]) from None
        except ArgumentError as exc:
            failures = state.arg_failures.get(tool.name, 0) + (tool.name not in self.turn_failed)
            state.arg_failures[tool.name] = failures
            self.turn_failed.add(tool.name)
            self.detector.record(tool.name, akey, result_key(exc.message, None, ()))
            if failures > tool.retries:
                return self._refuse(call, exc.message, StopReason.TOOL_RETRIES_EXHAUSTED,
                                    f"{tool.name}（参数连续 {failures} 次无效）")
            return self._refuse(call, exc.message, note=f"invalid arguments ({failures}/{tool.retries + 1})")
        state.arg_failures.pop(tool.name, None)  # the budget counts consecutive failures
        if tool.confirm and self.approver is None:  # fail closed: nobody can approve, so it never runs
            return self._refuse(call, NO_APPROVALS.format(name=tool.name), note="needs approval")
        if tool.confirm and self.approver is not None:
            try:
                verdict = await self.approver(call, tool, self.caller)
            except Exception:  # a failing approval store must neither crash the run nor run the tool
                log.exception("approver failed for %s", tool.name)
                return self._refuse(call, f"Approval of `{tool.name}` failed; not run.", note="approval failed")
            if verdict is None:
                return self._refuse(call, "[qunbot] waiting for approval", StopReason.AWAITING_APPROVAL, tool.name)
            if verdict is False:
                return self._refuse(call, f"The user's admin declined `{tool.name}`. Tell the user.", note="declined")
            if isinstance(verdict, str):
                return self._refuse(call, verdict, note="declined")
        try:
            ctx = ToolContext(deps=self.deps_for(tool), caller=self.caller, zone=self.zone, run_id=state.run_id,
                              tool_call_id=call.id, clock=self.clock, allowance=self.allowance)
            async with asyncio.timeout(tool.timeout_s):  # wait_for made a task per call (3.11); this does not
                result = await tool.invoke(ctx, args)
        except ToolError as exc:
            result = ToolResult.error(exc.message)
        except TimeoutError:
            result = ToolResult.error(f"`{tool.name}` timed out after {tool.timeout_s:g}s.")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # the run itself is being cancelled: pass it on
                # ...told first: cut in flight, the call may have acted (a payment sent, its answer not back)
                await self.emit({"type": "tool", **ToolTrace(
                    call_id=call.id, name=tool.name, arguments=call.arguments, result="cut short by the stop",
                    is_error=True, note="cancelled", read_only=tool.read_only).model_dump()})
                raise
            log.warning("tool %s was cancelled from inside (a future it awaited)", tool.name)
            result = ToolResult.error(f"`{tool.name}` was cancelled before it finished.")
        except Exception as exc:  # a tool bug must not take its siblings or the run down
            log.exception("tool %s failed", tool.name)
            result = ToolResult.error(f"`{tool.name}` failed internally ({type(exc).__name__}).")
        sendable = mend_text(result.content)  # a tool's lone surrogate must not break the next request
        if sendable is not result.content:  # a copy only when something was replaced
            result = result.model_copy(update={"content": sendable})
        rkey = result_key(result.content, result.data, tool.hash_exclude)
        signal = self.detector.record(tool.name, akey, rkey)
        note = ""
        if signal.level is not LoopLevel.OK:
            note = f"loop {signal.level.value}: {signal.reason}"
            result = result.model_copy(update={"content": result.content + (
                f"\n\n[qunbot] Warning: {signal.reason}. This is not making progress: change your approach "
                "or answer the user with what you have.")})
        trace = ToolTrace(call_id=call.id, name=tool.name, arguments=call.arguments, result=result.content,
                          is_error=result.is_error, note=note, data=result.data, read_only=tool.read_only)
        return Outcome(call, result, trace)
