"""A question the model is still answering when the bot stops (past the stop's grace) is kept and
answered, once, at the next start: OneBot, the web page and WeCom's AI bot never send it again."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

from function_calls import ModelRequest
from function_calls.testing import ScriptedModel, text
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.message import ChatRef
from robot.testing import MemoryChannel
from tests.robot.conftest import eventually

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
AT_BOT: dict[str, Any] = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "onebot_v11.json")
                                    .read_text("utf-8"))["events"]["group_message_at_bot"]


def slow_model(started: list[str]) -> ScriptedModel:
    """A model that never answers (a long answer, a reasoning model): the stop's grace runs out."""
    async def script(request: ModelRequest) -> Any:
        started.append(str(request.messages[-1]["content"]))
        await asyncio.Event().wait()
    return ScriptedModel(script)


def echo_model() -> ScriptedModel:
    return ScriptedModel(lambda r: text("答：" + str(r.messages[-1]["content"])))


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


async def test_questions_still_with_the_model_at_a_stop_are_answered_once_at_the_next_start(
        make_bot: Any, tmp_path: Path) -> None:
    started: list[str] = []
    bot, ch = await make_bot(slow_model(started))
    asking = [asyncio.create_task(ch.inject(f"问题{i}", at_bot=True, user=f"u{i}", message_id=f"q{i}"))
              for i in range(3)]
    await eventually(lambda: len(started) == 3)
    await bot.stop(flush_timeout_s=0.05)
    async with asyncio.timeout(5):  # (cut short by the stop, not left running on a closed store)
        await asyncio.gather(*asking, return_exceptions=True)
    assert ch.sent == []
    assert sorted(r[0] for r in rows(bot.db.path, "SELECT message_id FROM parked_messages")) == ["q0", "q1", "q2"]

    model = echo_model()
    again, ch2 = await make_bot(model, data_dir=tmp_path)
    await ch2.wait_sent(3)
    await eventually(lambda: again.db.run(lambda db: not db.execute("SELECT * FROM parked_messages").fetchall()))
    await again.stop()
    assert sorted(m.text for m in ch2.sent) == ["答：问题0", "答：问题1", "答：问题2"]
    assert len(model.requests) == 3
    history = rows(bot.db.path, "SELECT text FROM history WHERE text LIKE '问题%'")
    assert sorted(r[0] for r in history) == ["问题0", "问题1", "问题2"]  # recorded once, not again at the replay


async def test_a_onebot_question_cut_off_by_the_stop_is_answered_at_the_next_start(
        make_bot: Any, tmp_path: Path) -> None:
    # The channel's own stop cancels its deliveries (no grace): nothing was kept, and OneBot never sends it again.
    started: list[str] = []
    channel = OneBotChannel(OneBotSettings(enabled=True, port=0, action_timeout_s=2.0))
    bot, _ = await make_bot(slow_model(started), channel=channel, plugins=[])
    async with OneBotTestPeer(self_id=10001) as peer:
        await peer.connect(channel.url)
        await asyncio.wait_for(channel.wait_connected(), 5)
        await peer.send_event(AT_BOT, message_id=5001, user_id=30001,
                              message=[{"type": "at", "data": {"qq": "10001"}}, {"type": "text", "data": {"text": " 问题"}}])
        await eventually(lambda: len(started) == 1)
        await bot.stop(flush_timeout_s=0.05)
        assert not [a for a in peer.actions if a.get("action") == "send_group_msg"]

    channel2 = OneBotChannel(OneBotSettings(enabled=True, port=0, action_timeout_s=2.0))
    model = echo_model()
    again, _ = await make_bot(model, channel=channel2, plugins=[], data_dir=tmp_path)
    async with OneBotTestPeer(self_id=10001) as peer:
        await peer.connect(channel2.url)
        await asyncio.wait_for(channel2.wait_connected(), 5)
        await eventually(lambda: any(a.get("action") == "send_group_msg" for a in peer.actions))
        await again.stop()
        sent = [a for a in peer.actions if a.get("action") == "send_group_msg"]
    assert len(sent) == 1 and "答：问题" in json.dumps(sent[0], ensure_ascii=False) and len(model.requests) == 1


class StuckTrace(MemoryChannel):
    """Its tool trace hangs: a /command's reply is queued, its handling not over."""

    async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:
        await asyncio.Event().wait()


async def test_a_message_whose_reply_was_queued_is_not_kept_to_be_answered_again(
        make_bot: Any, tmp_path: Path) -> None:
    bot, ch = await make_bot(echo_model(), channel=StuckTrace())
    asking = asyncio.create_task(ch.inject("/n 牛奶", at_bot=True, message_id="c1"))
    await ch.wait_sent(1)
    await bot.stop(flush_timeout_s=0.05)
    async with asyncio.timeout(5):
        await asyncio.gather(asking, return_exceptions=True)
    assert rows(bot.db.path, "SELECT * FROM parked_messages") == []
    again, ch2 = await make_bot(echo_model(), data_dir=tmp_path)
    await again.parked.replay(again.handle)
    await again.outbox.flush()
    assert [m.text for m in ch.sent] == ["noted for u1: 牛奶 x1"] and ch2.sent == []
