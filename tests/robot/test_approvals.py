"""Approvals and paused runs, through the real pipeline: pause, approve once, deny, expire, ask_user."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from function_calls import (
    Caller,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolContext,
    ToolError,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text
from robot.plugin import Plugin
from robot.snapshots import ALPHABET
from robot.store import iso
from robot.testing import MemoryChannel

ADMIN = "9"
RUNS: list[tuple[str, int]] = []


class TransferArgs(BaseModel):
    amount: int = Field(description="how much", ge=0)


@tool_function(confirm="admin")
async def transfer(ctx: ToolContext[object], args: TransferArgs) -> ToolResult:
    """Move money (an admin must approve)."""
    RUNS.append(("transfer", args.amount))
    return ToolResult(content=f"transferred {args.amount}")


@tool_function(confirm="requester", aliases=["wipe"])
async def wipe(ctx: ToolContext[object]) -> ToolResult:
    """Delete my notes (I confirm myself)."""
    RUNS.append(("wipe", 0))
    return ToolResult.reply(f"wiped for {ctx.caller.user_id}")


PLUGIN = Plugin("risky", Toolset("risky", [transfer, wipe]))


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNS.clear()


def after_tool(done: str) -> Any:
    """A model that calls the tool first, and answers with what the tool said once it has a result."""

    def script(req: ModelRequest) -> ModelResponse:
        tool_msgs = [m for m in req.messages if m["role"] == "tool"]
        if not tool_msgs:
            return call("transfer", {"amount": 42})
        return text(f"{done}: {tool_msgs[-1]['content']}")

    return script


def code_in(message: str) -> str:
    import re

    found = re.search(r"/approve ([A-Z0-9]{5})", message)
    assert found, message
    return found.group(1)


async def start_bot(make_bot: Any, model: Any, data_dir: Path | None = None, **sections: Any) -> tuple[Any, MemoryChannel]:
    bot_section = {"admins": [f"memory:{ADMIN}"], **sections.pop("bot", {})}
    return await make_bot(model, plugins=[PLUGIN], data_dir=data_dir, bot=bot_section, **sections)  # type: ignore[no-any-return]


async def test_model_call_waits_for_an_admin_and_runs_once_after_approval(make_bot: Any) -> None:
    model = ScriptedModel(after_tool("完成"))
    bot, ch = await start_bot(make_bot, model)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    sent = await ch.wait_sent(2)
    [ask] = [m for m in sent if m.mention == ("u1",)]
    [notify] = [m for m in sent if m.mention == (ADMIN,)]
    assert RUNS == []
    assert "需要管理员批准" in ask.text and "transfer(amount=42)" in ask.text
    code = code_in(ask.text)
    assert len(code) == 5 and set(code) <= set(ALPHABET)
    assert notify.mention == (ADMIN,) and code in notify.text  # the approver is @-ed in the chat
    await ch.inject(f"/approve {code}", user="u1")  # the requester cannot approve an admin request
    assert "只有管理员" in (await ch.wait_sent(3))[2].text
    await asyncio.gather(ch.inject(f"/approve {code}", user=ADMIN), ch.inject(f"/approve {code}", user=ADMIN))
    await bot.approvals.idle()
    sent = await ch.wait_sent(6)
    assert RUNS == [("transfer", 42)]  # approved twice, at once: run once
    answers = sorted(m.text for m in sent[3:6])
    assert "已批准，正在执行。" in answers and any("已经" in a or "刚刚" in a for a in answers)
    assert any(m.text == "完成: transferred 42" and m.mention == ("u1",) for m in sent)
    # the model continued from the frozen conversation: its last request holds the real tool result
    assert model.requests[-1].messages[-1] == {"role": "tool", "tool_call_id": model.requests[-1].messages[-2][
        "tool_calls"][0]["id"], "content": "transferred 42"}
    await ch.inject(f"/approve {code}", user=ADMIN)
    assert "执行过" in (await ch.wait_sent(7))[6].text


async def test_deny_tells_the_model_and_the_requester(make_bot: Any) -> None:
    model = ScriptedModel(after_tool("没办成"))
    bot, ch = await start_bot(make_bot, model)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await ch.inject(f"/deny {code} 太多了", user=ADMIN)
    await bot.approvals.idle()
    sent = await ch.wait_sent(5)
    assert RUNS == []
    texts = [m.text for m in sent]
    assert "已拒绝。" in texts and "你的请求已被拒绝（理由：太多了）。" in texts
    assert any(t.startswith("没办成: The approver declined") and "太多了" in t for t in texts)


async def test_requester_confirms_with_a_plain_yes_and_commands_pause_too(make_bot: Any) -> None:
    bot, ch = await start_bot(make_bot, None)
    await ch.inject("/wipe", user="u1")
    ask = (await ch.wait_sent(1))[0].text
    assert "确定要执行 wipe()" in ask and RUNS == []
    await ch.inject("好的", user="u2")  # someone else's yes is just chat
    await ch.inject("好的！", user="u1")  # not addressed to the bot, still the answer
    await bot.approvals.idle()
    sent = await ch.wait_sent(3)
    assert RUNS == [("wipe", 0)]
    assert [m.text for m in sent[1:]] == ["好的，正在执行。", "wiped for u1"]


async def test_an_approved_command_shows_the_tools_own_words_when_it_refuses(make_bot: Any) -> None:
    # After /approve, a ToolError's message for the person became a bare "执行失败了".
    @tool_function(confirm="requester")
    async def pay(ctx: ToolContext[object], args: TransferArgs) -> ToolResult:
        """Pay (I confirm myself)."""
        raise ToolError("insufficient balance", user_message="余额不足：还差 30 元，没有转账。")

    _bot, ch = await make_bot(None, plugins=[Plugin("pay", Toolset("pay", [pay]))])
    await ch.inject("/pay 50", user="u1")
    ask = (await ch.wait_sent(1))[0].text
    await ch.inject(f"/approve {code_in(ask)}", user="u1")
    assert (await ch.wait_sent(3))[-1].text == "余额不足：还差 30 元，没有转账。"


async def test_unknown_foreign_and_repeated_wrong_codes(make_bot: Any) -> None:
    _bot, ch = await start_bot(make_bot, None)
    await ch.inject("/wipe", user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)
    other_chat = ch.chat("g2")
    await ch.inject(f"/approve {code}", user="u3", chat=other_chat)  # a code from another chat reads as unknown
    await ch.inject(f"/approve {code}", user="u3")  # seen in this chat, but not theirs
    sent = await ch.wait_sent(3)
    assert "没有找到这个确认码" in sent[1].text and "只有发起人本人" in sent[2].text
    for i in range(5):
        await ch.inject(f"/approve ZZZZ{ALPHABET[i]}", user="u1")
    await ch.inject(f"/approve {code}", user="u1")  # even the right code waits out the cool-down
    sent = await ch.wait_sent(9)
    assert "输错次数过多" in sent[-1].text and RUNS == []


async def test_an_edited_snapshot_is_refused_and_logged(make_bot: Any, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(after_tool("完成"))
    bot, ch = await start_bot(make_bot, model)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)

    def tamper(db: Any) -> None:
        [row] = list(db.query("SELECT id, state FROM snapshots"))
        state = json.loads(row["state"])
        state["pending"][0]["arguments"] = '{"amount": 7}'
        db.execute("UPDATE snapshots SET state = ? WHERE id = ?", [json.dumps(state), row["id"]])

    await bot.db.run(tamper)
    with caplog.at_level(logging.ERROR):
        await ch.inject(f"/approve {code}", user=ADMIN)
        sent = await ch.wait_sent(3)
    await bot.approvals.idle()
    assert "校验失败" in sent[2].text and RUNS == []
    assert any("integrity" in r.message for r in caplog.records)


async def test_a_paused_run_survives_a_restart_and_runs_once(make_bot: Any, tmp_path: Path) -> None:
    data = tmp_path / "d"
    bot1, ch1 = await start_bot(make_bot, ScriptedModel(after_tool("完成")), data_dir=data)
    await ch1.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch1.wait_sent(1))[0].text)
    await bot1.stop(flush_timeout_s=0.5)
    assert (data / "secret.key").stat().st_mode & 0o777 == 0o600
    bot2, ch2 = await start_bot(make_bot, ScriptedModel(after_tool("重启后完成")), data_dir=data)
    await ch2.inject(f"/approve {code}", user=ADMIN, message_id="after-restart")
    await bot2.approvals.idle()
    sent = await ch2.wait_sent(2)
    assert RUNS == [("transfer", 42)]
    assert any(m.text == "重启后完成: transferred 42" for m in sent)


ASKS: list[str] = []


def asking_model(req: ModelRequest) -> ModelResponse:
    tool_msgs = [m for m in req.messages if m["role"] == "tool"]
    if not tool_msgs:
        return call("ask_user", {"tip": "几点开会？", "timeout_s": 60})
    ASKS.append(tool_msgs[-1]["content"])
    return text(f"收到：{tool_msgs[-1]['content']}")


async def test_ask_user_takes_the_askers_next_message(make_bot: Any) -> None:
    ASKS.clear()
    bot, ch = await start_bot(make_bot, ScriptedModel(asking_model))
    await ch.inject("帮我约个会", at_bot=True, user="u1")
    assert (await ch.wait_sent(1))[0].text == "几点开会？"
    await ch.inject("三点", user="u2")  # another member's chat is not the answer
    await ch.inject("下午三点", user="u1")  # not addressed: still the answer, and routed nowhere else
    await bot.approvals.idle()
    sent = await ch.wait_sent(2)
    assert ASKS == ["下午三点"] and sent[1].text == "收到：下午三点" and len(sent) == 2


async def test_ask_user_times_out_across_a_restart(make_bot: Any, tmp_path: Path) -> None:
    ASKS.clear()
    now = [datetime(2026, 11, 23, 8, 0, tzinfo=UTC)]
    data = tmp_path / "d"
    bot1, ch1 = await start_bot(make_bot, ScriptedModel(asking_model), data_dir=data)
    bot1.clock = lambda: now[0]
    await ch1.inject("帮我约个会", at_bot=True, user="u1")
    await ch1.wait_sent(1)
    await bot1.stop(flush_timeout_s=0.5)
    now[0] += timedelta(seconds=61)
    bot2, ch2 = await start_bot(make_bot, ScriptedModel(asking_model), data_dir=data, start=False)
    bot2.clock = lambda: now[0]
    await bot2.start()
    sent = await ch2.wait_sent(1)
    await bot2.approvals.idle()
    assert ASKS == ["用户暂未回复"] and sent[0].text == "收到：用户暂未回复"


async def test_a_scheduled_run_pauses_in_its_chat_and_resumes_on_approval(make_bot: Any) -> None:
    bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("定时完成")))
    caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group")
    result = await bot.run_scheduled("每天转账", caller, allow=["transfer"])
    assert result is not None and result.stop.value == "awaiting_approval"
    ask = next(m for m in await ch.wait_sent(2) if "/approve" in m.text and m.mention == ("u1",))
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await ch.wait_sent(4)
    assert RUNS == [("transfer", 42)] and any(m.text == "定时完成: transferred 42" for m in ch.sent)


async def test_a_resumed_scheduled_run_keeps_only_the_tools_it_was_allowed(make_bot: Any) -> None:
    """A prompt reminder allowed one tool gets that one tool back after the approval, not every tool."""
    model = ScriptedModel(after_tool("定时完成"))
    bot, ch = await start_bot(make_bot, model)
    caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group")
    await bot.run_scheduled("每天转账", caller, allow=["transfer"])
    offered_before = {t["function"]["name"] for t in model.requests[0].tools}
    ask = next(m for m in await ch.wait_sent(2) if "/approve" in m.text and m.mention == ("u1",))
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await ch.wait_sent(4)
    assert offered_before == {"transfer"}
    assert {t["function"]["name"] for t in model.requests[-1].tools} == {"transfer"}
    assert "wipe" in {t.name for t in bot.offered_tools()}  # offered to chats, not to this run


async def test_pending_lists_mine_and_what_waits_for_me(make_bot: Any) -> None:
    _bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")))
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)
    await ch.inject("/pending", user="u1")
    await ch.inject("/pending", user=ADMIN)
    await ch.inject("/pending", user="u3")
    sent = await ch.wait_sent(5)
    assert code in sent[2].text and "等管理员批准" in sent[2].text
    assert code in sent[3].text and "等你批准" in sent[3].text
    assert sent[4].text == "没有等待中的请求。"


async def test_pending_in_a_group_shows_only_that_groups_requests(make_bot: Any) -> None:
    """A request made in private (its arguments included) is not read out in a group by /pending."""
    _bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")))
    secret_chat = ch.chat("u1", kind="private")
    await ch.inject("转 42 块", user="u1", chat=secret_chat)
    code = code_in((await ch.wait_sent(1))[0].text)
    await ch.inject("/pending", user="u1")  # in the group g1
    await ch.inject("/pending", user=ADMIN)
    await ch.inject("/pending", user="u1", chat=secret_chat)
    await ch.inject("/pending", user=ADMIN, chat=ch.chat(ADMIN, kind="private"))
    sent = await ch.wait_sent(6)
    in_group = [m for m in sent if m.chat == ch.chat()]
    assert len(in_group) == 2 and all(code not in m.text and "amount" not in m.text for m in in_group)
    assert all(m.text == "没有等待中的请求。" for m in in_group)
    assert code in sent[-2].text and code in sent[-1].text  # in private both still see it


async def test_forget_me_leaves_no_copy_in_paused_runs(make_bot: Any, tmp_path: Path) -> None:
    """A snapshot freezes the conversation: /forget me takes the person's finished and waiting ones."""
    data = tmp_path / "data"
    bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")), data_dir=data)
    await ch.inject("转 42 块 keep-me", at_bot=True, user="u2")  # another person's waiting request stays
    await ch.wait_sent(2)
    await ch.inject("转 42 块 PHONE-13812345678", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(4))[2].text)
    await ch.inject(f"/deny {code}", user=ADMIN)
    await bot.approvals.idle()
    await ch.inject("再转 42 块 ADDRESS-幸福路八号", at_bot=True, user="u1")  # this one stays pending
    await ch.wait_sent(9)

    def rows(db: Any) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT state FROM snapshots").fetchall()]

    assert sum("PHONE-13812345678" in r for r in await bot.db.run(rows)) == 2
    await ch.inject("/forget me", user="u1")
    await ch.wait_sent(10)
    left = await bot.db.run(rows)
    assert not any("PHONE-13812345678" in r or "ADDRESS-幸福路八号" in r for r in left)
    assert any("keep-me" in r for r in left)
    raw = b"".join(p.read_bytes() for p in data.iterdir() if p.name.startswith("qunbot.sqlite3"))
    assert "幸福路八号".encode() not in raw and b"PHONE-13812345678" not in raw


