"""The ``summary`` and ``forget`` tools, their arguments and their dependencies.

``summary`` reads this chat's history only (the chat comes from the caller, never from
arguments): since the chat's last summary by default (the last ``default_hours`` when there
was none), or the last ``hours`` hours, or the last ``messages`` messages; the message that
asked is never part of it (see :mod:`summary.window`). With a model it map-reduces (see
:mod:`summary.mapreduce`); without one, or when the daily token budget is spent, it gives the
extractive summary. The summary is the answer (no further model turn), and the chat's summary
mark moves to the newest message covered. If the model fails midway the extractive summary is
shown and the mark stays, so asking again covers the same messages. CPU-heavy steps run in a
worker thread, so a summary of thousands of messages does not stall the bot.

``forget`` (``/forget me``) deletes the caller's own stored messages in this chat (and, through the
bot's forget hooks, other plugins' data such as memories; ``/forget <id>`` goes to those hooks), and the
bot's earlier summaries there (they may quote the caller); nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlite_utils
from pydantic import BaseModel, Field, model_validator

from function_calls import (
    Caller,
    ChatModel,
    ToolContext,
    ToolError,
    ToolResult,
    Toolset,
    Usage,
    tool_function,
)
from robot import ChatRef, DailyBudget, Database, ForgetHook, HistoryEntry, HistoryStore
from summary.extractive import HEADER, Speakers, extractive_summary
from summary.mapreduce import SummaryFailed, map_reduce
from summary.settings import SummarySettings
from summary.window import advance_mark, create_marks_table, fetch, read_mark

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "ForgetArgs",
    "SummaryArgs",
    "SummaryDeps",
    "Window",
    "conversation",
    "forget",
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


class ForgetArgs(BaseModel):
    """What to forget: everything of the caller's here, or one item (a memory) by its id."""

    target: str = Field(pattern=r"^(me|#?\d{1,12})$",
                        description='"me": delete your own stored messages (and memories) in this chat; '
                                    "or the id of one memory to delete")


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
    forget_hooks: list[ForgetHook] = field(default_factory=list)
    """Other plugins' parts of ``/forget`` (the bot's list, see ``robot.hooks``)."""


async def setup(bot: Bot) -> SummaryDeps:
    """Read ``[summary]``, apply its history retention to the bot's store, build the deps."""
    settings = bot.settings.section("summary", SummarySettings)
    await bot.db.ensure(create_marks_table)
    bot.history.max_messages = settings.retention_max_messages
    bot.history.max_age = timedelta(days=settings.retention_days)
    commands = frozenset({"help", "帮助", *(n for t in bot.tools for n in (t.name, *t.aliases))})
    return SummaryDeps(bot.history, bot.db, settings, bot.model, bot.budget, commands, bot.forget_hooks)


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
    mode = "extractive"
    if deps.model is not None and deps.budget is not None:
        left = await deps.budget.remaining(caller)
        if left is not None and left <= 0:
            note, mode = note + "（今天的 AI 用量已达上限，以下为自动摘录）", "budget"
    if deps.model is None or mode == "budget":
        text = await asyncio.to_thread(extractive_summary, entries, zone=ctx.zone, title=window.title, note=note,
                                       top_members=settings.top_members, salient_count=settings.salient_count)
        await _set_mark(deps, chat, window)
        return ToolResult.reply(text, data=_data(Usage(), len(entries), mode))
    where = "群聊" if caller.chat_kind == "group" else "私聊"
    try:
        done = await map_reduce(entries, deps.model, settings, zone=ctx.zone, where=where)
    except SummaryFailed as exc:
        text = await asyncio.to_thread(
            extractive_summary, entries, zone=ctx.zone, title=window.title,
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
    await _set_mark(deps, chat, window)
    return ToolResult.reply(text, usage=done.usage, data=_data(
        done.usage, len(entries), "llm", chunks=done.chunks, chunks_used=done.chunks_used,
        messages_used=done.messages_used, largest_request_tokens=done.largest_request,
    ))


async def _set_mark(deps: SummaryDeps, chat: ChatRef, window: Window) -> None:
    if window.newest_id is not None:
        await advance_mark(deps.db, chat, window.newest_id)


def _forget_sync(db: sqlite_utils.Database, chat: ChatRef, user_id: str) -> tuple[int, int]:
    own = db.execute("DELETE FROM history WHERE chat = ? AND user_id = ? AND from_bot = 0",
                     [chat.key, user_id]).rowcount
    # Summaries quote members' messages; which ones quote this user cannot be told reliably
    # (names change, quotes are cut), so every earlier summary in the chat goes.
    summaries = db.execute("DELETE FROM history WHERE chat = ? AND from_bot = 1 AND substr(text, 1, ?) = ?",
                           [chat.key, len(HEADER), HEADER]).rowcount
    return own, summaries


@tool_function(examples=["/forget me", "/forget 12"])
async def forget(ctx: ToolContext[SummaryDeps], args: ForgetArgs) -> ToolResult:
    """删除你自己在本聊天中被记录的消息 (forget me)：删除提问者本人在当前聊天的记录（含记忆），以及本聊天中机器人之前发的总结；也可给出一条记忆的编号只删除它。"""
    caller = ctx.caller
    chat = ChatRef.of(caller)
    if args.target != "me":
        if ctx.via != "command":  # a message in the chat must not talk the model into deleting data
            raise ToolError("deleting by id needs the person to send `/forget <id>` themselves; tell them so",
                            user_message="要删除一条记忆，请直接发送 /forget <编号>。")
        item = args.target.lstrip("#")
        for hook in ctx.deps.forget_hooks:
            said = await hook(caller, item)
            if said:
                return ToolResult.reply(said)
        return ToolResult.reply(f"没有找到编号为 {item} 的记录。")
    removed, summaries = await ctx.deps.db.transaction(lambda db: _forget_sync(db, chat, caller.user_id))
    where = "本群" if caller.chat_kind == "group" else "本聊天"
    text = f"已删除你在{where}被记录的 {removed} 条消息"
    if summaries:
        text += f"，并删除了{where}之前的 {summaries} 条聊天总结（其中可能引用了你的消息）"
    others = [said for hook in ctx.deps.forget_hooks if (said := await hook(caller, "me"))]
    if others:
        text += "，以及" + "、".join(others)
    return ToolResult.reply(text + "。", data={"deleted": removed, "summaries_deleted": summaries})


toolset = Toolset("summary", [summary, forget])
