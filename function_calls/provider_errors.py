"""Reading a provider's failures: HTTP status, in-stream error events, Retry-After, x-should-retry.

One classification decides what is worth retrying (408, 409, 429, 5xx, timeouts and connection
errors; not 400, 401, 403, 404, 422 or 429 ``insufficient_quota``); ``x-should-retry`` overrides
it, and an ``{"error": ...}`` event inside a 200 stream counts as the HTTP status it names, as does an
``{"error": ...}`` body sent with HTTP 200 (one-api / new-api relays). A 200 whose body is no reply at all
(a captive portal's page, a misrouted ``base_url``) is not retried. Neither is billed: nothing was done.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from datetime import UTC
from typing import Any

import openai

from function_calls.errors import ModelAPIError

__all__ = ["body_error", "classify_status", "not_a_stream", "translate_error"]


def classify_status(status: int, code: str | None) -> bool:
    """Whether an HTTP status from the provider is worth retrying."""
    if status == 429:
        return code != "insufficient_quota"
    return status in (408, 409) or status >= 500


def _retry_after(headers: Any) -> float | None:
    """Seconds the provider asks us to wait; ``None`` when absent or unreadable ("soon", "nan")."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if not value:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            if name != "retry-after":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
            if when.tzinfo is None:  # RFC 9110 dates are GMT
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def _should_retry(headers: Any) -> bool | None:
    value = headers.get("x-should-retry") if headers is not None else None
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


#: What an error event's ``type`` / ``code`` means as an HTTP status, for errors sent inside a 200 stream.
_ERROR_STATUS = {
    "invalid_request_error": 400, "context_length_exceeded": 400, "string_above_max_length": 400,
    "authentication_error": 401, "invalid_api_key": 401, "permission_error": 403, "not_found_error": 404,
    "model_not_found": 404, "rate_limit_error": 429, "rate_limit_exceeded": 429, "requests": 429,
    "insufficient_quota": 429, "server_error": 500, "api_error": 500, "overloaded_error": 529,
}


def _event_status(body: Any) -> tuple[int | None, str | None]:
    """The HTTP status and code an in-stream ``{"error": ...}`` event stands for."""
    if not isinstance(body, dict):
        return None, None
    code = body.get("code")
    code_text = code if isinstance(code, str) and not code.isdigit() else None
    for key in ("status", "status_code", "code"):
        value = body.get(key)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value, code_text
    for label in (code_text, body.get("type")):
        if isinstance(label, str) and label in _ERROR_STATUS:
            return _ERROR_STATUS[label], code_text or (label if label == "insufficient_quota" else None)
    return None, code_text


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
        return ModelAPIError("the model endpoint timed out", retryable=True, text_shown=text_shown, network=True)
    if isinstance(exc, openai.APIConnectionError):
        return ModelAPIError("could not reach the model endpoint", retryable=True, text_shown=text_shown,
                             network=True)
    if isinstance(exc, openai.APIStatusError):
        code = _error_code(exc)
        should = _should_retry(exc.response.headers)
        return ModelAPIError(
            f"the model endpoint answered HTTP {exc.status_code}" + (f" ({code})" if code else ""),
            status=exc.status_code,
            code=code,
            retryable=classify_status(exc.status_code, code) if should is None else should,
            retry_after=_retry_after(exc.response.headers),
            text_shown=text_shown,
        )
    if isinstance(exc, openai.APIError):
        status, code = _event_status(exc.body)
        if status is not None:  # an error event inside a 200 stream: it means what its status means
            return ModelAPIError(
                f"the model stream reported an error (HTTP {status}" + (f", {code})" if code else ")"),
                status=status, code=code, retryable=classify_status(status, code), text_shown=text_shown,
            )
        return ModelAPIError(f"the model stream failed: {type(exc).__name__}", retryable=True, text_shown=text_shown)
    return ModelAPIError(f"the model call failed: {type(exc).__name__}", retryable=False, text_shown=text_shown)


def body_error(body: Any, *, what: str = "") -> ModelAPIError | None:
    """The failure an HTTP 200 body stands for: its top-level ``error`` object classified like its status,
    or, when the body is not JSON (an HTML page), one not retried (``what`` names it, a content type);
    ``None`` for any other JSON. Nothing was done: ``billed_output`` stays ``None``."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError, UnicodeDecodeError):
            return ModelAPIError(f"the model endpoint answered HTTP 200 with no reply ({what or 'not JSON'})")
    error = body.get("error") if isinstance(body, dict) and not body.get("choices") else None
    if not error:
        return None
    status, code = _event_status(error)
    if status is None:  # (as an error event of no known status: maybe transient)
        return ModelAPIError("the model endpoint answered HTTP 200 with an error", code=code, retryable=True)
    return ModelAPIError(f"the model endpoint answered HTTP 200 with an error (HTTP {status}"
                         + (f", {code})" if code else ")"), status=status, code=code,
                         retryable=classify_status(status, code))


async def not_a_stream(response: Any) -> ModelAPIError | None:
    """The failure a streamed request's 200 answer stands for when it is no event stream (its content type is
    not ``text/event-stream`` and it has no ``data:`` line): read whole and classified by :func:`body_error`.
    ``None`` when it is a stream (read as one: an empty body is a stream cut short). ``response``: httpx's."""
    kind = str(response.headers.get("content-type", "")) if response is not None else "text/event-stream"
    if "event-stream" in kind.lower():
        return None
    body = await response.aread()  # (kept: a stream sent under another type is then read from it as usual)
    if not body.strip() or re.search(rb"^data:", body, re.M):
        return None
    return body_error(body, what=kind.split(";")[0].strip() or "no content type")