async def test_forget_me_takes_the_approvers_notices_that_quote_the_call(make_bot: Any, tmp_path: Path) -> None:
    """The notice to the approvers quotes the requester's call: their /forget me takes it, in a group
    (where the admins are @-ed) and in the admins' private chats (a request made in private)."""
    model = ScriptedModel(lambda req: call("transfer", {"amount": 987654}))
    bot, ch = await start_bot(make_bot, model, data_dir=tmp_path / "data")
    private = ch.chat("u1", kind="private")
    await ch.inject("转账", at_bot=True, user="u1")
    await ch.inject("转账", user="u1", chat=private)
    sent = await ch.wait_sent(4)
    assert sum("987654" in m.text and m.mention == (ADMIN,) for m in sent) == 1  # @-ed in the group
    assert sum("987654" in m.text and m.chat == ch.chat(ADMIN, kind="private") for m in sent) == 1
    await ch.inject("/help", user=ADMIN, chat=ch.chat(ADMIN, kind="private"))
    await ch.inject("/forget me", user="u1")
    await ch.inject("/forget me all", user="u1", chat=private)  # the admin's own conversation is not theirs
    await ch.wait_sent(7)

    def quoted(db: Any) -> list[str]:
        return [str(r[0]) for q in ("SELECT text FROM history", "SELECT text FROM outbox")
                for r in db.execute(q).fetchall() if "987654" in str(r[0])]

    def admins(db: Any) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT text FROM history WHERE chat = ?", [f"memory:private:{ADMIN}"])]

    assert await bot.db.run(quoted) == []
    assert any("/pending" in t for t in await bot.db.run(admins))  # the admin's /help reply stays


