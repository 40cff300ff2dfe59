"""The chat-model protocol and its implementation over ``openai.AsyncOpenAI``.

The SDK's own retries are turned off: the invoke loop's retry policy is the only one.
Provider failures become :class:`~function_calls.errors.ModelAPIError` with ``retryable`` set
by one classification (408, 409, 429, 5xx, timeouts and connection errors retry; 400, 401,
403, 404, 422 and 429 ``insufficient_quota`` do not).
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import openai
from pydantic import BaseModel, ConfigDict

from function_calls.errors import ModelAPIError
from function_calls.tokens import estimate_messages

__all__ = [
    "ChatModel",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChatModel",
    "TextCallback",
    "ToolCall",
    "ToolCallAccumulator",
    "Usage",
    "classify_status",
    "translate_error",
]

TextCallback = Callable[[str], Awaitable[None]]


class ToolCall(BaseModel):
    """One function call requested by the model; ``arguments`` is the raw JSON text."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = ""


class Usage(BaseModel):
    """Token usage; ``estimated`` counts requests whose usage the provider did not report."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    estimated: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            requests=self.requests + other.requests,
            estimated=self.estimated + other.estimated,
        )


class ModelRequest(BaseModel):
    """What one model turn is asked: OpenAI-format messages and tool definitions."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = []
    tool_choice: Literal["auto", "none", "required"] | None = None
    max_tokens: int | None = None


class ModelResponse(BaseModel):
    """One assistant turn: its text, its tool calls, and what it cost."""

    text: str = ""
    tool_calls: list[ToolCall] = []
    usage: Usage = Usage()
    finish_reason: str | None = None


@runtime_checkable
class ChatModel(Protocol):
    """Anything that can answer a :class:`ModelRequest`; ``on_text`` receives streamed text."""

    name: str

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse: ...


def classify_status(status: int, code: str | None) -> bool:
    """Whether an HTTP status from the provider is worth retrying."""
    if status == 429:
        return code != "insufficient_quota"
    return status in (408, 409) or status >= 500


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _error_code(exc: openai.APIStatusError) -> str | None:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            return str(err["code"])
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else None


def translate_error(exc: Exception, *, text_shown: bool = False) -> ModelAPIError:
    """Map an SDK exception to a :class:`ModelAPIError` (never carrying the API key)."""
    if isinstance(exc, openai.APITimeoutError):
        return ModelAPIError("the model endpoint timed out", retryable=True, text_shown=text_shown)
    if isinstance(exc, openai.APIConnectionError):
        return ModelAPIError("could not reach the model endpoint", retryable=True, text_shown=text_shown)
    if isinstance(exc, openai.APIStatusError):
        code = _error_code(exc)
        return ModelAPIError(
            f"the model endpoint answered HTTP {exc.status_code}" + (f" ({code})" if code else ""),
            status=exc.status_code,
            code=code,
            retryable=classify_status(exc.status_code, code),
            retry_after=_retry_after(exc.response.headers),
            text_shown=text_shown,
        )
    if isinstance(exc, openai.APIError):
        return ModelAPIError(f"the model stream failed: {type(exc).__name__}", retryable=True, text_shown=text_shown)
    return ModelAPIError(f"the model call failed: {type(exc).__name__}", retryable=False, text_shown=text_shown)


@dataclass
class _Partial:
    id: str
    name: str = ""
    arguments: str = ""


def _complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


@dataclass
class ToolCallAccumulator:
    """Assembles streamed tool-call deltas.

    Providers disagree: some omit ``index``, some label every call 0, some reuse an index for
    a new call. An ``id`` always starts (or names) a call; a delta without one continues the
    call its index points to, or else the call seen last.
    """

    calls: list[_Partial] = field(default_factory=list)
    _by_index: dict[int, _Partial] = field(default_factory=dict)
    _by_id: dict[str, _Partial] = field(default_factory=dict)
    _last: _Partial | None = None

    def feed(self, index: int | None, call_id: str | None, name: str | None, arguments: str | None) -> None:
        part: _Partial | None
        if call_id:
            part = self._by_id.get(call_id)
            if part is None:
                part = self._new(call_id)
                self._by_id[call_id] = part
        elif index is not None and index in self._by_index:
            part = self._by_index[index]
        elif index is not None and self.calls:
            part = self._new("")  # an index not seen before starts a call, even without an id
        else:
            part = self._last or self._new("")
        if name and not call_id and part.name and _complete_json(part.arguments):
            part = self._new("")  # a name after complete arguments: a new call under a reused index
        if index is not None:
            self._by_index[index] = part
        if name and part.name != name:
            part.name = name if not part.name else part.name + name
        if arguments:
            part.arguments += arguments
        self._last = part

    def _new(self, call_id: str) -> _Partial:
        part = _Partial(id=call_id)
        self.calls.append(part)
        return part

    def result(self) -> list[ToolCall]:
        return [
            ToolCall(id=p.id or f"call_{n}", name=p.name, arguments=p.arguments)
            for n, p in enumerate(self.calls)
            if p.name or p.arguments
        ]


