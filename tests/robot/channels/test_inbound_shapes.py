"""Inbound shapes the platforms really send that the channels misread (found by an independent audit)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from robot.channels.onebot.channel import OneBotChannel
from robot.channels.onebot.settings import OneBotSettings
from robot.channels.telegram.channel import TelegramChannel
from robot.channels.telegram.settings import TelegramSettings
from robot.channels.weixin.api import GetUpdatesResp
from robot.channels.weixin.channel import WeixinChannel
from robot.channels.weixin.live import LiveAccount
from robot.channels.weixin.settings import WeixinSettings
from robot.channels.weixin.state import WeixinAccount

GROUP = {"id": -1001234567890, "title": "g", "type": "supergroup"}
#: What the Bot API puts in "from" of a message sent on behalf of a chat (a channel; the group itself).
CHANNEL_BOT = {"id": 136817688, "is_bot": True, "first_name": "Channel", "username": "Channel_Bot"}


def telegram(tmp_path: Path, **settings: Any) -> TelegramChannel:
    channel = TelegramChannel(TelegramSettings(token=SecretStr("1:x"), **settings), data_dir=tmp_path)
    channel.bot_id, channel.username = "424242", "qun_test_bot"
    return channel


def posted_as(chat: dict[str, Any], mid: int) -> dict[str, Any]:
    return {"update_id": mid, "message": {"message_id": mid, "date": 1700000000, "chat": GROUP, "from": CHANNEL_BOT,
                                          "sender_chat": chat, "text": "/reminders"}}


def test_telegram_people_posting_as_a_chat_are_that_chat_not_one_placeholder_user(tmp_path: Path) -> None:
    """Everyone posting as their channel shared one identity (limits, budgets, reminders, /forget me)."""
    channel = telegram(tmp_path)
    alice = channel.to_message(posted_as({"id": -1001111, "title": "Alice's channel", "type": "channel"}, 10))
    mallory = channel.to_message(posted_as({"id": -1002222, "title": "Mallory's channel", "type": "channel"}, 11))
    group = channel.to_message(posted_as(GROUP, 12))  # an anonymous admin: the group itself
    assert alice is not None and mallory is not None and group is not None
    assert (alice.sender.user_id, alice.sender.name, alice.sender.anonymous) == ("chat:-1001111", "Alice's channel",
                                                                                 False)
    assert mallory.sender.user_id == "chat:-1002222" and group.sender.anonymous


def test_telegram_edits_are_not_read_as_new_messages(tmp_path: Path) -> None:
    """An edit kept its original's id: asked for, then always dropped as a redelivery."""
    edit = {"update_id": 5, "edited_message": {"message_id": 77, "date": 1700000000, "edit_date": 1700000100,
                                              "chat": GROUP, "from": {"id": 7, "first_name": "A"}, "text": "hi"}}
    assert telegram(tmp_path).to_message(edit) is None


async def test_telegram_webhook_answers_a_secret_that_is_no_utf8_with_401(tmp_path: Path) -> None:
    channel = telegram(tmp_path, mode="webhook", webhook_secret=SecretStr("s3cret"), port=0)
    await channel._start_webhook()
    assert channel._url is not None and channel._runner is not None
    port = int(channel._url.split(":")[2].split("/")[0])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"update_id": 5}'
        writer.write(b"POST /telegram/webhook HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"X-Telegram-Bot-Api-Secret-Token: \xff\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        status = (await asyncio.wait_for(reader.read(200), 5)).split(b"\r\n", 1)[0]
        writer.close()
        assert status.split()[1] == b"401", status  # it was a 500 with a traceback in the log
    finally:
        await channel._runner.cleanup()


async def test_onebot_answers_a_token_that_is_no_utf8_as_a_wrong_one() -> None:
    channel = OneBotChannel(OneBotSettings(port=0, access_token="tok"))
    await channel.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", channel._port)
        writer.write(b"GET /onebot/v11/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Authorization: Bearer \xff\r\n\r\n")
        status = (await asyncio.wait_for(reader.read(200), 5)).split(b"\r\n", 1)[0]
        writer.close()
        assert status.split()[1] in (b"401", b"403"), status
    finally:
        await channel.stop()


@pytest.mark.parametrize("platform", ["telegram", "weixin"])
async def test_a_poll_answered_at_once_with_nothing_usable_is_no_busy_loop(tmp_path: Path, platform: str) -> None:
    """Instant answers of junk with the cursor unchanged: 770 and 793 requests a second."""
    calls: list[float] = []
    stop: asyncio.Event
    if platform == "telegram":
        channel = telegram(tmp_path, retry_delay_s=1.0)

        class TelegramApi:
            async def call(self, method: str, payload: Any = None, *, timeout_s: float | None = None) -> Any:
                calls.append(time.monotonic())
                await asyncio.sleep(0.001)
                return [{"message": {"text": "no update_id"}}, 1]

        async def no_offset(bot_id: str) -> None:
            return None

        channel.api = TelegramApi()  # type: ignore[assignment]
        channel.state.load_offset = no_offset  # type: ignore[method-assign]
        poll, stop = channel._poll(), channel._stopping
    else:
        weixin = WeixinChannel(WeixinSettings(state_dir=tmp_path, retry_delay_s=1.0))

        class WeixinApi:
            async def notify(self, start: bool) -> None:
                pass

            async def get_updates(self, buf: str, timeout_ms: int) -> GetUpdatesResp:
                calls.append(time.monotonic())
                await asyncio.sleep(0.001)
                return GetUpdatesResp(ret=0, msgs=["junk", 42], get_updates_buf=buf)

        account = LiveAccount(WeixinAccount(bot_id="b@im.bot", bot_token=SecretStr("t"), base_url="http://x"),
                              WeixinApi(), {})  # type: ignore[arg-type]
        poll, stop = weixin._poll(account), weixin._stopping
    task = asyncio.create_task(poll)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert 1 <= len(calls) <= 2
