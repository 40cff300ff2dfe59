"""Reading Perplexity's JSON into ``SearchAnswer`` (private: import the names from ``search.client``).

Leniently: a missing or oddly typed field counts as absent. Markers are renumbered so that ``[n]``
in the text cites ``sources[n - 1]``; markers citing nothing are dropped. ``WireError`` (a
``ValueError``) carries a user-presentable message when an answer cannot be used at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

__all__ = [
    "CITATION_MARKER",
    "Endpoint",
    "SearchAnswer",
    "SearchUsage",
    "Source",
    "WireError",
    "parse_agent",
    "parse_chat",
]

Endpoint = Literal["agent", "chat"]
CITATION_MARKER = re.compile(r"\[([1-9]\d{0,2})\]")
"""A citation marker such as ``[3]`` in answer text."""
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
# A block never closed: the output-token limit cut the model off while it was thinking. Only then (and
# never in a finished answer, which may well mention "<think>") does it run to the end.
_UNCLOSED = re.compile(r"<think>(?:(?!</think>).)*\Z", re.DOTALL)


class WireError(ValueError):
    """A Perplexity answer that cannot be used; the message is fit to show a user."""

    def __init__(self, message: str = "Perplexity sent an answer that could not be read") -> None:
        super().__init__(message)


class Source(BaseModel):
    """One cited web page."""

    model_config = ConfigDict(frozen=True)

    title: str
    url: str
    date: str | None = None


class SearchUsage(BaseModel):
    """What one search cost; fields an endpoint does not report stay 0."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    citation_tokens: int = 0
    num_search_queries: int = 0


class SearchAnswer(BaseModel):
    """A search answer; ``[n]`` in ``text`` cites ``sources[n - 1]``."""

    text: str
    sources: list[Source]
    usage: SearchUsage
    endpoint: Endpoint
    model: str
    truncated: bool = False
    """The answer hit the output-token limit and stops mid-way (shown to the user as cut off)."""


def parse_chat(data: Mapping[str, Any], *, fallback_model: str) -> SearchAnswer:
    """A Sonar chat-completions body as an answer."""
    choices = _dicts(data.get("choices"))
    if not choices:
        raise WireError()
    content = _content(_mapping(choices[0].get("message")).get("content"))
    truncated = choices[0].get("finish_reason") == "length"
    results = [r for r in _dicts(data.get("search_results")) if _str(r, "url")]
    by_url: dict[str, Mapping[str, Any]] = {}
    for result in results:
        by_url.setdefault(result["url"], result)
    # citations[i] is what [i + 1] cites; search_results carry the titles and dates.
    citations = [c for c in _list(data.get("citations")) if isinstance(c, str) and c]
    urls = citations or [r["url"] for r in results]
    numbered = {n: _source(url, by_url.get(url, {})) for n, url in enumerate(urls, 1)}
    text, sources = _renumber(_clean(content, truncated), numbered)
    usage = _mapping(data.get("usage"))
    counts = SearchUsage(
        prompt_tokens=_int(usage, "prompt_tokens"),
        completion_tokens=_int(usage, "completion_tokens"),
        citation_tokens=_int(usage, "citation_tokens"),
        num_search_queries=_int(usage, "num_search_queries"),
    )
    return _answer(text, sources, counts, "chat", _str(data, "model") or fallback_model, truncated)


