"""What a model writes in ``content`` that is not its answer (helpers of :mod:`function_calls.model`).

Reasoning models served without a reasoning parser (DeepSeek-R1, QwQ, Qwen3 on Ollama, vLLM, llama.cpp,
many relays) put their thinking in ``content`` as ``<think>…</think>``; served without a tool parser,
Hermes-format models (Qwen) write a call as ``<tool_call>{"name": …, "arguments": …}</tool_call>``.

The rules, the same whole or streamed in any pieces:

* Only blocks at the very start of the content (after whitespace, one after another) are thinking:
  ``<think>``, ``<thinking>`` or ``<reasoning>`` (any case), each closed by its own closing tag. An
  unclosed one runs to the end (a model cut at its cap): then there is no answer. The same tags later
  in an answer are its text (it may be explaining them).
* Content that is, after any thinking, nothing but ``<tool_call>`` blocks and whitespace is those calls
  (a block that cannot be read is a call with no name: the model is told). Anything else around them
  makes the whole content text, shown as it came.
* Nothing is shown before it is decided: a delta that could start a block is held back, and released
  once it turns out not to be one.
"""

from __future__ import annotations

import json
import re
import string
from typing import Literal

from function_calls.reply import ToolCall, as_text, made_up_id

__all__ = ["ContentReader", "read_content"]

_OPEN = ("<think>", "<thinking>", "<reasoning>")
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_END = re.compile(re.escape(_CALL_CLOSE), re.I | re.A)
_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)  # (str.lower can change a text's length)


def _fold(text: str) -> str:
    return text.translate(_FOLD)


def _maybe(text: str, tag: str) -> bool:
    """Whether ``text`` is ``tag`` begun but not ended (to be held back until it is known)."""
    return len(text) < len(tag) and tag.startswith(_fold(text))


def _starts(text: str, tag: str) -> bool:
    return _fold(text[: len(tag)]) == tag


class ContentReader:
    """Splits ``content``, fed whole or in deltas, into the answer (``text``), thinking (``reasoning``) and
    ``calls`` written as text; :meth:`feed` and :meth:`finish` return what may be shown."""

    def __init__(self) -> None:
        self._held = ""  # read, not yet decided
        self._state: Literal["start", "think", "calls", "text"] = "start"
        self._close = ""  # the open thinking block's closing tag
        self._after_block = False  # whitespace after a thinking block is not the answer's
        self._pos = self._scan = 0  # in "calls": end of the blocks read, where to look for the next close
        self._bodies: list[str] = []
        self._text: list[str] = []
        self._thoughts: list[str] = []
        self.calls: list[ToolCall] = []

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._thoughts)

    def feed(self, piece: str) -> str:
        """Read ``piece``; returns the text that may be shown now."""
        self._held += piece
        shown = len(self._text)
        while self._step():
            pass
        return "".join(self._text[shown:])

    def finish(self) -> str:
        """The content has all come: returns the text held back that is shown after all."""
        shown = len(self._text)
        held, self._held = self._held, ""
        if self._state == "think":
            self._thoughts.append(held)  # (an unclosed block: all of the rest is thinking)
        elif self._state == "calls" and not held[self._pos:].strip():
            self.calls = [_call_of(body) for body in self._bodies]  # every block closed
        else:
            self._text.append(held.lstrip() if self._after_block else held)
        self._state = "text"
        return "".join(self._text[shown:])

    def _step(self) -> bool:
        """One decision on what is held; False when more content is needed first."""
        held = self._held
        if self._state == "text":
            if held:
                self._text.append(held)
                self._held = ""
            return False
        if self._state == "think":
            return self._think()
        if self._state == "calls":
            if self._could_be_calls():
                return False
            self._state = "text"
            return True
        rest = held.lstrip()
        if self._after_block:
            held = self._held = rest
        if not rest:
            return False
        for tag in _OPEN:
            if _starts(rest, tag):
                self._state, self._close, self._held = "think", "</" + tag[1:], rest[len(tag):]
                return True
        if any(_maybe(rest, tag) for tag in _OPEN):
            return False
        self._state = "calls" if _starts(rest, _CALL_OPEN) or _maybe(rest, _CALL_OPEN) else "text"
        return True

    def _think(self) -> bool:
        held, close = self._held, self._close
        end = re.search(re.escape(close), held, re.I | re.A)
        if end is not None:
            self._thoughts.append(held[: end.start()])
            self._held, self._state, self._after_block = held[end.end():], "start", True
            return True
        keep = next((k for k in range(min(len(close) - 1, len(held)), 0, -1) if close.startswith(_fold(held[-k:]))), 0)
        self._thoughts.append(held[: len(held) - keep])  # (the tail that may begin the closing tag is kept)
        self._held = held[len(held) - keep:]
        return False

    def _could_be_calls(self) -> bool:
        """Whether what is held may still be only ``<tool_call>`` blocks; reads the blocks closed so far."""
        held = self._held
        while True:
            rest = held[self._pos:].lstrip()
            if not rest or _maybe(rest, _CALL_OPEN):
                return True
            if not _starts(rest, _CALL_OPEN):
                return False
            start = len(held) - len(rest) + len(_CALL_OPEN)
            end = _CALL_END.search(held, max(start, self._scan))
            if end is None:
                self._scan = max(start, len(held) - len(_CALL_CLOSE) + 1)
                return True
            self._bodies.append(held[start:end.start()])
            self._pos = self._scan = end.end()


def _call_of(body: str) -> ToolCall:
    """One ``<tool_call>`` block as a call: ``{"name": …, "arguments": …}`` (or ``parameters``)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        arguments = value.get("arguments", value.get("parameters"))
        return ToolCall(id=made_up_id(), name=value["name"], arguments="{}" if arguments is None else as_text(arguments))
    return ToolCall(id=made_up_id(), name="", arguments=body.strip())  # no tool has no name: the model is told


def read_content(content: str) -> ContentReader:
    """A whole ``content`` read (an unstreamed reply)."""
    reader = ContentReader()
    reader.feed(content)
    reader.finish()
    return reader
