"""Resuming a paused run (see :mod:`robot.approvals`) once its row was claimed.

The approved calls run once, each recorded on the row as it starts and as it ends (``ran``): a run broken off
after them (a stop, a crash) is reported as run, or as maybe run, never as one to ask for again (that paid
twice). The run goes on from its frozen state, and its replies leave through the outbox in the transaction
that ends the row. A row whose chat the gate now ignores ends with no model call and no message there; a
``/command`` whose tool now needs another approver waits anew for that one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from function_calls import Caller, RunState, StopReason, ToolCall, ToolError
from robot import snapshots
from robot.ask_user import GRANT, NO_REPLY, Grant, ask_user
from robot.commands import refusal
from robot.limits import BudgetExceeded
from robot.message import ChatRef, OutgoingMessage
from robot.snapshots import Row, SnapshotStore, describe_call
from robot.storage import Tx

if TYPE_CHECKING:
    from robot.approvals import Approvals
    from robot.bot import Bot

__all__ = ["RESUMING", "grants", "interrupted_text", "outgoing", "resume", "send"]

log = logging.getLogger(__name__)
#: The approval row a resumed run answers for: its approved calls are recorded on it as they start.
RESUMING: ContextVar[str | None] = ContextVar("qunbot_resuming", default=None)


def outgoing(row: Row, text: str, key: str) -> OutgoingMessage:
    """A message to the row's requester in the row's chat (an @ in a group)."""
    chat = ChatRef.from_key(str(row["chat"]))
    if row.get("account") and "account" in ChatRef.model_fields:
        chat = chat.model_copy(update={"account": row["account"]})
    requester = str(row["requester"]).split(":", 1)[-1]
    return OutgoingMessage(key=key, chat=chat, text=text, mention=(requester,) if chat.kind == "group" else (),
                           reply_to=row.get("reply_to"))


async def send(approvals: Approvals, row: Row, text: str, *, suffix: str) -> None:
    """Queue one message to the row's requester, unless the gate ignores its chat now."""
    if not approvals.bot.ignores(ChatRef.from_key(str(row["chat"]))):
        await approvals.bot.outbox.enqueue(outgoing(row, text, f"snapshot:{row['id']}:{suffix}"))


def interrupted_text(row: Row) -> str:
    """What the requester of an approved row broken off mid-run is told: what ran, what may have."""
    try:
        calls = json.loads(str(row["ran"])) if row.get("ran") else None
    except ValueError:
        calls = [{"call": "（记录无法读取）"}]
    if not calls:
        return ("上次批准的操作在执行中被中断，为安全起见没有重试，请重新发起。" if calls is None else
                "上次批准的操作在执行中被中断，可能已经执行了：请先核实结果，不要直接再次发起。")
    done = [f"{c['call']}（结果：{c['result']}）" for c in calls if "result" in c]
    maybe = [str(c["call"]) for c in calls if "result" not in c]
    said = ([f"已经执行：{'；'.join(done)}"] if done else []) + (
        [f"可能已经执行（结果未知，请先核实）：{'；'.join(maybe)}"] if maybe else [])
    return f"上次批准的操作{'，'.join(said)}。之后的回复被中断了，请不要直接再次发起。"


def grants(bot: Bot, row: Row, call: ToolCall) -> bool:
    """Whether ``row``'s verdict answers ``call``: an answer the questions, an admin's the admin calls, the
    requester's their own. A call paused beside them pauses anew, for its own approver (an answer, or its
    timeout, ran an admin's call; an admin's approval ran the requester's own wipe they never confirmed)."""
    tool = bot.tools.get(call.name)
    return tool is not None and tool.confirm == ("input" if row["kind"] == "input" else row["approver"])


async def resume(approvals: Approvals, row: Row, verdict: bool | str, *, answer: str | None,
                 notice: str | None) -> None:
    """Run a claimed row on with ``verdict`` (True, or a refusal told to the model) and end it."""
    bot, row_id = approvals.bot, str(row["id"])
    chat = ChatRef.from_key(str(row["chat"]))
    if bot.ignores(chat):  # closed since it paused ([gate]): no model, no message there
        log.info("snapshot %s: the gate ignores %s now; ended without running", row_id, chat.key)
        await approvals.store.transition(row_id, "refused", frm="approved", now=bot.clock())
        return
    state = RunState.model_validate_json(str(row["state"]))
    state.user_messages = []  # a reply tool's messages went out with the pause
    caller = snapshots.stored_caller(row, bot.is_admin)
    if notice:
        await send(approvals, row, notice, suffix="notice")
    if row["origin"] == "command":
        replies = await _run_command(approvals, row, state.pending, caller, chat) if verdict is True else []
    elif bot.router is None:
        replies = ["暂时无法继续：没有配置大模型。"]
    else:
        replies = await _run_on(approvals, row, state, verdict, answer, caller, chat)
    messages = [outgoing(row, t, f"snapshot:{row_id}:{i}") for i, t in enumerate(replies) if t.strip()]

    def commit(db: Tx) -> None:
        # The replies and the end of the snapshot commit together: a crash re-sends neither.
        bot.outbox.enqueue_many_sync(db, messages)
        SnapshotStore.finish_sync(db, row_id)

    await bot.db.transaction(commit)
    for platform in {m.chat.platform for m in messages}:
        bot.outbox.notify(platform)
    await approvals.announce()


