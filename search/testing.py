"""A local fake of Perplexity's API for tests: both endpoints, realistic bodies, fault injection.

The real client (and so the real ``openai`` SDK) talks to it over loopback::

    async with FakePerplexityServer(api_key="pplx-test") as server:
        server.answer("巴黎是法国的首都[1]。", [("Paris - Wikipedia", "https://en.wikipedia.org/wiki/Paris")])
        settings = SearchSettings(api_key="pplx-test", base_url=server.base_url)
        async with PerplexityClient(settings) as client:
            answer = await client.search("法国首都")
        assert server.last_request.authorization == "Bearer pplx-test"

Routes, as on ``api.perplexity.ai``: ``POST /v1/responses`` and its canonical twin ``POST /v1/agent``
(Agent API: ``output`` holds a ``search_results`` item and a ``message`` whose ``output_text`` has
``url_citation`` annotations; ``usage`` has ``input_tokens``/``output_tokens``, ``cost`` and
``tool_calls_details``), and ``POST /chat/completions`` (Sonar: ``citations``, ``search_results``,
``usage`` with ``citation_tokens``, ``num_search_queries`` and ``search_context_size``), and
background chat completions (``/async/chat/completions``, see :mod:`search._fakeresearch`).
Anything else is 404. With ``api_key`` set, a request without ``Bearer <api_key>`` gets the HTML
401 page Perplexity's front proxy sends. Malformed requests get a 400 JSON error, never a crash.

Requests are validated against the official SDK's request models (``perplexityai``:
``ResponsesRequestInput``, ``ApiChatCompletionsRequestInput``), so a field of the wrong shape gets
the 422 ``detail`` list a FastAPI server sends. On top of the SDK (whose fields are plain strings),
the fake refuses what Perplexity's docs rule out: a field the SDK does not know, the deprecated
``preset``, an effort level or a model name the docs do not list for that endpoint (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from function_calls.testing.loopback import LoopbackServer
from search._fakecheck import (
    AGENT_MODELS_DOCUMENTED,
    CHAT_MODELS_DOCUMENTED,
    check_agent,
    check_chat,
    error,
    validate,
)
from search._fakeresearch import ResearchJobs
from search.client import CITATION_MARKER, Source

__all__ = ["AGENT_MODELS_DOCUMENTED", "CHAT_MODELS_DOCUMENTED", "FakePerplexityServer", "RecordedRequest"]

FakeEndpoint = Literal["agent", "chat", "research"]

_DEFAULT_TEXT = (
    "Perplexity 是一家 AI 搜索公司[1]，总部位于美国旧金山[2]。It answers questions with cited sources[1]."
)
_DEFAULT_SOURCES = (
    Source(
        title="Perplexity AI - Wikipedia",
        url="https://en.wikipedia.org/wiki/Perplexity_AI",
        date="2025-06-01",
    ),
    Source(title="About Perplexity", url="https://www.perplexity.ai/hub/about", date=None),
)
_HTML_401 = (
    "<html>\r\n<head><title>401 Authorization Required</title></head>\r\n<body>\r\n"
    "<center><h1>401 Authorization Required</h1></center>\r\n<hr><center>openresty</center>\r\n"
    "</body>\r\n</html>\r\n"
)


@dataclass
class RecordedRequest:
    """One request as received. ``headers`` keys are lower-case; ``body`` is ``{}`` when not JSON."""

    method: str
    path: str
    endpoint: FakeEndpoint | None
    headers: dict[str, str] = field(repr=False)  # holds the API key: kept out of reprs
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header as sent, or None."""
        return self.headers.get("authorization")


@dataclass(frozen=True)
class _Fault:
    status: int
    retry_after: float | None
    message: str | None
    body: str | None


