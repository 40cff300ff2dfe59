"""How a long text is split into parts within a channel's limit (the outbox sends them one by one)."""

from __future__ import annotations

import re
import unicodedata

__all__ = ["split_text", "whole"]

_BLANK_LINES = re.compile(r"^(?:[ \t]*\n)+")
_BREAKS = ("\n\n", "\n", "。", "！", "？", ". ", "! ", "? ", "；", "，", ", ", " ")


def split_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters, at the most natural break."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = 0
        for mark in _BREAKS:
            pos = window.rfind(mark)
            if pos >= limit // 2:
                cut = pos + len(mark)
                break
        cut = cut or whole(rest, limit)
        parts.append(rest[:cut].rstrip())
        # Blank lines go, a line's own indentation stays (a code answer's part 2 lost it).
        rest = _BLANK_LINES.sub("", rest[cut:])
    if rest.strip() or not parts:
        parts.append(rest)
    return parts


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
