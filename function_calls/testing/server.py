"""A local OpenAI-compatible HTTP server for tests, with scripted replies and fault injection.

The real ``openai`` SDK talks to it over loopback, so tests exercise the SDK's own parsing,
streaming and error mapping::

    async with FakeOpenAIServer() as server:
        server.script(Reply(tool_calls=[Call("reminder_set", {"time": "09:00"})]), Reply("done"))
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        ...
        assert server.requests[0].body["tools"][0]["function"]["name"] == "reminder_set"

Each ``POST /v1/chat/completions`` consumes one step: first from the FIFO ``script``, then from
``responder`` (a callable given the request body); with neither, it answers the text ``"ok"``.
Steps: ``Reply`` (text and/or tool calls, streamed when the request asks), ``Fault`` (an
OpenAI-style HTTP error), ``Delay`` (sleep, then another step), ``Disconnect`` (drop the
connection without answering) and ``Raw`` (hand-written SSE events or JSON body, status and
headers: what real providers send when they bend the protocol; ``chunk()`` builds one event). ``GET /v1/models`` lists ``FakeOpenAIServer.MODELS``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from aiohttp import web

from function_calls.testing.loopback import LoopbackServer

__all__ = [
    "Call",
    "Delay",
    "Disconnect",
    "FakeOpenAIServer",
    "Fault",
    "Raw",
    "RecordedRequest",
    "Reply",
    "Responder",
    "Step",
    "Usage",
    "chunk",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """One tool call in a reply. ``arguments`` as a dict is JSON-encoded; a str is sent verbatim."""

    name: str
    arguments: str | dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    @property
    def arguments_json(self) -> str:
        """The arguments exactly as they go on the wire."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Usage:
    """Token usage to report; any field left ``None`` is estimated from the request and reply."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass(frozen=True)
class Reply:
    """A successful completion. The streaming knobs apply only when the request has ``stream: true``.

    ``chunk_size``: characters of text or arguments per delta. ``index_mode``: ``"omit"`` drops
    ``index`` from tool-call deltas, ``"all_zero"`` labels every call 0 (each call's first delta still
    carries its own ``id`` and name). ``break_after``: close the connection after that many chunks,
    without ``[DONE]``. ``chunk_delay``: seconds to sleep between chunks.
    """

    text: str | None = None
    tool_calls: list[Call] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None  # None: "tool_calls" when there are calls, else "stop"
    chunk_size: int = 5
    index_mode: Literal["normal", "omit", "all_zero"] = "normal"
    break_after: int | None = None
    chunk_delay: float = 0.0


@dataclass(frozen=True)
class Fault:
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``.

    ``type`` defaults from the status ("requests" for 429, "server_error" for 5xx, else
    "invalid_request_error"). ``retry_after`` / ``retry_after_ms`` set the ``Retry-After`` /
    ``retry-after-ms`` headers; ``headers`` adds any others.
    """

    status: int
    message: str = "fake server fault"
    code: str | None = None
    type: str | None = None
    retry_after: float | None = None
    retry_after_ms: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Disconnect:
    """Close the connection without sending any response."""


@dataclass(frozen=True)
class Raw:
    """A response written by hand, sent whatever the request asked for.

    ``events``: each a dict (JSON-encoded) or a str (sent verbatim) after ``data: ``; then
    ``data: [DONE]`` when ``done``. ``body`` (a dict or a str) replaces the event stream with a plain
    body. ``status`` and ``headers`` are sent as given (an error event inside a 200 stream, an odd
    ``Retry-After`` or ``x-should-retry``).
    """

    events: Sequence[dict[str, Any] | str] = ()
    body: dict[str, Any] | str | None = None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    done: bool = True


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, *,
          usage: dict[str, int] | None = None, choices: bool = True) -> dict[str, Any]:
    """One ``chat.completion.chunk`` event for :class:`Raw`; ``choices=False`` sends ``[]`` (a usage chunk)."""
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": None}
    return {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
            "choices": [choice] if choices else [], "usage": usage}


@dataclass(frozen=True)
class Delay:
    """Sleep ``seconds`` before answering with ``then`` (a client that gives up first is fine)."""

    seconds: float
    then: Step = field(default_factory=lambda: Reply("ok"))


