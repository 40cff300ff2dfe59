"""Telegram text rules: entity offsets in UTF-16 units, the 4096-unit limit, mentions, media placeholders."""

from __future__ import annotations

from typing import Any

from robot.channels.telegram.api import utf16_len
from robot.message import Sender
from robot.text_parts import whole

__all__ = ["LIMIT", "mention_prefix", "placeholder", "read_entities", "sender_of", "split_utf16", "start_as_help",
           "user_name"]

LIMIT = 4096
_NAME = 32  # characters of a mention's label at most


def user_name(user: dict[str, Any]) -> str:
    """A Bot API ``User``'s name as people see it: first and last name, else the username, else the id."""
    return " ".join(str(p) for p in (user.get("first_name"), user.get("last_name")) if p) or \
        str(user.get("username") or user.get("id") or "")


def mention_prefix(people: list[tuple[int, str]]) -> tuple[str, list[dict[str, Any]]]:
    """``"@name @name "`` to put before a text, with a ``text_mention`` entity on each label (offsets in
    UTF-16 units, no parse_mode): it notifies the person by id, with or without a username."""
    prefix, entities = "", []
    for user_id, name in people:
        name = " ".join(name.split()) or str(user_id)
        label = "@" + (name[:whole(name, _NAME)] if len(name) > _NAME else name)
        entities.append({"type": "text_mention", "offset": utf16_len(prefix), "length": utf16_len(label),
                         "user": {"id": user_id}})
        prefix += label + " "
    return prefix, entities


def split_utf16(text: str, limit: int = LIMIT) -> list[str]:
    """Cut ``text`` into parts of at most ``limit`` UTF-16 units, preferring line breaks."""
    parts: list[str] = []
    while utf16_len(text) > limit:
        cut, units = 0, 0
        for i, ch in enumerate(text):
            units += 2 if ord(ch) > 0xFFFF else 1
            if units > limit:
                cut = i
                break
        nl = text.rfind("\n", 0, cut)
        cut = nl + 1 if nl >= cut // 2 else whole(text, cut)  # (never inside an emoji sequence or a flag)
        parts.append(text[:cut])
        text = text[cut:]
    parts.append(text)
    return parts


def read_entities(text: str, entities: list[dict[str, Any]], username: str, bot_id: str
                  ) -> tuple[str, tuple[str, ...], bool]:
    """Strip ``@bot`` and ``/cmd@bot``; collect the other mentions. Offsets are UTF-16 units."""
    units = text.encode("utf-16-le", "surrogatepass")  # a lone surrogate is one unit, as Telegram counts
    cuts: list[tuple[int, int, str]] = []
    mentions: list[str] = []
    hit = False
    me = username.lower()
    for ent in entities:
        start, length = int(ent.get("offset", 0)) * 2, int(ent.get("length", 0)) * 2
        piece = units[start:start + length].decode("utf-16-le", errors="replace")
        kind = ent.get("type")
        if kind == "mention":
            if me and piece[1:].lower() == me:
                hit = True
                cuts.append((start, start + length, ""))
            else:
                mentions.append(piece[1:])
        elif kind == "text_mention" and isinstance(ent.get("user"), dict):
            if str(ent["user"].get("id")) == bot_id:
                hit = True
            else:
                mentions.append(str(ent["user"].get("id")))
        elif kind == "bot_command" and "@" in piece:
            command, _, target = piece.partition("@")
            if me and target.lower() == me:
                hit = True
                cuts.append((start, start + length, command))
    for start, end, keep in sorted(cuts, reverse=True):
        while not keep and units[end:end + 2] in (b" \x00", b"\t\x00"):  # "hi @bot  there": one space left,
            end += 2  # and only there (a message's own spaces, code's indentation, stay as sent)
        units = units[:start] + keep.encode("utf-16-le") + units[end:]
    return units.decode("utf-16-le", errors="replace").strip(), tuple(mentions), hit


def placeholder(msg: dict[str, Any]) -> str:
    """The marker of what ``msg`` carries besides text (``[图片]``, ``[投票: 周五聚餐?]``); "" for none."""
    for key, label in (("photo", "[图片]"), ("voice", "[语音]"), ("audio", "[音频]"), ("video", "[视频]"),
                       ("video_note", "[视频]"), ("sticker", "[贴纸]"), ("animation", "[动图]"), ("story", "[动态]")):
        if msg.get(key):
            return label
    for key, label, detail in (("document", "文件", lambda d: d.get("file_name")),
                               ("poll", "投票", lambda d: d.get("question")),
                               ("contact", "联系人", user_name),  # (the name only: not the phone number)
                               ("dice", "骰子", lambda d: f"{d.get('emoji') or ''}: {d.get('value')}".strip()),
                               ("venue", "位置", lambda d: ", ".join(str(p) for p in (d.get("title"), d.get("address"))
                                                                   if p))):
        if isinstance(part := msg.get(key), dict):
            shown = detail(part)
            return f"[{label}{' ' if key == 'dice' else ': '}{shown}]" if shown else f"[{label}]"
    return "[位置]" if msg.get("location") else ""


def start_as_help(text: str) -> str:
    """``/start`` (``/start <payload>``: a deep link), what a client sends first, as ``/help``: the greeting."""
    return "/help" if text == "/start" or text.startswith(("/start ", "/start\n")) else text


def sender_of(msg: dict[str, Any], chat_id: str) -> Sender:
    """Who wrote ``msg`` (which has a ``from``). Posted as a channel or as the group itself (an anonymous
    admin), ``from`` is one placeholder user for everyone who does so, anywhere (they shared limits,
    budgets and reminders): the chat it speaks as is the identity, and the group's own is nobody's."""
    sender = msg["from"]
    if isinstance(as_chat := msg.get("sender_chat"), dict) and as_chat.get("id") is not None:
        return Sender(user_id=f"chat:{as_chat['id']}", name=str(as_chat.get("title") or as_chat["id"]),
                      anonymous=str(as_chat["id"]) == chat_id)
    return Sender(user_id=str(sender["id"]), name=user_name(sender) or str(sender["id"]))
