"""The ``summary`` and ``forget`` tools, their arguments and their dependencies.

``summary`` reads this chat's history only (the chat comes from the caller, never from
arguments): since the chat's last summary by default (the last ``default_hours`` when there
was none), or the last ``hours`` hours, or the last ``messages`` messages. With a model it
map-reduces (see :mod:`summary.mapreduce`); without one, or when the daily token budget is
spent, it gives the extractive summary. The summary is the answer (no further model turn),
and the chat's summary mark moves to the newest message covered. If the model fails midway
the extractive summary is shown and the mark stays, so asking again covers the same messages.

``forget`` (``/forget me``) deletes the caller's own stored messages in this chat, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import sqlite_utils
from pydantic import BaseModel, Field, model_validator

from function_calls import Caller, ChatModel, ToolContext, ToolResult, Toolset, Usage, tool_function
from robot import ChatRef, DailyBudget, Database, HistoryEntry, HistoryStore, iso, parse_iso
from summary.extractive import HEADER, Speakers, extractive_summary
from summary.mapreduce import SummaryFailed, map_reduce
from summary.settings import SummarySettings

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "ForgetArgs",
    "SummaryArgs",
    "SummaryDeps",
    "Window",
    "chat_of",
    "conversation",
    "fetch_window",
    "forget",
    "setup",
    "summary",
    "toolset",
]

_TICK = timedelta(microseconds=1)  # history times keep microseconds: "after the mark" starts here


class SummaryArgs(BaseModel):
    """Which messages to summarise; neither field means "since the last summary"."""

    hours: float | None = Field(default=None, gt=0, le=168, description="summarise the last N hours (max 168)")
    messages: int | None = Field(default=None, ge=1, le=5000, description="summarise the last N messages (max 5000)")

    @model_validator(mode="after")
    def _one_window(self) -> SummaryArgs:
        if self.hours is not None and self.messages is not None:
            raise ValueError("give either hours or messages, not both (or neither: since the last summary)")
        return self


class ForgetArgs(BaseModel):
    """What to forget; only the caller's own messages can be."""

    target: Literal["me"] = Field(description='"me": delete your own stored messages in this chat')


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
    """Read ``[summary]``, apply its history retention to the bot's store, build the deps."""
    settings = bot.settings.section("summary", SummarySettings)
    bot.history.max_messages = settings.retention_max_messages
    bot.history.max_age = timedelta(days=settings.retention_days)
    commands = frozenset({"help", "帮助", *(n for t in bot.tools for n in (t.name, *t.aliases))})
    return SummaryDeps(bot.history, bot.db, settings, bot.model, bot.budget, commands)


def chat_of(caller: Caller) -> ChatRef:
    """The chat the caller is in: the only chat its tools may read or change."""
    return ChatRef(platform=caller.platform, chat_id=caller.chat_id, kind=caller.chat_kind)


@dataclass
class Window:
    """Messages picked for a summary (oldest first) and how many the window holds in all."""

    entries: list[HistoryEntry]
    title: str
    total: int


async def fetch_window(db: Database, chat: ChatRef, start: datetime, limit: int) -> tuple[list[HistoryEntry], int]:
    """The newest ``limit`` messages at or after ``start`` (oldest first), and the window's full count.

    ``HistoryStore.since`` keeps the oldest rows when it hits its limit; a summary wants the newest.
    """

    def work(db: sqlite_utils.Database) -> tuple[list[HistoryEntry], int]:
        count = db.execute("SELECT COUNT(*) FROM history WHERE chat = ? AND ts >= ?", [chat.key, iso(start)])
        total = int(count.fetchone()[0])
        rows = db.execute_returning_dicts(
            "SELECT * FROM history WHERE chat = ? AND ts >= ? ORDER BY ts DESC, id DESC LIMIT ?",
            [chat.key, iso(start), limit],
        )
        entries = [
            HistoryEntry(chat=str(r["chat"]), user_id=str(r["user_id"]), name=str(r["name"]), text=str(r["text"]),
                         at=parse_iso(str(r["ts"])), from_bot=bool(r["from_bot"]),
                         message_id=str(r["message_id"] or ""))
            for r in reversed(rows)
        ]
        return entries, total

    return await db.run(work)