class FakePerplexityServer(LoopbackServer):
    """An aiohttp server on 127.0.0.1 (random free port) answering like Perplexity."""

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self._text = _DEFAULT_TEXT
        self._sources: list[Source] = list(_DEFAULT_SOURCES)
        self._faults: deque[_Fault] = deque()
        self._disabled: set[FakeEndpoint] = set()
        self._delay = 0.0
        self._chunked = False
        self._cut_off = False
        self._closing = asyncio.Event()
        self.research = ResearchJobs()
        """Background jobs (deep research): set ``research.polls`` and ``research.failure`` to script them."""

    # -- lifecycle -------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._agent)
        app.router.add_post("/v1/agent", self._agent)
        app.router.add_post("/chat/completions", self._chat)
        for path in ("/async/chat/completions", "/v1/async/sonar"):  # the SDK's path, the docs' newer one
            app.router.add_post(path, self._research_submit)
            app.router.add_get(path + "/{job}", self._research_poll)
        app.router.add_route("*", "/{tail:.*}", self._unknown)

    async def start(self) -> None:
        self._closing.clear()
        await super().start()

    async def stop(self) -> None:
        """Stop serving; delayed requests are cut short. Safe to call twice."""
        self._closing.set()
        await super().stop()

    async def close(self) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: the API root, as ``SearchSettings.base_url`` expects."""
        return self.root_url

    @property
    def last_request(self) -> RecordedRequest:
        """The most recent request (``IndexError`` when none)."""
        return self.requests[-1]

    def requests_to(self, endpoint: FakeEndpoint) -> list[RecordedRequest]:
        """The requests that reached one endpoint."""
        return [r for r in self.requests if r.endpoint == endpoint]

    # -- scripting -------------------------------------------------------------------------
    def answer(self, text: str, sources: Iterable[Source | tuple[str, str]] = (), *, chunked: bool = False,
               cut_off: bool = False) -> None:
        """Answer every later search with ``text``; its ``[n]`` cites the n-th of ``sources``.

        ``chunked``: chat completions send the content as a list of text chunks. ``cut_off``: the
        answer stopped at the output-token limit (``finish_reason: "length"``; Agent API status
        ``incomplete``).
        """
        self._text = text
        self._sources = [s if isinstance(s, Source) else Source(title=s[0], url=s[1]) for s in sources]
        self._chunked = chunked
        self._cut_off = cut_off

    def next_status(
        self,
        code: int,
        retry_after: float | None = None,
        *,
        message: str | None = None,
        body: str | None = None,
    ) -> None:
        """Answer the next request (either endpoint) with HTTP ``code``; calls queue up in order.

        Requests stopped earlier (a disabled endpoint, a wrong key) do not use up a queued status.

        ``retry_after`` sets the ``Retry-After`` header; ``body`` replaces the JSON error body verbatim
        (with ``code=200`` it fakes a garbled success).
        """
        self._faults.append(_Fault(code, retry_after, message, body))

    def disable_endpoint(self, endpoint: FakeEndpoint) -> None:
        """Make ``endpoint`` answer 404, as where it is not deployed."""
        self._disabled.add(endpoint)

    def enable_endpoint(self, endpoint: FakeEndpoint) -> None:
        """Undo ``disable_endpoint``."""
        self._disabled.discard(endpoint)

    def delay(self, seconds: float) -> None:
        """Wait ``seconds`` before every later answer (0 turns it off)."""
        self._delay = max(0.0, seconds)

    # -- handlers --------------------------------------------------------------------------
    async def _agent(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "agent")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _research_submit(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "research")

    async def _research_poll(self, request: web.Request) -> web.StreamResponse:
        await self._record(request, "research")
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.Response(status=401, text=_HTML_401, content_type="text/html")
        if self._faults:
            return _fault(self._faults.popleft())
        return self.research.poll(request.match_info["job"], self._chat_body)

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        await self._record(request, None)
        return error(404, f"no route {request.method} {request.path}")

    async def _record(self, request: web.Request, endpoint: FakeEndpoint | None) -> dict[str, Any] | None:
        raw = await request.read()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(RecordedRequest(request.method, request.path, endpoint, headers, body or {}))
        return body

    async def _handle(self, request: web.Request, endpoint: FakeEndpoint) -> web.StreamResponse:
        body = await self._record(request, endpoint)
        if self._delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), timeout=self._delay)
        if endpoint in self._disabled:
            return error(404, "Not Found")
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.Response(status=401, text=_HTML_401, content_type="text/html")
        if self._faults:
            return _fault(self._faults.popleft())
        if body is None:
            return error(400, "request body must be a JSON object")
        if endpoint == "research":
            return self.research.submit(body)
        invalid = validate(body, endpoint)
        if invalid is not None:
            return invalid
        problem = check_agent(body) if endpoint == "agent" else check_chat(body)
        if problem:
            return error(400, problem)
        built = self._agent_body(body) if endpoint == "agent" else self._chat_body(body)
        return web.json_response(built, dumps=lambda o: json.dumps(o, ensure_ascii=False))

    # -- bodies ----------------------------------------------------------------------------
    def _results(self) -> list[dict[str, Any]]:
        return [
            {
                "title": s.title,
                "url": s.url,
                "date": s.date,
                "last_updated": s.date,
                "snippet": f"{s.title}: an excerpt of the page.",
                "source": "web",
            }
            for s in self._sources
        ]

    def _content(self) -> str | list[dict[str, str]]:
        if not self._chunked:
            return self._text
        half = len(self._text) // 2
        return [{"type": "text", "text": self._text[:half]}, {"type": "text", "text": self._text[half:]}]

    def _chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = _tokens(json.dumps(body.get("messages"), ensure_ascii=False))
        completion = _tokens(self._text)
        citation = 60 * len(self._sources)
        return {
            "id": str(uuid.uuid4()),
            "model": body["model"],
            "created": int(time.time()),
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length" if self._cut_off else "stop",
                    "message": {"role": "assistant", "content": self._content()},
                    "delta": {"role": "assistant", "content": ""},
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "search_context_size": "low",
                "citation_tokens": citation,
                "num_search_queries": 1,
                "cost": {
                    "input_tokens_cost": round(prompt * 1e-6, 6),
                    "output_tokens_cost": round(completion * 1e-6, 6),
                    "request_cost": 0.005,
                    "total_cost": round(0.005 + (prompt + completion) * 1e-6, 6),
                },
            },
            "citations": [s.url for s in self._sources],
            "search_results": self._results(),
        }

    def _agent_body(self, body: dict[str, Any]) -> dict[str, Any]:
        results = [{"id": i, **r} for i, r in enumerate(self._results(), 1)]
        annotations = []
        for match in CITATION_MARKER.finditer(self._text):
            n = int(match.group(1))
            if 1 <= n <= len(self._sources):
                source = self._sources[n - 1]
                annotations.append(
                    {
                        "type": "url_citation",
                        "url": source.url,
                        "title": source.title,
                        "start_index": match.start(),
                        "end_index": match.end(),
                    }
                )
        query = body["input"] if isinstance(body["input"], str) else "query"
        prompt = _tokens(json.dumps(body["input"], ensure_ascii=False)) + _tokens(
            str(body.get("instructions", ""))
        )
        completion = _tokens(self._text)
        model = body.get("model") or {"medium": "openai/gpt-5.1"}.get(str(body.get("effort")), "perplexity/sonar")
        status = "incomplete" if self._cut_off else "completed"
        return {
            "id": f"resp_{uuid.uuid4()}",
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": model,
            "output": [
                {"type": "search_results", "queries": [query[:80]], "results": results},
                {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4()}",
                    "status": status,
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": self._text, "annotations": annotations}],
                },
            ],
            "usage": {
                "input_tokens": prompt,
                "output_tokens": completion,
                "total_tokens": prompt + completion,
                "cost": {
                    "currency": "USD",
                    "input_cost": round(prompt * 2.5e-7, 8),
                    "output_cost": round(completion * 2.5e-6, 8),
                    "tool_calls_cost": 0.005,
                    "total_cost": round(0.005 + prompt * 2.5e-7 + completion * 2.5e-6, 8),
                },
                "tool_calls_details": {"web_search": {"invocation": 1}},
            },
        }


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _fault(fault: _Fault) -> web.Response:
    if fault.body is not None:
        response = web.Response(status=fault.status, text=fault.body, content_type="application/json")
    elif fault.status == 401:
        response = web.Response(status=401, text=_HTML_401, content_type="text/html")
    else:
        response = error(fault.status, fault.message or f"fake fault {fault.status}")
    if fault.retry_after is not None:
        ra = fault.retry_after
        response.headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
    return response
