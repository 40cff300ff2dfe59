"""Reading a provider's reply: text, reasoning, counts, tool calls and their ids, finish reasons, however it
sends them (helpers of :mod:`function_calls.model`)."""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict

from function_calls.errors import ModelAPIError
from function_calls.problems import mend_text
from function_calls.tokens import estimate_tokens, wide_chars

__all__ = ["ABORTED", "Received", "Shower", "TextCallback", "ToolCall", "ToolCallAccumulator", "as_text", "bill",
           "check_finish", "complete_json", "count", "made_up_id", "mended", "output_of", "reasoning_of", "reported",
           "str_or_none", "stream_limit", "stream_refused", "text_of"]

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
    """What a streamed reply has brought so far (text, reasoning, tool calls), in output tokens estimated as
    one text: each delta rounded up on its own counted a one-token English delta as two. ``over``: past
    ``limit``."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._wide = self._narrow = 0

    def add(self, piece: str) -> None:
        wide = wide_chars(piece)  # (by character class as they come: the whole text is never counted again)
        self._wide += wide
        self._narrow += len(piece) - wide

    @property
    def tokens(self) -> int:
        return self._wide + (self._narrow + 3) // 4

    @property
    def over(self) -> bool:
        return self.limit is not None and self.tokens > self.limit


def stream_limit(output_limit: int | None, max_tokens: int | None) -> int | None:
    """Past how many estimated tokens a streamed reply is left: ``output_limit`` (else ``max_tokens``), and half
    the cap sent more when one was. The provider keeps to that one by its own count, which the estimate passes
    (one token a CJK character, where Qwen counts 1.4): a 1,300-character answer within max_tokens=992 was cut."""
    limit = output_limit if output_limit is not None else max_tokens
    return limit if limit is None or max_tokens is None else limit + min(limit, max_tokens) // 2


def stream_refused(exc: Exception) -> bool:
    """Whether the provider refused to stream this request, and only that (HTTP 400 naming the stream: OpenAI's
    o3 for an organisation not verified): nothing was written, so the same request unstreamed costs nothing more."""
    if not isinstance(exc, openai.BadRequestError):
        return False
    return getattr(exc, "param", None) in ("stream", "stream_options") or re.search(r"\bstream", exc.message) is not None


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


def mended(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls`` as the next request can carry them: lone surrogates in names, ids and arguments made U+FFFD
    (a name that is then no tool's is told to the model), and ids made alike by that made up anew."""
    out: list[ToolCall] = []
    for c in calls:
        call_id = mend_text(c.id)
        if not call_id or any(call_id == seen.id for seen in out):  # ids alike: the results would mix
            call_id = made_up_id()
        out.append(ToolCall(id=call_id, name=mend_text(c.name), arguments=mend_text(c.arguments)))
    return out


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


class ToolCall(BaseModel):
    """One function call requested by the model; ``arguments`` is the raw JSON text."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = ""


@dataclass
class _Partial:
    id: str
    name: str = ""
    arguments: str = ""


@dataclass
class ToolCallAccumulator:
    """Assembles streamed tool-call deltas.

    Providers disagree: some omit ``index``, some label every call 0, some reuse an index for
    a new call, some send no ids, and vLLM can send a fresh ``id`` on every delta of one call.
    A delta continues the call its index points to (or else the call seen last) unless it names
    another tool, or names a tool after that call's arguments are complete JSON, or brings a new
    id with a name, or a new id after complete arguments: then it starts a call. An id already
    seen under another index, or whose call that delta does not continue (by the same rules), is
    one id reused for two calls: the second gets an id of its own.
    """

    calls: list[_Partial] = field(default_factory=list)
    _by_index: dict[int, _Partial] = field(default_factory=dict)
    _by_id: dict[str, _Partial] = field(default_factory=dict)
    _last: _Partial | None = None

    def feed(self, index: Any, call_id: Any, name: Any, arguments: Any) -> None:
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        call_id, name, args = str_or_none(call_id), str_or_none(name), as_text(arguments)
        part = self._by_id.get(call_id) if call_id else None
        if part is not None and call_id and not self._continues(part, None, name):
            part = self._new(call_id)  # the same id for another call (a relay's call_0 for each): an id made up
            self._by_id[call_id] = part
        elif part is not None and index is not None and self._by_index.get(index) is not part \
                and part in self._by_index.values():
            part = None  # its id under another index: one id reused for two calls (ids numbered per turn)
        if part is None:
            known = self._by_index.get(index) if index is not None else self._last
            part = known if known is not None and self._continues(known, call_id, name) else self._new(call_id or "")
            if call_id:
                if call_id not in self._by_id:  # an id another call holds is not this one's
                    part.id = part.id or call_id
                self._by_id[call_id] = part
        if index is not None:
            self._by_index[index] = part
        if name and not part.name:
            part.name = name
        part.arguments += args
        self._last = part

    @staticmethod
    def _continues(known: _Partial, call_id: str | None, name: str | None) -> bool:
        if name and known.name and name != known.name:
            return False  # another tool: another call, even under the same index and no id
        done = complete_json(known.arguments)
        if call_id is None:
            return not (name and done)
        # A new id: a regenerated one (vLLM) while the call is unfinished and no other name is given.
        return not done and (name is None or known.arguments != "" or not known.name)

    def _new(self, call_id: str) -> _Partial:
        part = _Partial(id="" if call_id in self._by_id else call_id)  # a reused id: made up in result()
        self.calls.append(part)
        return part

    def result(self) -> list[ToolCall]:
        for p in self.calls:
            p.id = p.id or made_up_id()  # kept: a second result() names the calls alike
        return [ToolCall(id=p.id, name=p.name, arguments=p.arguments) for p in self.calls if p.name or p.arguments]
