"""The function-calling exception tree.

Three kinds are kept apart, as in pydantic-ai: what the *model* must hear (it can correct
itself), what the *developer* got wrong (fix the code), and why a *run* stopped::

    FunctionCallError
    ├── ToolDefinitionError      a tool is declared wrongly (caught at decoration or registration)
    ├── ToolError                raised by a handler: the message goes back to the model
    │   └── ArgumentError        the model's arguments failed validation (field-level details)
    └── ModelAPIError            the chat-model endpoint failed (status, retryable, retry_after)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ArgumentError",
    "FieldProblem",
    "FunctionCallError",
    "ModelAPIError",
    "ToolDefinitionError",
    "ToolError",
]


class FunctionCallError(Exception):
    """Base of every error raised by :mod:`function_calls`."""


class ToolDefinitionError(FunctionCallError):
    """A developer mistake in a tool's declaration; the message names the tool."""


class ToolError(FunctionCallError):
    """Raised by a tool handler: its message is returned to the model as the tool's result."""

    def __init__(self, message: str, *, user_message: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: A shorter text for the human, when the model gives up (no internals).
        self.user_message = user_message


@dataclass(frozen=True)
class FieldProblem:
    """One validation failure: where, what, and the offending value (as JSON text).

    ``kind`` names the broken rule (a JSON-Schema keyword such as ``maximum``, or a Pydantic error
    type such as ``less_than_equal``) and ``limit`` its bound, so a front end can word the problem
    in its own language; ``length`` is the offending string's full length (``value`` is cut).
    """

    path: str
    problem: str
    value: str | None = None
    kind: str = ""
    limit: object = None
    length: int | None = None

    def render(self) -> str:
        got = f" (got {self.value})" if self.value is not None else ""
        return f"- {self.path or '<arguments>'}: {self.problem}{got}"


class ArgumentError(ToolError):
    """The model's arguments were not valid JSON, broke the schema, or failed Pydantic checks."""

    def __init__(self, tool: str, stage: str, problems: list[FieldProblem]) -> None:
        self.tool = tool
        self.stage = stage
        self.problems = problems
        lines = "\n".join(p.render() for p in problems)
        super().__init__(
            f"Invalid arguments for tool `{tool}` ({stage}):\n{lines}\nFix these fields and call the tool again."
        )


class ModelAPIError(FunctionCallError):
    """The chat-model endpoint failed. ``retryable`` follows the retry policy's classification."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        text_shown: bool = False,
        network: bool = False,
    ) -> None:
        super().__init__(message)
        #: The endpoint could not be reached or did not answer in time (else it answered what cannot be read).
        self.network = network
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
        #: Text already reached the user through streaming: replaying would show it twice.
        self.text_shown = text_shown
        #: The provider may have done (and billed) the work, it timed out or its stream broke off: the
        #: output tokens received by then (0: none); None when nothing was done (a refusal, no connection).
        self.billed_output: int | None = None
        #: The prompt tokens the provider reported for it (a reply it broke off); None: estimate them.
        self.billed_prompt: int | None = None
