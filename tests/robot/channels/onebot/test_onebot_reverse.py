"""The OneBot channel in reverse mode, against OneBotTestPeer over real loopback WebSockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from robot.channels.base import ChannelUnavailable, SendRejected
from robot.channels.onebot import (
    OneBotActionFailed,
    OneBotChannel,
    OneBotSettings,
    OneBotTestPeer,
    recall_from_event,
)
from robot.message import ChatRef, Message, OutgoingMessage

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "onebot_v11.json").read_text("utf-8")
)
EVENTS: dict[str, dict[str, Any]] = VECTORS["events"]
TOKEN = "test-token-7f3a"
GROUP = ChatRef(platform="onebot", chat_id="123456", kind="group", account="10001")


@pytest.fixture
async def channel(
    running: Callable[[OneBotChannel], AbstractAsyncContextManager[OneBotChannel]],
) -> AsyncIterator[OneBotChannel]:
    """A reverse-mode channel posting into ``inbox`` (conftest)."""
    ch = OneBotChannel(
        OneBotSettings(enabled=True, port=0, access_token=SecretStr(TOKEN), action_timeout_s=0.3)
    )
    async with running(ch):
        yield ch


@pytest.fixture
async def peer(channel: OneBotChannel) -> AsyncIterator[OneBotTestPeer]:
    async with OneBotTestPeer(self_id=10001, access_token=TOKEN) as p:
        await p.connect(channel.url)
        await asyncio.wait_for(channel.wait_connected(), 5)
        yield p


async def next_message(inbox: asyncio.Queue[Message]) -> Message:
    return await asyncio.wait_for(inbox.get(), 5)


async def until(condition: Any) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def test_handshake_with_token_is_accepted(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    assert channel.connected
    assert channel.self_id == "10001"
    assert channel.url.startswith("ws://127.0.0.1:") and channel.url.endswith("/onebot/v11/ws")


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("wrong-token", 403)])
async def test_missing_or_wrong_token_is_rejected_before_upgrade(
    channel: OneBotChannel, token: str | None, status: int
) -> None:
    async with OneBotTestPeer(access_token=token) as intruder:
        with pytest.raises(aiohttp.WSServerHandshakeError) as excinfo:
            await intruder.connect(channel.url)
        assert excinfo.value.status == status
        assert not intruder.connected
    assert not channel.connected


async def test_token_in_query_string_is_accepted(channel: OneBotChannel) -> None:
    async with OneBotTestPeer(access_token=None) as p:
        await p.connect(f"{channel.url}?access_token={TOKEN}")
        await asyncio.wait_for(channel.wait_connected(), 5)
        assert channel.connected


async def test_unknown_path_is_404(channel: OneBotChannel) -> None:
    async with OneBotTestPeer(access_token=TOKEN) as p:
        with pytest.raises(aiohttp.WSServerHandshakeError) as excinfo:
            await p.connect(channel.url.replace("/onebot/v11/ws", "/elsewhere"))
        assert excinfo.value.status == 404


async def test_lifecycle_and_heartbeat_track_online_state(
    channel: OneBotChannel, peer: OneBotTestPeer, inbox: asyncio.Queue[Message]
) -> None:
    await peer.send_event(EVENTS["lifecycle_connect"])
    await peer.send_event(EVENTS["heartbeat"])
    await peer.send_event(EVENTS["group_message_plain"])
    assert (await next_message(inbox)).message_id == "group:123456:2002"
    assert channel.online is True
    await peer.send_heartbeat(online=False)
    await peer.send_event(EVENTS["private_message"])
    assert (await next_message(inbox)).message_id == "private:20002:2003"
    assert channel.online is False
    assert inbox.empty()


async def test_group_message_at_bot(peer: OneBotTestPeer, inbox: asyncio.Queue[Message]) -> None:
    event = EVENTS["group_message_at_bot"]
    await peer.send_event(event, time=event["time"])  # the recorded stamp, to check it is parsed
    message = await next_message(inbox)
    assert message.chat == GROUP
    assert message.sender.user_id == "20002"
    assert message.sender.name == "明"
    assert message.sender.role == "member"
    assert message.message_id == "group:123456:2001"
    assert message.text == "提醒我明天早上8点交周报"
    assert message.mentions == ("10001",)
    assert message.mentions_bot is True
    assert message.reply_to is None
    assert message.timestamp == datetime.fromtimestamp(1732166410, tz=UTC)
    assert message.raw == event


async def test_plain_group_message_does_not_mention_bot(
    peer: OneBotTestPeer, inbox: asyncio.Queue[Message]
) -> None:
    await peer.send_event(EVENTS["group_message_plain"])
    message = await next_message(inbox)
    assert message.mentions_bot is False
    assert message.mentions == ()
    assert message.text == "今晚谁去打球？"
    assert message.sender.name == "阿强"  # empty card falls back to nickname
    assert message.sender.role == "admin"


async def test_private_message(peer: OneBotTestPeer, inbox: asyncio.Queue[Message]) -> None:
    await peer.send_event(EVENTS["private_message"])
    message = await next_message(inbox)
    assert message.chat == ChatRef(platform="onebot", chat_id="20002", kind="private", account="10001")
    assert message.sender.name == "小明"
    assert message.text == "我有哪些提醒？"
    assert message.mentions_bot is False


async def test_cq_string_message(peer: OneBotTestPeer, inbox: asyncio.Queue[Message]) -> None:
    await peer.send_event(EVENTS["group_message_string_format"])
    message = await next_message(inbox)
    assert message.text == "总结一下 & 谢谢"
    assert message.mentions_bot is True


async def test_reply_segment_and_string_ids(peer: OneBotTestPeer, inbox: asyncio.Queue[Message]) -> None:
    segments = [{"type": "reply", "data": {"id": 1999}}, {"type": "at", "data": {"qq": 10001}}]
    segments.append({"type": "text", "data": {"text": " 好的"}})
    await peer.send_event(
        EVENTS["group_message_plain"], group_id="123456", user_id="20003", self_id="10001", message=segments
    )
    message = await next_message(inbox)
    assert message.chat == GROUP
    assert message.reply_to == "group:123456:1999"
    assert message.mentions_bot is True
    assert message.text == "好的"


async def test_own_messages_and_message_sent_are_ignored(
    peer: OneBotTestPeer, inbox: asyncio.Queue[Message]
) -> None:
    await peer.send_event(EVENTS["group_message_plain"], user_id=10001, message_id=1)
    await peer.send_event(EVENTS["group_message_plain"], post_type="message_sent", message_id=2)
    await peer.send_event(EVENTS["group_message_plain"])
    assert (await next_message(inbox)).message_id == "group:123456:2002"
    assert inbox.empty()


async def test_malformed_frames_do_not_kill_the_connection(
    channel: OneBotChannel, peer: OneBotTestPeer, inbox: asyncio.Queue[Message]
) -> None:
    await peer.send_raw("this is not json {")
    await peer.send_raw("[1, 2, 3]")
    await peer.send_raw('{"post_type": "message", "message_type": "group"}')
    await peer.send_event(EVENTS["group_message_plain"], message=42)
    await peer.send_raw('{"echo": "nobody-waits-for-this", "status": "ok"}')
    await peer.send_event(EVENTS["private_message"])
    assert (await next_message(inbox)).message_id == "private:20002:2003"
    assert inbox.empty()
    assert channel.connected
    receipt = await channel.send(OutgoingMessage(key="k", chat=GROUP, text="still here"))
    assert receipt.platform_message_id == "group:123456:3001"


async def test_a_slow_bot_does_not_block_the_reader(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    release = asyncio.Event()
    seen: list[str] = []

    async def slow_sink(message: Message) -> None:
        seen.append(message.message_id)
        if message.message_id == "group:123456:2001":
            await release.wait()

    channel.bind(slow_sink)
    await peer.send_event(EVENTS["group_message_at_bot"])
    await peer.send_event(EVENTS["group_message_plain"])
    await until(lambda: seen == ["group:123456:2001", "group:123456:2002"])
    release.set()


async def test_send_group_message(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    out = OutgoingMessage(key="r1", chat=GROUP, text="已为你设置提醒", mention=("20002",))
    receipt = await channel.send(out)
    assert receipt.platform_message_id == "group:123456:3001"
    call = await peer.wait_for_action()
    expected = VECTORS["action_call"]
    assert call["action"] == expected["action"]
    assert call["params"] == expected["params"]
    second = await channel.send(out)
    assert second.platform_message_id == "group:123456:3002"
    assert (await peer.wait_for_action())["echo"] != call["echo"]


async def test_send_private_message_with_reply(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    chat = ChatRef(platform="onebot", chat_id="20002", kind="private")
    await channel.send(OutgoingMessage(key="r2", chat=chat, text="好", mention=("20002",), reply_to="private:20002:2003"))
    call = await peer.wait_for_action(lambda a: a["action"] == "send_private_msg")
    assert call["params"] == {
        "user_id": 20002,
        "message": [{"type": "reply", "data": {"id": "2003"}}, {"type": "text", "data": {"text": "好"}}],
    }
    # Another chat's message is not quoted here: its number may name one of this chat too
    await channel.send(OutgoingMessage(key="r2b", chat=chat, text="嗯", reply_to="group:30003:2004"))
    call = await peer.wait_for_action(lambda a: a["action"] == "send_private_msg" and "嗯" in str(a["params"]))
    assert call["params"]["message"] == [{"type": "text", "data": {"text": "嗯"}}]


async def test_failed_action_is_send_rejected_with_retcode(
    channel: OneBotChannel, peer: OneBotTestPeer
) -> None:
    peer.fail_next_action(retcode=VECTORS["action_response_failed"]["retcode"])
    with pytest.raises(SendRejected) as excinfo:
        await channel.send(OutgoingMessage(key="r3", chat=GROUP, text="x"))
    assert isinstance(excinfo.value, OneBotActionFailed)
    assert excinfo.value.retcode == 1404
    assert (await channel.send(OutgoingMessage(key="r4", chat=GROUP, text="y"))).platform_message_id == "group:123456:3001"


async def test_unanswered_action_times_out_as_unavailable(
    channel: OneBotChannel, peer: OneBotTestPeer
) -> None:
    peer.ignore_next_action()
    with pytest.raises(ChannelUnavailable, match="no answer"):
        await channel.send(OutgoingMessage(key="r5", chat=GROUP, text="x"))
    assert len(peer.actions) == 1


async def test_send_while_disconnected_is_unavailable(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    await peer.disconnect()
    await until(lambda: not channel.connected)
    with pytest.raises(ChannelUnavailable):
        await channel.send(OutgoingMessage(key="r6", chat=GROUP, text="x"))
    assert peer.actions == []


async def test_send_before_anyone_connects_is_unavailable(channel: OneBotChannel) -> None:
    with pytest.raises(ChannelUnavailable):
        await channel.send(OutgoingMessage(key="r7", chat=GROUP, text="x"))


async def test_call_action_get_login_info(channel: OneBotChannel, peer: OneBotTestPeer) -> None:
    response = await channel.call_action("get_login_info", {})
    assert response["data"] == {"user_id": 10001, "nickname": "qunbot"}
    with pytest.raises(OneBotActionFailed):
        await channel.call_action("no_such_action")


async def test_split_api_and_event_sockets(channel: OneBotChannel, inbox: asyncio.Queue[Message]) -> None:
    async with OneBotTestPeer(access_token=TOKEN) as p:
        await p.connect(channel.url, split=True)
        await asyncio.wait_for(channel.wait_connected(), 5)
        await p.send_event(EVENTS["group_message_at_bot"])
        assert (await next_message(inbox)).mentions_bot is True
        receipt = await channel.send(OutgoingMessage(key="s1", chat=GROUP, text="ok"))
        assert receipt.platform_message_id == "group:123456:3001"
        assert (await p.wait_for_action())["action"] == "send_group_msg"


async def test_stop_closes_connections_and_is_idempotent(
    channel: OneBotChannel, peer: OneBotTestPeer
) -> None:
    await channel.stop()
    await until(lambda: not peer.connected)
    assert not channel.connected
    await channel.stop()


async def test_tokens_never_reach_the_logs(
    channel: OneBotChannel, inbox: asyncio.Queue[Message], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    async with OneBotTestPeer(access_token="wrong-but-secret") as intruder:
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await intruder.connect(channel.url)
    async with OneBotTestPeer(access_token=None) as p:
        await p.connect(f"{channel.url}?access_token={TOKEN}")
        await asyncio.wait_for(channel.wait_connected(), 5)
        await p.send_raw("garbage")
        await p.send_event(EVENTS["private_message"])
        assert (await next_message(inbox)).message_id == "private:20002:2003"
    assert "rejected a connection" in caplog.text
    assert TOKEN not in caplog.text
    assert "wrong-but-secret" not in caplog.text


def test_recall_notices_name_the_recalled_message_its_chat_and_its_author() -> None:
    group = {"time": 1, "self_id": 10001, "post_type": "notice", "notice_type": "group_recall",
             "group_id": 123456, "user_id": 20002, "operator_id": 30001, "message_id": 2001}
    assert recall_from_event(group) == (GROUP, "group:123456:2001", "20002")  # an admin's recall: still 20002's
    friend = {"time": 1, "self_id": 10001, "post_type": "notice", "notice_type": "friend_recall",
              "user_id": 20002, "message_id": 7}
    private = ChatRef(platform="onebot", chat_id="20002", kind="private", account="10001")
    assert recall_from_event(friend) == (private, "private:20002:7", "20002")
    assert recall_from_event({**group, "user_id": 80000000})[2] is None  # type: ignore[index]  # anonymous
    # the bot's own message (an admin recalled it): its history row is found by the send's receipt
    assert recall_from_event({**group, "user_id": 10001}) == (GROUP, "group:123456:2001", "10001")
    assert recall_from_event({**group, "group_id": None}) is None
    assert recall_from_event({**group, "message_id": None}) is None
    assert recall_from_event({**group, "notice_type": "group_increase"}) is None


async def test_a_recall_that_overtakes_its_message_is_applied_once_the_message_is_stored(
    channel: OneBotChannel, peer: OneBotTestPeer
) -> None:
    """The recall notice came while the message was still on its way to the history (a busy bot):
    looked for again a moment later, not left stored."""
    asked: list[tuple[ChatRef, str, str | None]] = []

    async def forget(chat: ChatRef, message_id: str, sender: str | None) -> int:
        asked.append((chat, message_id, sender))
        return int(len(asked) >= 2)  # stored by the second look

    channel.bind_recalls(forget)
    channel.recall_retry_s = (0.05, 0.05)
    await peer.send_event({"time": 1, "self_id": 10001, "post_type": "notice", "notice_type": "group_recall",
                           "group_id": 123456, "user_id": 20002, "operator_id": 20002, "message_id": 2001})
    await until(lambda: len(asked) >= 2)
    await asyncio.sleep(0.15)
    assert asked == [(GROUP, "group:123456:2001", "20002")] * 2
    # A recall on this account's socket for another account's chats is dropped (as its messages are).
    await peer.send_event({"time": 1, "self_id": 10002, "post_type": "notice", "notice_type": "group_recall",
                           "group_id": 123456, "user_id": 20002, "operator_id": 20002, "message_id": 2002})
    await asyncio.sleep(0.1)
    assert len(asked) == 2
