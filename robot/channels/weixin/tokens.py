"""Context tokens: learned from messages, dropped by ``/forget me`` here and in every other process.

The database is the authority. A forget deletes the person's tokens there, then tells every process
sharing it (``FORGOTTEN_TOKENS``), and each drops its copies in memory: a process serving another
account must not write to the person with a token it read before (WeChat would deliver it). When
that notice may have been missed (PostgreSQL's LISTEN connection was cut), every process keeps only
the tokens the database still holds.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

from robot.channels.weixin.api import MESSAGE_TYPE_BOT, WeixinMessage
from robot.channels.weixin.convert import PLATFORM, chat_id_of
from robot.channels.weixin.live import FORGOTTEN_GRACE_S, LiveAccount
from robot.channels.weixin.state import WeixinState
from robot.privacy import ForgetRequest

__all__ = ["EVERY_CHAT", "FORGOTTEN_TOKENS", "drop_forgotten", "forget", "keep_stored", "remember"]

log = logging.getLogger(__name__)

#: The notification every Weixin channel listens to: a JSON list of chat ids, or ``EVERY_CHAT``.
FORGOTTEN_TOKENS = "weixin_forgotten_tokens"
EVERY_CHAT = "*"
_MOST_BYTES = 7000  # PostgreSQL refuses a notification over 8000 bytes: past that, "every chat"


async def remember(state: WeixinState, acc: LiveAccount, raw: list[dict[str, object]]) -> None:
    """Keep (and store) the newest token of each chat ``raw`` holds a user's message of."""
    changed = False
    for item in raw:
        try:  # the chat as to_message reads it (a numeric or padded id was kept under another key)
            msg = WeixinMessage.model_validate(item)
        except ValueError:
            continue
        token, chat_id = msg.context_token, chat_id_of(msg)
        if token and chat_id and msg.message_type != MESSAGE_TYPE_BOT and acc.tokens.get(chat_id) != token:
            acc.tokens[chat_id] = token
            acc.forgotten.pop(chat_id, None)
            changed = True
    if changed:
        try:
            await state.save_context_tokens(acc.bot_id, acc.tokens)
        except OSError:
            log.exception("weixin %s: could not save context tokens", acc.bot_id)


async def forget(state: WeixinState, accounts: Iterable[LiveAccount], request: ForgetRequest) -> int:
    """``/forget me``: drop the person's private-chat ``context_token`` on every account; how many went.

    A group's token stays: it belongs to the group's latest message (anyone's), and without it the
    group's reminders could not go out. The tokens dropped here stay usable in memory for
    ``FORGOTTEN_GRACE_S``: the answer to the command itself must still go out.
    """
    if request.platform != PLATFORM:
        return 0
    chats = {c.chat_id for c in request.chats if c.kind == "private" and c.platform == PLATFORM}
    if request.everywhere:
        chats.add(request.user_id)
    deadline = time.monotonic() + FORGOTTEN_GRACE_S
    removed = 0
    for acc in accounts:
        gone = {chat: acc.tokens.pop(chat) for chat in chats if chat in acc.tokens}
        if gone:
            removed += len(gone)
            acc.forgotten.update({chat: (token, deadline) for chat, token in gone.items()})
            await state.save_context_tokens(acc.bot_id, acc.tokens)  # an OSError fails the forget
    # Every account's stored tokens too: another process may have learned some after this one read them.
    removed += await state.forget_context_tokens(chats, skip=set())
    if state.store is not None and chats:  # then every process drops what it holds in memory
        payload = json.dumps(sorted(chats))
        payload = payload if len(payload.encode()) <= _MOST_BYTES else EVERY_CHAT
        await state.store.db.run(lambda tx: tx.notify(FORGOTTEN_TOKENS, payload))
    return removed


def drop_forgotten(state: WeixinState, accounts: Iterable[LiveAccount], payload: str) -> list[LiveAccount]:
    """Another process forgot the chats ``payload`` names: drop their tokens from memory (not the grace
    copies a forget made here). The accounts to check against the database (all, for ``EVERY_CHAT``)."""
    if payload == EVERY_CHAT:
        return list(accounts)
    try:
        chats = {str(chat) for chat in json.loads(payload)}
    except (ValueError, TypeError):
        log.error("weixin: unreadable forget notice; keeping only the tokens the database holds")
        return list(accounts)
    for acc in accounts:
        for chat in chats:
            acc.tokens.pop(chat, None)
    state.forgotten_elsewhere(chats)
    return []


async def keep_stored(state: WeixinState, accounts: Iterable[LiveAccount]) -> None:
    """Keep in memory only the tokens the database still holds (a forget notice may have been missed)."""
    for acc in list(accounts):
        try:
            stored = await state.load_context_tokens(acc.bot_id)
        except OSError:  # fail closed: a send reads the database itself when memory has no token
            log.exception("weixin %s: could not re-read context tokens; dropping them from memory", acc.bot_id)
            acc.tokens.clear()
            state.forgotten_elsewhere(None, acc.bot_id)
            continue
        for chat in [chat for chat in acc.tokens if chat not in stored]:
            del acc.tokens[chat]
