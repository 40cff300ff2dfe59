"""The chat-model protocol and its implementation over ``openai.AsyncOpenAI``.

The SDK's own retries are turned off: the invoke loop's retry policy is the only one.
Provider failures become :class:`~function_calls.errors.ModelAPIError`, classified in
:mod:`function_calls.provider_errors`.

Whatever a provider streams, :meth:`OpenAIChatModel.complete` returns a response or raises
``ModelAPIError``: missing, regenerated or reused ids and indexes, ``arguments`` sent as a JSON
object (llama.cpp), no ``finish_reason`` before ``[DONE]``, ``reasoning_content`` (DeepSeek,
Qwen), thinking or tool calls written in ``content`` (:mod:`function_calls.inline`: never shown), an error
sent with HTTP 200. A failing ``on_text`` callback is the bot's fault: it is logged and streaming stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Literal, Protocol, runtime_checkable

import openai
from pydantic import BaseModel, Field

from function_calls.errors import ModelAPIError
from function_calls.inline import ContentReader, read_content
from function_calls.problems import mend_text
from function_calls.provider_errors import body_error, classify_status, not_a_stream, translate_error
from function_calls.reply import (
    Received,
    Shower,
    TextCallback,
    ToolCall,
    ToolCallAccumulator,
    as_text,
    bill,
    check_finish,
    complete_json,
    mended,
    output_of,
    reasoning_of,
    reported,
    str_or_none,
    stream_limit,
    stream_refused,
    text_of,
)
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
    "failed_usage",
    "translate_error",
]

TokenParam = Literal["max_tokens", "max_completion_tokens"]

log = logging.getLogger(__name__)


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
        return Usage.model_construct(  # sums of validated ints: nothing to check again
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            requests=self.requests + other.requests,
            estimated=self.estimated + other.estimated,
        )


def failed_usage(error: BaseException, prompt_estimate: int) -> Usage:
    """What a failed request costs: nothing but the request when the provider did no work (a refusal, no
    connection), else what it reported, or ``prompt_estimate`` and the output read by then (estimated). A
    request cancelled in flight was sent: the provider has its prompt and bills it."""
    if isinstance(error, ModelAPIError):
        out, prompt = error.billed_output, error.billed_prompt
    else:  # (what OpenAIChatModel had read, when it was reading)
        read = getattr(error, "billed_output", 0)
        out, prompt = (read if isinstance(read, int) else 0), None
    if out is None:
        return Usage(requests=1)
    return Usage(prompt_tokens=prompt_estimate if prompt is None else prompt, completion_tokens=out, requests=1,
                 estimated=1)


def _sendable(arguments: str) -> str:
    """Arguments the next request can carry: vLLM and DashScope refuse a history whose call is not a JSON
    object (HTTP 400), and the model never saw its correction. The error it gets quotes what it sent."""
    try:
        return arguments if isinstance(json.loads(arguments), dict) else "{}"
    except (ValueError, RecursionError):
        return "{}"


class ModelRequest(BaseModel):
    """What one model turn is asked: OpenAI-format messages and tool definitions."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)  # factories: a default is deep-copied per use
    tool_choice: Literal["auto", "none", "required"] | None = None
    max_tokens: int | None = None
    #: The most the turn may write (text, reasoning and tool arguments, estimated), sent or not: a streamed
    #: reply is left once it passes it (a provider may ignore ``max_tokens``), or half as much again when
    #: ``max_tokens`` was sent (the provider keeps to that by its own count). None: ``max_tokens``.
    output_limit: int | None = None


class ModelResponse(BaseModel):
    """One assistant turn: its text, its tool calls, and what it cost."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    #: The model's thinking (``reasoning_content``), kept so it can be sent back when the provider needs it.
    reasoning: str = ""

    def as_message(self) -> dict[str, Any]:
        """The turn as the assistant message the next request carries."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.reasoning:  # the model decides whether to send it back (DeepSeek's thinking mode needs it)
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _sendable(c.arguments)}}
                for c in self.tool_calls
            ]
        return message


@runtime_checkable
class ChatModel(Protocol):
    """Anything that can answer a :class:`ModelRequest` (read only: a model never changes it); ``on_text``
    receives streamed text."""

    name: str

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse: ...