async def test_a_resumed_run_refuses_when_the_budget_cannot_be_read(make_bot: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Approved later, the run spends tokens again: a budget store that fails then refuses it (fail closed)."""
    model = ScriptedModel(after_tool("完成"))
    bot, ch = await start_bot(make_bot, model)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    calls = len(model.requests)

    await bot.db.run(lambda tx: tx.execute("DROP TABLE usage_daily"))  # the budget cannot be read
    await ch.inject(f"/approve {code}", user=ADMIN)
    await bot.approvals.idle()
    sent = await ch.wait_sent(4)
    assert RUNS == [] and len(model.requests) == calls  # neither the tool nor the model ran
    assert any("AI 用量" in m.text and m.mention == ("u1",) for m in sent)


async def test_finished_paused_runs_follow_the_history_retention(make_bot: Any, tmp_path: Path, until: Any) -> None:
    """A snapshot holds a copy of the conversation: once finished, it is kept no longer than the history."""
    data = tmp_path / "data"
    bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")), data_dir=data)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await ch.inject(f"/deny {code}", user=ADMIN)
    await bot.approvals.idle()
    await ch.inject("再转 42 块", at_bot=True, user="u2")
    await ch.wait_sent(6)
    old = iso(datetime.now(UTC) - timedelta(days=31))
    await bot.db.transaction(lambda db: db.execute("UPDATE snapshots SET created_at = ?", [old]))  # a month old
    await bot.stop()

    bot, _ = await start_bot(make_bot, ScriptedModel(after_tool("完成")), data_dir=data)

    async def statuses() -> list[str]:
        return [str(r[0]) for r in await bot.db.run(lambda db: db.execute("SELECT status FROM snapshots").fetchall())]

    async def pruned() -> bool:
        return "denied" not in await statuses()

    await until(pruned)
    assert await statuses() == ["pending"]  # a waiting one is not cut short


async def test_a_run_without_approvals_wired_never_runs_a_confirm_tool() -> None:
    from function_calls import Runner

    runner = Runner(ScriptedModel(after_tool("完成")))
    result = await runner.run([{"role": "user", "content": "转"}], Toolset("t", [transfer]))
    assert RUNS == [] and result.stop.value in ("awaiting_approval", "completed")


def test_codes_avoid_ambiguous_characters() -> None:
    assert not set("0O1I") & set(ALPHABET) and len(ALPHABET) == 32
    assert sqlite3.sqlite_version  # the partial unique index on live codes needs SQLite >= 3.8


async def test_qunbot_pending_lists_what_waits(make_bot: Any, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from robot.cli import main

    data = tmp_path / "d"
    # An amount no timestamp on the same line can contain (the expiry "…18:42 UTC" did, one minute in 60).
    model = ScriptedModel(lambda req: call("transfer", {"amount": 987654}) if not any(
        m["role"] == "tool" for m in req.messages) else text("完成"))
    bot, ch = await start_bot(make_bot, model, data_dir=data)
    await ch.inject("转 987654 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await bot.stop(flush_timeout_s=0.5)
    config = tmp_path / "qunbot.toml"
    config.write_text(f'[bot]\ndata_dir = "{data}"\n', encoding="utf-8")
    assert await asyncio.to_thread(main, ["--config", str(config), "pending"]) == 0
    out = capsys.readouterr().out
    assert code in out and "admin approval" in out and "memory:u1 in memory:group:g1" in out
    assert "987654" not in out  # the CLI shows no arguments or state


async def test_a_resumed_run_is_held_against_the_daily_budget(make_bot: Any) -> None:
    from function_calls import Usage

    model = ScriptedModel(after_tool("完成"))
    bot, ch = await start_bot(make_bot, model, limits={"user_burst": 1000, "chat_burst": 1000,
                                                       "user_daily_tokens": 5000})
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    requester = Caller(platform="memory", user_id="u1", chat_id="g1", chat_kind="group")
    await bot.budget.charge(requester, Usage(requests=1, prompt_tokens=6000, completion_tokens=0))
    await ch.inject(f"/approve {code}", user=ADMIN)
    await bot.approvals.idle()
    await bot.outbox.flush()
    assert RUNS == []  # the day's budget is spent: the approved call waits for no model it cannot pay
    assert any("用量" in m.text and m.mention == ("u1",) for m in ch.sent)


def same_ids(*turns: list[tuple[str, dict[str, Any]]]) -> Any:
    """A provider that numbers its calls afresh each turn (``call_0``...), as llama.cpp and some
    OpenAI-compatible builds do: the n-th turn makes ``turns[n]``'s calls, then it reports the results."""

    def script(req: ModelRequest) -> ModelResponse:
        done = [m for m in req.messages if m["role"] == "tool"]
        asked = sum(1 for m in req.messages if m.get("tool_calls"))
        if asked < len(turns):
            return ModelResponse(tool_calls=[ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args))
                                             for i, (name, args) in enumerate(turns[asked])], finish_reason="tool_calls")
        return text("结果：" + " | ".join(str(m["content"]) for m in done))

    return script


