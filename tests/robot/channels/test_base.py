"""The Channel base: background delivery that never raises into a reader, and a clean drain on stop."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest

from robot.message import ChatRef, Message, Sender
from robot.testing import MemoryChannel


def _message(n: int) -> Message:
    return Message(chat=ChatRef(platform="memory", chat_id="g", kind="group"), sender=Sender(user_id="u"),
                   message_id=f"m{n}", text="hi", timestamp=datetime.now(UTC))


async def test_a_failing_bot_is_logged_not_raised_into_the_channel(caplog: pytest.LogCaptureFixture) -> None:
    channel = MemoryChannel()

    async def broken(message: Message) -> None:
        raise RuntimeError("bot bug")

    channel.bind(broken)
    channel.deliver_soon(_message(1))
    await channel.finish_deliveries(grace_s=1.0)
    assert "delivering message m1 failed" in caplog.text and caplog.records[-1].levelno == logging.ERROR


async def test_finish_deliveries_lets_quick_ones_finish_and_cancels_the_rest() -> None:
    channel = MemoryChannel()
    done: list[str] = []
    release = asyncio.Event()

    async def sink(message: Message) -> None:
        if message.message_id == "m2":
            await release.wait()  # a delivery stuck behind a slow bot
        done.append(message.message_id)

    channel.bind(sink)
    channel.deliver_soon(_message(1))
    channel.deliver_soon(_message(2))
    await channel.finish_deliveries(grace_s=0.2)
    assert done == ["m1"]
    assert not channel._deliveries  # the stuck one was cancelled, nothing is left running
