"""End to end: a group member asks over OneBot v11, the real OpenAI client calls ``reminder_set``
on the fake server, the confirmation comes back, and at the due second the reminder @-s its owner."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import reminders
from function_calls import OpenAIChatModel
from function_calls.testing import Call, FakeOpenAIServer, Reply
from robot.bot import Bot
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.config import Settings

ROOT = Path(__file__).resolve().parents[2]
VECTORS: dict[str, Any] = json.loads((ROOT / "tests" / "vectors" / "onebot_v11.json").read_text("utf-8"))
ASK = VECTORS["events"]["group_message_at_bot"]  # user 20002 in group 123456: "@bot 提醒我...交周报"


def is_group_send(frame: dict[str, Any]) -> bool:
    return frame.get("action") == "send_group_msg"


def texts(frame: dict[str, Any]) -> str:
    return "".join(s["data"]["text"] for s in frame["params"]["message"] if s["type"] == "text")


def ats(frame: dict[str, Any]) -> list[str]:
    return [str(s["data"]["qq"]) for s in frame["params"]["message"] if s["type"] == "at"]


async def test_group_member_sets_a_reminder_and_it_arrives_at_the_due_second(tmp_path: Path) -> None:
    due = (datetime.now(UTC) + timedelta(seconds=2.5)).replace(microsecond=0)
    wall = due.astimezone(ZoneInfo("Asia/Shanghai")).strftime("%Y-%m-%d %H:%M:%S")
    async with FakeOpenAIServer() as server, OneBotTestPeer(self_id=10001) as peer:
        server.script(Reply(tool_calls=[Call("reminder_set", {"type": "once", "time": wall, "content": "交周报"})]))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test-key")
        channel = OneBotChannel(OneBotSettings(enabled=True, port=0), bot_name="qunbot")
        bot = Bot(Settings(bot={"data_dir": tmp_path}), model=model, channels=[channel], plugins=[reminders.plugin])
        await bot.start()
        try:
            await peer.connect(channel.url)
            await channel.wait_connected()
            await peer.send_event(ASK, time=int(time.time()), message_id=4242)

            confirmation = await peer.wait_for_action(is_group_send, timeout=10)
            assert confirmation["params"]["group_id"] == 123456
            assert ats(confirmation) == ["20002"]
            assert texts(confirmation).strip().startswith("好的，已设置提醒 #")
            assert wall[:16] in texts(confirmation) and "交周报" in texts(confirmation)

            reminder = await peer.wait_for_action(is_group_send, timeout=10)
            arrived = datetime.now(UTC)
            assert reminder["params"]["group_id"] == 123456
            assert ats(reminder) == ["20002"]
            assert texts(reminder).strip() == "⏰ 提醒：交周报"
            assert arrived >= due  # never early

            [request] = server.requests  # the confirmation answered the user: one model call
            assert "reminder_set" in [t["function"]["name"] for t in request.body["tools"]]
            assert "提醒我明天早上8点交周报" in request.body["messages"][-1]["content"]
        finally:
            await bot.stop()


async def test_an_anonymous_member_is_refused_a_reminder_and_never_at_ed(tmp_path: Path) -> None:
    peers = json.loads((ROOT / "tests" / "vectors" / "onebot_peers.json").read_text("utf-8"))
    anonymous = peers["anonymous_group_message"]
    async with FakeOpenAIServer() as server, OneBotTestPeer(self_id=10001) as peer:
        server.script(Reply(tool_calls=[Call("reminder_set", {"type": "daily", "time": "08:00", "content": "交周报"})]))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test-key")
        channel = OneBotChannel(OneBotSettings(enabled=True, port=0), bot_name="qunbot")
        bot = Bot(Settings(bot={"data_dir": tmp_path}), model=model, channels=[channel], plugins=[reminders.plugin])
        await bot.start()
        try:
            await peer.connect(channel.url)
            await channel.wait_connected()
            await peer.send_event(anonymous, time=int(time.time()))
            answer = await peer.wait_for_action(is_group_send, timeout=10)
            assert "匿名消息不能设置提醒" in texts(answer)
            assert ats(answer) == []  # neither 80000000 nor the anonymous flag
            deps = bot.deps_for(reminders.reminder_set)
            assert await deps.store.for_chat("onebot:group:123456") == []  # type: ignore[attr-defined]
        finally:
            await bot.stop()
