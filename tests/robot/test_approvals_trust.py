"""Approvals that must not grant more than the approver saw and meant (found by an independent audit)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from function_calls import (
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolContext,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text
from robot.plugin import Plugin
from robot.testing import MemoryChannel

RUNS: list[str] = []
ADMIN = "9"


class TransferArgs(BaseModel):
    memo: str = Field("", description="a note for the transfer")
    amount: int = Field(ge=0)


@tool_function(confirm="admin")
async def transfer(ctx: ToolContext[object], args: TransferArgs) -> ToolResult:
    """Move money (an admin must approve)."""
    RUNS.append(f"transfer {args.amount}")
    return ToolResult(content=f"transferred {args.amount}")


@tool_function(confirm="requester")
async def wipe(ctx: ToolContext[object]) -> ToolResult:
    """Delete my notes (I confirm myself)."""
    RUNS.append(f"wipe for {ctx.caller.user_id}")
    return ToolResult(content="wiped")


@tool_function(admin_only=True, confirm="requester")
async def reset_all(ctx: ToolContext[object]) -> ToolResult:
    """Reset every user's data (bot admins only; the admin confirms)."""
    RUNS.append(f"reset by {ctx.caller.user_id}")
    return ToolResult.reply(f"reset by {ctx.caller.user_id}")


PLUGIN = Plugin("risky", Toolset("risky", [transfer, wipe, reset_all]))


def code_in(said: str) -> str:
    found = re.search(r"/approve ([A-Z0-9]{5})", said)
    assert found, said
    return found.group(1)


async def test_an_admin_removed_before_approving_no_longer_runs_an_admin_only_call(
        make_bot: Any, tmp_path: Path) -> None:
    RUNS.clear()
    data = tmp_path / "d"

    def script(req: ModelRequest) -> ModelResponse:
        return text("done") if any(m["role"] == "tool" for m in req.messages) else call("reset_all", {})

    before, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN], data_dir=data, bot={"admins": ["memory:boss"]})
    await ch.inject("/reset_all", user="boss", message_id="x1")
    typed = code_in((await ch.wait_sent(1))[0].text)
    await ch.inject("重置所有数据", user="boss", at_bot=True, message_id="x2")
    await ch.wait_sent(2)
    await before.stop(flush_timeout_s=0.5)
    after, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN], data_dir=data, bot={"admins": []})
    await ch.inject(f"/approve {typed}", user="boss", message_id="x3")  # the command path
    await after.approvals.idle()
    await ch.inject("确认", user="boss", message_id="x4")  # the model path
    await after.approvals.idle()
    await after.outbox.flush()
    assert RUNS == [], RUNS
    assert any("只有机器人管理员可以使用" in m.text for m in ch.sent)


async def test_the_approver_sees_every_argument_of_the_call(make_bot: Any) -> None:
    """A padded memo hid the amount after it: the notice read transfer(memo=午饭AA，amount=5 …)."""
    RUNS.clear()
    memo = "午饭AA，amount=5" + " " * 200 + "。" * 300

    def script(req: ModelRequest) -> ModelResponse:
        if any(m["role"] == "tool" for m in req.messages):
            return text("ok")
        return call("transfer", {"memo": memo, "amount": 50000})

    _, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN], bot={"admins": [f"memory:{ADMIN}"]})
    await ch.inject("帮我把午饭钱转了", at_bot=True, user="u1")
    notice = next(m for m in await ch.wait_sent(2) if m.mention == (ADMIN,)).text
    await ch.inject("/pending", user=ADMIN, chat=ch.chat(ADMIN, kind="private"))
    pending = (await ch.wait_sent(3))[2].text
    for shown in (notice, pending):
        assert "amount=50000" in shown and 'memo="午饭AA，amount=5 。' in shown and "共" in shown, shown


async def test_an_admins_approval_does_not_run_the_requesters_own_call_beside_it(make_bot: Any) -> None:
    RUNS.clear()

    def script(req: ModelRequest) -> ModelResponse:
        if any(m["role"] == "tool" for m in req.messages):
            return text("ok")
        return ModelResponse(tool_calls=[ToolCall(id="c1", name="transfer", arguments=json.dumps({"amount": 5})),
                                         ToolCall(id="c2", name="wipe", arguments="{}")], finish_reason="tool_calls")

    bot, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN], bot={"admins": [f"memory:{ADMIN}"]})
    await ch.inject("转5块，顺便清空我的笔记", at_bot=True, user="u1")
    ask = next(m for m in await ch.wait_sent(2) if m.mention == ("u1",))
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await bot.outbox.flush()
    assert RUNS == ["transfer 5"]  # wipe waits for u1 now
    again = next(m for m in ch.sent if "确定要执行 wipe" in m.text)
    await ch.inject(f"/approve {code_in(again.text)}", user="u1")
    await bot.approvals.idle()
    assert RUNS == ["transfer 5", "wipe for u1"]