Step: TypeAlias = Reply | Fault | Delay | Disconnect | Raw
Responder: TypeAlias = Callable[[dict[str, Any]], Step | Awaitable[Step]]


@dataclass
class RecordedRequest:
    """One request as received. ``headers`` keys are lower-case; ``body`` is ``{}`` when not JSON."""

    method: str
    path: str
    headers: dict[str, str] = field(repr=False)  # holds the API key: kept out of reprs
    body: dict[str, Any]
    raw: bytes = field(default=b"", repr=False)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``messages`` sent, or ``[]``."""
        messages: list[dict[str, Any]] = self.body.get("messages", [])
        return messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The ``tools`` sent, or ``[]``."""
        tools: list[dict[str, Any]] = self.body.get("tools", [])
        return tools


class FakeOpenAIServer(LoopbackServer):
    """An aiohttp server on 127.0.0.1 (random free port) speaking the chat-completions API."""

    MODELS: tuple[str, ...] = ("fake-model", "fake-model-mini")

    def __init__(self, responder: Responder | None = None) -> None:
        super().__init__()
        self.responder: Responder | None = responder
        self.requests: list[RecordedRequest] = []
        self._steps: deque[Step] = deque()
        self._counter = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._not_found)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, ready for ``openai.AsyncOpenAI(base_url=...)``."""
        return f"{self.root_url}/v1"

    def script(self, *steps: Step) -> None:
        """Queue steps; each chat-completions request consumes the oldest one."""
        self._steps.extend(steps)

    @property
    def pending_steps(self) -> int:
        """How many scripted steps are not consumed yet."""
        return len(self._steps)

    @property
    def last_request(self) -> RecordedRequest:
        """The most recent request (``IndexError`` when none)."""
        return self.requests[-1]

    async def _next_step(self, body: dict[str, Any]) -> Step:
        if self._steps:
            return self._steps.popleft()
        if self.responder is None:
            return Reply("ok")
        step = self.responder(body)
        return await step if inspect.isawaitable(step) else step

    async def _record(self, request: web.Request) -> RecordedRequest | None:
        """Record the request; ``None`` when its body is not a JSON object."""
        raw = await request.read()
        body: Any = {}
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        headers = {k.lower(): v for k, v in request.headers.items()}
        fields = body if isinstance(body, dict) else {}
        rec = RecordedRequest(request.method, request.path, headers, fields, raw)
        self.requests.append(rec)
        return rec if isinstance(body, dict) else None

    async def _models(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.MODELS]
        return web.json_response({"object": "list", "data": data})

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return _error(Fault(404, f"fake server has no route {request.method} {request.path}"))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request)
        if rec is None:
            return _error(Fault(400, "request body is not a JSON object"))
        body = rec.body
        try:
            step = await self._next_step(body)
        except Exception as exc:  # a broken test responder must not look like a network problem
            _log.exception("FakeOpenAIServer responder raised")
            return _error(Fault(500, f"fake server responder raised {type(exc).__name__}: {exc}"))
        while isinstance(step, Delay):
            await asyncio.sleep(step.seconds)
            step = step.then
        if isinstance(step, Fault):
            return _error(step)
        if isinstance(step, Disconnect):
            _hang_up(request)
            return web.Response()
        if isinstance(step, Raw):
            return await self._raw(request, step)
        if not isinstance(step, Reply):
            return _error(Fault(500, f"fake server step must be Reply/Fault/Delay/Disconnect/Raw, got {step!r}"))
        self._counter += 1
        reply = _Built(step, body, self._counter)
        if body.get("stream"):
            return await self._stream(request, reply, body)
        return web.json_response(reply.completion())

    async def _stream(self, request: web.Request, reply: _Built, body: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        options = body.get("stream_options") or {}
        chunks = reply.chunks(include_usage=bool(options.get("include_usage")))
        try:
            for sent, chunk in enumerate(chunks):
                if sent == reply.step.break_after:
                    break
                await resp.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
                if reply.step.chunk_delay:
                    await asyncio.sleep(reply.step.chunk_delay)
            if reply.step.break_after is not None:
                _hang_up(request)  # chunked body never terminated and no [DONE]: a broken stream
                return resp
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:  # the client stopped reading: its choice, not a server error
            _log.debug("FakeOpenAIServer: client left mid-stream")
        return resp


    async def _raw(self, request: web.Request, step: Raw) -> web.StreamResponse:
        headers = dict(step.headers)
        if step.body is not None:
            text = step.body if isinstance(step.body, str) else json.dumps(step.body, ensure_ascii=False)
            headers.setdefault("Content-Type", "application/json")
            return web.Response(status=step.status, body=text.encode("utf-8", "surrogatepass"), headers=headers)
        headers.setdefault("Content-Type", "text/event-stream")
        resp = web.StreamResponse(status=step.status, headers=headers)
        await resp.prepare(request)
        try:
            for event in step.events:
                data = event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)
                await resp.write(b"data: " + data.encode("utf-8", "surrogatepass") + b"\n\n")
            if step.done:
                await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            _log.debug("FakeOpenAIServer: client left mid-stream")
        return resp


def _hang_up(request: web.Request) -> None:
    # aiohttp then fails to write the response with a ConnectionError, which it ignores quietly.
    if request.transport is not None:
        request.transport.close()


def _error(fault: Fault) -> web.Response:
    default_type = "server_error" if fault.status >= 500 else "invalid_request_error"
    kind = fault.type or ("requests" if fault.status == 429 else default_type)
    headers = dict(fault.headers)
    if fault.retry_after is not None:
        ra = fault.retry_after
        headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = str(fault.retry_after_ms)
    payload = {"error": {"message": fault.message, "type": kind, "param": None, "code": fault.code}}
    return web.json_response(payload, status=fault.status, headers=headers)


class _Built:
    """A Reply resolved against one request: ids, usage and finish reason filled in."""

    def __init__(self, step: Reply, body: dict[str, Any], n: int) -> None:
        self.step = step
        self.model = str(body.get("model") or FakeOpenAIServer.MODELS[0])
        self.id = f"chatcmpl-fake-{n}"
        self.created = int(time.time())
        calls = enumerate(step.tool_calls)
        self.calls = [(c.id or f"call_{n}_{i}", c.name, c.arguments_json) for i, c in calls]
        self.finish = step.finish_reason or ("tool_calls" if self.calls else "stop")
        u = step.usage or Usage()
        completion_guess = len(step.text or "") // 4 + sum(len(nm) + len(a) for _, nm, a in self.calls) // 4
        completion_guess = max(completion_guess, 1) if step.text or self.calls else 0  # as a provider counts
        prompt_guess = len(json.dumps(body.get("messages", []), ensure_ascii=False)) // 4
        prompt = u.prompt_tokens if u.prompt_tokens is not None else prompt_guess
        completion = u.completion_tokens if u.completion_tokens is not None else completion_guess
        total = u.total_tokens if u.total_tokens is not None else prompt + completion
        self.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.step.text, "refusal": None}
        if self.calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in self.calls
            ]
        choice = {"index": 0, "message": message, "finish_reason": self.finish, "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage}

    def chunks(self, *, include_usage: bool) -> Iterator[dict[str, Any]]:
        yield self._chunk({"role": "assistant", "content": ""})
        for piece in _pieces(self.step.text or "", self.step.chunk_size):
            yield self._chunk({"content": piece})
        for i, (cid, name, args) in enumerate(self.calls):
            first = {"id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
            yield self._chunk({"tool_calls": [self._indexed(i, first)]})
            for piece in _pieces(args, self.step.chunk_size):
                yield self._chunk({"tool_calls": [self._indexed(i, {"function": {"arguments": piece}})]})
        yield self._chunk({}, finish=self.finish)
        if include_usage:
            yield {**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage}

    def _indexed(self, i: int, delta: dict[str, Any]) -> dict[str, Any]:
        mode = self.step.index_mode
        return delta if mode == "omit" else {"index": 0 if mode == "all_zero" else i, **delta}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice], "usage": None}

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def _pieces(text: str, size: int) -> Iterator[str]:
    size = max(1, size)
    for start in range(0, len(text), size):
        yield text[start : start + size]