class OpenAIChatModel:
    """A :class:`ChatModel` over any OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        timeout_s: float = 60.0,
        stream: bool = True,
        strict_tools: bool = False,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.name = model
        self.temperature = temperature
        self.stream = stream
        self.strict_tools = strict_tools
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=0
        )

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIChatModel(model={self.name!r}, base_url={str(self._client.base_url)!r})"

    async def aclose(self) -> None:
        await self._client.close()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.name, "messages": request.messages}
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice:
                params["tool_choice"] = request.tool_choice
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if request.max_tokens is not None:
            params["max_tokens"] = request.max_tokens
        return params

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse:
        if self.stream:
            return await self._complete_stream(request, on_text)
        try:
            resp = await self._client.chat.completions.create(**self._params(request))
        except Exception as exc:
            raise translate_error(exc) from None
        if not resp.choices:
            raise ModelAPIError("the model returned no choices", retryable=True)
        choice = resp.choices[0]
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
            for c in (choice.message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        text = choice.message.content or ""
        if text and on_text is not None:
            await on_text(text)
        return ModelResponse(
            text=text, tool_calls=calls, usage=self._usage(resp.usage, request), finish_reason=choice.finish_reason
        )

    async def _complete_stream(self, request: ModelRequest, on_text: TextCallback | None) -> ModelResponse:
        text_parts: list[str] = []
        acc = ToolCallAccumulator()
        finish: str | None = None
        usage_obj: Any = None
        shown = received = False
        try:
            stream = await self._client.chat.completions.create(
                **self._params(request), stream=True, stream_options={"include_usage": True}
            )
            async for chunk in stream:
                received = True
                if getattr(chunk, "usage", None) is not None:
                    usage_obj = chunk.usage
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta is not None and delta.content:
                        text_parts.append(delta.content)
                        if on_text is not None:
                            await on_text(delta.content)
                            shown = True
                    for tc in (getattr(delta, "tool_calls", None) or ()) if delta is not None else ():
                        fn = getattr(tc, "function", None)
                        acc.feed(
                            getattr(tc, "index", None),
                            getattr(tc, "id", None),
                            getattr(fn, "name", None),
                            getattr(fn, "arguments", None),
                        )
                    finish = choice.finish_reason or finish
        except Exception as exc:
            if isinstance(exc, openai.APIError) and not (isinstance(exc, openai.APIConnectionError) and received):
                raise translate_error(exc, text_shown=shown) from None
            # Transport errors surface raw while a stream is being read: the stream broke off.
            raise ModelAPIError(
                f"the model stream broke off ({type(exc).__name__})", retryable=True, text_shown=shown
            ) from None
        if finish is None:
            # No finish_reason: the stream was cut short, so its tool-call JSON may be truncated.
            raise ModelAPIError("the model stream ended before it finished", retryable=True, text_shown=shown)
        return ModelResponse(
            text="".join(text_parts), tool_calls=acc.result(), usage=self._usage(usage_obj, request),
            finish_reason=finish,
        )

    def _usage(self, usage: Any, request: ModelRequest) -> Usage:
        if usage is None or getattr(usage, "prompt_tokens", None) is None:
            return Usage(prompt_tokens=estimate_messages(request.messages, request.tools), requests=1, estimated=1)
        return Usage(
            prompt_tokens=int(usage.prompt_tokens or 0),
            completion_tokens=int(usage.completion_tokens or 0),
            requests=1,
        )
