"""OneBot v11 message segments and CQ codes.

A OneBot message arrives either as an array of segments
(``[{"type": "at", "data": {"qq": "10001"}}, {"type": "text", "data": {"text": " hi"}}]``)
or as a CQ string (``[CQ:at,qq=10001] hi``). Both parse to a list of :class:`Segment`.
CQ escaping: ``&`` -> ``&amp;``, ``[`` -> ``&#91;``, ``]`` -> ``&#93;``, and inside
parameter values also ``,`` -> ``&#44;``.

Errors::

    ValueError
    └── CQCodeError   a message that is neither a segment array nor a CQ string
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CQCodeError",
    "Segment",
    "at_targets",
    "compose_message",
    "escape",
    "parse_cq",
    "parse_message",
    "parse_segments",
    "placeholder",
    "plain_text",
    "reply_id",
    "to_array",
    "to_cq",
    "unescape",
]

# Parameters stop at the next "[" too: a sender escapes brackets in them, so an unescaped one starts
# something else, and an unclosed "[CQ:x," head is text. (Running on to the next "]" instead rescanned
# the rest of the message from every head: quadratic, seconds of a frozen loop for a long message.)
_CQ_RE = re.compile(r"\[CQ:([A-Za-z0-9_.\-]+)((?:,[^\[\]]*)?)\]")


class CQCodeError(ValueError):
    """A message value that cannot be read as OneBot segments."""


@dataclass(frozen=True)
class Segment:
    """One message segment: ``type`` (``text``, ``at``, ``reply``, ``image``...) and its ``data``.

    Scalar data values that arrive as numbers are normalised to strings (``{"qq": 10001}`` ->
    ``{"qq": "10001"}``) because implementations disagree on the type of ids.
    """

    type: str
    data: dict[str, object] = field(default_factory=dict)

    @classmethod
    def text_segment(cls, text: str) -> Segment:
        return cls("text", {"text": text})

    @classmethod
    def at(cls, user_id: str | int) -> Segment:
        """An @ of one user id, or of everyone with ``"all"``."""
        return cls("at", {"qq": str(user_id)})

    @classmethod
    def reply(cls, message_id: str | int) -> Segment:
        return cls("reply", {"id": str(message_id)})

    def to_dict(self) -> dict[str, object]:
        """The array-form JSON object of this segment."""
        return {"type": self.type, "data": dict(self.data)}

    def get_str(self, key: str) -> str | None:
        """A data value as a string, or ``None`` when missing or not a scalar."""
        value = self.data.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return None


def escape(text: str, *, escape_comma: bool = True) -> str:
    """CQ-escape ``text``; commas only matter inside parameter values."""
    text = text.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    if escape_comma:
        text = text.replace(",", "&#44;")
    return text


def unescape(text: str) -> str:
    """Undo :func:`escape`; ``&amp;`` goes last so ``&amp;#91;`` stays the literal ``&#91;``."""
    return text.replace("&#44;", ",").replace("&#91;", "[").replace("&#93;", "]").replace("&amp;", "&")