@pytest.mark.parametrize("amount", [5000, 42])
async def test_a_verdict_answers_its_own_call_once_not_a_later_call_with_the_same_id(
        make_bot: Any, amount: int) -> None:
    """An admin approves ``transfer(42)`` (``call_0``); the resumed run's next call is ``call_0`` again:
    another transfer, or the very same one, waits for its own approval."""
    bot, ch = await start_bot(make_bot, ScriptedModel(same_ids([("transfer", {"amount": 42})],
                                                               [("transfer", {"amount": amount})])))
    await ch.inject("转 42 块", at_bot=True, user="u1")
    ask = next(m for m in await ch.wait_sent(2) if m.mention == ("u1",))
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await ch.wait_sent(5)
    assert RUNS == [("transfer", 42)]
    [again] = await bot.approvals.store.pending(bot.clock())
    assert again["approver"] == "admin" and f"transfer(amount={amount})" in ch.sent[-2].text + ch.sent[-1].text


async def test_an_answer_to_ask_user_does_not_approve_a_call_paused_beside_it(make_bot: Any) -> None:
    """``ask_user`` and an admin's tool in one turn: the requester's answer (or its timeout) resumes the
    question only; the transfer then waits for an admin."""
    bot, ch = await start_bot(make_bot, ScriptedModel(same_ids(
        [("ask_user", {"tip": "转给谁？", "timeout_s": 60}), ("transfer", {"amount": 1000})])))
    await ch.inject("帮我转 1000 块", at_bot=True, user="u1")
    assert (await ch.wait_sent(1))[0].text == "转给谁？"
    await ch.inject("张三", user="u1")
    await bot.approvals.idle()
    sent = await ch.wait_sent(3)
    assert RUNS == []
    ask = next(m for m in sent if "需要管理员批准" in m.text)
    assert "transfer(amount=1000)" in ask.text and "ask_user" not in ask.text
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await ch.wait_sent(5)
    assert RUNS == [("transfer", 1000)]
    assert any(m.text == "结果：张三 | transferred 1000" for m in ch.sent)


