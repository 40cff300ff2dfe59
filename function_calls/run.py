"""A run's typed outcome and its resumable state."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from function_calls.context import Caller
from function_calls.model import ToolCall, Usage
from function_calls.tool import Tool

__all__ = ["Approver", "EventCallback", "RunResult", "RunState", "StopReason", "ToolTrace"]

EventCallback = Callable[[dict[str, Any]], Awaitable[None]]
#: Decides a ``confirm`` call: True runs it, None pauses the run, False or a reason (told to the model) refuses.
Approver = Callable[[ToolCall, Tool, Caller], Awaitable[bool | str | None]]


class StopReason(StrEnum):
    """Why a run ended."""

    COMPLETED = "completed"
    ANSWERED_BY_TOOL = "answered_by_tool"
    ITERATION_LIMIT = "iteration_limit"
    TOOL_CALL_LIMIT = "tool_call_limit"
    TOKEN_BUDGET = "token_budget"
    DAILY_BUDGET = "daily_budget"
    LOOP_CRITICAL = "loop_critical"
    LOOP_BREAKER = "loop_breaker"
    TOOL_RETRIES_EXHAUSTED = "tool_retries_exhausted"
    MODEL_ERROR = "model_error"
    EMPTY_ANSWER = "empty_answer"
    AWAITING_APPROVAL = "awaiting_approval"


class ToolTrace(BaseModel):
    """One executed (or refused) tool call, for logs and the web playground."""

    call_id: str
    name: str
    arguments: str
    result: str
    is_error: bool = False
    #: Refused before its handler ran (arguments, permission, approval, a guard): it did nothing. An error
    #: after the handler started (raised, timed out, cut by the stop) leaves this False: it may have acted.
    refused: bool = False
    #: Its tool is declared ``read_only``: whatever happened, it changed nothing.
    read_only: bool = False
    duration_ms: float = 0.0
    note: str = ""
    #: The tool result's ``data`` (e.g. the model tiers' token usage).
    data: dict[str, Any] | None = None


class RunState(BaseModel):
    """Everything needed to resume a run; serialise with ``model_dump_json()``."""

    # Factories, not mutable defaults (pydantic deep-copies those for every run). The id names a
    # run in logs and keys, it is no secret: the random module's 48 bits (uuid4 read the OS's
    # random source, which lets go of the GIL, on every run).
    run_id: str = Field(default_factory=lambda: f"{random.getrandbits(48):012x}")
    messages: list[dict[str, Any]]
    iterations: int = 0
    tool_calls: int = 0
    api_retries: int = 0
    retry_wait_s: float = 0.0
    arg_failures: dict[str, int] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)
    pending: list[ToolCall] = Field(default_factory=list)
    user_messages: list[str] = Field(default_factory=list)
    trace: list[ToolTrace] = Field(default_factory=list)
    loop: dict[str, Any] = Field(default_factory=dict)


class RunResult(BaseModel):
    """A finished (or paused) run. ``replies`` is what the user should see, in order."""

    stop: StopReason
    text: str = ""
    replies: list[str] = Field(default_factory=list)
    detail: str = ""
    usage: Usage = Field(default_factory=Usage)
    trace: list[ToolTrace] = Field(default_factory=list)
    state: RunState

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.state.messages

    def tier_tokens(self) -> dict[str, int]:
        """Tokens per model tier: what tools report in ``data["tiers"]`` (the model tiers' sub-runs); the
        rest is the run's own model's, ``execute``."""
        tiers: dict[str, int] = {}
        for trace in self.trace:
            for tier, tokens in ((trace.data or {}).get("tiers") or {}).items():
                tiers[tier] = tiers.get(tier, 0) + int(tokens)
        tiers["execute"] = tiers.get("execute", 0) + self.usage.total_tokens - sum(tiers.values())
        return tiers