def _normalise(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _segment_from_obj(obj: object, index: int) -> Segment:
    if not isinstance(obj, Mapping):
        raise CQCodeError(f"segment {index} is {type(obj).__name__}, not an object")
    kind = obj.get("type")
    if not isinstance(kind, str) or not kind:
        raise CQCodeError(f"segment {index} has no string 'type'")
    data = obj.get("data")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise CQCodeError(f"segment {index} ({kind}) has non-object 'data'")
    return Segment(kind, {str(k): _normalise(v) for k, v in data.items()})


def parse_segments(items: Iterable[object]) -> list[Segment]:
    """Parse the array form of a message."""
    return [_segment_from_obj(obj, i) for i, obj in enumerate(items)]


def parse_cq(message: str) -> list[Segment]:
    """Parse a CQ string; text between codes becomes unescaped ``text`` segments."""
    segments: list[Segment] = []
    pos = 0
    for match in _CQ_RE.finditer(message):
        if match.start() > pos:
            segments.append(Segment.text_segment(unescape(message[pos : match.start()])))
        data: dict[str, object] = {}
        for param in match.group(2).split(",")[1:]:
            key, sep, value = param.partition("=")
            if key:
                data[key] = unescape(value) if sep else ""
        segments.append(Segment(match.group(1), data))
        pos = match.end()
    if pos < len(message):
        segments.append(Segment.text_segment(unescape(message[pos:])))
    return segments


def parse_message(message: object) -> list[Segment]:
    """Parse a message in any OneBot form: segment array, single segment object, or CQ string."""
    if isinstance(message, str):
        return parse_cq(message)
    if isinstance(message, Mapping):
        return [_segment_from_obj(message, 0)]
    if isinstance(message, list | tuple):
        return parse_segments(message)
    raise CQCodeError(f"message is {type(message).__name__}, expected a segment array or a CQ string")


def to_array(segments: Iterable[Segment]) -> list[dict[str, object]]:
    """Render segments in array form (what actions send)."""
    return [segment.to_dict() for segment in segments]


def _param_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def to_cq(segments: Iterable[Segment]) -> str:
    """Render segments as a CQ string."""
    parts: list[str] = []
    for segment in segments:
        if segment.type == "text":
            parts.append(escape(segment.get_str("text") or "", escape_comma=False))
            continue
        params = "".join(f",{key}={escape(_param_text(value))}" for key, value in segment.data.items())
        parts.append(f"[CQ:{segment.type}{params}]")
    return "".join(parts)


_PLACEHOLDERS = {"image": "[图片]", "face": "[表情]", "mface": "[表情]", "record": "[语音]", "video": "[视频]",
                 "forward": "[聊天记录]", "json": "[卡片消息]", "xml": "[卡片消息]", "poke": "[戳一戳]"}
# Rendered by plain_text itself (markdown is the message's own text; a reply's quote is Message.reply_to).
_NOT_PLACEHOLDERS = frozenset({"text", "markdown", "at", "reply"})
_LABEL_LEN = 40


def _label(text: str, limit: int = _LABEL_LEN) -> str:
    # A sender's client chooses summaries and file names: one short line, never a fake speaker line.
    return " ".join(text.split())[:limit]


def _fields(segment: Segment, *keys: str, sep: str = " ", limit: int = _LABEL_LEN) -> str:
    return sep.join(part for key in keys if (part := _label(segment.get_str(key) or "", limit)))


def _detail(segment: Segment) -> tuple[str, str] | None:
    """The label and the content shown of a segment that carries some (a place, a link, a roll...)."""
    kind = segment.type
    if kind == "file":
        return "文件", _label(segment.get_str("name") or segment.get_str("file") or "")
    if kind in ("onlinefile", "flashtransfer"):  # NapCat's online file and 闪传 (a file set: no one name)
        return "文件", _fields(segment, "fileName")
    if kind == "location":
        return "位置", _fields(segment, "title", "content", sep=", ") or _fields(segment, "lat", "lon", sep=", ")
    if kind == "share":
        return "链接", " ".join(p for p in (_fields(segment, "title"), _fields(segment, "url", limit=2000)) if p)
    if kind == "music":  # (a card by platform id names no song)
        return "音乐", _fields(segment, "title", "content")
    if kind in ("dice", "rps"):  # NapCat reports the result; Lagrange does not
        return ("骰子" if kind == "dice" else "猜拳"), _fields(segment, "result") or _fields(segment, "value")
    if kind == "contact":  # a QQ or group card carries only its number (never a phone number)
        number = _fields(segment, "id")
        if segment.get_str("type") == "group":
            return "群聊", number
        return "联系人", f"QQ {number}" if number else ""
    return None


def placeholder(segment: Segment) -> str | None:
    """What a reader (and the model) sees for a non-text segment: ``[图片]``, NapCat's image ``summary``
    (``[动画表情]``), ``[文件: name]``, ``[位置: 广州塔, 地址]``, ``[链接: 标题 url]``, ``[骰子: 3]``...,
    ``[<type>]`` for a type not known here (so no message is empty); ``None`` for text, markdown, @ and reply."""
    if segment.type in _NOT_PLACEHOLDERS:
        return None
    if segment.type == "image":
        summary = _label(segment.get_str("summary") or "")
        if summary:
            return summary if summary.startswith("[") and summary.endswith("]") else f"[{summary}]"
    if (detail := _detail(segment)) is not None:
        label, shown = detail
        return f"[{label}: {shown}]" if shown else f"[{label}]"
    return _PLACEHOLDERS.get(segment.type) or f"[{_label(segment.type)}]"


def _mention(name: str) -> str:
    # Lagrange's name is the mention as QQ shows it, "@小红", its "@" included (full-width from some clients).
    return name[1:] if name[:1] in ("@", "＠") else name


def plain_text(
    segments: Iterable[Segment], *, strip_at: Collection[str] | None = None, placeholders: bool = False
) -> str:
    """The text of a message (markdown's content included); other non-text segments (images, faces...)
    are dropped, or with ``placeholders`` shown as :func:`placeholder` (so no message is empty).

    With ``strip_at=None`` every ``at`` is dropped. Otherwise only the @s of the ids in
    ``strip_at`` are dropped and the others are kept as ``@name`` (or ``@id``), so a reader
    still sees who was addressed.
    """
    parts: list[str] = []
    for segment in segments:
        if segment.type in ("text", "markdown"):
            parts.append(segment.get_str("text" if segment.type == "text" else "content") or "")
        elif placeholders and (shown := placeholder(segment)) is not None:
            parts.append(shown)
        elif segment.type == "at" and strip_at is not None:
            target = segment.get_str("qq")
            if target is None or target in strip_at:
                continue
            name = _mention(segment.get_str("name") or "")
            parts.append("@全体成员" if target == "all" else f"@{name or target}")
    return "".join(parts)


def at_targets(segments: Iterable[Segment]) -> list[str]:
    """The ids @-ed in a message, in order, without duplicates (``"all"`` for @everyone)."""
    targets: dict[str, None] = {}
    for segment in segments:
        if segment.type == "at":
            target = segment.get_str("qq")
            if target:
                targets[target] = None
    return list(targets)


def reply_id(segments: Iterable[Segment]) -> str | None:
    """The message id a ``reply`` segment points at, if the message is a reply."""
    for segment in segments:
        if segment.type == "reply":
            return segment.get_str("id")
    return None


def compose_message(text: str, *, mentions: Iterable[str] = (), reply_to: str | None = None) -> list[Segment]:
    """Outgoing segments: an optional ``reply``, one ``at`` per mention, then the text.

    After @s the text starts with a space, as QQ clients render ``@name text``.
    """
    segments: list[Segment] = []
    if reply_to:
        segments.append(Segment.reply(reply_to))
    ats = [Segment.at(user_id) for user_id in dict.fromkeys(mentions)]
    segments.extend(ats)
    if text:
        segments.append(Segment.text_segment(f" {text}" if ats else text))
    return segments
