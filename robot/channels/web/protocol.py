"""The web playground's JSON protocol: one JSON object per WebSocket text frame on ``/ws``.

Page -> server::

    {"type": "send", "kind": "group" | "private", "user": {"id": "u-alice", "name": "Alice"}, "text": "@qunbot hi"}
    {"type": "panels", "chat": {"kind": "group", "id": "playground"}}    ask for one chat's side panels
    {"type": "ping"}                                                      answered by {"type": "pong"}

A ``send`` goes to the shared group (id ``playground``) or to the sender's private chat with
the bot (its id is the user's id). Ids are ``[A-Za-z0-9_.-]{1,64}``, names 1-32 characters.

Server -> page. Each chat-bound frame names its ``chat`` as ``{"kind", "id"}``; every page gets
every frame and shows the chat it is on::

    {"type": "welcome", "bot_name", "group_id", "members": [{"id", "name", "approver"?}], "max_text_len"}
                                           always first; members are the presets, then the web platform's
                                           approvers (``[bot] admins``/``[approvals] approvers``), marked
                                           ``"approver": true``; ``max_text_len``: the most characters a
                                           ``send`` may carry (``[limits] max_message_chars``): a longer
                                           one is refused, and the page keeps it unsent, with a notice
    {"type": "history", "frames": [...]}   recent message/reply/trace frames of every chat, oldest first;
                                           also what a page missed while none was connected, and after a
                                           restart a chat's newest stored messages (sent again when a page
                                           first opens a chat whose messages were not restored yet)
    {"type": "message", "chat", "id", "sender": {"id", "name"}, "text", "time", "mentions_bot", "zone"}
                                           a person's message, echoed to every page (the sender's too)
    {"type": "delta", "chat", "run_id", "delta"}     a piece of a streaming reply; ``run_id`` is the id
                                                     of the message being answered
    {"type": "reply", "chat", "id", "text", "mention": [{"id", "name"}], "reply_to", "time", "zone"}
                                           the bot's message; it replaces the streaming bubble of ``reply_to``
    {"type": "trace", "chat", "event"}     a run's event: "tool" (call_id, name, arguments, result, is_error,
                                           duration_ms, note), "retry" (error, delay_s) or "run_end" (stop,
                                           detail, tokens, model_calls); ``event.message_id`` is the run;
                                           a /command is traced as one "tool" event and run_end stop "command"
    {"type": "panels", "chat", "panels": [{"name", "rows": [{label: value}], "actions"?, "actors"?, "error"?}]}
                                           side panels, pushed on request, after each run_end and each bot
                                           message (for that chat and for each chat a page shows);
                                           ``actions[i]`` lists row i's buttons ``[{"label", "text"}]``: the
                                           page sends ``text`` (a /command) as its current identity;
                                           ``actors[i]``: the ids the bot lets press them (null: not said)
    {"type": "error", "error": "..."}      the page's last frame was refused; the socket stays open
    {"type": "pong"}

Times are ISO 8601 in UTC; ``zone`` is the chat's IANA zone (``[bot] zones``/``timezone``), in
which the page shows them (null when the channel runs without a bot).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from datetime import UTC
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from yarl import URL

from robot.config import LimitsSection
from robot.history import HistoryEntry
from robot.message import ChatKind, ChatRef

__all__ = ["MAX_MESSAGE", "MAX_TEXT", "ChatAddress", "FrameError", "PanelsFrame", "PingFrame", "SendFrame", "UserRef", "address",
           "answers_to", "authority", "is_loopback", "parse_frame", "stored_frames", "trim"]

_ID = r"^[A-Za-z0-9_.\-]{1,64}$"
MAX_TEXT = 4000  # the bot's messages are sent in parts of this size
#: The longest text a page may send unless the channel is told ``[limits] max_message_chars``.
MAX_MESSAGE: int = LimitsSection().max_message_chars
_LONG = 4000  # trace strings are cut here


def authority(url: str) -> str | None:
    """A URL's ``host[:port]`` as sent (an Origin header's), or None for one that does not parse."""
    try:
        return URL(url).raw_authority
    except ValueError:
        return None


class FrameError(ValueError):
    """A frame from a page that cannot be used; the message says why and goes back to the page."""


class _Frame(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", str_strip_whitespace=True)


class UserRef(_Frame):
    """The identity a page speaks as."""

    id: str = Field(pattern=_ID)
    name: str = Field(min_length=1, max_length=32)


class ChatAddress(_Frame):
    """A chat as pages name it."""

    kind: ChatKind
    id: str = Field(pattern=_ID)


class SendFrame(_Frame):
    """A person's message."""

    type: Literal["send"]
    kind: ChatKind
    user: UserRef
    text: str = Field(min_length=1)  # (at most the channel's limit: see parse_frame)


