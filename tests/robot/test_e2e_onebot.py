"""End to end: a OneBot peer, the real OneBot channel, the bot, the real OpenAI client and a fake LLM.

A group member @-s the bot; the model (over HTTP, streamed) calls a tool; the reply goes back as
``send_group_msg`` @-ing the member. While the peer is away the outbox holds the reply.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from function_calls import Caller, OpenAIChatModel, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import Call, FakeOpenAIServer, Reply
from robot.bot import Bot
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.config import Settings
from robot.message import ChatRef
from robot.plugin import Plugin

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "onebot_v11.json").read_text("utf-8"))
AT_BOT: dict[str, Any] = VECTORS["events"]["group_message_at_bot"]
Until = Callable[..., Awaitable[None]]
CALLERS: list[Caller] = []


class RemindArgs(BaseModel):
    when: str = Field(description="when, in the chat's zone")
    content: str = Field(description="what to remind of")


class ForecastArgs(BaseModel):
    day: str = Field(description="which day")


@tool_function
async def remind(ctx: ToolContext[object], args: RemindArgs) -> ToolResult:
    """Set a reminder for the person asking."""
    CALLERS.append(ctx.caller)
    return ToolResult.reply("已为你设置提醒")


@tool_function
async def forecast(ctx: ToolContext[object], args: ForecastArgs) -> str:
    """The weather forecast (data for the model)."""
    return f"{args.day}: 晴, 12-20°C"


@dataclass
class Rig:
    server: FakeOpenAIServer
    channel: OneBotChannel
    peer: OneBotTestPeer
    bot: Bot


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    CALLERS.clear()
    async with FakeOpenAIServer() as server:
        channel = OneBotChannel(OneBotSettings(enabled=True, port=0, action_timeout_s=2.0))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test")
        bot = Bot(Settings(bot={"data_dir": tmp_path}), model=model, channels=[channel],
                  plugins=[Plugin("e2e", Toolset("e2e", [remind, forecast]))])
        bot.outbox.retry_base_s, bot.outbox.retry_max_s = 0.05, 0.2
        await bot.start()
        try:
            async with OneBotTestPeer(self_id=10001) as peer:
                await peer.connect(channel.url)
                await asyncio.wait_for(channel.wait_connected(), 5)
                yield Rig(server, channel, peer, bot)
        finally:
            await bot.stop(flush_timeout_s=0.5)


def is_group_send(frame: dict[str, Any]) -> bool:
    return frame.get("action") == "send_group_msg"


def texts(frame: dict[str, Any]) -> str:
    return "".join(s["data"]["text"] for s in frame["params"]["message"] if s["type"] == "text")


async def test_an_at_in_a_group_is_answered_by_a_tool_at_ing_the_sender(rig: Rig) -> None:
    rig.server.script(Reply(tool_calls=[Call("remind", {"when": "明天 08:00", "content": "交周报"})]))
    await rig.peer.send_event(AT_BOT)
    action = await rig.peer.wait_for_action(is_group_send, timeout=10)
    params = action["params"]
    assert params["group_id"] == 123456
    assert {"type": "at", "data": {"qq": "20002"}} in params["message"]
    assert texts(action).strip() == "已为你设置提醒"
    # What the model was asked, and who the tool believed was asking (the platform, not the model).
    request = rig.server.requests[0].body
    assert request["messages"][-1] == {"role": "user", "content": "提醒我明天早上8点交周报"}
    assert "群聊" in request["messages"][0]["content"] and "id:20002" in request["messages"][0]["content"]
    assert {t["function"]["name"] for t in request["tools"]} == {"remind", "forecast", "ask_user"}
    (caller,) = CALLERS
    assert (caller.platform, caller.user_id, caller.chat_id, caller.chat_kind) == ("onebot", "20002", "123456", "group")
    assert len(rig.server.requests) == 1  # the tool's reply ended the run


async def test_a_data_tool_result_goes_back_to_the_model_then_the_answer_goes_out(rig: Rig) -> None:
    rig.server.script(Reply(tool_calls=[Call("forecast", {"day": "明天"})]), Reply("明天晴，12 到 20 度。"))
    await rig.peer.send_event(AT_BOT, message_id=2101)
    action = await rig.peer.wait_for_action(is_group_send, timeout=10)
    assert {"type": "at", "data": {"qq": "20002"}} in action["params"]["message"]
    assert texts(action).strip() == "明天晴，12 到 20 度。"
    second = rig.server.requests[1].body["messages"]
    assert any(m["role"] == "tool" and "晴, 12-20°C" in m["content"] for m in second)


async def test_a_redelivered_event_is_answered_once(rig: Rig) -> None:
    rig.server.script(Reply("好的"), Reply("第二条"))
    await rig.peer.send_event(AT_BOT, message_id=2201)
    await rig.peer.wait_for_action(is_group_send, timeout=10)
    await rig.peer.send_event(AT_BOT, message_id=2201)  # the implementation redelivers
    await rig.peer.send_event(AT_BOT, message_id=2202)
    await rig.peer.wait_for_action(is_group_send, timeout=10)
    await rig.bot.stop()  # waits for in-flight messages and flushes the outbox
    assert [texts(a).strip() for a in rig.peer.actions if is_group_send(a)] == ["好的", "第二条"]
    assert len(rig.server.requests) == 2


async def test_the_outbox_holds_the_reply_while_the_peer_is_away(rig: Rig, until: Until) -> None:
    release = asyncio.Event()

    async def slow_model(body: dict[str, Any]) -> Reply:
        await release.wait()
        return Reply(tool_calls=[Call("remind", {"when": "明天 08:00", "content": "交周报"})])

    rig.server.responder = slow_model
    await rig.peer.send_event(AT_BOT, message_id=2301)
    await until(lambda: len(rig.server.requests) == 1)
    await rig.peer.disconnect()
    await until(lambda: not rig.channel.connected)
    release.set()

    async def held() -> bool:  # parked while the peer is away: tried, but no backoff grows
        rows = await rig.bot.outbox.rows("pending")
        return bool(rows) and "connected" in str(rows[0]["error"]) and rows[0]["attempts"] == 0

    await until(held, timeout=10)
    assert not any(is_group_send(a) for a in rig.peer.actions)
    await rig.peer.connect(rig.channel.url)
    action = await rig.peer.wait_for_action(is_group_send, timeout=10)
    assert {"type": "at", "data": {"qq": "20002"}} in action["params"]["message"]
    assert texts(action).strip() == "已为你设置提醒"

    async def sent() -> bool:
        return [r["status"] for r in await rig.bot.outbox.rows()] == ["sent"]

    await until(sent)
    assert len([a for a in rig.peer.actions if is_group_send(a)]) == 1


async def test_with_two_accounts_on_one_url_the_reply_leaves_through_the_account_that_was_asked(
    rig: Rig, until: Until
) -> None:
    rig.server.script(Reply(tool_calls=[Call("remind", {"when": "明天 08:00", "content": "交周报"})]))
    async with OneBotTestPeer(self_id=10002) as second:
        await second.connect(rig.channel.url)  # the newer socket, another QQ account
        await until(lambda: second.connected)
        await rig.peer.send_event(AT_BOT, message_id=2401)
        action = await rig.peer.wait_for_action(is_group_send, timeout=10)
        assert texts(action).strip() == "已为你设置提醒"
        assert second.actions == []
        (caller,) = CALLERS
        assert caller.account == "10001"
        rows = await rig.bot.outbox.rows()
        assert [r["account"] for r in rows] == ["10001"]


async def test_an_at_to_one_account_seen_first_by_another_is_answered_once_by_the_one_asked(
    rig: Rig, until: Until
) -> None:
    """Lagrange gives a group line one message id on every account: the copy account 10002 sees (not
    @-ed) may come first. Dropped as a duplicate, the @-ed copy went unanswered."""
    rig.server.script(Reply("好的"))
    async with OneBotTestPeer(self_id=10002) as second:
        await second.connect(rig.channel.url)
        await until(lambda: second.connected)
        await second.send_event(AT_BOT, message_id=2501, self_id=10002)
        group = ChatRef(platform="onebot", chat_id="123456", kind="group")

        async def seen() -> bool:  # (the sibling's copy first, for sure)
            return bool(await rig.bot.history.recent(group, 10))

        await until(seen)
        await rig.peer.send_event(AT_BOT, message_id=2501)  # the copy of the account @-ed
        action = await rig.peer.wait_for_action(is_group_send, timeout=10)
        await rig.bot.stop()
        assert texts(action).strip() == "好的" and second.actions == []
        assert len([a for a in rig.peer.actions if is_group_send(a)]) == 1 and len(rig.server.requests) == 1
        assert rig.server.requests[0].body["messages"][-1]["content"] == "提醒我明天早上8点交周报"


async def test_an_image_only_at_reaches_the_model_as_placeholders_in_history_and_prompt(
    rig: Rig, until: Until
) -> None:
    peers = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "onebot_peers.json").read_text("utf-8"))
    rig.server.script(Reply("看到了一张图片。"))
    # First a file shared in the group (not addressed: only recorded), then an @ with only an image.
    shared = [peers["napcat_segments"]["file"]]
    await rig.peer.send_event(VECTORS["events"]["group_message_plain"], message_id=2501, message=shared,
                              user_id=20003)
    group = ChatRef(platform="onebot", chat_id="123456", kind="group")

    async def recorded() -> bool:
        return any(e.text == "[文件: 周报.docx]" for e in await rig.bot.history.recent(group, 10))

    await until(recorded)
    await rig.peer.send_event(peers["napcat_group_image_only_at_bot"])
    await rig.peer.wait_for_action(is_group_send, timeout=10)
    messages = rig.server.requests[0].body["messages"]
    assert messages[-1] == {"role": "user", "content": "[图片]"}
    assert any("[文件: 周报.docx]" in str(m["content"]) for m in messages[:-1])


async def test_a_flood_reaches_the_provider_a_few_requests_at_a_time_and_each_message_is_answered_once(
        tmp_path: Path, until: Until) -> None:
    # 200 @-messages pushed at once over the socket: the provider sees at most messages_at_once
    # requests together (not 200, which a real one answers with 429s), and every one is answered.
    at_once, count = 8, 200
    in_flight, peak = 0, 0

    async def respond(body: dict[str, Any]) -> Reply:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return Reply("收到：" + str(body["messages"][-1]["content"]).split()[-1])

    async with FakeOpenAIServer(respond) as server:
        channel = OneBotChannel(OneBotSettings(enabled=True, port=0, action_timeout_s=5.0))
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test")
        big = 10**6
        settings = Settings(bot={"data_dir": tmp_path}, limits={
            "messages_at_once": at_once, "user_burst": big, "user_per_minute": big, "chat_burst": big,
            "chat_per_minute": big, "user_daily_tokens": None, "chat_daily_tokens": None})
        bot = Bot(settings, model=model, channels=[channel], plugins=[])
        bot.pipeline.admission.hold_s = 30.0  # places kept for the whole run (1 s by default), however slow this machine
        await bot.start()
        try:
            async with OneBotTestPeer(self_id=10001) as peer:
                await peer.connect(channel.url)
                await asyncio.wait_for(channel.wait_connected(), 5)
                for i in range(count):
                    question = f"第{i}个问题"  # (from 40 members: one member's questions are answered in turn)
                    who = 30000 + i % 40
                    await peer.send_event(AT_BOT, message_id=5000 + i, raw_message=f"[CQ:at,qq=10001] {question}",
                                          user_id=who, sender={**AT_BOT["sender"], "user_id": who},
                                          message=[{"type": "at", "data": {"qq": "10001"}},
                                                   {"type": "text", "data": {"text": f" {question}"}}])
                await until(lambda: sum(map(is_group_send, peer.actions)) >= count, timeout=60)
                await asyncio.sleep(0.2)  # a doubled reply would land now
                replies = sorted(texts(a).strip() for a in peer.actions if is_group_send(a))
        finally:
            await bot.stop(flush_timeout_s=0.5)
    assert replies == sorted(f"收到：第{i}个问题" for i in range(count))
    assert len(server.requests) == count and 1 < peak <= at_once


async def test_a_recalled_message_leaves_the_history(rig: Rig, until: Until) -> None:
    """A member recalls (撤回) a message, or an admin recalls it for them: the model and summaries no longer
    read it. A notice from another group, or naming another sender, takes nothing."""
    group = ChatRef(platform="onebot", chat_id="123456", kind="group", account="10001")

    def line(message_id: int, text: str, user_id: int = 20002) -> dict[str, Any]:
        return {**AT_BOT, "message_id": message_id, "user_id": user_id,
                "sender": {**AT_BOT["sender"], "user_id": user_id},
                "message": [{"type": "text", "data": {"text": text}}], "raw_message": text}

    def recall(message_id: int, user_id: int, operator_id: int, group_id: int = 123456) -> dict[str, Any]:
        return {"time": 1, "self_id": 10001, "post_type": "notice", "notice_type": "group_recall",
                "group_id": group_id, "user_id": user_id, "operator_id": operator_id, "message_id": message_id}

    async def texts() -> list[str]:
        return [e.text for e in await rig.bot.history.recent(group) if not e.from_bot]

    for message_id, text, user_id in [(2001, "我的身份证号 110101199003071234", 20002), (2002, "发错群了", 20003),
                                      (2003, "留着", 20002)]:
        await rig.peer.send_event(line(message_id, text, user_id))
    await until(lambda: _has(texts, 3))
    await rig.peer.send_event(recall(2001, 20002, 20002))  # the member's own recall
    await rig.peer.send_event(recall(2002, 20003, 30001))  # an admin recalls another member's message
    await rig.peer.send_event(recall(2003, 20002, 20002, group_id=654321))  # the same id in another group
    await rig.peer.send_event(recall(2003, 20009, 20009))  # a notice naming someone who did not write it
    await until(lambda: _has(texts, 1))
    await asyncio.sleep(0.1)
    assert await texts() == ["留着"]


async def test_the_bots_message_an_admin_recalls_leaves_the_history(rig: Rig, until: Until) -> None:
    """An admin recalls (撤回) what the bot said (a wrong answer, someone's number it repeated): the model read
    it again in every later window. Its history row goes, found by the send's receipt; other rows stay."""
    group = ChatRef(platform="onebot", chat_id="123456", kind="group", account="10001")
    rig.server.script(Reply("张三的电话是 13800001111"), Reply("留着的回答"))

    async def said() -> list[str]:
        return [e.text for e in await rig.bot.history.recent(group) if e.from_bot]

    await rig.peer.send_event(AT_BOT, message_id=4001)
    first = await rig.peer.wait_for_action(is_group_send, timeout=10)
    await rig.peer.send_event(AT_BOT, message_id=4002)
    await until(lambda: _has(said, 2))
    receipt = 3001  # the peer's message id for the bot's first send (OneBotTestPeer numbers them from 3001)
    assert "13800001111" in texts(first)
    await rig.peer.send_event({"time": 1, "self_id": 10001, "post_type": "notice", "notice_type": "group_recall",
                               "group_id": 123456, "user_id": 10001, "operator_id": 30001, "message_id": receipt})
    await until(lambda: _has(said, 1))
    assert [t for t in await said() if "13800001111" in t] == []


async def _has(texts: Callable[[], Awaitable[list[str]]], n: int) -> bool:
    return len(await texts()) == n
