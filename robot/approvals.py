"""Paused runs: pausing at a ``confirm`` tool or ``ask_user``, deciding, expiring and resuming.

A run that reaches a ``confirm`` tool (or ``ask_user``) stops with ``AWAITING_APPROVAL``; the
bot freezes it as a snapshot (:mod:`robot.snapshots`) with a five-character code. Whoever is
entitled presents the code (``/approve LQ5RZ``); the row moves ``pending -> approved`` in one
guarded UPDATE, so two approvals (or two processes) resume it exactly once; the frozen chain
continues and its replies go out through the outbox in the transaction that ends the snapshot.
A crash after the claim and before the run finished does not re-run the call (such rows are
reported as interrupted once their process is known dead: at the next start, or by a living process
within about ``[storage] lease_s`` of its lease lapsing, with what its calls did: see
:mod:`robot.approvals_resume`): a risky call runs at most once.

Only calls that need a person create a snapshot; ordinary multi-step chains never do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import unicodedata
import uuid
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from function_calls import Caller, RunResult, RunState, Tool, ToolCall
from robot import approvals_resume as resuming
from robot.approvals_panel import PANEL, PendingPanel, admin_prompt, approver_notices, pending_text
from robot.approvals_watch import AnswerWatch
from robot.ask_user import GRANT, AskUserArgs
from robot.config import ApprovalsSection
from robot.message import ChatRef, OutgoingMessage
from robot.snapshots import ALPHABET, Row, SnapshotStore, describe_call, load_secret
from robot.store import iso, parse_iso

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["Approvals"]

log = logging.getLogger(__name__)
_YES = frozenset({"确认", "确定", "好的", "好", "是", "是的", "可以", "yes", "y", "ok", "okay"})
_PUNCT = " \t\r\n。.!！~～,，"

class Approvals:
    """The bot's paused runs: pause, decide, answer, expire, resume."""

    def __init__(self, bot: Bot, settings: ApprovalsSection, secret_path: Path | None) -> None:
        self.bot = bot
        self.settings = settings
        self.secret_path = secret_path
        self.store = SnapshotStore(bot.db)
        self._wrong: dict[tuple[str, str], list[float]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resuming: set[asyncio.Task[None]] = set()
        self._notices: list[OutgoingMessage] = []
        #: Chat keys with a pending input or requester snapshot (any process's): only their messages are looked up.
        self.watch = AnswerWatch(self.store)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.secret_path is not None:
            self.store.secret = await asyncio.to_thread(load_secret, self.secret_path)
        else:
            self.store.secret = secrets.token_bytes(32)  # an in-memory bot: its snapshots die with it
        await self._interrupt_orphans()
        self.watch.follow(self.bot.db)
        await self.watch.reload()
        self.bot.panels.setdefault(PANEL, PendingPanel(self))  # the web playground's approve/deny buttons
        self._task = asyncio.create_task(self._expiry_loop(), name="qunbot-snapshots")

    def _spawn(self, row: Row, verdict: bool | str, *, answer: str | None = None, notice: str | None = None) -> None:
        task = asyncio.create_task(self._resume_logged(row, verdict, answer=answer, notice=notice),
                                   name=f"resume-{row['id']}")
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait for resumed runs in flight (stop, and tests)."""
        if self._resuming:
            await asyncio.wait(set(self._resuming), timeout=timeout)

    async def stop(self, timeout: float = 5.0) -> None:
        """Wait ``timeout`` for resumed runs, then break them off before the store closes: what their
        approved calls did is reported now (a run left behind was reported at the next start as not run)."""
        await self.idle(timeout)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        left = set(self._resuming)
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
            try:
                await self._interrupt_orphans(mine=True)
            except Exception:
                log.exception("reporting the resumed runs broken off failed")

    # --- the runner's approver --------------------------------------------------------------
    async def approver(self, call: ToolCall, tool: Tool, caller: Caller) -> bool | str | None:
        """Inside a resumed run, the recorded verdict; otherwise pause (None)."""
        grant = GRANT.get()
        verdict = None if grant is None else grant.verdicts.pop((call.id, call.name, call.arguments), None)
        if verdict is True and (row_id := resuming.RESUMING.get()) is not None:
            await self.store.ran(row_id, describe_call(call))  # before it runs: broken off now, it may have run
        return verdict

    # --- pausing ----------------------------------------------------------------------------
    async def pause(self, result: RunResult, caller: Caller, chat: ChatRef, *, tools: Iterable[str],
                    origin: str = "chat", reply_to: str | None = None) -> str:
        """Freeze a run stopped for a person (``tools``: what it was offered, all its resume gets);
        returns the message for the requester (with the code)."""
        offered = sorted(set(tools))
        pending = result.state.pending
        used = [self.bot.tools.get(c.name) for c in pending]
        kinds = {t.confirm for t in used if t is not None}
        tip: str | None = None
        if "input" in kinds:
            kind, approver = "input", "requester"
            ask = next(c for c, t in zip(pending, used, strict=True) if t is not None and t.confirm == "input")
            try:
                parsed = AskUserArgs.model_validate_json(ask.arguments or "{}")
                tip, ttl = parsed.tip, timedelta(seconds=parsed.timeout_s)
            except ValueError:
                tip, ttl = "请回复", timedelta(seconds=300)
        else:
            kind = "approval"
            approver = "admin" if "admin" in kinds or not kinds else "requester"
            ttl = timedelta(minutes=self.settings.ttl_minutes)
        return await self._store(kind, approver, caller, chat, result.state, origin, reply_to, tip, ttl, offered)

    async def pause_command(self, tool: Tool, arguments: dict[str, Any], caller: Caller, chat: ChatRef,
                            reply_to: str | None) -> str:
        """A ``confirm`` tool typed as a /command: the call itself waits for the approval."""
        call = ToolCall(id=f"cmd-{uuid.uuid4().hex[:8]}", name=tool.name,
                        arguments=json.dumps(arguments, ensure_ascii=False))
        approver = "requester" if tool.confirm == "requester" else "admin"
        return await self._store("approval", approver, caller, chat, RunState(messages=[], pending=[call]),
                                 "command", reply_to, None, timedelta(minutes=self.settings.ttl_minutes), [tool.name])

    async def _store(self, kind: str, approver: str, caller: Caller, chat: ChatRef, state: RunState, origin: str,
                     reply_to: str | None, tip: str | None, ttl: timedelta, tools: list[str]) -> str:
        now = self.bot.clock()
        code = await self.store.insert({
            "kind": kind, "approver": approver, "requester": caller.qualified_user, "chat": chat.key,
            "account": str(getattr(chat, "account", "") or ""), "caller": caller.model_dump_json(),
            "state": state.model_dump_json(), "origin": origin, "reply_to": reply_to, "tip": tip,
            "created_at": iso(now), "expires_at": iso(now + ttl), "tools": json.dumps(tools, ensure_ascii=False),
        })
        if kind == "input" or approver == "requester":
            self.watch.add(chat.key)
        self._wake.set()
        log.info("run paused for %s (%s)", caller.qualified_user, kind)
        if kind == "input":
            return str(tip)
        what = "；".join(describe_call(c) for c in state.pending)
        minutes = self.settings.ttl_minutes
        if approver == "requester":
            return (f"确定要执行 {what} 吗？回复 /approve {code} 确认（或直接回复“确认”），"
                    f"/deny {code} 取消；{minutes} 分钟内有效。")
        notices = await approver_notices(self, chat, code, what, caller)
        self._notices += notices  # approvers hear of it after the requester's reply (see :meth:`announce`)
        return admin_prompt(what, code, minutes, notified=bool(notices),
                            own=caller.qualified_user in self.approver_ids())

    def approver_ids(self) -> list[str]:
        return [*self.bot.settings.bot.admins, *self.settings.approvers]

    async def announce(self) -> None:
        """Queue the approvers' notices of the requests paused so far (after the requester's reply)."""
        notices, self._notices = self._notices, []
        if notices:
            await self.bot.outbox.enqueue(*notices)

    # --- people's answers ---------------------------------------------------------------------
    def _entitled(self, row: Row, caller: Caller) -> bool:
        if row["approver"] == "requester":
            return caller.qualified_user == str(row["requester"])
        return caller.qualified_user in self.approver_ids()

    def _cooling(self, chat: ChatRef, caller: Caller) -> bool:
        now = time.monotonic()
        key = (chat.key, caller.qualified_user)
        self._wrong[key] = [t for t in self._wrong.get(key, []) if now - t < self.settings.cooldown_minutes * 60]
        return len(self._wrong[key]) >= self.settings.max_wrong_codes

    async def decide(self, caller: Caller, chat: ChatRef, code: str, *, approve: bool, reason: str = "") -> str:
        """``/approve CODE`` or ``/deny CODE [reason]``: the reply for the person who typed it."""
        if self._cooling(chat, caller):
            return f"确认码输错次数过多，请 {self.settings.cooldown_minutes} 分钟后再试。"
        # As typed in an IME's full-width mode, or ending a sentence ("ＬＱ５ＲＺ。"): the command name is read so too.
        code = unicodedata.normalize("NFKC", code).strip(_PUNCT).upper()
        if len(code) != 5 or not set(code) <= set(ALPHABET):
            # Not counted as a wrong code: it can match no request, so it is no guess worth limiting.
            return "这不是确认码：确认码是 5 位字母和数字（不含 0、O、1、I），如 /approve LQ5RZ。发送 /pending 查看等待中的请求。"
        row = await self.store.by_code(code)
        # A code from another chat reads as unknown: it reveals nothing the person could not see.
        if row is None or not (row["chat"] == chat.key or caller.qualified_user in self.approver_ids()
                               or caller.qualified_user == row["requester"]):
            self._wrong.setdefault((chat.key, caller.qualified_user), []).append(time.monotonic())
            return "没有找到这个确认码（可能已过期、已处理或输错了）。发送 /pending 查看等待中的请求。"
        if row["status"] != "pending":
            return _DONE.get(str(row["status"]), "这个请求已经处理过了。")
        if not self._entitled(row, caller):
            return f"只有{'发起人本人' if row['approver'] == 'requester' else '管理员'}可以处理这个请求。"
        if row["kind"] == "input":
            return "这个请求在等对方的回答，不需要批准。"
        if parse_iso(str(row["expires_at"])) <= self.bot.clock():
            await self._expire(row)
            return "这个请求已过期。"
        if self.bot.ignores(ChatRef.from_key(str(row["chat"]))):  # the owner closed that group since ([gate])
            await self._claim(row, "refused", caller.qualified_user)
            return "这个请求所在的群已不再由机器人服务，请求已作废，没有执行。"
        if not await self._claim(row, "approved" if approve else "denied", caller.qualified_user):
            return "这个请求的记录校验失败，已作废，没有执行。请重新发起。" if not self.store.verify(row) else "这个请求刚刚已被处理。"
        if approve:
            self._spawn(row, True)
            return "好的，正在执行。" if caller.qualified_user == row["requester"] else "已批准，正在执行。"
        why = reason.strip()[:200]
        self._spawn(row, f"The approver declined this call{': ' + why if why else ''}. Tell the user.",
                    notice=f"你的请求已被拒绝{'（理由：' + why + '）' if why else ''}。")
        return "已拒绝。"

    async def _claim(self, row: Row, to: str, by: str) -> bool:
        """pending -> ``to`` for a row whose MAC holds; an edited row is refused (and logged) instead."""
        if not self.store.verify(row):
            log.error("snapshot %s failed its integrity check (edited?); refusing to resume it", row["id"])
            await self.store.transition(str(row["id"]), "refused", frm="pending", now=self.bot.clock())
            await self.watch.reload()
            return False
        return await self.store.transition(str(row["id"]), to, frm="pending", now=self.bot.clock(), by=by,
                                           runner=self.bot.leases.leases.holder if to == "approved" else None)

    async def intercept(self, chat: ChatRef, caller: Caller, text: str) -> bool:
        """A message that answers a paused run (``ask_user``, or a plain "确认"): consumed, routed nowhere else."""
        if chat.key not in self.watch:
            return False
        by = caller.qualified_user
        row, now = await self.store.latest_answerable(chat.key, by), self.bot.clock()
        if row is not None and (row["kind"] == "approval" or parse_iso(str(row["expires_at"])) <= now):
            # A bare yes answers the prompt only while it is the bot's last word here: a "好的" to a later
            # question of the model's ran the wipe paused before it.
            if (row["kind"] == "approval" and parse_iso(str(row["expires_at"])) > now
                    and text.strip(_PUNCT).lower() in _YES and await self._prompt_is_last(chat, str(row["code"]))):
                answer = await self.decide(caller, chat, str(row["code"]), approve=True)
                await self.bot.outbox.enqueue(OutgoingMessage(key=f"snapshot:{row['id']}:ack", chat=chat, text=answer,
                                                              mention=(caller.user_id,) if chat.kind == "group" else ()))
                return True
            mine = await self.store.pending(now, requester=by, chat=chat.key)  # else it may answer an older
            row = next((r for r in reversed(mine) if r["kind"] == "input"), None)  # question (a newer /wipe hid it)
        if row is None or self.bot.pipeline.is_command(text) or not await self._claim(row, "approved", by):
            return False  # (a /deny typed while a question waits is no answer to it)
        self._spawn(row, True, answer=text)
        return True

    async def _prompt_is_last(self, chat: ChatRef, code: str) -> bool:
        try:
            said = [e for e in await self.bot.history.recent(chat, 20) if e.from_bot]
        except Exception:  # unknown: a code is asked for
            log.exception("reading the history of %s failed", chat.key)
            return False
        return bool(said) and f"/approve {code}" in said[-1].text

    async def pending_text(self, caller: Caller) -> str:
        """``/pending``: what waits for me, and what waits for my approval."""
        return await pending_text(self, caller)

    # --- expiry -------------------------------------------------------------------------------
    async def _expiry_loop(self) -> None:
        while True:
            try:
                wait = await self.expire_due()
            except Exception:
                log.exception("expiring snapshots failed")
                wait = 5.0
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def expire_due(self) -> float:
        """Expire what is due (an unanswered ``ask_user`` resumes with "用户暂未回复"), report calls whose
        process died as interrupted, re-read the watched chats; seconds to the next pass."""
        others = await self._interrupt_orphans()
        await self.watch.reload()
        for row in await self.store.due(self.bot.clock()):
            await self._expire(row)
        nxt = await self.store.next_expiry()
        # Another process's running call is looked at again within a lease: its process may die (a restart
        # sooner than its lease lapses took it for alive), and nobody else would ever report it.
        wait = self.bot.leases.leases.ttl.total_seconds() if others else 30.0
        if nxt is None:
            return wait
        return max(0.05, min(wait, (parse_iso(nxt) - self.bot.clock()).total_seconds()))

    async def _interrupt_orphans(self, *, mine: bool = False) -> bool:
        """Report approved calls whose process died mid-run (``mine``: or this one's, stopping) as interrupted
        (never retried), with what they did; True while another living process runs one."""
        leases = self.bot.leases.leases
        dead, living = await self.store.orphans(
            lambda db, runner: not (mine and runner == leases.holder) and leases.alive_sync(db, runner))
        for row in dead:
            if await self.store.transition(str(row["id"]), "interrupted", frm="approved", now=self.bot.clock()):
                await resuming.send(self, row, resuming.interrupted_text(row), suffix="interrupted")
        return bool(living - {leases.holder})

    async def _expire(self, row: Row) -> None:
        if self.bot.ignores(ChatRef.from_key(str(row["chat"]))):  # closed since ([gate]): no model, no message
            await self._claim(row, "expired", "timeout")
        elif row["kind"] == "input":
            if await self._claim(row, "approved", "timeout"):
                self._spawn(row, True, answer=None)
        elif await self._claim(row, "expired", "timeout"):
            self._spawn(row, "Nobody approved this call in time; it was not run. Tell the user.",
                        notice="你的请求等待批准超时，已取消，没有执行。")

    # --- resuming -----------------------------------------------------------------------------
    async def _resume_logged(self, row: Row, verdict: bool | str, *, answer: str | None = None,
                             notice: str | None = None) -> None:
        try:
            await resuming.resume(self, row, verdict, answer=answer, notice=notice)
        except Exception:
            log.exception("resuming snapshot %s failed", row["id"])
            await self.store.transition(str(row["id"]), "failed", frm="approved", now=self.bot.clock())
            await resuming.send(self, row, "继续执行时出错了，请稍后重新发起。", suffix="failed")
        await self.watch.reload()


_DONE = {"approved": "这个请求已经批准了，正在执行。", "resumed": "这个请求已经批准并执行过了。",
         "denied": "这个请求已被拒绝。", "expired": "这个请求已过期。"}
