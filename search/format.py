"""Turning a ``SearchAnswer`` into a chat reply (for people) or compact context (for the model).

A chat reply is the answer text followed by a short source list whose numbers match the ``[n]``
markers left in the text::

    巴黎是法国的首都[1]，也是最大的城市[2]。

    来源 / Sources:
    [1] Paris - Wikipedia - https://en.wikipedia.org/wiki/Paris
    [2] Paris facts - https://example.org/paris

Sources are numbered in the order the text first cites them; uncited ones come last and are the
first to go when there are more than ``max_sources``. The whole reply fits ``max_chars``: the text is
cut at a sentence end where one is near, else at a character, never inside a marker or a URL, and
sources cited only in the cut-off part are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from search.client import CITATION_MARKER, SearchAnswer, Source

__all__ = ["CUT_OFF_NOTE", "SOURCES_HEADER", "format_answer", "format_for_model"]

SOURCES_HEADER = "来源 / Sources:"
"""The line that opens the source list in a chat reply."""

CUT_OFF_NOTE = "（回答达到长度上限，以下内容不完整）"
"""Opens a chat reply whose answer Perplexity cut off at its output-token limit."""
_MODEL_CUT_NOTE = "\n\n(Perplexity cut this answer off at its length limit: it is incomplete; say so.)"
_ELLIPSIS = "…"
_MAX_TITLE = 80
_URL = re.compile(r"https?://[^\s<>\"'，。、；：！？（）「」『』【】]+")
_SENTENCE_END = re.compile(
    r"(?:[。！？!?；;…]|\.(?=[\s\[]|$)|\n)"  # a terminator ('.' only before space, marker or end)
    r"[”’」』）)\"']*"  # closing quotes and brackets that belong to the sentence
)
_MARKERS_AFTER = re.compile(r"(?:\[[1-9]\d{0,2}\])+")


def format_answer(answer: SearchAnswer, *, max_chars: int, max_sources: int) -> str:
    """The answer as a chat reply of at most ``max_chars`` characters, with up to ``max_sources`` sources."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    if max_sources < 0:
        raise ValueError("max_sources must not be negative")
    if answer.truncated:
        # At the head, where trimming to max_chars never cuts it away.
        answer = answer.model_copy(update={"text": CUT_OFF_NOTE + "\n" + answer.text, "truncated": False})
    sources = answer.sources
    cited, uncited = _citation_order(answer.text, sources)
    order = (cited + uncited)[:max_sources]
    text = _reindex(answer.text, sources, order)

    # Give the text at least a third of the room (or all it needs) by shedding sources from the end.
    need = min(len(text), max(1, max_chars // 3))
    while order and max_chars - len(_block([sources[i - 1] for i in order])) < need:
        order.pop()
    while True:
        kept = [sources[i - 1] for i in order]
        text = _reindex(answer.text, sources, order)
        budget = max_chars - len(_block(kept))
        if len(text) <= budget:
            return text + _block(kept)
        body = _trim(text, budget)
        # Sources whose every marker was cut away go too; that frees room, so trim again.
        # Cited sources hold the first numbers (uncited ones follow them in ``order``).
        n_cited = sum(1 for i in order if i in cited)
        still_cited = {int(m.group(1)) for m in CITATION_MARKER.finditer(body)}
        survivors = [k for k in range(1, len(kept) + 1) if k in still_cited or k > n_cited]
        if len(survivors) == len(kept):
            return body + _block(kept)
        order = [order[k - 1] for k in survivors]


def format_for_model(answer: SearchAnswer) -> str:
    """The answer and all its sources, compactly, as tool output for the LLM."""
    cited, uncited = _citation_order(answer.text, answer.sources)
    order = cited + uncited
    text = re.sub(r"\n{3,}", "\n\n", _reindex(answer.text, answer.sources, order)).strip()
    if answer.truncated:
        text += _MODEL_CUT_NOTE
    if not order:
        return text
    lines = []
    for k, i in enumerate(order, 1):
        source = answer.sources[i - 1]
        date = f" ({source.date})" if source.date else ""
        lines.append(f"[{k}] {source.title}{date} {source.url}")
    return text + "\n\nSources:\n" + "\n".join(lines)


def _citation_order(text: str, sources: Sequence[Source]) -> tuple[list[int], list[int]]:
    """1-based source numbers: cited ones by first citation, then uncited; repeated URLs once."""
    first_of_url: dict[str, int] = {}
    for i, source in enumerate(sources, 1):
        first_of_url.setdefault(source.url, i)
    cited: list[int] = []
    for match in CITATION_MARKER.finditer(text):
        n = int(match.group(1))
        if n <= len(sources):
            canonical = first_of_url[sources[n - 1].url]
            if canonical not in cited:
                cited.append(canonical)
    uncited = [i for i in sorted(set(first_of_url.values())) if i not in cited]
    return cited, uncited


def _reindex(text: str, sources: Sequence[Source], order: Sequence[int]) -> str:
    """Renumber markers so source ``order[k]`` becomes ``[k + 1]``; markers of the rest vanish."""
    new_by_url = {sources[i - 1].url: k for k, i in enumerate(order, 1)}

    def sub(match: re.Match[str]) -> str:
        n = int(match.group(1))
        k = new_by_url.get(sources[n - 1].url) if n <= len(sources) else None
        return f"[{k}]" if k else ""

    return _MARKERS_AFTER.sub(_tidy_run, CITATION_MARKER.sub(sub, text))


def _tidy_run(match: re.Match[str]) -> str:
    # "[3][1][3]" reads better as "[1][3]" once numbers have moved.
    numbers = sorted({int(n) for n in CITATION_MARKER.findall(match.group(0))})
    return "".join(f"[{n}]" for n in numbers)


def _block(sources: Sequence[Source]) -> str:
    if not sources:
        return ""
    lines = [SOURCES_HEADER]
    for k, source in enumerate(sources, 1):
        title = " ".join(source.title.split())
        if len(title) > _MAX_TITLE:
            title = title[: _MAX_TITLE - 1].rstrip() + _ELLIPSIS
        lines.append(
            f"[{k}] {title} - {source.url}" if title and title != source.url else f"[{k}] {source.url}"
        )
    return "\n\n" + "\n".join(lines)


def _trim(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (ellipsis included), at a safe place."""
    if len(text) <= limit:
        return text
    if limit <= len(_ELLIPSIS):
        return ""
    room = limit - len(_ELLIPSIS)
    urls = [m.span() for m in _URL.finditer(text)]
    spans = [m.span() for m in CITATION_MARKER.finditer(text)] + urls

    def safe(p: int) -> bool:
        return not any(start < p < end for start, end in spans)

    # Prefer the last sentence end (with any markers right after it) in the second half of the room.
    best = 0
    for match in _SENTENCE_END.finditer(text):
        if match.start() >= room:
            break
        for end in (match.end(), _markers_end(text, match.end())):
            if room // 2 <= end <= room and safe(end):
                best = max(best, end)
    head = text[: best or _char_cut(text, room, spans)].rstrip()
    # A chat client would take an ellipsis glued to a URL as part of the link.
    while (url := next((start for start, end in urls if end == len(head)), None)) is not None:
        if len(head) + 1 + len(_ELLIPSIS) <= limit:
            return head + " " + _ELLIPSIS
        head = text[:url].rstrip()
    return head + _ELLIPSIS


def _markers_end(text: str, pos: int) -> int:
    match = _MARKERS_AFTER.match(text, pos)
    return match.end() if match else pos


def _char_cut(text: str, room: int, spans: list[tuple[int, int]]) -> int:
    cut = room
    for start, end in sorted(spans, reverse=True):
        if start < cut < end:
            cut = start
    # Mid-word in Latin script: back up to the last space, if one is close.
    if 0 < cut < len(text) and _latin(text[cut - 1]) and _latin(text[cut]):
        space = text.rfind(" ", max(0, cut - 30), cut)
        if space > 0:
            cut = space
    return cut


def _latin(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()
