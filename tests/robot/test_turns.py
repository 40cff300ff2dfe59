"""A member's questions are answered in the order they were asked, each run reading the answers before it;
other members (and commands) do not wait. Unit tests of :mod:`robot.turns` below the end-to-end ones."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import pytest

from function_calls import ModelRequest
from function_calls.testing import ScriptedModel, text
from robot.turns import SenderTurns
from tests.robot.conftest import eventually


def gated_model(gate: asyncio.Event, started: list[str]) -> ScriptedModel:
    """Answers "答：<question>"; a question containing "慢" waits for ``gate`` first (a long answer)."""
    async def script(request: ModelRequest) -> Any:
        question = str(request.messages[-1]["content"])
        started.append(question)
        if "慢" in question:
            await gate.wait()
        return text("答：" + question)
    return ScriptedModel(script)


async def test_a_members_second_question_is_answered_after_the_first_and_reads_its_answer(make_bot: Any) -> None:
    gate, started = asyncio.Event(), list[str]()
    model = gated_model(gate, started)
    _bot, ch = await make_bot(model)
    first = asyncio.create_task(ch.inject("慢问题：明天天气怎么样", at_bot=True, message_id="q1"))
    await eventually(lambda: len(started) == 1)
    second = asyncio.create_task(ch.inject("那后天呢", at_bot=True, message_id="q2"))
    await asyncio.sleep(0.2)
    assert started == ["慢问题：明天天气怎么样"]  # the second waits for the first run, not answered before it
    assert ch.sent == []
    gate.set()
    await asyncio.gather(first, second)
    await ch.wait_sent(2)
    assert [m.text for m in ch.sent] == ["答：慢问题：明天天气怎么样", "答：那后天呢"]
    second_request = json.dumps(model.requests[1].messages, ensure_ascii=False)
    assert "答：慢问题：明天天气怎么样" in second_request  # its window has the first answer


async def test_other_members_and_commands_do_not_wait_for_a_members_run(make_bot: Any) -> None:
    gate, started = asyncio.Event(), list[str]()
    _bot, ch = await make_bot(gated_model(gate, started))
    slow = asyncio.create_task(ch.inject("慢问题", at_bot=True, user="u1", message_id="q1"))
    await eventually(lambda: len(started) == 1)
    await ch.inject("你好", at_bot=True, user="u2", message_id="q2")  # another member: answered meanwhile
    await ch.inject("/help", at_bot=True, user="u1", message_id="q3")  # the same member's command too
    await ch.wait_sent(2)
    assert ch.sent[0].text == "答：你好"
    assert "/help" in ch.sent[1].text or "命令" in ch.sent[1].text
    gate.set()
    await slow
    await ch.wait_sent(3)


async def test_a_question_waiting_its_turn_at_a_stop_is_kept_for_the_next_start(make_bot: Any) -> None:
    gate, started = asyncio.Event(), list[str]()
    bot, ch = await make_bot(gated_model(gate, started))
    asking = [asyncio.create_task(ch.inject("慢问题", at_bot=True, message_id="q1"))]
    await eventually(lambda: len(started) == 1)
    asking.append(asyncio.create_task(ch.inject("第二个问题", at_bot=True, message_id="q2")))
    await asyncio.sleep(0.1)
    await bot.stop(flush_timeout_s=0.05)
    async with asyncio.timeout(5):
        await asyncio.gather(*asking, return_exceptions=True)
    db = sqlite3.connect(bot.db.path)
    try:
        kept = sorted(r[0] for r in db.execute("SELECT message_id FROM parked_messages"))
    finally:
        db.close()
    assert kept == ["q1", "q2"]
    assert started == ["慢问题"]


async def test_a_line_keeps_its_order_through_a_place_given_up_without_a_run() -> None:
    turns = SenderTurns()
    a, b, c = turns.enter("k"), turns.enter("k"), turns.enter("k")
    assert await a.wait() is False
    b.leave()  # answered without a run (a command): c still waits for a
    waiting = asyncio.create_task(c.wait())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    a.leave()
    assert await waiting is True
    c.leave()
    assert len(turns) == 0  # nothing kept for a member once their line is empty


async def test_a_stuck_run_delays_the_next_only_so_long_and_is_not_cancelled() -> None:
    turns = SenderTurns(wait_s=0.05)
    a, b = turns.enter("k"), turns.enter("k")
    other = turns.enter("other")
    assert await other.wait() is False  # other lines do not wait
    assert await b.wait() is True  # (went ahead after wait_s)
    b.leave()
    a.leave()
    other.leave()
    assert len(turns) == 0


async def test_a_waiter_cancelled_leaves_the_run_ahead_alone() -> None:
    turns = SenderTurns()
    a, b = turns.enter("k"), turns.enter("k")
    waiting = asyncio.create_task(b.wait())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    b.leave()
    c = turns.enter("k")
    waiting_c = asyncio.create_task(c.wait())
    await asyncio.sleep(0.01)
    assert not waiting_c.done()  # a still runs: the newcomer waits for it
    a.leave()
    assert await waiting_c is True
    c.leave()
    assert len(turns) == 0