async def test_a_resumed_run_is_told_the_time_it_resumes_at_not_the_time_it_paused(make_bot: Any) -> None:
    """Approved 50 minutes later: "in 20 minutes" must count from now (it counted from the pause)."""
    now = [datetime(2026, 11, 23, 8, 0, tzinfo=UTC)]  # 16:00 in Shanghai
    model = ScriptedModel(after_tool("完成"))
    bot, ch = await start_bot(make_bot, model)
    bot.clock = lambda: now[0]
    await ch.inject("转 42 块", at_bot=True, user="u1")
    ask = next(m for m in await ch.wait_sent(2) if m.mention == ("u1",))
    now[0] += timedelta(minutes=50)
    await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
    await bot.approvals.idle()
    await ch.wait_sent(4)
    first, resumed = (str(r.messages[0]["content"]) for r in (model.requests[0], model.requests[-1]))
    assert "2026-11-23 16:00" in first and "2026-11-23 16:50" in resumed
    assert resumed.replace("16:50", "16:00") == first  # the rest of it unchanged


@pytest.mark.parametrize("gap", ["\u3000", "\n"])
async def test_deny_takes_its_reason_after_a_full_width_space_or_a_new_line(make_bot: Any, gap: str) -> None:
    bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("没办成")))
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await ch.inject(f"/deny {code}{gap}太多了", user=ADMIN)
    await bot.approvals.idle()
    sent = [m.text for m in await ch.wait_sent(4)]
    assert "已拒绝。" in sent and "你的请求已被拒绝（理由：太多了）。" in sent and RUNS == []