async def _run_on(approvals: Approvals, row: Row, state: RunState, verdict: bool | str, answer: str | None,
                  caller: Caller, chat: ChatRef) -> list[str]:
    """The model's run from where it paused; its replies (a new pause's prompt among them)."""
    bot, row_id = approvals.bot, str(row["id"])
    assert bot.router is not None
    # Only what the paused run was offered, if still offered (a row from before: its calls' tools)
    names = set(json.loads(row["tools"]) if row.get("tools") else (c.name for c in state.pending))
    if row["kind"] == "input":
        _answer(state, answer)
    verdicts = {(c.id, c.name, c.arguments): verdict for c in state.pending if grants(bot, row, c)}
    if state.messages and state.messages[0].get("role") == "system":  # the time now, not the pause's
        state.messages[0] = {"role": "system", "content": bot.router.retime(
            str(state.messages[0]["content"]), bot.zone_for(chat), bot.clock())}
    grant = Grant(verdicts=dict(verdicts), answer=answer)
    recording = row["kind"] == "approval" and verdict is True

    async def ran(event: dict[str, Any]) -> None:  # an approved call's result, on the row as it comes
        key = (event.get("call_id"), event.get("name"), event.get("arguments"))
        if recording and event.get("type") == "tool" and key in verdicts and key not in grant.verdicts:
            what = describe_call(ToolCall(id=str(key[0]), name=str(key[1]), arguments=str(key[2])))
            await approvals.store.ran(row_id, what, str(event.get("result", ""))[:120])

    token, running = GRANT.set(grant), RESUMING.set(row_id if recording else None)
    try:  # held like any request's run (see Pipeline.run_llm): a budget that cannot be read refuses
        with bot.tool_scope(names):
            async with bot.budget.for_run(caller, bot.settings.llm.max_run_tokens):
                result = await bot.router.runner.run(
                    state, bot.offered_tools(), caller=caller, deps_for=bot.deps_for, zone=bot.zone_for(chat),
                    clock=bot.clock, on_event=ran)
    except BudgetExceeded as exc:
        return [exc.user_message]
    finally:
        GRANT.reset(token)
        RESUMING.reset(running)
    if result.stop is StopReason.AWAITING_APPROVAL:  # another confirm tool
        return [*result.state.user_messages, await approvals.pause(
            result, caller, chat, tools=names, origin=str(row["origin"]), reply_to=row.get("reply_to"))]
    return list(result.replies)


def _answer(state: RunState, answer: str | None) -> None:
    """The core ``ask_user`` calls the run paused at, answered in place: whatever ``[approvals] ask_user`` says
    now (switched off since, the answer reached the model as "Unknown tool")."""
    asked = {c.id for c in state.pending if c.name == ask_user.name}
    for i in reversed(range(len(state.messages))):  # an id-less provider reuses ids: the latest answer is it
        message = state.messages[i]
        if message.get("role") == "tool" and message.get("tool_call_id") in asked:
            state.messages[i] = {**message, "content": answer or NO_REPLY}
            asked.discard(message["tool_call_id"])
    state.pending = [c for c in state.pending if c.name != ask_user.name]


async def _run_command(approvals: Approvals, row: Row, calls: Sequence[ToolCall], caller: Caller,
                       chat: ChatRef) -> list[str]:
    """An approved ``/command``'s call, checked as it is now: gone, refused or unavailable, it does not run;
    its tool needing another approver now (confirm="admin" since), it waits for that one."""
    bot, row_id, out = approvals.bot, str(row["id"]), []
    for call in calls:
        tool = bot.tools.get(call.name)
        tool = None if tool is not None and tool.confirm == "input" else tool  # (no command: see Pipeline)
        off = bot.unavailable_tools().get(call.name)
        refused = f"/{call.name} 已不存在，没有执行。" if tool is None else refusal(tool, caller) or (
            f"/{call.name} 暂不可用：{off}，没有执行。" if off else None)  # (an admin removed since: no longer theirs)
        if tool is None or refused:
            out.append(str(refused))
            continue
        if tool.confirm and not grants(bot, row, call):
            out.append(await approvals.pause_command(tool, json.loads(call.arguments or "{}"), caller, chat,
                                                     row.get("reply_to")))
            continue
        what = describe_call(call)
        await approvals.store.ran(row_id, what)
        try:
            result = await bot.invoke_tool(tool, tool.parse_arguments(call.arguments), caller, bot.zone_for(chat),
                                           via="command", run_id="command", call_id=call.id)
        except Exception as exc:  # a ToolError's words for the person are the tool's own (as Pipeline.run_command)
            log.warning("approved command %s failed: %s", call.name, type(exc).__name__)
            said = exc.user_message or exc.message if isinstance(exc, ToolError) else f"/{call.name} 执行失败了。"
            await approvals.store.ran(row_id, what, said[:120])
            out.append(said)
            continue
        await approvals.store.ran(row_id, what, (result.content or "\n".join(result.user_messages))[:120])
        out.extend(result.user_messages or (result.content,))
    return out
