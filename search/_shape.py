"""Shaping Perplexity requests and reading its error bodies (private: used by ``search.client``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search.settings import Recency, SearchSettings

__all__ = ["Request", "about_model", "agent_body", "server_message"]


class Request:
    """One search as asked: the query, an optional style instruction, an optional recency."""

    __slots__ = ("query", "recency", "system")

    def __init__(self, query: str, system: str | None, recency: Recency | None) -> None:
        self.query, self.system, self.recency = query, system, recency


def agent_body(settings: SearchSettings, req: Request) -> dict[str, Any]:
    body: dict[str, Any] = {"input": req.query}
    if settings.effort is not None:
        body["effort"] = settings.effort
    elif "/" in settings.model:
        body["model"] = settings.model
    else:
        body["model"] = f"perplexity/{settings.model}"
    if req.system:
        body["instructions"] = req.system
    if settings.language_preference:
        body["language_preference"] = settings.language_preference
    if settings.max_output_tokens is not None:
        body["max_output_tokens"] = settings.max_output_tokens
    filters: dict[str, Any] = {}
    if req.recency:
        filters["search_recency_filter"] = req.recency
    if settings.search_domain_filter:
        filters["search_domain_filter"] = list(settings.search_domain_filter)
    # Third-party models search only through the web_search tool; Sonar and effort levels search by
    # themselves, and get the tool only to carry filters.
    third_party = settings.effort is None and "/" in settings.model
    if third_party or filters:
        tool: dict[str, Any] = {"type": "web_search"}
        if filters:
            tool["filters"] = filters
        body["tools"] = [tool]
    return body


def about_model(body: object) -> bool:
    """Whether an error body blames the model (name unknown or not offered on this endpoint)."""
    return "model" in (server_message(body) or "").lower()


def server_message(body: object, limit: int = 300) -> str | None:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and body.get("detail") is None:
            body = error
        for key in ("message", "detail"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value[:limit]
            if isinstance(value, list) and (text := _detail_list(value)):
                return text[:limit]
    return None


def _detail_list(items: list[Any]) -> str:
    """A FastAPI-style 422 ``detail`` list as ``"body.model: Field required; ..."``."""
    parts: list[str] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        loc = item.get("loc")
        where = ".".join(str(p) for p in loc) if isinstance(loc, list) else ""
        msg = item.get("msg")
        if isinstance(msg, str) and msg:
            parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)