async def _window(deps: SummaryDeps, chat: ChatRef, args: SummaryArgs, now: datetime) -> Window:
    limit = deps.settings.max_fetch
    if args.messages is not None:
        entries = await deps.history.recent(chat, args.messages)
        return Window(entries, f"最近 {args.messages} 条", len(entries))
    if args.hours is not None:
        start, title = now - timedelta(hours=args.hours), f"最近 {args.hours:g} 小时"
    else:
        mark = await deps.history.summary_mark(chat)
        if mark is not None:
            start, title = mark + _TICK, "自上次总结以来"
        else:
            hours = deps.settings.default_hours
            start, title = now - timedelta(hours=hours), f"最近 {hours:g} 小时"
    entries, total = await fetch_window(deps.db, chat, start, limit)
    return Window(entries, title, total)


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


@tool_function(timeout_s=600, examples=["总结一下今天的群聊", "/summary hours=3", "/summary messages=200"])
async def summary(ctx: ToolContext[SummaryDeps], args: SummaryArgs) -> ToolResult:
    """总结本聊天的消息 (summarise this chat): 默认总结上次总结以来的消息，也可指定最近 hours 小时或最近 messages 条。"""
    deps, caller = ctx.deps, ctx.caller
    chat = chat_of(caller)
    window = await _window(deps, chat, args, ctx.now())
    entries = conversation(window.entries, deps.commands)
    if not entries:
        return ToolResult.reply(f"{HEADER}{window.title}：没有可以总结的新消息。", data=_data(Usage(), 0, "empty"))
    settings = deps.settings
    people = len(Speakers(entries).members())
    note = f"（这段时间共 {window.total} 条，只看最近 {len(window.entries)} 条）" if window.total > len(window.entries) else ""
    newest = max(e.at for e in window.entries)
    mode = "extractive"
    if deps.model is not None and deps.budget is not None:
        left = await deps.budget.remaining(caller)
        if left is not None and left <= 0:
            note, mode = note + "（今天的 AI 用量已达上限，以下为自动摘录）", "budget"
    if deps.model is None or mode == "budget":
        text = extractive_summary(entries, zone=ctx.zone, title=window.title, note=note,
                                  top_members=settings.top_members, salient_count=settings.salient_count)
        await _set_mark(deps, chat, newest)
        return ToolResult.reply(text, data=_data(Usage(), len(entries), mode))
    where = "群聊" if caller.chat_kind == "group" else "私聊"
    try:
        done = await map_reduce(entries, deps.model, settings, zone=ctx.zone, where=where)
    except SummaryFailed as exc:
        text = extractive_summary(entries, zone=ctx.zone, title=window.title,
                                  note=note + "（AI 总结暂时失败，以下为自动摘录；稍后再试会重新总结这些消息）",
                                  top_members=settings.top_members, salient_count=settings.salient_count)
        return ToolResult.reply(text, usage=exc.usage, data=_data(exc.usage, len(entries), "fallback",
                                                                   error=exc.reason,
                                                                   largest_request_tokens=exc.largest_request))
    header = f"{HEADER}{window.title} · {len(entries)} 条消息 · {people} 人发言"
    if done.sampled:
        note += (f"（消息太多：按时间均匀抽取了 {done.chunks_used}/{done.chunks} 段、"
                 f"{done.messages_used} 条来总结）")
    text = "\n".join(part for part in (header, note, done.text) if part)
    await _set_mark(deps, chat, newest)
    return ToolResult.reply(text, usage=done.usage, data=_data(
        done.usage, len(entries), "llm", chunks=done.chunks, chunks_used=done.chunks_used,
        messages_used=done.messages_used, largest_request_tokens=done.largest_request,
    ))


async def _set_mark(deps: SummaryDeps, chat: ChatRef, newest: datetime) -> None:
    previous = await deps.history.summary_mark(chat)
    await deps.history.set_summary_mark(chat, max(newest, previous) if previous else newest)


@tool_function(examples=["/forget me"])
async def forget(ctx: ToolContext[SummaryDeps], args: ForgetArgs) -> ToolResult:
    """删除你自己在本聊天中被记录的消息 (forget me)：只删除提问者本人在当前聊天的记录。"""
    caller = ctx.caller
    removed = await ctx.deps.history.forget_user(chat_of(caller), caller.user_id)
    where = "本群" if caller.chat_kind == "group" else "本聊天"
    return ToolResult.reply(f"已删除你在{where}被记录的 {removed} 条消息。", data={"deleted": removed})


toolset = Toolset("summary", [summary, forget])