def parse_agent(data: Mapping[str, Any], *, fallback_model: str) -> SearchAnswer:
    """An Agent API (Responses) body as an answer."""
    status = data.get("status")
    if status in ("failed", "cancelled"):
        raise WireError("Perplexity could not complete the search; try again later")
    if status in ("queued", "in_progress", "requires_action"):
        # Only background requests answer before they are done; this client never sends one.
        raise WireError(f"Perplexity has not finished the search (status {status}); try again later")
    output = _dicts(data.get("output"))
    if not any(item.get("type") == "message" for item in output):
        raise WireError()
    texts: list[str] = []
    numbered: dict[int, Source] = {}
    annotated: list[Source] = []
    queries = 0
    for item in output:
        if item.get("type") == "search_results":
            queries += len(_list(item.get("queries")))
            # Markers in the text are result ids; results without ids count in order.
            for result in _dicts(item.get("results")):
                if url := _str(result, "url"):
                    n = _int(result, "id") or len(numbered) + 1
                    numbered.setdefault(n, _source(url, result))
        elif item.get("type") == "message":
            for part in _dicts(item.get("content")):
                if part.get("type") == "output_text" and (text := _str(part, "text")):
                    texts.append(text)
                for note in _dicts(part.get("annotations")):
                    # Perplexity's spec leaves the annotation type open; OpenAI's is "url_citation".
                    if note.get("type") in (None, "url_citation") and (url := _str(note, "url")):
                        annotated.append(Source(title=_title(_str(note, "title"), url), url=url))
    # Annotated pages missing from search_results are numbered after them, so markers keep meaning.
    known = {s.url for s in numbered.values()}
    for source in annotated:
        if source.url not in known:
            numbered[max(numbered, default=0) + 1] = source
            known.add(source.url)
    # "incomplete" (OpenAI Responses) is how an output-token limit shows on the Agent API.
    truncated = status == "incomplete" or any(
        item.get("type") == "message" and item.get("status") == "incomplete" for item in output)
    text, sources = _renumber(_clean("\n\n".join(texts), truncated), numbered)
    usage = _mapping(data.get("usage"))
    web_search = _mapping(_mapping(usage.get("tool_calls_details")).get("web_search"))
    counts = SearchUsage(
        prompt_tokens=_int(usage, "input_tokens"),
        completion_tokens=_int(usage, "output_tokens"),
        num_search_queries=_int(web_search, "invocation") or queries,
    )
    return _answer(text, sources, counts, "agent", _str(data, "model") or fallback_model, truncated)


def _answer(
    text: str, sources: list[Source], usage: SearchUsage, endpoint: Endpoint, model: str, truncated: bool
) -> SearchAnswer:
    if not text and truncated:  # a reasoning model spent the output-token limit thinking
        raise WireError("Perplexity's answer was cut off before any answer (output-token limit reached while "
                        "reasoning); try again, or raise [search] max_output_tokens")
    if not text:
        raise WireError("Perplexity returned an empty answer; try rephrasing the question")
    return SearchAnswer(text=text, sources=sources, usage=usage, endpoint=endpoint, model=model,
                        truncated=truncated)


def _content(value: object) -> str | None:
    """Message content: a string, or a list of chunks whose ``text`` chunks are joined."""
    if isinstance(value, str):
        return value
    texts = [t for part in _dicts(value) if part.get("type") in (None, "text", "output_text")
             and (t := _str(part, "text"))]
    return "".join(texts) or None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: object) -> list[Mapping[str, Any]]:
    return [v for v in _list(value) if isinstance(v, Mapping)]


def _str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _source(url: str, meta: Mapping[str, Any]) -> Source:
    return Source(title=_title(_str(meta, "title"), url), url=url, date=_str(meta, "date"))


def _renumber(text: str, numbered: Mapping[int, Source]) -> tuple[str, list[Source]]:
    """Number sources 1..N in marker order, merging repeated URLs; drop markers citing nothing."""
    sources: list[Source] = []
    new: dict[int, int] = {}
    by_url: dict[str, int] = {}
    for n in sorted(numbered):
        source = numbered[n]
        if source.url not in by_url:
            sources.append(source)
            by_url[source.url] = len(sources)
        new[n] = by_url[source.url]

    def sub(match: re.Match[str]) -> str:
        k = new.get(int(match.group(1)))
        return f"[{k}]" if k else ""

    return CITATION_MARKER.sub(sub, text), sources


def _clean(text: str | None, truncated: bool) -> str:
    # sonar-reasoning models put their chain of thought in <think> blocks ahead of the answer.
    text = _THINK.sub("", text or "")
    return (_UNCLOSED.sub("", text) if truncated else text).strip()


def _title(title: str | None, url: str) -> str:
    title = " ".join((title or "").split())
    return title or urlsplit(url).hostname or url