async def test_an_answer_to_ask_user_is_held_to_the_message_size_limit(make_bot: Any) -> None:
    """An addressed message over max_message_chars is refused; an answer went to the model whole."""
    ASKS.clear()
    bot, ch = await start_bot(make_bot, ScriptedModel(asking_model), limits={"max_message_chars": 100})
    await ch.inject("帮我约个会", at_bot=True, user="u1")
    await ch.wait_sent(1)
    await ch.inject("三" * 5000, user="u1")
    await bot.approvals.idle()
    await ch.wait_sent(2)
    assert ASKS == ["三" * 100]


async def test_a_full_width_code_approves_and_a_malformed_one_does_not_lock_the_admin_out(make_bot: Any) -> None:
    """A code typed in an IME's full-width mode (the command name already was read so) approves at once;
    text that is no code at all is answered as such and is no guess: five of them lock nobody out."""
    bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")))
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    for typo in ("0O1IL", "好的", "ABC", "ABCDEF", "—"):  # 0, O, 1, I are never in a code
        await ch.inject(f"/approve {typo}", user=ADMIN)
    sent = await ch.wait_sent(7)
    assert all("不是确认码" in m.text for m in sent[2:7]), [m.text for m in sent[2:7]]
    full_width = "".join(chr(ord(c) + 0xFEE0) for c in code.lower())
    await ch.inject(f"／ａｐｐｒｏｖｅ　{full_width}。", user=ADMIN)
    await bot.approvals.idle()
    sent = await ch.wait_sent(9)
    assert "已批准，正在执行。" in [m.text for m in sent[7:]] and RUNS == [("transfer", 42)]


class Accounts(MemoryChannel):
    """A platform with per-account connections (as OneBot's): a private chat leaves through one account."""

    account_leases = True


async def test_approvers_on_another_platform_are_told_privately_and_the_unreachable_are_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Approvers only on other platforms: each hears of the request in their private chat there, through
    the platform's one account; one whose platform has no channel, or several accounts, is skipped and logged."""
    from robot.bot import Bot
    from robot.config import Settings

    home, chat2, multi = MemoryChannel(), MemoryChannel("chat2"), Accounts("multi")
    bot = Bot(Settings(bot={"data_dir": tmp_path, "admins": ["chat2:boss", "multi:b2", "gone:b3"]},
                       limits={"user_burst": 1000, "chat_burst": 1000}),
              model=ScriptedModel(after_tool("完成")), channels=[home, chat2, multi], plugins=[PLUGIN])
    await bot.start()
    try:
        leases = bot.leases.leases
        assert await leases.acquire("account:multi:self1")  # its only account (a live process holds it)
        await home.inject("转 42 块", at_bot=True, user="u1")
        ask = (await home.wait_sent(1))[0]
        code = code_in(ask.text)
        assert "已通知管理员" in ask.text
        [notice] = await chat2.wait_sent(1)
        assert notice.chat == chat2.chat("boss", kind="private") and f"/approve {code}" in notice.text

        def queued(db: Any) -> list[tuple[str, str]]:
            return [(str(r["chat"]), str(r["account"])) for r in db.query(
                "SELECT chat, account FROM outbox WHERE platform = 'multi'", [])]

        assert await bot.db.run(queued) == [("multi:private:b2", "self1")]
        await chat2.inject(f"/approve {code}", user="boss", chat=chat2.chat("boss", kind="private"))
        await bot.approvals.idle()
        assert RUNS == [("transfer", 42)]

        assert await leases.acquire("account:multi:self2")  # two accounts: which one knows b2 is a guess
        with caplog.at_level(logging.WARNING):
            await home.inject("再转 42 块", at_bot=True, user="u1")
            await chat2.wait_sent(3)
        assert len(await bot.db.run(queued)) == 1
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert "multi:b2" in logged and "gone:b3" in logged
    finally:
        await bot.stop(flush_timeout_s=0.5)