async def test_a_yes_to_a_later_question_of_the_models_approves_nothing(make_bot: Any) -> None:
    RUNS.clear()

    def script(req: ModelRequest) -> ModelResponse:
        user = str([m for m in req.messages if m["role"] == "user"][-1]["content"])
        if "笔记" in user and not any(m["role"] == "tool" for m in req.messages):
            return call("wipe", {})
        return text("要我帮你查一下北京明天的天气吗？")

    bot, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN])
    private = ch.chat("u1", kind="private")
    await ch.inject("帮我整理笔记", user="u1", chat=private)
    prompt = (await ch.wait_sent(1))[0].text
    await ch.inject("明天要出门", user="u1", chat=private)
    await ch.wait_sent(2)
    await ch.inject("好的", user="u1", chat=private)  # to the weather question
    await ch.wait_sent(3)
    await bot.approvals.idle()
    assert RUNS == []
    await ch.inject(f"/approve {code_in(prompt)}", user="u1", chat=private)  # the code still works
    await bot.approvals.idle()
    assert RUNS == ["wipe for u1"]


async def test_a_yes_right_after_the_prompt_still_confirms(make_bot: Any) -> None:
    RUNS.clear()

    def script(req: ModelRequest) -> ModelResponse:
        return text("已清空") if any(m["role"] == "tool" for m in req.messages) else call("wipe", {})

    bot, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN])
    private = ch.chat("u1", kind="private")
    await ch.inject("清空我的笔记", user="u1", chat=private)
    await ch.wait_sent(1)
    await ch.inject("好的", user="u1", chat=private)
    await bot.approvals.idle()
    assert RUNS == ["wipe for u1"]


async def test_a_deny_typed_while_a_question_waits_is_a_deny_not_the_answer(make_bot: Any) -> None:
    RUNS.clear()
    answers: list[str] = []

    def script(req: ModelRequest) -> ModelResponse:
        user = str([m for m in req.messages if m["role"] == "user"][-1]["content"])
        tools = [m for m in req.messages if m["role"] == "tool"]
        if "笔记" in user and not tools:
            return call("wipe", {})
        if "开会" in user and not tools:
            return call("ask_user", {"tip": "几点开会？", "timeout_s": 600})
        answers.extend(str(t["content"]) for t in tools[-1:])
        return text("好的")

    bot, ch = await make_bot(ScriptedModel(script), plugins=[PLUGIN])
    await ch.inject("清空我的笔记", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)
    await ch.inject("帮我约个开会时间", at_bot=True, user="u1")
    await ch.wait_sent(2)
    await ch.inject(f"/deny {code}", user="u1")
    await ch.wait_sent(3)
    await bot.approvals.idle()
    assert all(r["code"] != code for r in await bot.approvals.store.pending(bot.clock()))  # denied
    await ch.inject("下午三点", user="u1")  # the answer
    await bot.approvals.idle()
    assert "下午三点" in answers and not any("/deny" in a for a in answers) and RUNS == []


PAID: list[int] = []
GATE: dict[str, asyncio.Event] = {}


class PayArgs(BaseModel):
    amount: int = Field(ge=0)


@tool_function(confirm="admin", timeout_s=30)
async def pay(ctx: ToolContext[object], args: PayArgs) -> ToolResult:
    """Pay (an admin approves)."""
    GATE["started"].set()
    await GATE["release"].wait()  # a slow payment API
    PAID.append(args.amount)
    return ToolResult(content=f"paid {args.amount}")


PAY = Plugin("pay", Toolset("pay", [pay]))


def pay_script(req: ModelRequest) -> ModelResponse:
    done = [m for m in req.messages if m["role"] == "tool"]
    return text(f"done: {done[-1]['content']}") if done else call("pay", {"amount": 42})


