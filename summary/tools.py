"""The ``summary`` tool, its arguments and its dependencies.

``summary`` reads this chat's history only (the chat comes from the caller, never from
arguments): since the chat's last summary by default (the last ``default_hours`` when there
was none), or the last ``hours`` hours, or the last ``messages`` messages; the message that
asked is never part of it (see :mod:`summary.window`). With a model it map-reduces (see
:mod:`summary.mapreduce`); without one, or when the daily token budget is spent, it gives the
extractive summary. The summary is the answer (no further model turn), and the chat's summary
mark moves to the newest message covered. If the model fails midway the extractive summary is
shown and the mark stays, so asking again covers the same messages. CPU-heavy steps run in a
worker thread, so a summary of thousands of messages does not stall the bot.

On ``/forget me`` (core: :mod:`robot.privacy`) the bot's earlier summaries in the chats
concerned go too: they may quote the person.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import sqlite_utils
from pydantic import BaseModel, Field, model_validator

from function_calls import (
    Caller,
    ChatModel,
    ToolContext,
    ToolResult,
    Toolset,
    Usage,
    estimate_tokens,
    tool_function,
)
from robot import (
    BudgetExceeded,
    ChatRef,
    DailyBudget,
    Database,
    ForgetRequest,
    Forgetter,
    HistoryEntry,
    HistoryStore,
)
from summary.extractive import HEADER, Speakers, extractive_summary
from summary.mapreduce import MapReduceResult, SummaryFailed, map_reduce
from summary.settings import PROMPT_ALLOWANCE, SummarySettings
from summary.window import advance_mark, create_marks_table, fetch, read_mark

if TYPE_CHECKING:
    from robot import Bot

log = logging.getLogger(__name__)

__all__ = [
    "SummaryArgs",
    "SummaryDeps",
    "Window",
    "conversation",
    "estimate_cost",
    "setup",
    "summary",
    "toolset",
]

class SummaryArgs(BaseModel):
    """Which messages to summarise; neither field means "since the last summary"."""

    hours: float | None = Field(default=None, gt=0, le=168, description="summarise the last N hours (max 168)")
    messages: int | None = Field(default=None, ge=1, le=5000, description="summarise the last N messages (max 5000)")

    @model_validator(mode="after")
    def _one_window(self) -> SummaryArgs:
        if self.hours is not None and self.messages is not None:
            raise ValueError("give either hours or messages, not both (or neither: since the last summary)")
        return self


@dataclass
class SummaryDeps:
    """What the tools use; built by :func:`setup`."""

    history: HistoryStore
    db: Database
    settings: SummarySettings
    model: ChatModel | None
    budget: DailyBudget | None
    commands: frozenset[str]
    """This bot's command names: ``/summary`` lines are requests, not conversation."""


async def setup(bot: Bot) -> SummaryDeps:
    """Read ``[summary]``, register the summaries' part of ``/forget me``, build the deps."""
    settings = bot.settings.section("summary", SummarySettings)
    await bot.db.ensure(create_marks_table)
    db = bot.db
    bot.forgetters.append(Forgetter("summary", "条可能引用你的聊天总结",
                                    lambda request: db.transaction(lambda d: _forget_summaries_sync(d, request))))
    commands = frozenset({"help", "帮助", *(n for t in bot.tools for n in (t.name, *t.aliases))})
    return SummaryDeps(bot.history, bot.db, settings, bot.model, bot.budget, commands)


@dataclass
class Window:
    """Messages picked for a summary (oldest first), how many the window holds, where the mark goes."""

    entries: list[HistoryEntry]
    title: str
    total: int
    newest_id: int | None


async def _window(deps: SummaryDeps, caller: Caller, args: SummaryArgs, now: datetime) -> Window:
    chat, limit, skip = ChatRef.of(caller), deps.settings.max_fetch, caller.message_id
    if args.messages is not None:
        got = await fetch(deps.db, chat, limit=args.messages, skip_message_id=skip)
        return Window(got.entries, f"最近 {args.messages} 条", len(got.entries), got.newest_id)
    if args.hours is not None:
        start, title = now - timedelta(hours=args.hours), f"最近 {args.hours:g} 小时"
        got = await fetch(deps.db, chat, limit=limit, start=start, skip_message_id=skip)
        return Window(got.entries, title, got.total, got.newest_id)
    mark = await read_mark(deps.db, chat)
    if mark is not None:
        got = await fetch(deps.db, chat, limit=limit, after_id=mark, skip_message_id=skip)
        return Window(got.entries, "自上次总结以来", got.total, got.newest_id)
    hours = deps.settings.default_hours
    start, title = now - timedelta(hours=hours), f"最近 {hours:g} 小时"
    got = await fetch(deps.db, chat, limit=limit, start=start, skip_message_id=skip)
    return Window(got.entries, title, got.total, got.newest_id)


def _is_command(text: str, commands: frozenset[str]) -> bool:
    if not text.startswith(("/", "／")):
        return False
    head = text[1:].split(maxsplit=1)
    return bool(head) and head[0].lower() in commands


def conversation(entries: Sequence[HistoryEntry], commands: frozenset[str]) -> list[HistoryEntry]:
    """The messages worth summarising: no empty ones, no bot commands, no earlier summaries."""
    keep: list[HistoryEntry] = []
    for entry in entries:
        text = entry.text.strip()
        if not text or (entry.from_bot and text.startswith(HEADER)):
            continue
        if not entry.from_bot and _is_command(text, commands):
            continue
        keep.append(entry)
    return keep


def _data(usage: Usage, messages: int, mode: str, **extra: object) -> dict[str, object]:
    return {"model_calls": usage.requests, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "messages": messages, "mode": mode, **extra}