async def test_a_requester_whose_request_reaches_no_approver_is_told_so(make_bot: Any) -> None:
    _bot, ch = await start_bot(make_bot, ScriptedModel(after_tool("完成")), bot={"admins": ["gone:b3"]})
    await ch.inject("转 42 块", at_bot=True, user="u1")
    [ask] = await ch.wait_sent(1)
    assert "已通知" not in ask.text and "没有能通知到的管理员" in ask.text and "/approve " in ask.text
    assert "30 分钟" in ask.text


async def test_an_answer_reaches_the_question_behind_the_askers_own_newer_confirmation(make_bot: Any) -> None:
    """ask_user waits for u1; then u1's /wipe waits for their own 确认: "100" is no yes, so it answers the question."""
    ASKS.clear()
    bot, ch = await start_bot(make_bot, ScriptedModel(asking_model))
    await ch.inject("帮我约个会", at_bot=True, user="u1")
    await ch.inject("/wipe", user="u1")
    assert "确定要执行 wipe()" in (await ch.wait_sent(2))[1].text
    await ch.inject("100", user="u1")
    await bot.approvals.idle()
    assert ASKS == ["100"] and (await ch.wait_sent(3))[2].text == "收到：100"
    assert [r["kind"] for r in await bot.approvals.store.pending(bot.clock())] == ["approval"]  # /wipe still waits
    assert RUNS == []


async def test_a_stop_right_after_an_approved_call_ran_reports_it_ran_never_to_ask_again(
        make_bot: Any, tmp_path: Path) -> None:
    """A deploy stops the bot while the model's turn after an approved transfer is still out: the requester
    hears it ran (asking again would pay twice), at the stop or at the next start, never "请重新发起"."""

    async def slow_after_tool(req: ModelRequest) -> ModelResponse:
        if not any(m["role"] == "tool" for m in req.messages):
            return call("transfer", {"amount": 42})
        await asyncio.sleep(60)  # a slow provider: the stop does not wait for it
        return text("已转账")

    data = tmp_path / "d"
    bot, ch = await start_bot(make_bot, ScriptedModel(slow_after_tool), data_dir=data)
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await ch.inject(f"/approve {code}", user=ADMIN)
    async with asyncio.timeout(5):
        while RUNS != [("transfer", 42)]:
            await asyncio.sleep(0.01)
    await bot.stop(flush_timeout_s=0.3)
    bot2, ch2 = await start_bot(make_bot, ScriptedModel(after_tool("完成")), data_dir=data, start=False)
    bot2.leases.leases.holder = "the-next-process"
    await bot2.start()
    await bot2.outbox.flush()  # (a start reports what it finds at once)
    said = [m.text for m in [*ch.sent, *ch2.sent]]
    assert RUNS == [("transfer", 42)]
    assert not any("重新发起" in t for t in said), said
    assert sum("已经执行" in t and "transfer(amount=42)" in t for t in said) == 1, said


def wipe_plugin(confirm: str, unavailable: str | None = None) -> Plugin[Any]:
    @tool_function(name="wipe", confirm=confirm)  # type: ignore[arg-type]
    async def wipe_notes(ctx: ToolContext[object]) -> ToolResult:
        """Delete the group's notes."""
        RUNS.append(("wipe", 0))
        return ToolResult.reply("已清空群笔记")

    async def setup(bot: Any) -> object:
        return bot

    return Plugin("notes", Toolset("notes", [wipe_notes]), setup=setup,
                  unavailable=(lambda deps: unavailable) if unavailable else None)


async def test_an_approved_command_whose_tool_now_needs_an_admin_waits_for_one(make_bot: Any, tmp_path: Path) -> None:
    """/wipe paused for the requester's own yes; the tool then became confirm="admin" (a restart): their
    yes no longer runs it, an admin's approval does; a tool unavailable since is not run either."""
    data, admins = tmp_path / "d", {"admins": [f"memory:{ADMIN}"]}
    bot, ch = await make_bot(None, plugins=[wipe_plugin("requester")], data_dir=data, bot=admins)
    await ch.inject("/wipe", user="u1")
    code = code_in((await ch.wait_sent(1))[0].text)
    await ch.inject("/wipe", user="u1", message_id="second")
    second = code_in((await ch.wait_sent(2))[1].text)
    await bot.stop(flush_timeout_s=0.3)
    bot, ch = await make_bot(None, plugins=[wipe_plugin("admin")], data_dir=data, bot=admins)
    await ch.inject(f"/approve {code}", user="u1", message_id="b2-1")
    await bot.approvals.idle()
    await bot.outbox.flush()
    assert RUNS == []
    again = next(m.text for m in ch.sent if "需要管理员批准" in m.text)
    await ch.inject(f"/approve {code_in(again)}", user=ADMIN, message_id="b2-2")
    await bot.approvals.idle()
    await ch.wait_sent(5)
    assert RUNS == [("wipe", 0)] and "已清空群笔记" in [m.text for m in ch.sent]
    await bot.stop(flush_timeout_s=0.3)
    RUNS.clear()
    bot, ch = await make_bot(None, plugins=[wipe_plugin("requester", unavailable="没有配置 API key")],
                             data_dir=data, bot=admins)
    await ch.inject(f"/approve {second}", user="u1", message_id="b3-1")
    await bot.approvals.idle()
    sent = await ch.wait_sent(2)
    assert RUNS == [] and any("暂不可用" in m.text for m in sent)