async def test_a_process_starting_leaves_alone_a_call_another_living_process_is_running(make_bot: Any, pg_url: str,
                                                                          tmp_path: Path) -> None:
    GATE["started"], GATE["release"] = asyncio.Event(), asyncio.Event()
    a, ch = await make_bot(ScriptedModel(pay_script), plugins=[PAY], data_dir=tmp_path / "a", start=False,
                           storage={"url": pg_url}, bot={"admins": ["memory:9"]})
    a.leases.leases.holder = "process-a"
    await a.start()
    await ch.inject("pay 42", at_bot=True, user="u1")
    code = re.search(r"/approve ([A-Z0-9]{5})", (await ch.wait_sent(1))[0].text).group(1)  # type: ignore[union-attr]
    await ch.inject(f"/approve {code}", user="9")
    await asyncio.wait_for(GATE["started"].wait(), 10)  # process A is running the approved call
    chb = MemoryChannel()
    b, _ = await make_bot(ScriptedModel(pay_script), plugins=[PAY], data_dir=tmp_path / "b", start=False,
                          storage={"url": pg_url}, bot={"admins": ["memory:9"]}, channel=chb)
    b.leases.leases.holder = "process-b"
    await b.start()  # a second process starts (scale-out, or a sibling's restart)
    GATE["release"].set()
    await a.approvals.idle()
    await a.outbox.flush()

    def texts(db: Any) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT text FROM outbox").fetchall()]

    def status(db: Any) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT status FROM snapshots").fetchall()]

    await b.outbox.flush()
    await asyncio.sleep(1.0)
    await a.outbox.flush()
    await b.outbox.flush()
    out = [m.text for m in ch.sent] + [m.text for m in chb.sent]
    # It ran, and the requester was told it was interrupted and not run (asking again would pay twice)
    assert PAID == [42] and not any("中断" in t for t in out) and "done: paid 42" in out
    assert await a.db.run(status) == ["resumed"]


async def test_a_call_whose_runner_died_after_this_process_started_is_reported_interrupted(
        make_bot: Any, pg_url: str, tmp_path: Path) -> None:
    # systemd restarts a killed process sooner than its process lease expires: at the restart the dead
    # predecessor still looks alive, so its approved call must be looked at again once the lease lapses.
    PAID.clear()
    a, ch = await make_bot(ScriptedModel(pay_script), plugins=[PAY], data_dir=tmp_path / "a",
                           storage={"url": pg_url}, bot={"admins": ["memory:9"]})
    await ch.inject("pay 42", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)

    def crashed_mid_call(db: Any) -> None:  # approved and running in process-dead, which was then killed
        db.execute("UPDATE snapshots SET status = 'approved', runner = 'process-dead'")
        db.execute("INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, ?, ?, ?)",
                   ["process:process-dead", "process-dead", "2999-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00"])

    await a.db.run(crashed_mid_call)
    await a.stop(flush_timeout_s=0.5)
    chb = MemoryChannel()
    b, _ = await make_bot(ScriptedModel(pay_script), plugins=[PAY], data_dir=tmp_path / "b",
                          storage={"url": pg_url}, bot={"admins": ["memory:9"]}, channel=chb)
    status = "SELECT status FROM snapshots"
    assert await b.db.run(lambda db: [r[0] for r in db.execute(status).fetchall()]) == ["approved"]
    assert await b.approvals.expire_due() <= b.settings.storage.lease_s  # looked at again within a lease
    await b.db.run(lambda db: db.execute("UPDATE leases SET expires_at = '2000-01-01T00:00:00+00:00' "
                                         "WHERE holder = 'process-dead'"))  # the dead lease lapses
    await b.approvals.expire_due()
    assert await b.db.run(lambda db: [r[0] for r in db.execute(status).fetchall()]) == ["interrupted"]
    await chb.inject(f"/approve {code}", user="9", message_id="b-1")  # (ids are one dedupe across processes)
    said = [m.text for m in await chb.wait_sent(2)]
    assert any("中断" in t for t in said) and not any("正在执行" in t for t in said) and PAID == []


def asking(req: ModelRequest) -> ModelResponse:
    done = [m for m in req.messages if m["role"] == "tool"]
    if done:
        return text(f"按 {done[-1]['content']} 来")
    return call("ask_user", {"tip": "几点开始？", "timeout_s": 600}) if "会议室" in str(
        req.messages[-1].get("content")) else text("（一条新消息）")


async def test_an_answer_that_reaches_another_process_resumes_the_paused_run(make_bot: Any, pg_url: str,
                                                                              tmp_path: Path, until: Any) -> None:
    _, cha = await make_bot(ScriptedModel(asking), plugins=[PLUGIN], data_dir=tmp_path / "a", storage={"url": pg_url})
    chb = MemoryChannel()
    b, _ = await make_bot(ScriptedModel(asking), plugins=[PLUGIN], data_dir=tmp_path / "b", storage={"url": pg_url},
                          channel=chb)  # started before A paused the run
    private = cha.chat("u1", "private")
    await cha.inject("帮我订会议室", user="u1", chat=private)
    assert (await cha.wait_sent(1))[0].text == "几点开始？"
    await until(lambda: private.key in b.approvals.watch)  # told by A's notification, no message needed
    await chb.inject("下午三点", user="u1", chat=private, message_id="b-1")  # the answer reaches process B
    await b.approvals.idle()

    def said() -> list[str]:
        return [m.text for m in [*cha.sent, *chb.sent]]

    await until(lambda: "按 下午三点 来" in said())  # (either process may send it)
    assert "（一条新消息）" not in said()
    assert await b.db.run(lambda db: [r[0] for r in db.execute("SELECT status FROM snapshots").fetchall()]) == [
        "resumed"]
