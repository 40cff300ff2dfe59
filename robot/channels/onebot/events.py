"""OneBot v11 message events -> :class:`robot.Message`."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from robot.channels.onebot.cq import at_targets, parse_message, plain_text, reply_id
from robot.message import ChatRef, Message, Role, Sender

__all__ = ["Recall", "chat_scope", "message_from_event", "recall_from_event"]

log = logging.getLogger("robot.channels.onebot.channel")
_ROLES: dict[str, Role] = {"owner": "owner", "admin": "admin", "member": "member"}
_ANONYMOUS = "80000000"  # the user_id QQ gives every anonymous member
#: A recalled message: its chat, its id as received (scoped), its sender (None: an anonymous member).
Recall = tuple[ChatRef, str, str | None]


def _id(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _timestamp(value: object) -> datetime:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        # Some implementations report milliseconds.
        seconds = value / 1000 if value > 10**11 else value
        try:
            return datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            log.warning("onebot: event time %r is out of range; using the time it arrived", value)
    return datetime.now(UTC)


def chat_scope(chat: ChatRef) -> str:
    """What goes before a platform message id (``"group:123:"``): OneBot numbers messages per
    implementation and account, even by counter, so ids are kept per chat (received and sent alike)."""
    return f"{chat.kind}:{chat.chat_id}:"


def message_from_event(
    event: Mapping[str, Any], *, self_id: str | None = None, own: Collection[str] = ()
) -> Message | None:
    """Convert a ``post_type: message`` event; ``None`` for events that are not chat input.

    The bot's own messages (``user_id == self_id``) and message types other than ``group`` and
    ``private`` give ``None``. ``own`` are the bot's other accounts on this channel: an @ of any of
    them is an @ of the bot, and a group line that @s one of them (not the receiving account) is given
    that account as ``chat.account``, so it answers. ``text`` has the bot's @s removed and is stripped;
    other @s stay as ``@name``/``@id``. Raises ``ValueError`` (or pydantic's ``ValidationError``) when
    required fields are missing or the message cannot be parsed.
    """
    kind = event.get("message_type")
    if kind not in ("group", "private"):
        return None
    bot_id = _id(event.get("self_id")) or self_id
    user_id = _id(event.get("user_id"))
    message_id = _id(event.get("message_id"))
    if user_id is None or message_id is None:
        raise ValueError(f"{kind} message event without user_id or message_id")
    if bot_id is not None and user_id == bot_id:
        return None
    segments = parse_message(event.get("message", ""))
    targets = at_targets(segments)
    bot_ids = {account for account in (bot_id, *own) if account}
    if kind == "group":
        group_id = _id(event.get("group_id"))
        if group_id is None:
            raise ValueError("group message event without group_id")
        # Lagrange gives one id to a group line on every account, and the first copy to arrive is kept: the
        # copy a sibling account sees must answer through the account asked (dropped, it went unanswered).
        asked = [t for t in targets if t in bot_ids]
        account = bot_id if bot_id in asked or not asked else asked[0]
        chat = ChatRef(platform="onebot", chat_id=group_id, kind="group", account=account or "")
    else:
        chat = ChatRef(platform="onebot", chat_id=user_id, kind="private", account=bot_id or "")

    raw_sender = event.get("sender")
    sender = raw_sender if isinstance(raw_sender, Mapping) else {}
    name = sender.get("card") or sender.get("nickname") or ""
    role = _ROLES.get(str(sender.get("role") or "member"), "member")
    anonymous, is_anonymous = event.get("anonymous"), False
    if kind == "group" and (event.get("sub_type") == "anonymous" or isinstance(anonymous, Mapping)):
        # Every anonymous member shares one user_id (80000000): key them by their anonymous flag.
        info = anonymous if isinstance(anonymous, Mapping) else {}
        flag = _id(info.get("flag")) or _id(info.get("id")) or "unknown"
        user_id, role, is_anonymous = f"anonymous:{flag}", "member", True
        name = f"匿名·{info.get('name') or '?'}"
    return Message(
        chat=chat,
        sender=Sender(user_id=user_id, name=str(name), role=role, anonymous=is_anonymous),
        message_id=chat_scope(chat) + message_id,  # (by the bare id, dedupe dropped another chat's 4001)
        text=plain_text(segments, strip_at=bot_ids, placeholders=True).strip(),
        timestamp=_timestamp(event.get("time")),
        mentions=tuple(target for target in targets if target != "all"),
        mentions_bot=any(target in bot_ids for target in targets),
        reply_to=chat_scope(chat) + replied if (replied := reply_id(segments)) else None,
        raw=dict(event),
    )


def recall_from_event(event: Mapping[str, Any], *, self_id: str | None = None) -> Recall | None:
    """A ``group_recall`` / ``friend_recall`` notice as the message it takes back; ``None`` for other events
    and incomplete ones.

    The sender is ``user_id`` (who wrote it), not ``operator_id``: an admin may recall a member's message, or
    the bot's (then the sender is the bot's account: its history row is found by the outbox's receipt).
    """
    notice = event.get("notice_type")
    if notice not in ("group_recall", "friend_recall"):
        return None
    bot_id = _id(event.get("self_id")) or self_id
    user_id, message_id = _id(event.get("user_id")), _id(event.get("message_id"))
    if user_id is None or message_id is None:
        return None
    if notice == "group_recall":
        group_id = _id(event.get("group_id"))
        if group_id is None:
            return None
        chat = ChatRef(platform="onebot", chat_id=group_id, kind="group", account=bot_id or "")
    else:
        chat = ChatRef(platform="onebot", chat_id=user_id, kind="private", account=bot_id or "")
    return chat, chat_scope(chat) + message_id, None if user_id == _ANONYMOUS else user_id