async def test_a_run_paused_in_a_chat_the_gate_now_ignores_ends_without_the_model_or_a_message_there(
        make_bot: Any, tmp_path: Path) -> None:
    """The owner closed the group ([gate] allowlist) after runs paused there: an approval runs nothing and
    tells the approver; a question's timeout asks no model; nothing goes into the group."""
    ASKS.clear()
    now = [datetime.now(UTC)]

    def script(req: ModelRequest) -> ModelResponse:
        if "约" in str(req.messages[-1].get("content")):
            return call("ask_user", {"tip": "几点开会？", "timeout_s": 60})
        return after_tool("完成")(req) if not ASKS else text("-")

    data = tmp_path / "d"
    bot, ch = await start_bot(make_bot, ScriptedModel(script), data_dir=data, gate={"allowlist": ["memory:g1"]})
    bot.clock = lambda: now[0]
    await ch.inject("转 42 块", at_bot=True, user="u1")
    code = code_in((await ch.wait_sent(2))[0].text)
    await ch.inject("帮我约个会", at_bot=True, user="u2")
    await ch.wait_sent(3)
    await bot.stop(flush_timeout_s=0.3)
    model = ScriptedModel(script)
    bot, ch = await start_bot(make_bot, model, data_dir=data, gate={"allowlist": ["memory:g2"]}, start=False)
    bot.clock = lambda: now[0]
    await bot.start()
    admin_dm = ch.chat(ADMIN, kind="private")
    await ch.inject(f"/approve {code}", user=ADMIN, chat=admin_dm, message_id="b2-1")
    await bot.approvals.idle()
    [answer] = await ch.wait_sent(1)
    assert answer.chat == admin_dm and "没有执行" in answer.text
    now[0] += timedelta(seconds=61)  # the question times out
    await bot.approvals.expire_due()
    await bot.approvals.idle()
    await bot.outbox.flush()
    assert RUNS == [] and model.requests == [] and len(ch.sent) == 1
    statuses = await bot.db.run(lambda db: [r[0] for r in db.execute("SELECT status FROM snapshots")])
    assert "pending" not in statuses and "approved" not in statuses


async def test_a_reply_tools_message_sent_at_the_pause_is_not_sent_again_when_the_run_resumes(make_bot: Any) -> None:
    """A note (its own reply) and a transfer in one turn: the note's message went out with the pause; the
    approval and a second pause do not repeat it."""
    from .conftest import note

    def script(req: ModelRequest) -> ModelResponse:
        done = [m for m in req.messages if m["role"] == "tool"]
        if not done:
            return call("note", {"text": "买牛奶"}, ("transfer", {"amount": 42}))
        if len(done) == 2:
            return call("transfer", {"amount": 7})
        return text("转账完成")

    bot, ch = await make_bot(ScriptedModel(script), plugins=[Plugin("risky", Toolset("risky", [transfer, note]))],
                             bot={"admins": [f"memory:{ADMIN}"]})
    await ch.inject("记下买牛奶并转 42", at_bot=True, user="u1")
    for amount in (42, 7):
        await bot.outbox.flush()
        ask = next(m for m in ch.sent if f"amount={amount}" in m.text and m.mention == ("u1",))
        await ch.inject(f"/approve {code_in(ask.text)}", user=ADMIN)
        await bot.approvals.idle()
    await bot.outbox.flush()
    texts = [m.text for m in ch.sent]
    assert RUNS == [("transfer", 42), ("transfer", 7)] and "转账完成" in texts
    assert sum("noted for" in t for t in texts) == 1, texts


async def test_an_answer_reaches_the_model_after_ask_user_was_turned_off(make_bot: Any, tmp_path: Path) -> None:
    """A question waits; the owner sets [approvals] ask_user = false and restarts: the answer still resolves
    the question the run paused at (the model hears it, not "Unknown tool")."""
    ASKS.clear()
    data = tmp_path / "d"
    bot, ch = await start_bot(make_bot, ScriptedModel(asking_model), data_dir=data)
    await ch.inject("帮我约个会", at_bot=True, user="u1")
    assert (await ch.wait_sent(1))[0].text == "几点开会？"
    await bot.stop(flush_timeout_s=0.3)
    bot, ch = await start_bot(make_bot, ScriptedModel(asking_model), data_dir=data, approvals={"ask_user": False})
    await ch.inject("下午三点", user="u1", message_id="b2-1")
    await bot.approvals.idle()
    assert ASKS == ["下午三点"] and (await ch.wait_sent(1))[0].text == "收到：下午三点"