class PanelsFrame(_Frame):
    """A request for one chat's side panels."""

    type: Literal["panels"]
    chat: ChatAddress


class PingFrame(_Frame):
    """A liveness probe."""

    type: Literal["ping"]


Inbound = Annotated[SendFrame | PanelsFrame | PingFrame, Field(discriminator="type")]
_INBOUND: TypeAdapter[SendFrame | PanelsFrame | PingFrame] = TypeAdapter(Inbound)
_TYPES = ("send", "panels", "ping")


def parse_frame(raw: str, max_text: int = MAX_MESSAGE) -> SendFrame | PanelsFrame | PingFrame:
    """Parse and validate one page frame (a ``send`` of at most ``max_text`` characters); :class:`FrameError`
    says what is wrong."""
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise FrameError(f"frame is not JSON: {exc.msg} at position {exc.pos}") from None
    except ValueError:  # a number of more than 4,300 digits: Python's limit, not JSONDecodeError
        raise FrameError("frame holds a number too long to read") from None
    except RecursionError:
        raise FrameError("frame is nested too deeply") from None
    if not isinstance(data, dict):
        raise FrameError("frame must be a JSON object")
    if data.get("type") not in _TYPES:
        raise FrameError(f"unknown frame type {str(data.get('type'))[:40]!r}; expected one of {', '.join(_TYPES)}")
    try:
        frame = _INBOUND.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "frame"
        raise FrameError(f"bad {data['type']} frame: {where}: {first['msg']}") from None
    if isinstance(frame, SendFrame) and len(frame.text) > max_text:
        raise FrameError(f"太长：{len(frame.text)}/{max_text} (text longer than this bot takes: "
                         "[limits] max_message_chars)")
    return frame


def address(chat: ChatRef) -> dict[str, str]:
    """A chat as it appears in server frames."""
    return {"kind": chat.kind, "id": chat.chat_id}


def stored_frames(chat: ChatRef, entries: Sequence[HistoryEntry], shown: Sequence[dict[str, Any]],
                  zone: str | None) -> list[dict[str, Any]]:
    """``message``/``reply`` frames for stored messages, leaving out those already ``shown`` in this run."""
    seen_ids = {frame.get("id") for frame in shown}
    # A reply's frame id is its outbox key, which older history rows do not keep: match replies by text.
    seen_replies = [frame.get("text") for frame in shown if frame.get("type") == "reply"]
    frames: list[dict[str, Any]] = []
    for n, entry in enumerate(entries):
        at = entry.at.astimezone(UTC).isoformat()
        if entry.from_bot:
            if entry.text in seen_replies:
                seen_replies.remove(entry.text)
                continue
            frames.append({"type": "reply", "chat": address(chat), "id": f"stored:{chat.key}:{n}:{at}",
                           "text": entry.text, "mention": [], "reply_to": None, "time": at, "zone": zone})
        elif entry.message_id not in seen_ids:
            frames.append({"type": "message", "chat": address(chat), "id": entry.message_id or f"stored:{n}:{at}",
                           "sender": {"id": entry.user_id, "name": entry.name}, "text": entry.text, "time": at,
                           "mentions_bot": False, "zone": zone})
    return frames


def trim(value: Any) -> Any:
    """A trace event with every long string cut to a readable length."""
    if isinstance(value, str) and len(value) > _LONG:
        return value[:_LONG] + f"… ({len(value) - _LONG} more characters)"
    if isinstance(value, dict):
        return {str(k): trim(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [trim(v) for v in value]
    return value


def answers_to(host: str | None, allowed: Iterable[str]) -> bool:
    """Whether a playground listening beyond this machine serves a request for ``host``: an IP address, this
    machine, or a name the owner listed. Another name may be a site that points its own at the playground
    (DNS rebinding): the page's Origin then matches Host, and it would drive the bot."""
    if not host:
        return False
    name = host.strip("[]").lower().rstrip(".")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name == "localhost" or name in {a.strip().lower().rstrip(".") for a in allowed}
    return True


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, brackets allowed) is this machine only."""
    if not host:
        return False
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