class OpenAIChatModel:
    """A :class:`ChatModel` over any OpenAI-compatible ``/chat/completions`` endpoint.

    ``reasoning_pass_back`` sends each assistant turn's ``reasoning_content`` back with the next
    request (DeepSeek's thinking mode answers HTTP 400 without it during tool calls); otherwise it
    is stripped. ``token_param`` names the output cap: reasoning models accept only
    ``max_completion_tokens``. ``timeout_s`` bounds each read (the SDK's timeout), so all of a reply
    that is not streamed; ``deadline_s`` (default five times ``timeout_s``) bounds a request in all, a
    stream that keeps trickling included.
    """

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
        reasoning_pass_back: bool = False,
        token_param: TokenParam = "max_tokens",
        client: openai.AsyncOpenAI | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self.name = model
        self.temperature = temperature
        self.stream = stream
        self.strict_tools = strict_tools
        self.reasoning_pass_back = reasoning_pass_back
        self.token_param = token_param
        self.deadline_s = deadline_s if deadline_s is not None else 5 * timeout_s
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=0
        )

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIChatModel(model={self.name!r}, base_url={str(self._client.base_url)!r})"

    async def aclose(self) -> None:
        await self._client.close()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        messages = request.messages
        if not self.reasoning_pass_back:
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} if "reasoning_content" in m else m
                        for m in messages]
        params: dict[str, Any] = {"model": self.name, "messages": messages}
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice:
                params["tool_choice"] = request.tool_choice
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if request.max_tokens is not None:
            params[self.token_param] = request.max_tokens
        return params

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse:
        shower, got = Shower(on_text), Received(stream_limit(request.output_limit, request.max_tokens))
        deadline = asyncio.timeout(self.deadline_s)
        try:
            async with deadline:
                if self.stream:
                    return await self._complete_stream(request, shower, got)
                return await self._complete_once(request, shower)
        except TimeoutError:
            if not deadline.expired():
                raise
            # Not retried: another try would keep the person waiting as long again. What came is billed.
            error = ModelAPIError(f"the model's reply took longer than {self.deadline_s:g}s in all",
                                  text_shown=shower.shown, network=True)
            error.billed_output = got.tokens
            raise error from None
        except asyncio.CancelledError as exc:  # (a tier's timeout, a stop): the runner charges what came
            exc.billed_output = got.tokens  # type: ignore[attr-defined]
            raise

    async def _complete_once(self, request: ModelRequest, shower: Shower) -> ModelResponse:
        try:
            resp = await self._client.chat.completions.create(**self._params(request))
        except Exception as exc:
            error = translate_error(exc)
            if isinstance(exc, openai.APITimeoutError):  # sent: the provider may have done the work
                error.billed_output = 0
            raise error from None
        failed = body_error(resp) if isinstance(resp, str) else body_error(  # (a body not JSON comes as a str)
            {"error": getattr(resp, "error", None), "choices": getattr(resp, "choices", None)})
        if failed is not None:  # HTTP 200 with an error body (a relay): nothing was done, nothing billed
            raise failed
        try:
            choice = resp.choices[0] if resp.choices else None
            if choice is None or choice.message is None:
                raise ModelAPIError("the model returned no choices", retryable=True)
            message = choice.message
            content = read_content(mend_text(text_of(message.content)))
            calls = mended([ToolCall(id=str_or_none(getattr(c, "id", None)) or "",
                                     name=str_or_none(getattr(c.function, "name", None)) or "",
                                     arguments=as_text(getattr(c.function, "arguments", None)))
                            for c in message.tool_calls or [] if getattr(c, "function", None) is not None]
                           + content.calls)  # (a JSON escape in a call written as text may be half an emoji)
            text = content.text
            finish = str_or_none(choice.finish_reason)
            check_finish(finish, shown=False)
            response = ModelResponse(text=text, tool_calls=calls, finish_reason=finish,
                                     reasoning=mend_text(reasoning_of(message)) + content.reasoning)
            response.usage = self._usage(resp.usage, request, response)
        except ModelAPIError as error:  # the provider answered: it billed what it did
            raise bill(error, getattr(resp, "usage", None), output_of(resp)) from None
        except Exception as exc:  # a reply shape nobody expected: the provider's fault, and not transient
            log.warning("unreadable model reply: %s", type(exc).__name__, exc_info=True)
            raise bill(ModelAPIError(f"the model's reply could not be read ({type(exc).__name__})"),
                       getattr(resp, "usage", None), output_of(resp)) from None
        if text:
            await shower.show(text)
        return response

    async def _complete_stream(self, request: ModelRequest, shower: Shower, got: Received) -> ModelResponse:
        text_parts: list[str] = []
        thoughts: list[str] = []
        acc, reader = ToolCallAccumulator(), ContentReader()
        finish: str | None = None
        usage_obj: Any = None
        received = capped = False
        try:
            stream = await self._client.chat.completions.create(
                **self._params(request), stream=True, stream_options={"include_usage": True}
            )
        except Exception as exc:  # the SDK wraps what the network does: anything else failed here
            if not stream_refused(exc):
                raise translate_error(exc, text_shown=shower.shown) from None
            response = await self._complete_once(request, shower)  # (unread past its cap, as any unstreamed reply)
            log.warning("%s refused to stream (%s): its replies are not streamed from now on", self.name,
                        translate_error(exc))  # (the provider's own words may quote what it was sent)
            self.stream = False  # once the unstreamed request worked: a 400 it refuses too changes nothing
            return response
        try:
            failed = await not_a_stream(getattr(stream, "response", None))
        except Exception as exc:  # (reading the body failed: the stream broke off)
            failed = ModelAPIError(f"the model stream broke off ({type(exc).__name__})", retryable=True, network=True)
            failed.billed_output = 0
        if failed is not None:  # HTTP 200 with an error body or a page (a relay, a portal): nothing was done
            with contextlib.suppress(Exception):
                await stream.close()
            raise failed
        try:
            async for chunk in stream:
                received = True
                if getattr(chunk, "usage", None) is not None:
                    usage_obj = chunk.usage
                for choice in getattr(chunk, "choices", None) or ():
                    if getattr(choice, "index", 0) not in (0, None):
                        continue  # only the first choice is the answer; others would garble it
                    delta = getattr(choice, "delta", None)
                    content = text_of(getattr(delta, "content", None))
                    if content:
                        text_parts.append(content)
                        got.add(content)
                        if shown := reader.feed(content):  # (what may be thinking or a call is held back)
                            await shower.show(shown)
                    if thought := reasoning_of(delta):
                        thoughts.append(thought)
                        got.add(thought)
                    for tc in getattr(delta, "tool_calls", None) or ():
                        fn = getattr(tc, "function", None)
                        acc.feed(getattr(tc, "index", None), getattr(tc, "id", None), getattr(fn, "name", None),
                                 getattr(fn, "arguments", None))
                        got.add(as_text(getattr(fn, "arguments", None)))
                    finish = str_or_none(getattr(choice, "finish_reason", None)) or finish
                if got.over:
                    # Past its cap (ignored by the provider, or not sent): left as if the provider had cut it
                    # (60,000 tokens of thought were read against a cap of 24,000). What came is charged, or the
                    # count this chunk brings when less (an earlier chunk's is no count of all that came).
                    finish, usage_obj, capped = "length", getattr(chunk, "usage", None), True
                    break
        except Exception as exc:
            if isinstance(exc, openai.APIError) and not (isinstance(exc, openai.APIConnectionError) and received):
                error = translate_error(exc, text_shown=shower.shown)
            else:  # Transport errors surface raw while a stream is being read: the stream broke off.
                error = ModelAPIError(f"the model stream broke off ({type(exc).__name__})", retryable=True,
                                      text_shown=shower.shown, network=True)
            if received or isinstance(exc, openai.APITimeoutError):  # billed all the same, what came included
                error.billed_output = got.tokens
            raise error from None
        finally:
            with contextlib.suppress(Exception):  # left early (its cap, a deadline): the connection goes now
                await stream.close()
        if rest := reader.finish():
            await shower.show(rest)
        calls = [c for c in acc.result() if not capped or complete_json(c.arguments)]  # (one cut off: never made)
        calls += reader.calls
        try:
            if finish is None:
                # [DONE] without a finish_reason is common (some vLLM / Ollama builds). What cannot be
                # accepted is a stream cut short: nothing at all, or tool-call JSON left unfinished.
                cut = not (text_parts or thoughts or calls) or any(
                    c.arguments.strip() and not complete_json(c.arguments) for c in calls)
                if cut:
                    raise ModelAPIError("the model stream ended before it finished", retryable=True,
                                        text_shown=shower.shown)
                finish = "tool_calls" if calls else "stop"
            check_finish(finish, shown=shower.shown)
        except ModelAPIError as error:  # read: the provider did the work and billed it
            raise bill(error, usage_obj, got.tokens) from None
        # (mended once whole: a surrogate pair split by deltas is joined again first)
        response = ModelResponse(text=mend_text(reader.text), tool_calls=mended(calls), finish_reason=finish,
                                 reasoning=mend_text("".join(thoughts) + reader.reasoning))
        response.usage = self._usage(usage_obj, request, response, got.tokens if capped else 0)
        return response

    def _usage(self, usage: Any, request: ModelRequest, reply: ModelResponse, output: int = 0) -> Usage:
        """The provider's counts; what it did not report (many relays, Ollama and vLLM builds) is
        estimated, and said so: an output counted as 0 was never charged to any budget. A 0 the request
        or the reply contradicts is no count (a relay that sends usage {0, 0} on every chunk)."""
        prompt, completion = reported(usage)
        prompt = None if prompt == 0 and request.messages else prompt
        completion = None if completion == 0 and (reply.text or reply.reasoning or reply.tool_calls) else completion
        completion = min(completion, output) if completion is not None and output else completion  # (a cut stream)
        if prompt is not None and completion is not None:
            return Usage(prompt_tokens=prompt, completion_tokens=completion, requests=1)
        if completion is None:
            said = {"role": "assistant", "content": reply.text, "reasoning_content": reply.reasoning,
                    "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in reply.tool_calls]}
            completion = max(estimate_messages([said]), output)
        if prompt is None:
            prompt = estimate_messages(request.messages, request.tools)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, requests=1, estimated=1)

