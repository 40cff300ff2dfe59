"""End to end: a OneBot v11 group, the real OpenAI client against a fake server, the summary plugin."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import summary
from function_calls import OpenAIChatModel
from function_calls.testing import Call, FakeOpenAIServer, Reply
from robot.bot import Bot
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.config import Settings
from robot.message import ChatRef
from summary.window import read_mark

SELF_ID = 10001
GROUP, OTHER_GROUP = 123456, 654321
G = ChatRef(platform="onebot", chat_id=str(GROUP), kind="group")
OTHER = ChatRef(platform="onebot", chat_id=str(OTHER_GROUP), kind="group")
SUMMARY_TEXT = "大家约了周六下午三点后打球，小红(20004) 负责订体育馆二号场。"
LINE = re.compile(r"^\[\d\d:\d\d\] (.+?)\((\d+)\): (.*)$")


def group_event(group: int, user: int, name: str, text: str, message_id: int, at: int,
                *, at_bot: bool = False) -> dict[str, Any]:
    segments: list[dict[str, Any]] = [{"type": "at", "data": {"qq": str(SELF_ID)}}] if at_bot else []
    segments.append({"type": "text", "data": {"text": text}})
    return {
        "time": at, "self_id": SELF_ID, "post_type": "message", "message_type": "group", "sub_type": "normal",
        "message_id": message_id, "group_id": group, "user_id": user, "anonymous": None, "message": segments,
        "raw_message": text, "font": 0, "sender": {"user_id": user, "nickname": name, "card": "", "role": "member"},
    }


def respond(body: dict[str, Any]) -> Reply:
    if body.get("tools"):  # the user's request: the model decides to summarise
        return Reply(tool_calls=[Call("summary", {})])
    return Reply(SUMMARY_TEXT)  # the summary tool's own request(s)


@dataclass
class World:
    bot: Bot
    peer: OneBotTestPeer
    server: FakeOpenAIServer


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with FakeOpenAIServer(respond) as server:
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test")
        channel = OneBotChannel(OneBotSettings(enabled=True, port=0))
        bot = Bot(Settings(bot={"data_dir": tmp_path}), model=model, channels=[channel], plugins=[summary.plugin])
        await bot.start()
        try:
            async with OneBotTestPeer(self_id=SELF_ID) as peer:
                await peer.connect(channel.url)
                await asyncio.wait_for(channel.wait_connected(), 5)
                yield World(bot, peer, server)
        finally:
            await bot.stop()


async def recorded(bot: Bot, chat: ChatRef, count: int) -> None:
    async with asyncio.timeout(5):
        while len(await bot.history.recent(chat, 100)) < count:
            await asyncio.sleep(0.01)


def sent_text(action: dict[str, Any]) -> str:
    return "".join(s["data"]["text"] for s in action["params"]["message"] if s["type"] == "text").strip()


async def test_a_member_asks_for_a_summary_and_the_group_gets_it(world: World) -> None:
    bot, peer, server = world.bot, world.peer, world.server
    start = int(time.time()) - 600
    talk = [(20002, "小明", "周六下午去打球吗？"), (20003, "阿强", "可以，三点以后都行"),
            (20004, "小红", "我来订场地，体育馆二号场")]
    for i, (user, name, text) in enumerate(talk):
        await peer.send_event(group_event(GROUP, user, name, text, 5000 + i, start + 60 * i))
    await peer.send_event(group_event(OTHER_GROUP, 30001, "路人", "别的群：明天考试别迟到", 5100, start + 30))
    await recorded(bot, G, 3)
    await recorded(bot, OTHER, 1)

    await peer.send_event(group_event(GROUP, 20002, "小明", "帮忙总结一下群聊", 5003, start + 300, at_bot=True))
    action = await peer.wait_for_action(lambda f: f["action"] == "send_group_msg", timeout=10)

    # The summary comes back to the group, addressed to the member who asked.
    assert action["params"]["group_id"] == GROUP
    reply = sent_text(action)
    assert reply.startswith("【群聊总结】最近 24 小时 · 3 条消息 · 3 人发言")
    assert SUMMARY_TEXT in reply
    assert {"type": "at", "data": {"qq": "20002"}} in action["params"]["message"]

    # First the user's request (with tools), then the summary tool's own request: no third turn.
    assert [bool(r.body.get("tools")) for r in server.requests] == [True, False]
    summary_request = server.requests[1]
    body = summary_request.messages[-1]["content"]
    lines = [LINE.match(line).groups() for line in body.splitlines() if LINE.match(line)]  # type: ignore[union-attr]
    assert lines == [  # exactly the three members' messages: not the request, not the other group
        ("小明", "20002", "周六下午去打球吗？"),
        ("阿强", "20003", "可以，三点以后都行"),
        ("小红", "20004", "我来订场地，体育馆二号场"),
    ]
    assert "帮忙总结一下群聊" not in body
    assert all("明天考试" not in r.raw.decode() for r in server.requests)
    assert summary_request.body["model"] == "fake-model" and summary_request.body.get("max_tokens")

    await asyncio.sleep(0.05)  # nothing is sent to the other group
    assert [a["params"].get("group_id") for a in peer.actions if a["action"] == "send_group_msg"] == [GROUP]
    assert await read_mark(bot.db, G) is not None
    assert await read_mark(bot.db, OTHER) is None

    # Asked again: the earlier talk and the first request are behind the mark.
    await peer.send_event(group_event(GROUP, 20003, "阿强", "再总结一次", 5004, start + 400, at_bot=True))
    again = await peer.wait_for_action(lambda f: f["action"] == "send_group_msg", timeout=10)
    assert sent_text(again).startswith("【群聊总结】自上次总结以来：没有可以总结的新消息。")


async def test_forget_me_over_onebot_deletes_only_the_callers_messages(world: World) -> None:
    bot, peer = world.bot, world.peer
    start = int(time.time()) - 120
    await peer.send_event(group_event(GROUP, 20002, "小明", "我的手机号是 138xxxx", 6000, start))
    await peer.send_event(group_event(GROUP, 20003, "阿强", "收到", 6001, start + 1))
    await peer.send_event(group_event(OTHER_GROUP, 20002, "小明", "另一个群", 6002, start + 2))
    await recorded(bot, G, 2)
    await recorded(bot, OTHER, 1)
    await peer.send_event(group_event(GROUP, 20002, "小明", "/forget me", 6003, start + 3))
    action = await peer.wait_for_action(lambda f: f["action"] == "send_group_msg", timeout=10)
    assert sent_text(action) == "已删除你在本群的记录：2 条消息。"
    left = [(h.user_id, h.text) for h in await bot.history.recent(G, 50) if not h.from_bot]
    assert left == [("20003", "收到")]
    assert [h.text for h in await bot.history.recent(OTHER, 50)] == ["另一个群"]
    assert world.server.requests == []  # a command needs no model
