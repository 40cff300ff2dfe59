"""The pipeline's replies to an incoming message: queued in the outbox, keyed by the message (a redelivery
cannot double them), or said directly when the database cannot take them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from function_calls import ToolTrace
from function_calls.stops import may_have_acted, told_text
from robot.channels.base import Channel
from robot.hooks import observe
from robot.message import Message, OutgoingMessage
from robot.storage import Tx
from robot.storage.base import CommitUnknown
from robot.text_parts import split_text

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["RETRY_NOTICE", "Replies", "reply_key", "send_directly"]

log = logging.getLogger(__name__)

RETRY_NOTICE = "抱歉，我这边暂时出了点问题，没能处理这条消息，请稍后再试。"
#: Told instead, once a tool call of the message's run took effect (asked again, a payment went twice).
_FAILED_AFTER = ("抱歉，我这边出了点问题，这条消息没能处理完", "")
_STOPPED_AFTER = ("机器人正在停止，这条消息没能处理完", "")


def reply_key(platform: str, chat_id: str, message_id: str, index: int = 0) -> str:
    """The outbox key of the ``index``-th reply to a message (a tool may commit it ahead of the pipeline)."""
    return f"{platform}:{chat_id}:{message_id}:{index}"


async def send_directly(channel: Channel, items: Sequence[OutgoingMessage]) -> int:
    """Send ``items`` now, each in parts within the channel's limit as the outbox sends them; a part that
    fails ends its message (the rest would read as cut) but not the others. How many parts went out;
    when none did, the first failure is raised."""
    sent, first_error = 0, None
    for item in items:
        parts = split_text(item.text, channel.capabilities.max_text_len)
        for index, part in enumerate(parts):
            try:
                await channel.send(item.model_copy(update={
                    "key": f"{item.key}#{index}" if len(parts) > 1 else item.key, "text": part,
                    "mention": item.mention if index == 0 else ()}))
            except Exception as exc:
                log.warning("sending %s directly failed at part %d of %d: %s", item.key, index + 1, len(parts), exc)
                first_error = first_error or exc
                break
            sent += 1
    if not sent and first_error is not None:
        raise first_error
    return sent


class Replies:
    """Replies to the messages the pipeline has in hand; ``unmarked``: the pipeline's new messages not yet
    marked handled, which the unit queueing their reply marks."""

    def __init__(self, bot: Bot, unmarked: set[tuple[str, str]]) -> None:
        self.bot, self._unmarked = bot, unmarked
        #: Messages in hand something was queued or said for (the pipeline discards them when done).
        self.said: set[tuple[str, str]] = set()
        #: The tool calls that took effect in the run of each message in hand (the pipeline discards them).
        self.ran: dict[tuple[str, str], list[ToolTrace]] = {}

    def took_effect(self, message: Message, event: dict[str, object]) -> None:
        """Note a run's ``tool`` event (:class:`ToolTrace` fields) for ``message`` if the call may have acted:
        it ran, or failed or was cut after it started (not refused, not a ``read_only`` tool's)."""
        if event.get("type") != "tool":
            return
        trace = ToolTrace(call_id=str(event.get("call_id", "")), name=str(event.get("name", "")),
                          arguments=str(event.get("arguments", "")), result="", is_error=bool(event.get("is_error")),
                          refused=bool(event.get("refused")), read_only=bool(event.get("read_only")))
        if may_have_acted(trace):
            self.ran.setdefault((message.platform, message.message_id), []).append(trace)

    async def stopped(self, message: Message) -> None:
        """A run cut short by the stop after some of its calls took effect: the message is not kept to be
        answered again (its calls would run twice); the sender is told what ran, at the next start at worst."""
        done = self.ran.get((message.platform, message.message_id), [])
        try:
            await self.reply(message, [told_text(_STOPPED_AFTER, done)])  # (marks it handled: not kept)
        except Exception:
            log.exception("telling the sender of %s message %s what ran before the stop failed", message.platform,
                          message.message_id)

    async def reply(self, message: Message, texts: Sequence[str]) -> None:
        """Queue replies; in a group each @-mentions the person answered."""
        mention = (message.sender.user_id,) if message.chat.kind == "group" else ()
        out = [
            OutgoingMessage(key=reply_key(message.platform, message.chat.chat_id, message.message_id, i),
                            chat=message.chat, text=text, mention=mention, reply_to=message.message_id)
            for i, text in enumerate(t for t in texts if t.strip())
        ]
        if not out:
            return
        bot, ident = self.bot, (message.platform, message.message_id)
        mark = ident in self._unmarked

        def enqueue(db: Tx) -> None:
            # The message is marked handled in the unit that queues its reply (one unit fewer per
            # message): once the reply is durable a redelivery has nothing left to do.
            bot.outbox.enqueue_many_sync(db, out)
            if mark:
                bot.dedupe.done_sync(db, *ident)

        try:
            # Durable where a database crash could undo the commit: nothing would queue the reply again.
            await bot.db.transaction(enqueue, durable=not bot.db.crash_safe)
            if mark:
                self._unmarked.discard(ident)
            for item in out:
                bot.outbox.notify(item.chat.platform, item.chat.key, item.chat.account)
        except CommitUnknown as exc:  # (a connection lost at COMMIT) maybe queued: sent directly too, it went twice
            bot.pending.add(enqueue, f"queueing the reply to {message.platform} message {message.message_id}", exc,
                            idempotent=True)  # (a queued key is kept as it is: retrying until it lands is safe)
        except Exception:
            # The database cannot take the reply (disk full, locked): say it now rather than never.
            log.exception("queueing the reply to %s message %s failed; sending it directly",
                          message.platform, message.message_id)
            channel = bot.channels.get(message.platform)
            if channel is None:
                raise
            await send_directly(channel, out)
        self.said.add(ident)

    async def sorry(self, message: Message) -> bool:
        """Tell the sender their message could not be handled, directly (the database is the likely cause);
        whether it went out."""
        channel = self.bot.channels.get(message.platform)
        if channel is None:
            return False
        done = self.ran.get((message.platform, message.message_id))
        notice = OutgoingMessage(
            key=reply_key(message.platform, message.chat.chat_id, message.message_id) + ":retry", chat=message.chat,
            text=told_text(_FAILED_AFTER, done) if done else RETRY_NOTICE, mention=(message.sender.user_id,) if message.chat.kind == "group" else (),
            reply_to=message.message_id)
        try:
            await send_directly(channel, [notice])
        except Exception:
            log.exception("telling the sender of %s message %s to try again failed", message.platform,
                          message.message_id)
            return False
        return True

    async def trace_command(self, message: Message, name: str, rest: str, answer: str, seconds: float) -> None:
        """Show a /command in the channel's tool trace like a model's tool call (and refresh side panels)."""
        channel = self.bot.channels.get(message.platform)
        if channel is None:
            return
        tool = self.bot.tools.resolve(name)
        base = {"message_id": message.message_id}
        await observe(channel.trace(message.chat, {
            **base, "type": "tool", "call_id": f"cmd-{name}", "name": f"/{name}" + (
                f" ({tool.name})" if tool and tool.name != name else ""), "arguments": rest, "result": answer,
            "is_error": False, "duration_ms": seconds * 1000, "note": ""}), "trace")
        await observe(channel.trace(message.chat, {**base, "type": "run_end", "stop": "command", "detail": "",
                                                   "tokens": 0, "model_calls": 0}), "trace")
