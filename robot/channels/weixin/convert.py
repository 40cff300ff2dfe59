"""Inbound iLink messages to :class:`robot.Message`, and outbound markdown to WeChat's plain text."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import UTC, datetime

from robot.channels.weixin.api import (
    ITEM_FILE,
    ITEM_IMAGE,
    ITEM_TEXT,
    ITEM_VIDEO,
    ITEM_VOICE,
    MESSAGE_TYPE_BOT,
    MessageItem,
    WeixinMessage,
)
from robot.message import ChatRef, Message, Sender

__all__ = ["flatten_markdown", "item_text", "made_up_id", "message_id_of", "to_message"]

PLATFORM = "weixin"
log = logging.getLogger(__name__)


def item_text(item: MessageItem) -> str:
    """One item as history text: the text, a voice note's transcription, or a placeholder."""
    if item.type == ITEM_TEXT:
        return (item.text_item.text if item.text_item else None) or ""
    if item.type == ITEM_VOICE:
        said = item.voice_item.text if item.voice_item else None
        return f"[语音] {said}" if said else "[语音]"
    if item.type == ITEM_IMAGE:
        return "[图片]"
    if item.type == ITEM_FILE:
        name = item.file_item.file_name if item.file_item else None
        return f"[文件: {name}]" if name else "[文件]"
    if item.type == ITEM_VIDEO:
        return "[视频]"
    return ""


def message_id_of(msg: WeixinMessage) -> str | None:
    """The top-level id, else the first item's (as the reference client does)."""
    if msg.message_id and msg.message_id.strip():
        return msg.message_id.strip()
    for item in msg.item_list:
        if item.msg_id and item.msg_id.strip():
            return item.msg_id.strip()
    return None


def made_up_id(msg: WeixinMessage) -> str:
    """An id for a message that came without one, the same each time the message comes again (a replay
    after a restart): a digest of who sent what, when, with which token. ``seq`` counts only when there
    is no time (it is the message's place in the server's stream, not a property of the message)."""
    what = [msg.from_user_id, msg.group_id, msg.create_time_ms, msg.context_token,
            [item.model_dump(mode="json", exclude_none=True) for item in msg.item_list],
            msg.seq if msg.create_time_ms is None else None]
    digest = hashlib.sha256(json.dumps(what, ensure_ascii=False, sort_keys=True).encode()).hexdigest()
    return f"qunbot-{digest[:32]}"


def chat_id_of(msg: WeixinMessage) -> str:
    """The chat a message belongs to (its context token is kept under it, where a reply looks for it)."""
    return (msg.group_id or "").strip() or msg.from_user_id


def to_message(account: str, msg: WeixinMessage) -> Message | None:
    """The bot-side message, or None for what is not a user's message (the bot's own echoes)."""
    if msg.message_type == MESSAGE_TYPE_BOT or not msg.from_user_id:
        return None
    message_id = message_id_of(msg)
    if message_id is None:  # the reference client makes one up too: the message is not lost
        message_id = made_up_id(msg)
        log.warning("weixin %s: a message with no message_id (seq %s); handled as %s", account, msg.seq, message_id)
    parts: list[str] = []
    reply_to: str | None = None
    for item in msg.item_list:
        if item.ref_msg is not None:
            ref = item.ref_msg
            quoted = [p for p in ((ref.title or "").strip(),
                                  item_text(ref.message_item) if ref.message_item else "") if p]
            parts.append(f"[引用: {' | '.join(quoted)}]" if quoted else "[引用]")
            ref_id = (ref.svr_id or "").strip() or (
                (ref.message_item.msg_id or "").strip() if ref.message_item else "")
            reply_to = reply_to or ref_id or None
        text = item_text(item)
        if text:
            parts.append(text)
    group = (msg.group_id or "").strip()
    chat = ChatRef(platform=PLATFORM, chat_id=chat_id_of(msg), kind="group" if group else "private", account=account)
    try:
        stamp = datetime.fromtimestamp(msg.create_time_ms / 1000, UTC) if msg.create_time_ms else None
    except (ValueError, OverflowError, OSError):  # a nonsense time is not worth losing the message
        stamp = None
    return Message(chat=chat, sender=Sender(user_id=msg.from_user_id), message_id=message_id,
                   text="\n".join(parts), timestamp=stamp or datetime.now(UTC), reply_to=reply_to,
                   raw=msg.model_dump(mode="json", exclude_none=True))


