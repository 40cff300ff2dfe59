"""The message path while the database refuses work: messages are still answered (or the sender is told to
try again, or the message is left to the platform), never acknowledged in silence."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.channels.base import NotTaken, SendRejected
from robot.message import ChatRef, Message, OutgoingMessage, Sender
from robot.testing import MemoryChannel

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
LONG = "很长的回答。" * 50  # 300 characters


def asked(message_id: str, line: str, *, reply_to: str | None = None) -> Message:
    return Message(chat=G1, sender=Sender(user_id="u1", name="u1"), message_id=message_id, text=line,
                   timestamp=datetime.now(UTC), mentions_bot=True, reply_to=reply_to)


@contextlib.contextmanager
def write_locked(bot: Bot) -> Iterator[None]:
    """Another program holds the database's write lock (the sqlite3 shell, a long DELETE, a VACUUM)."""
    other = sqlite3.connect(bot.settings.bot.data_dir / "qunbot.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


class Strict(MemoryChannel):
    """Refuses a text over its limit, as a platform does."""

    async def send(self, message: OutgoingMessage) -> Any:
        if len(message.text) > self.capabilities.max_text_len:
            raise SendRejected(f"message too long ({len(message.text)} > {self.capabilities.max_text_len})")
        return await super().send(message)


@pytest.mark.parametrize("capped", [True, False])
async def test_a_locked_database_still_gets_a_question_and_a_reply_to_a_message_answered(
        make_bot: Any, capped: bool) -> None:
    # Storing the message failed ("answer anyway"), then reading the history window and whether the message
    # replied to the bot's own hit the same lock: no reply, nothing kept, and every channel acknowledged it.
    # With daily budgets the run's hold fails closed (the sender is told to try again); without, the model answers.
    limits: dict[str, Any] = {"user_burst": 1000, "chat_burst": 1000}
    if not capped:
        limits.update(user_daily_tokens="off", chat_daily_tokens="off")
    bot, ch = await make_bot(ScriptedModel(lambda req: text("模型的回答"), record=False), limits=limits)
    await bot.db.run(lambda tx: tx.execute("PRAGMA busy_timeout = 50"))  # stands for the 30 s wait
    with write_locked(bot):
        for message in (asked("q1", "明天几点开会？"), asked("c2", "/help", reply_to="someone-elses-message")):
            await bot.handle(message)  # what a channel awaits before acknowledging the platform
    replies = {m.reply_to: m.text for m in ch.sent}
    assert "请稍后再试" in replies["q1"] if capped else replies.get("q1") == "模型的回答"
    assert replies.get("c2", "").startswith("可用命令")


async def test_a_message_the_failing_database_keeps_from_answering_gets_a_try_again(make_bot: Any) -> None:
    bot, ch = await make_bot(ScriptedModel(lambda req: text("模型的回答"), record=False))

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    bot.budget.for_run = refused  # the run's budget hold cannot be read or written
    await bot.handle(asked("q1", "明天几点开会？"))
    (said,) = ch.sent
    assert said.reply_to == "q1" and "请稍后再试" in said.text and said.mention == ("u1",)


async def test_a_message_nobody_can_be_told_about_is_kept_and_tried_again(make_bot: Any) -> None:
    # Neither answered nor told: it is kept (robot.parked) and handed over again until it is answered. Its
    # channel is not told NotTaken while the bot runs: a poll cursor held back froze for every later message.
    bot, ch = await make_bot(ScriptedModel(lambda req: text("模型的回答"), record=False))
    hold = bot.budget.for_run

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    bot.budget.for_run = refused
    ch.down = True
    await bot.handle(asked("q1", "明天几点开会？"))
    kept = "SELECT message_id FROM parked_messages"
    assert ch.sent == [] and await bot.db.run(lambda db: db.execute(kept).fetchall()) == [("q1",)]
    await bot.parked.replay(bot._replayed)  # still failing: still kept
    assert ch.sent == [] and await bot.db.run(lambda db: db.execute(kept).fetchall()) == [("q1",)]
    bot.budget.for_run, ch.down = hold, False
    await bot.parked.replay(bot._replayed)
    await bot.outbox.flush()
    assert [m.text for m in ch.sent] == ["模型的回答"] and await bot.db.run(lambda db: db.execute(kept).fetchall()) == []
    with pytest.raises(NotTaken):  # (stopping: the platform's redelivery, if any, is left to it)
        bot.started = False
        bot.budget.for_run, ch.down = refused, True
        await bot.handle(asked("q2", "还有呢？"))


async def test_a_run_that_failed_after_a_call_took_effect_says_what_ran_not_try_again(make_bot: Any) -> None:
    # "请稍后再试" after a payment went through: asked again, it paid twice.
    bot, ch = await make_bot(ScriptedModel([call("note", {"text": "转账5元"}), text("好了")]))

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database is locked")

    bot.pipeline.replies.reply = refused  # type: ignore[method-assign]
    await bot.handle(asked("q1", "转5元给小王"))
    (said,) = ch.sent
    assert "已执行：note（text=\"转账5元\"）" in said.text and "请勿直接重复请求" in said.text
    assert "请稍后再试" not in said.text


@pytest.mark.parametrize("full", [False, True])
async def test_a_long_reply_sent_directly_is_split_like_the_outboxs(make_bot: Any, full: bool) -> None:
    # The outbox cannot take the reply (disk full): sent directly, it went out whole and the platform refused it.
    bot, ch = await make_bot(ScriptedModel(lambda req: text(LONG), record=False), channel=Strict(max_text_len=100))
    if full:
        def disk_full(*args: Any) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        bot.outbox.enqueue_many_sync = disk_full
    await ch.inject("讲个长故事", at_bot=True, message_id="q1")
    await ch.wait_sent(4)
    await bot.outbox.flush()
    assert [len(m.text) for m in ch.sent] == [96, 96, 96, 12]
    assert "".join(m.text for m in ch.sent) == LONG and [m.mention for m in ch.sent] == [("u1",), (), (), ()]


async def test_a_part_sent_directly_that_fails_leaves_the_other_replies_going(make_bot: Any) -> None:
    bot, ch = await make_bot(ScriptedModel(lambda req: text("第一条"), record=False))

    def disk_full(*args: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    bot.outbox.enqueue_many_sync = disk_full
    real, tried = ch.send, []

    async def first_refused(message: OutgoingMessage) -> Any:
        tried.append(message.text)
        if len(tried) == 1:
            raise SendRejected("refused")
        return await real(message)

    ch.send = first_refused
    message = asked("q1", "hi")
    await bot.pipeline.reply(message, ["refused one", "second one"])
    assert tried == ["refused one", "second one"] and [m.text for m in ch.sent] == ["second one"]
