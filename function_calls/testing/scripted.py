"""A scripted chat model: a test seam that needs no HTTP at all."""

from __future__ import annotations

import copy
import inspect
import itertools
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from function_calls.errors import ModelAPIError
from function_calls.model import ModelRequest, ModelResponse, TextCallback, ToolCall, Usage
from function_calls.tokens import estimate_messages, estimate_tokens

__all__ = ["ScriptedModel", "call", "text"]

Turn = ModelResponse | ModelAPIError
Script = Callable[[ModelRequest], Turn | Awaitable[Turn]]
_ids = itertools.count(1)


def text(content: str) -> ModelResponse:
    """A turn that answers with plain text."""
    return ModelResponse(text=content, finish_reason="stop")


def call(name: str, arguments: dict[str, Any] | str | None = None, *more: tuple[str, dict[str, Any] | str]) -> ModelResponse:
    """A turn with one or more tool calls: ``call("a", {...})`` or ``call("a", {...}, ("b", {...}))``."""
    pairs = [(name, arguments or {}), *more]
    calls = [
        ToolCall(id=f"call_{next(_ids)}", name=n, arguments=a if isinstance(a, str) else json.dumps(a, ensure_ascii=False))
        for n, a in pairs
    ]
    return ModelResponse(tool_calls=calls, finish_reason="tool_calls")


def _snapshot(request: ModelRequest) -> ModelRequest:
    """A deep copy of ``request`` (later turns must not change what was recorded), without copying
    strings: ``deepcopy`` of a long conversation dominated benchmarks that use this model."""
    messages = [{k: copy.deepcopy(v) if isinstance(v, list | dict) else v for k, v in m.items()}
                for m in request.messages]
    # Tool definitions are built afresh for each run and never changed: a list copy is a snapshot.
    return request.model_copy(update={"messages": messages, "tools": list(request.tools)})


_TOOL_TOKENS: dict[int, tuple[dict[str, Any], int]] = {}


def _tool_tokens(tool: dict[str, Any]) -> int:
    """A tool definition's tokens, counted once per definition object (tools keep theirs)."""
    known = _TOOL_TOKENS.get(id(tool))
    if known is not None and known[0] is tool:
        return known[1]
    if len(_TOOL_TOKENS) > 10_000:  # a bound, not a policy
        _TOOL_TOKENS.clear()
    tokens = estimate_messages((), [tool])
    _TOOL_TOKENS[id(tool)] = (tool, tokens)  # the definition kept alive here: its id is not reused
    return tokens


@dataclass
class ScriptedModel:
    """Answers from a list of turns, or from a function of the request; records every request
    (unless ``record`` is False: a benchmark's millions of requests would be its memory).

    Usage is estimated from the request and the answer, so budget logic sees realistic numbers.
    """

    script: Sequence[Turn] | Script = ()
    name: str = "scripted"
    requests: list[ModelRequest] = field(default_factory=list)
    record: bool = True
    _position: int = 0

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse:
        if self.record:
            self.requests.append(_snapshot(request))
        if callable(self.script):
            turn = self.script(request)
            if inspect.isawaitable(turn):
                turn = await turn
        else:
            if self._position >= len(self.script):
                raise AssertionError(f"ScriptedModel ran out of turns after {self._position} requests")
            turn = self.script[self._position]
            self._position += 1
        if isinstance(turn, ModelAPIError):
            raise turn
        if turn.text and on_text is not None:
            await on_text(turn.text)
        if turn.usage.requests:
            return turn
        completion = estimate_tokens(turn.text) + sum(estimate_tokens(c.arguments) + 8 for c in turn.tool_calls)
        usage = Usage(prompt_tokens=estimate_messages(request.messages) + sum(map(_tool_tokens, request.tools)),
                      completion_tokens=completion, requests=1)
        return turn.model_copy(update={"usage": usage})
