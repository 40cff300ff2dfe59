"""qunbot's function-calling core: typed tools, two-stage validation and a guarded invoke loop."""

from function_calls.context import Allowance, Caller, ToolContext, ToolResult
from function_calls.errors import (
    ArgumentError,
    FieldProblem,
    FunctionCallError,
    ModelAPIError,
    ToolDefinitionError,
    ToolError,
)
from function_calls.guards import BudgetHook, Limits, LoopConfig, LoopDetector, RetryPolicy
from function_calls.loop import Runner
from function_calls.model import (
    ChatModel,
    ModelRequest,
    ModelResponse,
    OpenAIChatModel,
    ToolCall,
    Usage,
    failed_usage,
)
from function_calls.router import FunctionCallRouter, HistoryTurn, time_line
from function_calls.run import RunResult, RunState, StopReason, ToolTrace
from function_calls.schema import compact_schema, strict_schema
from function_calls.tokens import estimate_messages, estimate_tokens
from function_calls.tool import Confirm, Scope, Tool, Toolset, collect_tools, tool_function

__all__ = [
    "Allowance",
    "ArgumentError",
    "BudgetHook",
    "Caller",
    "ChatModel",
    "Confirm",
    "FieldProblem",
    "FunctionCallError",
    "FunctionCallRouter",
    "HistoryTurn",
    "Limits",
    "LoopConfig",
    "LoopDetector",
    "ModelAPIError",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChatModel",
    "RetryPolicy",
    "RunResult",
    "RunState",
    "Runner",
    "Scope",
    "StopReason",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolResult",
    "ToolTrace",
    "Toolset",
    "Usage",
    "collect_tools",
    "compact_schema",
    "estimate_messages",
    "estimate_tokens",
    "failed_usage",
    "strict_schema",
    "time_line",
    "tool_function",
]
