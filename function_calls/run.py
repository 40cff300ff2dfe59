"""A run's typed outcome and its resumable state."""

from __future__ import annotations

import uuid
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
    duration_ms: float = 0.0
    note: str = ""
    #: The tool result's ``data`` (e.g. the model tiers' token usage).
    data: dict[str, Any] | None = None


class RunState(BaseModel):
    """Everything needed to resume a run; serialise with ``model_dump_json()``."""

    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    messages: list[dict[str, Any]]
    iterations: int = 0
    tool_calls: int = 0
    api_retries: int = 0
    retry_wait_s: float = 0.0
    arg_failures: dict[str, int] = {}
    usage: Usage = Usage()
    pending: list[ToolCall] = []
    user_messages: list[str] = []
    trace: list[ToolTrace] = []
    loop: dict[str, Any] = {}


class RunResult(BaseModel):
    """A finished (or paused) run. ``replies`` is what the user should see, in order."""

    stop: StopReason
    text: str = ""
    replies: list[str] = []
    detail: str = ""
    usage: Usage = Usage()
    trace: list[ToolTrace] = []
    state: RunState

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.state.messages
