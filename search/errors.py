"""The search client's errors: one tree, every message short, user-presentable and free of the API key."""

from __future__ import annotations

__all__ = ["SearchAuthError", "SearchError", "SearchNotConfigured", "SearchRateLimited", "SearchRejected",
           "SearchUnavailable"]


class SearchError(Exception):
    """Base of every search failure; ``str(exc)`` is fit to show a chat user."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        #: Requests sent before this failure (a retry's refusal may follow an attempt Perplexity took).
        self.attempts = 1
        #: Perplexity may have taken (and billed) the request: it timed out after sending, or answered
        #: HTTP 200 unusably. False only when it refused (4xx), failed (5xx) or was never reached.
        self.billed = False


class SearchNotConfigured(SearchError):
    """No Perplexity API key is configured."""


class SearchAuthError(SearchError):
    """Perplexity rejected the API key (HTTP 401/403)."""


class SearchRateLimited(SearchError):
    """Perplexity is rate-limiting (HTTP 429); ``retry_after`` is in seconds when known."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, status_code: int | None = 429
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class SearchRejected(SearchError):
    """Perplexity refused the request as invalid; ``detail`` holds its own words (key scrubbed)."""

    def __init__(self, message: str, *, status_code: int | None = None, detail: str | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.detail = detail


class SearchUnavailable(SearchError):
    """Perplexity could not be reached in time, failed, or answered unreadably."""
