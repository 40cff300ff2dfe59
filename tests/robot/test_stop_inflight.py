"""A question the model is still answering when the bot stops (past the stop's grace) is kept and
answered, once, at the next start: OneBot, the web page and WeCom's AI bot never send it again."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from function_calls import ModelRequest, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.message import ChatRef
from robot.plugin import Plugin
from robot.testing import MemoryChannel
from tests.robot.conftest import eventually

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
AT_BOT: dict[str, Any] = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "onebot_v11.json")
                                    .read_text("utf-8"))["events"]["group_message_at_bot"]


class PayArgs(BaseModel):
    to: str
    amount: int


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


async def stop_mid_run(bot: Any, ch: Any, question: str, reached: Callable[[], Awaitable[object]]) -> None:
    """Ask ``question`` (as q1), wait until ``reached``, then stop the bot and let the handling it cut end."""
    asking = asyncio.create_task(ch.inject(question, at_bot=True, message_id="q1"))
    await reached()
    await bot.stop(flush_timeout_s=0.05)
    async with asyncio.timeout(5):
        await asyncio.gather(asking, return_exceptions=True)


async def told_at_next_start(make_bot: Any, tmp_path: Path, plugins: list[Plugin[Any]],
                             ch: Any) -> tuple[list[str], ScriptedModel]:
    """Start again on the same data and replay what was kept: the "what ran" notices sent, and the model."""
    model = echo_model()
    again, ch2 = await make_bot(model, data_dir=tmp_path, plugins=plugins)
    await again.parked.replay(again.handle)
    await again.outbox.flush()
    return [m.text for m in ch.sent + ch2.sent if "已执行" in m.text], model


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


async def test_a_question_cut_short_after_a_call_took_effect_is_not_run_again_but_told_what_ran(
        make_bot: Any, tmp_path: Path) -> None:
    """Kept to be answered again, its run would take its calls again (a payment twice): the sender is told
    what ran, at the next start, and nothing runs twice."""
    turns: list[str] = []
    paid: list[int] = []

    @tool_function
    async def pay(ctx: ToolContext[object], args: PayArgs) -> ToolResult:
        """Pay someone."""
        paid.append(args.amount)
        return ToolResult(content=f"paid {args.amount}")

    async def script(request: ModelRequest) -> Any:
        turns.append("turn")
        if len(turns) == 1:
            return call("pay", {"to": "小王", "amount": 5})
        await asyncio.Event().wait()  # the answer after the call never comes before the stop

    payments = Plugin("payments", Toolset("payments", [pay]))
    bot, ch = await make_bot(ScriptedModel(script), plugins=[payments])
    await stop_mid_run(bot, ch, "转5元给小王", lambda: eventually(lambda: len(turns) == 2))
    assert rows(bot.db.path, "SELECT * FROM parked_messages") == []

    told, model = await told_at_next_start(make_bot, tmp_path, [payments], ch)
    assert len(told) == 1 and "pay（to=\"小王\", amount=5）" in told[0] and "请勿直接重复请求" in told[0]
    assert model.requests == [] and paid == [5]  # not answered again: paid once


async def test_a_call_the_stop_cuts_in_flight_is_told_as_maybe_run_and_not_run_again(
        make_bot: Any, tmp_path: Path) -> None:
    """A payment whose answer had not come back when the stop cut it may have gone through: kept to be
    answered again, it would be sent twice. The sender is told it may have run instead."""
    started = asyncio.Event()

    @tool_function
    async def pay(ctx: ToolContext[object], args: PayArgs) -> ToolResult:
        """Pay someone."""
        started.set()
        await asyncio.Event().wait()  # the bank's answer never comes before the stop
        return ToolResult(content="paid")

    payments = Plugin("payments", Toolset("payments", [pay]))
    bot, ch = await make_bot(ScriptedModel(lambda r: call("pay", {"to": "小王", "amount": 5})), plugins=[payments])
    await stop_mid_run(bot, ch, "转5元给小王", lambda: asyncio.wait_for(started.wait(), 5))
    assert rows(bot.db.path, "SELECT * FROM parked_messages") == []

    told, model = await told_at_next_start(make_bot, tmp_path, [payments], ch)
    assert len(told) == 1 and "可能已执行：pay（to=\"小王\", amount=5）" in told[0] and "请勿直接重复请求" in told[0]
    assert model.requests == []


async def test_a_question_cut_short_after_only_read_only_calls_is_answered_again(
        make_bot: Any, tmp_path: Path) -> None:
    """A lookup changed nothing: the question is kept and answered at the next start, as one without calls."""
    turns: list[str] = []

    @tool_function(read_only=True)
    async def balance(ctx: ToolContext[object]) -> ToolResult:
        """Look up the balance."""
        return ToolResult(content="12 元")

    async def script(request: ModelRequest) -> Any:
        turns.append("turn")
        if len(turns) == 1:
            return call("balance", {})
        await asyncio.Event().wait()

    lookups = Plugin("lookups", Toolset("lookups", [balance]))
    bot, ch = await make_bot(ScriptedModel(script), plugins=[lookups])
    await stop_mid_run(bot, ch, "我还有多少钱", lambda: eventually(lambda: len(turns) == 2))
    assert [r[0] for r in rows(bot.db.path, "SELECT message_id FROM parked_messages")] == ["q1"]
    assert [m.text for m in ch.sent] == []
