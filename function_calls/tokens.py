"""A dependency-free token estimate for budgets and history windows.

Exact tokenizers need their vocabulary files (tiktoken downloads them at run time, which an
offline bot cannot do), and the provider's reported usage is the real count anyway: this
estimate only has to be close and a little pessimistic. CJK characters count one token each,
other text one per four characters, plus a small per-message overhead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["estimate_messages", "estimate_tokens", "forget_texts", "wide_chars"]

_MESSAGE_OVERHEAD = 4


# Runs of wide characters: summing run lengths is ~3x faster than one match per character.
_WIDE = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0010ffff]+")


_counted: dict[str, int] = {}


def wide_chars(text: str) -> int:
    """How many of ``text``'s characters count one token each (CJK); the others count one per four. Not
    remembered: for a stream's deltas (:class:`function_calls.reply.Received`), each seen once."""
    return 0 if text.isascii() else sum(map(len, _WIDE.findall(text)))


def estimate_tokens(text: str) -> int:
    """Approximate token count of ``text``."""
    if text.isascii():  # no wide character possible: skip the scan
        return (len(text) + 3) // 4
    # A run counts its history window several times (the window, each turn's guard) and the next
    # message's run the same turns again: the scan is remembered (a string keeps its hash).
    known = _counted.get(text)
    if known is not None:
        return known
    wide = sum(map(len, _WIDE.findall(text)))
    narrow = len(text) - wide
    if len(_counted) >= 20_000:  # a bound, not a policy
        _counted.clear()
    tokens = _counted[text] = wide + (narrow + 3) // 4
    return tokens


def forget_texts() -> None:
    """Drop the remembered counts, and with them the texts they are keyed by (after a /forget)."""
    _counted.clear()


def estimate_messages(messages: Iterable[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]] = ()) -> int:
    """Approximate prompt tokens for a chat request (messages plus tool definitions)."""
    total = 0
    for message in messages:
        total += _MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            total += estimate_tokens(content)
        elif content is not None:
            total += estimate_tokens(json.dumps(content, ensure_ascii=False))
        for call in message.get("tool_calls") or ():
            total += estimate_tokens(json.dumps(call, ensure_ascii=False))
        reasoning = message.get("reasoning_content")  # sent back in DeepSeek's thinking mode: tokens too
        if isinstance(reasoning, str):
            total += estimate_tokens(reasoning)
    for tool in tools:
        total += estimate_tokens(json.dumps(tool, ensure_ascii=False, separators=(",", ":")))
    return total
