"""The OneBot channel in forward mode: it dials the peer's WebSocket server and reconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from robot.channels.base import ChannelUnavailable
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.message import ChatRef, Message, OutgoingMessage

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "onebot_v11.json").read_text("utf-8")
)
EVENTS: dict[str, dict[str, Any]] = VECTORS["events"]
TOKEN = "forward-token-91c2"
GROUP = ChatRef(platform="onebot", chat_id="123456", kind="group")
Running = Callable[[OneBotChannel], AbstractAsyncContextManager[OneBotChannel]]


def forward_settings(url: str, token: str = TOKEN) -> OneBotSettings:
    return OneBotSettings(
        enabled=True,
        mode="forward",
        url=url,
        access_token=SecretStr(token),
        action_timeout_s=1,
        reconnect_initial_s=0.02,
        reconnect_max_s=0.1,
    )


@pytest.fixture
async def peer() -> AsyncIterator[OneBotTestPeer]:
    async with OneBotTestPeer(self_id=10001, access_token=TOKEN) as p:
        yield p


async def test_forward_connects_receives_and_sends(
    peer: OneBotTestPeer, running: Running, inbox: asyncio.Queue[Message]
) -> None:
    async with running(OneBotChannel(forward_settings(await peer.serve()))) as channel:
        await peer.wait_connected()
        await asyncio.wait_for(channel.wait_connected(), 5)
        await peer.send_event(EVENTS["group_message_at_bot"])
        message = await asyncio.wait_for(inbox.get(), 5)
        assert message.mentions_bot is True
        assert message.text == "提醒我明天早上8点交周报"
        assert channel.self_id == "10001"  # learnt from the events: forward mode has no X-Self-ID
        out = OutgoingMessage(key="f1", chat=GROUP, text="已为你设置提醒", mention=("20002",))
        assert (await channel.send(out)).platform_message_id == "group:123456:3001"
        assert (await peer.wait_for_action())["params"] == VECTORS["action_call"]["params"]
    assert peer.rejected == 0


async def test_forward_reconnects_after_the_peer_drops(
    peer: OneBotTestPeer, running: Running, inbox: asyncio.Queue[Message]
) -> None:
    async with running(OneBotChannel(forward_settings(await peer.serve()))) as channel:
        await peer.wait_connected()
        await asyncio.wait_for(channel.wait_connected(), 5)
        await peer.disconnect()
        await peer.wait_connected()
        assert peer.connections == 2
        await asyncio.wait_for(channel.wait_connected(), 5)
        assert (await channel.send(OutgoingMessage(key="f2", chat=GROUP, text="back"))).platform_message_id
        await peer.send_event(EVENTS["private_message"])
        assert (await asyncio.wait_for(inbox.get(), 5)).message_id == "private:20002:2003"


async def test_forward_wrong_token_keeps_retrying_without_connecting(
    peer: OneBotTestPeer, running: Running
) -> None:
    async with running(OneBotChannel(forward_settings(await peer.serve(), token="not-the-token"))) as channel:
        async with asyncio.timeout(5):
            while peer.rejected < 2:
                await asyncio.sleep(0.01)
        assert peer.connections == 0
        assert not channel.connected
        with pytest.raises(ChannelUnavailable):
            await channel.send(OutgoingMessage(key="f3", chat=GROUP, text="x"))


async def test_forward_stop_closes_the_socket(peer: OneBotTestPeer, running: Running) -> None:
    async with running(OneBotChannel(forward_settings(await peer.serve()))) as channel:
        await peer.wait_connected()
        await channel.stop()
        async with asyncio.timeout(5):
            while peer.connected:
                await asyncio.sleep(0.01)
        assert peer.connections == 1
        await channel.stop()  # again: stop is idempotent
