"""The people a group message @s and the labels they get (:class:`MentionNames`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from robot.channels.telegram.api import TelegramApi, TelegramError
from robot.channels.telegram.convert import mention_prefix, user_name
from robot.message import ChatRef, OutgoingMessage

__all__ = ["MentionNames"]

log = logging.getLogger(__name__)
_MENTIONS = 20  # people @-ed in one message at most
_KEPT = 4096  # names remembered at most (the least recently seen goes)


class MentionNames:
    """User id -> name, from their messages, else asked once (``getChatMember``): a mention's label."""

    def __init__(self, target: Callable[[ChatRef], tuple[str, int | None]]) -> None:
        self._target = target  # a chat's current Telegram id (after a migration) and thread
        self._names: dict[int, str] = {}

    def remember(self, user_id: int, name: str) -> None:
        """Keep ``name`` as the label of ``user_id`` (the most recently seen is kept longest)."""
        self._names.pop(user_id, None)
        self._names[user_id] = name
        if len(self._names) > _KEPT:
            self._names.pop(next(iter(self._names)))

    async def prefix(self, api: TelegramApi | None, message: OutgoingMessage) -> tuple[str, list[dict[str, Any]]]:
        """The labels of the people to @ in a group (a reminder's owner, approvers) and their entities. Not on
        a reply: its quote notifies the one it answers; not for an id that is no user's (a chat's, anonymous)."""
        if message.chat.kind != "group" or message.reply_to:
            return "", []
        ids = [int(m) for m in dict.fromkeys(message.mention) if m.isdigit()][:_MENTIONS]
        return mention_prefix([(uid, await self.name_of(api, message.chat, uid)) for uid in ids])

    async def name_of(self, api: TelegramApi | None, chat: ChatRef, user_id: int) -> str:
        """The name of ``user_id``: seen in a message, else asked (getChatMember); else the id."""
        if user_id not in self._names and api is not None:
            try:
                member = await api.call("getChatMember", {"chat_id": self._target(chat)[0], "user_id": user_id},
                                        timeout_s=5)
            except TelegramError as exc:
                log.debug("telegram: getChatMember failed: %s", exc)
                self.remember(user_id, "")  # not asked again per send: the id stands in until they speak
            else:
                if isinstance(member, dict) and isinstance(member.get("user"), dict):
                    self.remember(user_id, user_name(member["user"]))
        return self._names.get(user_id) or str(user_id)
