"""Perplexity web-search client: one question in, one answer with numbered sources out.

Both Perplexity endpoints go through the official ``openai`` SDK (auth header, timeouts, HTTP
error classes), with ``base_url`` set to the API root (``https://api.perplexity.ai``):

* Agent API: ``POST {base}/v1/responses``, the OpenAI-Responses-compatible alias of
  ``POST {base}/v1/agent``. Sent with ``client.post(..., cast_to=object)`` and read as plain JSON,
  because ``client.responses.create`` types Perplexity's ``search_results`` output item as an
  OpenAI message (and warns whenever the result is dumped).
* Sonar chat completions: ``POST {base}/chat/completions`` via ``client.chat.completions.create``;
  ``citations`` / ``search_results`` and the extra usage fields are read from the dumped model.

In every ``SearchAnswer`` a marker ``[n]`` in ``text`` refers to ``sources[n - 1]``.

Errors: one tree, every message short, user-presentable and free of the API key::

    SearchError
     ├── SearchNotConfigured   no API key in the settings
     ├── SearchAuthError       HTTP 401/403: the key was rejected
     ├── SearchRateLimited     HTTP 429; ``retry_after`` seconds when the server said
     ├── SearchRejected        other 4xx (unknown model, bad request) or an empty query
     └── SearchUnavailable     timeout, connection failure, 5xx, unreadable or failed response

5xx answers and connection failures are retried once after a short pause; timeouts and 4xx never.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from search._shape import Request, about_model, agent_body, server_message
from search._wire import (
    CITATION_MARKER,
    Endpoint,
    SearchAnswer,
    SearchUsage,
    Source,
    WireError,
    parse_agent,
    parse_chat,
)
from search.errors import (
    SearchAuthError,
    SearchError,
    SearchNotConfigured,
    SearchRateLimited,
    SearchRejected,
    SearchUnavailable,
)
from search.settings import Recency, SearchSettings

__all__ = [
    "AGENT_PATH",
    "CHAT_PATH",
    "CITATION_MARKER",
    "RESEARCH_MODEL",
    "RESEARCH_PATH",
    "Endpoint",
    "PerplexityClient",
    "ResearchStatus",
    "SearchAnswer",
    "SearchAuthError",
    "SearchError",
    "SearchNotConfigured",
    "SearchRateLimited",
    "SearchRejected",
    "SearchUnavailable",
    "SearchUsage",
    "Source",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

AGENT_PATH = "v1/responses"
"""Agent API path under the base URL (``/v1/agent`` is the same endpoint under its canonical name)."""
CHAT_PATH = "chat/completions"
"""Sonar chat-completions path under the base URL (the SDK appends it)."""
RESEARCH_PATH = "async/chat/completions"
"""Background (async) chat completions, as the ``perplexityai`` SDK calls them: POST to submit,
GET ``.../{id}`` to poll (statuses ``CREATED``, ``IN_PROGRESS``, ``COMPLETED``, ``FAILED``)."""
RESEARCH_MODEL = "sonar-deep-research"


@dataclass(frozen=True)
class ResearchStatus:
    """Where a background research request stands; ``answer`` once done, ``error`` once failed."""

    state: Literal["running", "done", "failed"]
    answer: SearchAnswer | None = None
    error: str = ""

# In "auto" these statuses from the agent endpoint mean "this account or deployment cannot use it
# this way"; chat completions gets the question instead (a genuine bad request fails there too).
_FALLBACK_STATUSES = frozenset({400, 403, 404, 405, 422, 501})
# Of those, only these say the endpoint itself is missing; they switch "auto" to chat for good.
# A 400/422 naming the model says the same of the model (every search would pay a rejected call);
# any other 400/403/422 may concern one odd query (or a passing state): fallback for that query only.
_MISSING_STATUSES = frozenset({404, 405, 501})
_MODEL_STATUSES = frozenset({400, 422})
# Chat completions answering these after "auto" switched to it: it moved away; try the agent again.
_CHAT_GONE_STATUSES = frozenset({404, 410})


class PerplexityClient:
    """Asks Perplexity one question at a time. Safe to share; close with ``aclose()``."""

    def __init__(self, settings: SearchSettings, *, retry_backoff_s: float = 0.5) -> None:
        self._settings = settings
        self._backoff = retry_backoff_s
        self._remembered: Endpoint | None = None
        self._sdk: openai.AsyncOpenAI | None = None
        if settings.api_key is not None:
            self._sdk = openai.AsyncOpenAI(
                api_key=settings.api_key.get_secret_value(),
                base_url=settings.base_url,
                max_retries=0,
                timeout=settings.timeout_s,
            )
            # The SDK fills these from OPENAI_ORG_ID / OPENAI_PROJECT_ID, which belong to the bot's
            # own LLM provider and must not be sent to Perplexity.
            self._sdk.organization = None
            self._sdk.project = None

    def __repr__(self) -> str:
        s = self._settings
        return f"PerplexityClient(endpoint={s.endpoint!r}, model={s.model!r}, configured={self.configured})"

    @property
    def settings(self) -> SearchSettings:
        """The settings this client was built from."""
        return self._settings

    @property
    def configured(self) -> bool:
        """Whether an API key is set (searching can work at all)."""
        return self._sdk is not None

    @property
    def endpoint_in_use(self) -> Endpoint | None:
        """The endpoint searches go to: fixed by the settings, or learned in "auto" (None: not yet)."""
        if self._settings.endpoint != "auto":
            return self._settings.endpoint
        return self._remembered

    async def search(self, query: str, *, system: str | None = None, recency: Recency | None = None) -> SearchAnswer:
        """Search the web for ``query``; ``system`` is an optional instruction for the answer's style.

        ``recency`` narrows this search to pages of the last hour/day/week/month/year (it overrides
        the ``search_recency_filter`` setting).
        """
        if self._sdk is None:
            raise SearchNotConfigured("web search is not set up (no Perplexity API key)")
        query = query.strip()
        if not query:
            raise SearchRejected("the search query is empty")
        request = Request(query, system, recency or self._settings.search_recency_filter)
        try:
            return await self._dispatch(self._sdk, request)
        except WireError as exc:  # an HTTP 200 (billed) that holds no usable answer
            unusable = SearchUnavailable(str(exc))
            unusable.billed = True
            raise unusable from None
        except (openai.OpenAIError, TimeoutError, ValueError) as exc:
            # ValueError: a body that is not JSON at all.
            # "from None": SDK errors carry the request (and so the key) and raw server text.
            raise self._translate(exc) from None

    async def submit_research(self, query: str, *, key: str) -> str:
        """Start a deep-research run in background mode; its request id. ``key`` is the idempotency
        key: submitting again with it (after a crash) does not start a second, paid run."""
        if self._sdk is None:
            raise SearchNotConfigured("web search is not set up (no Perplexity API key)")
        body = {"request": {"model": RESEARCH_MODEL, "messages": [{"role": "user", "content": query.strip()}]},
                "idempotency_key": key}
        data = await self._call(lambda sdk: sdk.post(RESEARCH_PATH, cast_to=object, body=body))
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise SearchUnavailable(str(WireError()))
        return str(data["id"])

    async def research_status(self, request_id: str) -> ResearchStatus:
        """Poll a background run (one GET)."""
        if self._sdk is None:
            raise SearchNotConfigured("web search is not set up (no Perplexity API key)")
        data = await self._call(lambda sdk: sdk.get(f"{RESEARCH_PATH}/{request_id}", cast_to=object))
        if not isinstance(data, dict):
            raise SearchUnavailable(str(WireError()))
        status = data.get("status")
        if status in ("CREATED", "IN_PROGRESS"):
            return ResearchStatus("running")
        if status == "FAILED":
            return ResearchStatus("failed", error=self._scrub(str(data.get("error_message") or "")) or "")
        if status == "COMPLETED" and isinstance(data.get("response"), dict):
            try:
                return ResearchStatus("done", parse_chat(data["response"], fallback_model=RESEARCH_MODEL))
            except WireError as exc:
                raise SearchUnavailable(str(exc)) from None
        raise SearchUnavailable(str(WireError()))

    async def _call(self, attempt: Callable[[openai.AsyncOpenAI], Awaitable[object]]) -> object:
        sdk = self._sdk
        assert sdk is not None
        tries = 0

        async def counted() -> object:
            nonlocal tries
            tries += 1
            return await attempt(sdk)

        try:
            return await self._retrying(counted)
        except (openai.OpenAIError, TimeoutError, ValueError) as exc:
            error = self._translate(exc)
            error.attempts = tries
            raise error from None

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._sdk is not None:
            await self._sdk.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- endpoint choice -------------------------------------------------------------------
    async def _dispatch(self, sdk: openai.AsyncOpenAI, req: Request) -> SearchAnswer:
        mode = self._settings.endpoint
        if mode == "chat" or (mode == "auto" and not self._settings.agent_serves()):
            # A Sonar model the Agent API does not list: asking it first would always be refused.
            return await self._retrying(lambda: self._chat(sdk, req))
        if mode == "agent":
            return await self._retrying(lambda: self._agent(sdk, req))
        if self._remembered == "chat":
            try:
                return await self._retrying(lambda: self._chat(sdk, req))
            except openai.APIStatusError as exc:
                if exc.status_code not in _CHAT_GONE_STATUSES:
                    raise
                _log.info("Perplexity chat completions answered HTTP %s; trying the Agent API again",
                          exc.status_code)
                self._remembered = None  # whatever happens next, probe afresh next time
            answer = await self._retrying(lambda: self._agent(sdk, req))
            self._remembered = "agent"
            return answer
        try:
            answer = await self._retrying(lambda: self._agent(sdk, req))
        except openai.APIStatusError as exc:
            if exc.status_code not in _FALLBACK_STATUSES:
                raise
            _log.info("Perplexity Agent API answered HTTP %s; trying chat completions", exc.status_code)
            answer = await self._retrying(lambda: self._chat(sdk, req))
            if exc.status_code in _MISSING_STATUSES or (
                    exc.status_code in _MODEL_STATUSES and about_model(exc.body)):
                self._remembered = "chat"
                _log.info("Perplexity search will use chat completions from now on")
            return answer
        self._remembered = "agent"
        return answer

    async def _retrying(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        try:
            return await self._bounded(attempt)
        except openai.APITimeoutError:
            raise  # the user already waited a full timeout
        except (openai.APIConnectionError, openai.InternalServerError) as exc:
            _log.warning("Perplexity request failed (%s); retrying once", type(exc).__name__)
            await asyncio.sleep(self._backoff)
            return await self._bounded(attempt)

    async def _bounded(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        # The SDK timeout bounds each read; this bounds the whole exchange (a trickling server).
        async with asyncio.timeout(self._settings.timeout_s):
            return await attempt()

    # -- the two endpoints -----------------------------------------------------------------
    async def _agent(self, sdk: openai.AsyncOpenAI, req: Request) -> SearchAnswer:
        body = agent_body(self._settings, req)
        data = await sdk.post(AGENT_PATH, cast_to=object, body=body)
        if not isinstance(data, dict):
            raise WireError()
        return parse_agent(data, fallback_model=str(body.get("model") or body.get("effort")))

    async def _chat(self, sdk: openai.AsyncOpenAI, req: Request) -> SearchAnswer:
        settings = self._settings
        model = settings.chat_model()
        messages: list[ChatCompletionMessageParam] = []
        if req.system:
            messages.append({"role": "system", "content": req.system})
        messages.append({"role": "user", "content": req.query})
        # Perplexity's own fields ride in extra_body: the openai SDK does not know them.
        extra: dict[str, Any] = {}
        if req.recency:
            extra["search_recency_filter"] = req.recency
        if settings.search_domain_filter:
            extra["search_domain_filter"] = list(settings.search_domain_filter)
        if settings.language_preference:
            extra["language_preference"] = settings.language_preference
        completion = await sdk.chat.completions.create(
            model=model, messages=messages, extra_body=extra or None,
            max_tokens=settings.max_output_tokens if settings.max_output_tokens is not None else openai.omit,
        )
        if not isinstance(completion, ChatCompletion):  # the SDK hands back text for non-JSON bodies
            raise WireError()
        return parse_chat(completion.model_dump(warnings=False), fallback_model=model)

    # -- errors ----------------------------------------------------------------------------
    def _translate(self, exc: BaseException) -> SearchError:
        error = self._translated(exc)
        # Sent and not refused: Perplexity may be answering (and billing) still, or answered unreadably.
        # Only a connection that never opened surely sent nothing (the SDK's transport, httpx or httpx2,
        # raises its ConnectError then: matched by name, as the SDK's major versions differ in the module).
        never_sent = isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError) \
            and any(cls.__name__ == "ConnectError" for cls in type(exc.__cause__).__mro__)
        error.billed = not isinstance(exc, openai.APIStatusError) and not never_sent
        return error

    def _translated(self, exc: BaseException) -> SearchError:
        if isinstance(exc, openai.APITimeoutError | TimeoutError):
            return SearchUnavailable(f"Perplexity did not answer within {self._settings.timeout_s:g} s")
        if isinstance(exc, openai.APIConnectionError):
            return SearchUnavailable("could not reach Perplexity; try again later")
        if isinstance(exc, openai.APIStatusError):
            code = exc.status_code
            _log.warning("Perplexity search failed: HTTP %s from %s", code, exc.request.url.path)
            if code in (401, 403):
                return SearchAuthError("the Perplexity API key was rejected", status_code=code)
            if code == 429:
                wait = _retry_after(exc.response.headers)
                when = f"in {max(1, round(wait))} s" if wait is not None else "later"
                return SearchRateLimited(
                    f"Perplexity is rate-limiting searches; try again {when}", retry_after=wait
                )
            if code >= 500:
                return SearchUnavailable(
                    f"Perplexity is having trouble (HTTP {code}); try again later", status_code=code
                )
            # Masked before it is cut: a key the cut split would keep its first part
            detail = (self._scrub(server_message(exc.body, limit=100_000)) or "")[:300] or None
            return SearchRejected(
                f"Perplexity refused the search request (HTTP {code})" + (f": {detail}" if detail else ""),
                status_code=code,
                detail=detail,
            )
        _log.warning("Perplexity answer could not be read: %s", type(exc).__name__)
        return SearchUnavailable(str(WireError()))

    def _scrub(self, text: str | None) -> str | None:
        key = self._settings.api_key
        if text is None or key is None:
            return text
        secret = key.get_secret_value()
        return text.replace(secret, "***") if secret else text


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        with contextlib.suppress(ValueError):  # "inf" parses too, and broke rounding the reply's wait
            if math.isfinite(value := float(raw) / scale):
                return max(0.0, value)
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)  # HTTP dates are GMT by definition
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return None
