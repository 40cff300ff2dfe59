"""How a long text is split into parts within a channel's limit (the outbox sends them one by one)."""

from __future__ import annotations

__all__ = ["split_text"]

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
        cut = cut or limit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest or not parts:
        parts.append(rest)
    return parts