def _prepare(entries: Sequence[HistoryEntry], commands: frozenset[str]) -> tuple[list[HistoryEntry], int]:
    kept = conversation(entries, commands)
    return kept, len(Speakers(kept).members())


@tool_function(timeout_s=600, examples=["总结一下今天的群聊", "/summary hours=3", "/summary messages=200"])
async def summary(ctx: ToolContext[SummaryDeps], args: SummaryArgs) -> ToolResult:
    """总结本聊天的消息 (summarise this chat): 默认总结上次总结以来的消息，也可指定最近 hours 小时或最近 messages 条。"""
    deps, caller = ctx.deps, ctx.caller
    chat = ChatRef.of(caller)
    window = await _window(deps, caller, args, ctx.now())
    entries, people = await asyncio.to_thread(_prepare, window.entries, deps.commands)
    if not entries:
        return ToolResult.reply(f"{HEADER}{window.title}：没有可以总结的新消息。", data=_data(Usage(), 0, "empty"))
    settings = deps.settings
    note = f"（这段时间共 {window.total} 条，只看最近 {len(window.entries)} 条）" if window.total > len(window.entries) else ""
    where = "群聊" if caller.chat_kind == "group" else "私聊"
    mode, done = "extractive", None
    try:
        if deps.model is not None:
            done = await _map_reduce_reserved(deps, deps.model, caller, entries, ctx.zone, where)
            if done is None:
                note, mode = note + "（今天的 AI 用量已达上限，以下为自动摘录）", "budget"
    except SummaryFailed as exc:
        text = await asyncio.to_thread(
            extractive_summary, entries, zone=ctx.zone, title=window.title,
            note=note + "（AI 总结暂时失败，以下为自动摘录；稍后再试会重新总结这些消息）",
            top_members=settings.top_members, salient_count=settings.salient_count)
        return ToolResult.reply(text, usage=exc.usage, data=_data(exc.usage, len(entries), "fallback",
                                                                   error=exc.reason,
                                                                   largest_request_tokens=exc.largest_request))
    if done is None:
        text = await asyncio.to_thread(extractive_summary, entries, zone=ctx.zone, title=window.title, note=note,
                                       top_members=settings.top_members, salient_count=settings.salient_count)
        await _set_mark(deps, chat, window)
        return ToolResult.reply(text, data=_data(Usage(), len(entries), mode))
    header = f"{HEADER}{window.title} · {len(entries)} 条消息 · {people} 人发言"
    if done.sampled:
        note += (f"（消息太多：按时间均匀抽取了 {done.chunks_used}/{done.chunks} 段、"
                 f"{done.messages_used} 条来总结）")
    text = "\n".join(part for part in (header, note, done.text) if part)
    await _set_mark(deps, chat, window)
    return ToolResult.reply(text, usage=done.usage, data=_data(
        done.usage, len(entries), "llm", chunks=done.chunks, chunks_used=done.chunks_used,
        messages_used=done.messages_used, largest_request_tokens=done.largest_request,
    ))


def estimate_cost(entries: Sequence[HistoryEntry], settings: SummarySettings) -> int:
    """About the most a map-reduce over ``entries`` spends: full requests, every answer at its cap."""
    cap, out_cap, final_cap = settings.max_request_tokens, settings.chunk_output_tokens, settings.summary_output_tokens
    room = cap - PROMPT_ALLOWANCE
    text = sum(min(estimate_tokens(e.text), settings.max_message_tokens) + 16 for e in entries)
    chunks = min(settings.max_chunks, max(1, math.ceil(text / room)))
    if chunks == 1:
        return min(cap, text + PROMPT_ALLOWANCE) + final_cap
    cost, pieces = chunks * (cap + out_cap), chunks
    while True:  # reduce rounds: each merge request holds pieces of at most out_cap tokens
        groups = min(math.ceil(pieces * out_cap / room), (pieces + 1) // 2)
        if groups <= 1:
            return cost + min(cap, pieces * out_cap + PROMPT_ALLOWANCE) + final_cap
        cost, pieces = cost + groups * (cap + out_cap), groups


async def _map_reduce_reserved(deps: SummaryDeps, model: ChatModel, caller: Caller, entries: Sequence[HistoryEntry],
                               zone: ZoneInfo, where: str) -> MapReduceResult | None:
    """The map-reduce with its estimated cost reserved first; None when today's budget cannot hold it."""
    if deps.budget is None:
        return await map_reduce(entries, model, deps.settings, zone=zone, where=where)
    try:
        async with deps.budget.reserve(caller, estimate_cost(entries, deps.settings)) as hold:
            try:
                done = await map_reduce(entries, model, deps.settings, zone=zone, where=where)
            except SummaryFailed as exc:
                hold.spend(exc.usage)
                raise
            hold.spend(done.usage)
            return done
    except BudgetExceeded as exc:
        log.info("summary for %s refused by the budget: %s", caller.qualified_user, exc)
        return None


async def _set_mark(deps: SummaryDeps, chat: ChatRef, window: Window) -> None:
    if window.newest_id is not None:
        await advance_mark(deps.db, chat, window.newest_id)


def _forget_summaries_sync(db: sqlite_utils.Database, request: ForgetRequest) -> int:
    # Summaries quote members' messages; which ones quote this person cannot be told reliably
    # (names change, quotes are cut), so every earlier summary in the chats forgotten goes.
    return sum(db.execute("DELETE FROM history WHERE chat = ? AND from_bot = 1 AND substr(text, 1, ?) = ?",
                          [chat.key, len(HEADER), HEADER]).rowcount for chat in request.chats)


toolset = Toolset("summary", [summary])
