"""How a long text is split into parts within a channel's limit (the outbox sends them one by one)."""

from __future__ import annotations

import re
import unicodedata
from typing import NamedTuple

__all__ = ["split_text", "whole"]

_BLANK_LINES = re.compile(r"^(?:[ \t]*\n)+")
_BREAKS = ("\n\n", "\n", "。", "！", "？", ". ", "! ", "? ", "；", "，", ", ", " ")
# A fence may be indented (inside a list item); a backtick fence's info string has no backtick.
_FENCE_OPEN = re.compile(r"([ \t]*)(`{3,}|~{3,})([^\n]*)")
_FENCE_CLOSE = re.compile(r"[ \t]*(`{3,}|~{3,})\s*")


class _Fence(NamedTuple):
    opening: str  # the line that opened the block (its info string: ```python)
    closing: str  # a line that closes it
    start: int  # where the opening line starts


def split_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters, at the most natural break.

    A cut inside a fenced code block closes the block at the end of its part and opens it again (same
    info string) at the start of the next, so every part is whole markdown: a channel that renders
    or flattens markdown (WeChat) still reads part 2 as code, not as prose.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = _cut(rest, limit)
        fence, room = _open_fence(rest[:cut], limit), limit
        # Room for the closing line, and a cut at the end of a line of code (again if the block open at
        # the new cut is another one, with a longer closing line: the room shrinks each round).
        while fence is not None and room > limit - len(fence.closing) - 1:
            room = limit - len(fence.closing) - 1
            cut = _cut(rest, room, code=True)
            fence = _open_fence(rest[:cut], limit)
        if (fence is not None and rest[:fence.start].strip()
                and not rest[fence.start:cut].partition("\n")[2].strip()):
            cut, fence = fence.start, None  # none of the block's code fits: it starts in the next part
        # Blank lines go, a line's own indentation stays (a code answer's part 2 lost it).
        after = _BLANK_LINES.sub("", rest[cut:])
        if fence is None:
            parts.append(rest[:cut].rstrip())
            rest = after
            continue
        parts.append(rest[:cut].rstrip() + "\n" + fence.closing)
        first, _, beyond = after.partition("\n")
        closes = _closes(first, fence.opening)
        if closes or not after.strip():  # the block ends right here: the next part starts after it
            rest = _BLANK_LINES.sub("", beyond) if closes else after
        else:
            rest = fence.opening + "\n" + after
    if rest.strip() or not parts:
        parts.append(rest)
    return parts


def _cut(rest: str, limit: int, *, code: bool = False) -> int:
    window = rest[:limit]
    if code:  # the end of any line, rather than a long line of code cut in two (the fence lines take
        pos = window.rfind("\n")  # at most a quarter of a part: each part still moves on)
        if pos >= limit // 4:
            return pos + 1
    for mark in _BREAKS:
        pos = window.rfind(mark)
        if pos >= limit // 2:
            return pos + len(mark)
    return whole(rest, limit)


def _closes(line: str, opening: str) -> bool:
    """Whether ``line`` closes the block ``opening`` opened (the same character, at least as many)."""
    opened, close = _FENCE_OPEN.fullmatch(opening), _FENCE_CLOSE.fullmatch(line)
    return bool(opened and close and close[1][0] == opened[2][0] and len(close[1]) >= len(opened[2]))


def _open_fence(head: str, limit: int) -> _Fence | None:
    """The fenced block still open at the end of ``head``, if its fence lines leave room for code in a
    part (a limit of a few characters cuts the block as text)."""
    fence: _Fence | None = None
    pos = 0
    for line in head.split("\n"):
        if fence is None:
            opened = _FENCE_OPEN.fullmatch(line)
            if opened and not (opened[2][0] == "`" and "`" in opened[3]):
                fence = _Fence(line, opened[1] + opened[2], pos)
        elif _closes(line, fence.opening):
            fence = None
        pos += len(line) + 1
    if fence is None or len(fence.opening) + len(fence.closing) + 2 > limit // 4:
        return None
    return fence


def _joins(ch: str) -> bool:
    """A character that belongs to the one before it (as people see it)."""
    return (ch in "\u200d\ufe0f\ufe0e" or "\U0001f3fb" <= ch <= "\U0001f3ff"  # ZWJ, variation selectors, skin
            or "\U000e0020" <= ch <= "\U000e007f"  # tag characters
            or unicodedata.category(ch) in ("Mn", "Mc", "Me"))  # accents, Thai and Indic vowel signs, keycaps (1️⃣)


def whole(text: str, cut: int) -> int:
    """``cut`` moved back to where no character people see as one is split (an emoji ZWJ sequence, a flag's
    two letters, a letter and its accent): it cut 👨|‍👩‍👧 and 🇨|🇳. Not below 1: a run that long is cut."""
    start = cut
    while 0 < cut < len(text) and (_joins(text[cut]) or text[cut - 1] == "\u200d"):
        cut -= 1
    flags = 0  # regional indicators pair up from the start of their run
    while cut - flags > 0 and "\U0001f1e6" <= text[cut - flags - 1] <= "\U0001f1ff":
        flags += 1
    cut -= flags % 2 if 0 < cut < len(text) and "\U0001f1e6" <= text[cut] <= "\U0001f1ff" else 0
    return cut if cut > 0 else start