# A fence may be indented (inside a list item); a backtick fence's info string has no backtick.
_FENCE_OPEN = re.compile(r"[ \t]*(`{3,}|~{3,})([^\n]*)")
_FENCE_CLOSE = re.compile(r"[ \t]*(`{3,}|~{3,})\s*")
_INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
# ASCII only: it stops at a held code span's mark (and at Chinese text running on after a link); no "*":
# "**https://…**" keeps its emphasis markers out.
_URL = re.compile(r"https?://[^\x00-\x20<>()\[\]`*\x7f-\U0010ffff]+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)[^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)[^)]*\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.M)
_QUOTE = re.compile(r"^\s{0,3}>\s?", re.M)
_BULLET = re.compile(r"^(\s*)[-*+]\s+", re.M)
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$", re.M)
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EM = re.compile(r"(?<![*\w])([*_])(?=\S)([^*_\n]+?)(?<=\S)\1(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$", re.M)


def _hold_code(text: str) -> tuple[str, dict[int, str]]:
    """``text`` with each fenced block's contents, each inline code span's contents and each URL replaced
    by one placeholder character (a private-use one absent from ``text``), and what each stands for.

    Code is copied by the user, so none of the prose rewriting may touch it: the fence lines and
    the backticks go (the established rendering: WeChat shows no markdown), the code stays verbatim.
    A URL too: emphasis markers read inside it cut ``__init__.py`` to ``init.py`` in a cited source.
    """
    present = set(text)
    spare = (c for c in map(chr, range(0xF0000, 0x110000)) if c not in present)
    held: dict[int, str] = {}
    marks: dict[str, str] = {}  # one mark per text: a link's text that is its URL still reads as equal

    def hold(code: str) -> str:
        if code in marks:
            return marks[code]
        mark = next(spare, None)
        if mark is None:  # more code spans than spare characters (absurd): the rest is flattened
            return code
        held[ord(mark)], marks[code] = code, mark
        return mark

    def span(m: re.Match[str]) -> str:
        code = m[2]  # CommonMark: one space each side is padding (``` `` `x` `` ```)
        if len(code) > 2 and code[0] == code[-1] == " " and code.strip(" "):
            code = code[1:-1]
        return hold(code)

    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        opening = _FENCE_OPEN.fullmatch(lines[i])
        if opening is None or (opening[1][0] == "`" and "`" in opening[2]):
            out.append(_URL.sub(lambda m: hold(m[0]), _INLINE_CODE.sub(span, lines[i])))
            i += 1
            continue
        fence = opening[1]
        end = i + 1  # the first fence of the same character, at least as long; else the end of the text
        while end < len(lines) and not (
            (close := _FENCE_CLOSE.fullmatch(lines[end])) and close[1][0] == fence[0] and len(close[1]) >= len(fence)
        ):
            end += 1
        code = "\n".join(lines[i + 1 : end])
        closed = end < len(lines)  # an unclosed block ends the message: its trailing newlines go, as the prose's do
        out += ["", hold(code if closed else code.rstrip("\n"))] + ([""] if closed else [])
        i = end + 1
    return "\n".join(out), held


def flatten_markdown(text: str) -> str:
    """Markdown to the plain text WeChat shows: no markers, links as ``text (url)``, lists as ``• ``.

    Code (fenced blocks and inline spans) passes through verbatim, only its fences and backticks dropped.
    """
    text, held = _hold_code(text)
    text = _IMAGE.sub(lambda m: f"[图片 {m.group(1)}] {m.group(2)}".replace("[图片 ] ", "[图片] "), text)
    text = _LINK.sub(lambda m: m.group(1) if m.group(1) == m.group(2) else f"{m.group(1)} ({m.group(2)})", text)
    text = _TABLE_RULE.sub("", text)
    text = _RULE.sub("", text)
    text = _HEADING.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub(r"\1• ", text)
    text = _STRONG.sub(r"\2", text)
    text = _STRIKE.sub(r"\1", text)
    text = _EM.sub(r"\2", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip().translate(held)
