"""Reading a provider's reply: text, reasoning, counts, ids and finish reasons, however it sends them
(helpers of :mod:`function_calls.model`)."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from function_calls.errors import ModelAPIError
from function_calls.tokens import estimate_tokens

__all__ = ["ABORTED", "Received", "Shower", "TextCallback", "as_text", "bill", "check_finish", "complete_json", "count",
           "made_up_id", "output_of", "reasoning_of", "reported", "str_or_none", "text_of"]

TextCallback = Callable[[str], Awaitable[None]]

log = logging.getLogger("function_calls.model")


def complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def as_text(value: Any) -> str:
    """Arguments as JSON text, whatever the provider sent (llama.cpp sends an object)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


#: Finish reasons that mean the provider broke the answer off (DeepSeek, when short of capacity).
ABORTED = frozenset({"insufficient_system_resource"})


def check_finish(finish: str | None, *, shown: bool) -> None:
    """An answer the provider broke off is no answer: retried (unless part of it was shown)."""
    if finish in ABORTED:
        raise ModelAPIError(f"the model broke its answer off ({finish})", retryable=True, text_shown=shown)


class Received:
    """What a streamed reply has brought so far, in estimated output tokens (text, reasoning, tool calls)."""

    def __init__(self) -> None:
        self.tokens = 0

    def add(self, piece: str) -> None:
        if piece:
            self.tokens += estimate_tokens(piece)


def reported(usage: Any) -> tuple[int | None, int | None]:
    """The provider's (prompt, completion) counts, each None when not reported as a count."""
    return count(getattr(usage, "prompt_tokens", None)), count(getattr(usage, "completion_tokens", None))


def bill(error: ModelAPIError, usage: Any, output: int) -> ModelAPIError:
    """``error`` for a reply the provider made and billed: what it reported it spent, else ``output``
    (estimated; a reported 0 is no count once output came)."""
    prompt, completion = reported(usage)
    error.billed_output = completion or output
    error.billed_prompt = prompt or None
    return error


def output_of(resp: Any) -> int:
    """A whole reply's text and reasoning in estimated tokens, whatever its shape (0 when none can be read)."""
    try:
        message = resp.choices[0].message
        return estimate_tokens(text_of(message.content) + reasoning_of(message))
    except Exception:
        return 0


def made_up_id() -> str:
    """An id for a call the provider sent without one. Unique in the run, not ``call_<n>``: that one
    would come back on every turn, and a verdict or result kept for one call would match the next."""
    return f"call_{secrets.token_hex(8)}"


class Shower:
    """Passes streamed text to ``on_text``; a callback that raises is logged once and not called again."""

    def __init__(self, on_text: TextCallback | None) -> None:
        self.on_text = on_text
        self.shown = False

    async def show(self, text: str) -> None:
        if self.on_text is None:
            return
        try:
            await self.on_text(text)
        except Exception:  # the bot's own callback: not the provider's fault, so no retry
            log.exception("on_text callback failed; no more streaming for this reply")
            self.on_text = None
            return
        self.shown = True


def text_of(content: Any) -> str:
    """Message text: a string, or a list of content parts (Mistral) whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def count(value: Any) -> int | None:
    """A token count as reported, or ``None`` when it is not a non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
        return None
    return int(value)


def reasoning_of(obj: Any) -> str:
    """Thinking text: ``reasoning_content`` (DeepSeek, Qwen) or ``reasoning`` (vLLM, OpenRouter)."""
    for key in ("reasoning_content", "reasoning"):
        value = getattr(obj, key, None)
        if isinstance(value, str) and value:
            return value
    return ""
