"""The ``summary`` tool, its arguments and its dependencies.

``summary`` reads this chat's history only (the chat comes from the caller, never from
arguments): since the chat's last summary by default (the last ``default_hours`` when there
was none), or the last ``hours`` hours, or the last ``messages`` messages; the message that
asked is never part of it (see :mod:`summary.window`). Noise (stickers, 哈哈, +1, see
:mod:`summary.signals`) is dropped first. With a model every other message is map-reduced (see
:mod:`summary.mapreduce`) within what is left of the daily token budget (and, called by the model,
of what its request has left: ``ToolContext.allowance``); if that cannot cover the whole window, the
newest part is summarised and the reply names the period left out.
Without a model, or when the budget cannot pay for any of it, it gives the extractive summary.
The summary is the answer (no further model turn); "since the last summary" moves the mark, but
not when the model fails midway (the extractive summary is shown: asking again covers the same
messages). CPU-heavy steps run in a worker thread: thousands of messages do not stall the bot.

On ``/forget me`` (:mod:`robot.privacy`) earlier summaries in the chats go too (they may quote them);
on ``/forget me all`` also in every chat whose summaries read them (:mod:`summary.authors`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

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
from robot import ChatRef, DailyBudget, Engine, Forgetter, HistoryEntry, HistoryStore
from summary.authors import create_authors_table, record_authors
from summary.digest import schedule_digest, schedule_words, send_to_me
from summary.extractive import HEADER, PRIVATE_HEADER, Speakers, extractive_summary
from summary.mapreduce import SummaryFailed
from summary.reserved import estimate_cost, map_reduce_reserved
from summary.settings import SummarySettings
from summary.signals import is_noise
from summary.window import (
    advance_mark,
    create_marks_table,
    fetch,
    forget_summaries_sync,
    opted_out,
    parse_period,
    read_mark,
    said_at,
    set_optout,
    split_member,
)

if TYPE_CHECKING:
    from robot import Bot

log = logging.getLogger(__name__)

__all__ = ["SummaryArgs", "SummaryDeps", "Window", "conversation", "estimate_cost", "setup", "summary", "toolset"]

class SummaryArgs(BaseModel):
    """Which messages to summarise; no window field means "since the last summary"."""

    period: str | None = Field(
        default=None, max_length=80,
        description='a named window: "昨天", "今天", a date "2026-11-20", a time range "09:00-12:00" (today) or '
                    '"昨天 09:00-12:00"; or "optout" / "optin": stop / resume summarising the asker\'s own messages '
                    'in this chat; or "#<group id>" in a private chat: that group (bot admins and the group\'s admins)')
    hours: float | None = Field(default=None, gt=0, le=168, description="summarise the last N hours (max 168)")
    messages: int | None = Field(default=None, ge=1, le=5000, description="summarise the last N messages (max 5000)")
    group: str | None = Field(default=None, max_length=64, pattern=r"^[^\s#＃]+$",
                              description="in a private chat: the id of a group to summarise here (bot admins and the group's "
                                          "admins)")
    member: str | None = Field(default=None, max_length=40,
                               description='only this member\'s messages, by the name shown in the chat ("小明" or "@小明")')
    daily_at: list[str] | None = Field(
        default=None, min_length=1, max_length=6,
        description='schedule a digest every day at these times ("HH:MM", the chat\'s zone), e.g. ["22:00"]; '
                    'it is a reminder: /reminders lists it, /unremind cancels it')
    to_me: bool = Field(default=False, description="in a group: send the summary to the asker in private "
                                                    "(group admins only)")

    @model_validator(mode="after")
    def _one_window(self) -> SummaryArgs:
        schedule_words(self)
        period = (self.period or "").strip()
        member, rest = split_member(period) if self.member is None else (None, period)
        if member is not None:  # "/summary @小明", "/summary @小明 昨天", "/summary 昨天 @小明"
            self.member, self.period, period = member, rest or None, rest
        if period.startswith(("#", "＃")) and len(period) > 1:  # "/summary #123456" (in private)
            self.group, self.period, period = period[1:].strip(), None, ""
        elif period.replace(".", "", 1).isdigit() and len(period.partition(".")[2]) < 2 and self.hours is None:
            # "/summary 3" and "/summary 1.5" are hours; "/summary 11.20" is a date (parse_period)
            if not 0 < float(period) <= 168:
                raise ValueError("小时数应大于 0、不超过 168")
            self.period, self.hours, period = None, float(period), ""
        if self.hours is not None and self.messages is not None:
            raise ValueError("hours 和 messages 只能给一个（都不给：总结上次总结以来的消息）")
        if period and (self.hours is not None or self.messages is not None):
            raise ValueError("时间段、hours、messages 只能给一个")
        if self.daily_at is not None and (period or self.hours or self.messages or self.member):
            raise ValueError("每日定时总结覆盖上次以来的消息：daily 不能再带时间段、hours、messages 或成员")
        return self


@dataclass
class SummaryDeps:
    """What the tools use; built by :func:`setup`."""

    history: HistoryStore
    db: Engine
    settings: SummarySettings
    model: ChatModel | None
    budget: DailyBudget | None
    commands: frozenset[str]
    """This bot's command names: ``/summary`` lines are requests, not conversation."""
    last_run: dict[str, datetime] = field(default_factory=dict)
    """When each member last had a model summary in each chat, a forum group's topics as one (the cool-down)."""
    call_tool: Callable[..., Awaitable[ToolResult]] | None = None
    """``bot.call_tool``: a scheduled digest is a command-mode reminder set through the reminders tool."""
    send: Callable[..., Awaitable[bool]] | None = None
    """``bot.send``: a digest an admin asked for in private (``/summary to me``) goes through the outbox."""
    zone_for: Callable[[ChatRef], ZoneInfo] | None = None
    """``bot.zone_for``: a group summarised from a private chat is read in the group's own zone."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # per chat: one summary at a time (a process)


async def setup(bot: Bot) -> SummaryDeps:
    """Read ``[summary]``, register the summaries' part of ``/forget me``, build the deps."""
    settings = bot.settings.section("summary", SummarySettings)
    await bot.db.ensure("summary", [create_marks_table, create_authors_table])  # (append only)
    bot.forgetters.append(Forgetter("summary", "条可能引用你的聊天总结",
                                    lambda request: bot.db.transaction(lambda d: forget_summaries_sync(d, request))))
    core = ("help", "帮助", "approve", "批准", "deny", "拒绝", "pending", "待批准")  # robot.pipeline's own
    commands = frozenset({*core, *(n for t in bot.tools for n in (t.name, *t.aliases))})
    return SummaryDeps(bot.history, bot.db, settings, bot.model, bot.budget, commands,
                       call_tool=bot.call_tool, send=bot.send, zone_for=bot.zone_for)


@dataclass
class Window:
    """Messages picked for a summary (oldest first), how many the window holds, where the mark goes."""

    entries: list[HistoryEntry]
    title: str
    total: int
    newest_id: int | None
    remote: bool = False
    """Summarised from another chat (a private one): the chat's own mark stays."""


async def _window(deps: SummaryDeps, caller: Caller, args: SummaryArgs, now: datetime, zone: ZoneInfo,
                  chat: ChatRef) -> Window:
    limit, skip = deps.settings.max_fetch, caller.message_id
    if args.period:  # "今天" is the day the message asking was said (a kept one may be answered the next)
        said = await said_at(deps.db, ChatRef.of(caller), caller.message_id, caller.user_id, now)
        try:
            span = parse_period(args.period, said, zone)
        except ValueError as exc:
            raise ToolError(f"bad period: {exc}", user_message=str(exc)) from None
        got = await fetch(deps.db, chat, limit=limit, start=span.start, end=span.end, skip_message_id=skip)
        return Window(got.entries, span.title, got.total, None)  # (explicit windows leave the mark: see below)
    if args.messages is not None:
        # Room for the /commands among them, which are not conversation: "last 3" means 3 said by people.
        got = await fetch(deps.db, chat, limit=args.messages + 50, skip_message_id=skip, people_only=True)
        picked = conversation(got.entries, deps.commands)[-args.messages:]
        return Window(picked, f"最近 {args.messages} 条", len(picked), None)
    if args.hours is not None:
        start, title = now - timedelta(hours=args.hours), f"最近 {args.hours:g} 小时"
        got = await fetch(deps.db, chat, limit=limit, start=start, skip_message_id=skip, people_only=True)
        return Window(got.entries, title, got.total, None)
    mark = await read_mark(deps.db, chat)
    if mark is not None:
        got = await fetch(deps.db, chat, limit=limit, after_id=mark, skip_message_id=skip, people_only=True)
        return Window(got.entries, "自上次总结以来", got.total, got.newest_id)
    hours = deps.settings.default_hours
    start, title = now - timedelta(hours=hours), f"最近 {hours:g} 小时"
    got = await fetch(deps.db, chat, limit=limit, start=start, skip_message_id=skip, people_only=True)
    return Window(got.entries, title, got.total, got.newest_id)


def _is_command(text: str, commands: frozenset[str]) -> bool:
    if not text.startswith(("/", "／")):
        return False
    head = text[1:].split(maxsplit=1)
    return bool(head) and head[0].lower() in commands


def conversation(entries: Sequence[HistoryEntry], commands: frozenset[str]) -> list[HistoryEntry]:
    """The messages worth summarising: what people said; no empty ones, no bot commands, nothing
    the bot said (its replies and earlier summaries are not the conversation)."""
    keep: list[HistoryEntry] = []
    for entry in entries:
        text = entry.text.strip()
        if not text or entry.from_bot:
            continue
        if _is_command(text, commands):
            continue
        keep.append(entry)
    return keep


def _data(usage: Usage, messages: int, mode: str, **extra: object) -> dict[str, object]:
    return {"model_calls": usage.requests, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "messages": messages, "mode": mode, **extra}


def _prepare(entries: Sequence[HistoryEntry],
             commands: frozenset[str]) -> tuple[list[HistoryEntry], list[HistoryEntry], int]:
    """The conversation, the part of it worth a model's time (no noise), and how many people spoke."""
    kept = conversation(entries, commands)
    meaningful = [e for e in kept if not is_noise(e.text)]
    return kept, meaningful, len(Speakers(meaningful).members())


_OPT = {"optout": True, "退出": True, "optin": False, "加入": False}


async def _opt(deps: SummaryDeps, caller: Caller, out: bool) -> ToolResult:
    changed = await set_optout(deps.db, ChatRef.of(caller), caller.user_id, out)
    where = "本群" if caller.chat_kind == "group" else "本聊天"
    if out:
        text = (f"好的，之后{where}的总结不会引用你的消息（总结时不发给 AI；对话时我仍看得到最近的聊天）。用 /summary optin 恢复。" if changed
                else f"你已经退出{where}的总结了。")
    else:
        text = f"好的，{where}的总结会重新包括你的消息。" if changed else f"你本来就在{where}的总结里。"
    return ToolResult.reply(text, data={"optout": out, "changed": changed})


def _one_member(entries: list[HistoryEntry], wanted: str) -> tuple[list[HistoryEntry], str]:
    """Only ``wanted``'s messages (by latest name, an earlier name, or id), and how to call them."""
    name = wanted.strip().lstrip("@＠").strip()
    speakers = Speakers(entries)
    found = [p for p in speakers.members() if name in (p.name, p.user_id, *p.aliases)]
    if not found:
        raise ToolError(f"no member called {name!r} spoke in this window",
                        user_message=f"这段时间没有找到「{name}」的发言。")
    if len(found) > 1:
        labels = "、".join(p.label for p in found)
        raise ToolError(f"several members are called {name!r}: {labels}",
                        user_message=f"有几位都叫「{name}」：{labels}。请写括号里的 id。")
    person = found[0]
    return [e for e in entries if not e.from_bot and e.user_id == person.user_id], person.name


async def _elsewhere(deps: SummaryDeps, caller: Caller, group: str) -> ChatRef:
    """The group a private ``/summary #<id>`` names: for bot admins, and for that group's owner and
    admins as the platform reported them with their newest message there (no live message carries
    a role in private). Membership alone cannot be checked, so other members are refused."""
    if caller.chat_kind != "private":
        raise ToolError("#<group> is for private chats", user_message="在群里直接用 /summary 即可；#群号 只在私聊里用。")
    chat = ChatRef(platform=caller.platform, chat_id=group, kind="group", account=caller.account)
    if not caller.bot_admin and await deps.history.last_role(chat, caller.user_id) not in ("owner", "admin"):
        raise ToolError("only bot admins and the group's admins may summarise a group from a private chat",
                        user_message="只有机器人管理员或该群的群主/管理员可以在私聊里总结这个群"
                        "（以你在群里最近一条消息时的身份为准）。")
    return chat


def _cooling(deps: SummaryDeps, caller: Caller, now: datetime) -> float:
    """Seconds the caller must still wait before another model summary in this chat (0: none); in any
    topic of a forum group (one each had let a member run them back to back)."""
    last = deps.last_run.get(f"{ChatRef.of(caller).group_key}|{caller.user_id}")
    if last is None or not deps.settings.user_cooldown_s:
        return 0.0
    return max(0.0, deps.settings.user_cooldown_s - (now - last).total_seconds())


@tool_function(timeout_s=600, examples=["总结一下今天的群聊", "/summary 昨天", "/summary 09:00-12:00", "总结 @小明",
                                        "/summary hours=3", "/summary optout"])
async def summary(ctx: ToolContext[SummaryDeps], args: SummaryArgs) -> ToolResult:
    """总结本聊天的消息 (summarise this chat): 默认总结上次总结以来的消息；也可指定时间段（昨天、2026-11-20、09:00-12:00）、
    最近 hours 小时、最近 messages 条，或只总结某位成员（member）。period="optout"/"optin" 退出/恢复被总结。"""
    deps, caller = ctx.deps, ctx.caller
    chat = ChatRef.of(caller)
    if args.period and args.period.strip().lower() in _OPT:
        return await _opt(deps, caller, _OPT[args.period.strip().lower()])
    here = chat
    if args.daily_at is not None:
        if args.group is not None:
            await _elsewhere(deps, caller, args.group)  # the permission, checked now (and at every run)
        return await schedule_digest(ctx, args)
    if args.to_me and caller.chat_kind == "group":
        return await send_to_me(ctx, args, summary)
    if args.group is not None:
        chat = await _elsewhere(deps, caller, args.group)
    # One summary of a chat at a time: two asked together read the same mark and paid twice for it
    async with deps.locks.setdefault(chat.key, asyncio.Lock()):
        return await _summarise(ctx, args, chat, here)


async def _summarise(ctx: ToolContext[SummaryDeps], args: SummaryArgs, chat: ChatRef, here: ChatRef) -> ToolResult:
    deps, caller = ctx.deps, ctx.caller
    zone = deps.zone_for(chat) if chat != here and deps.zone_for is not None else ctx.zone  # 昨天 in its zone
    window = await _window(deps, caller, args, ctx.now(), zone, chat)
    if chat != here:
        window.remote, window.title = True, f"群 {chat.chat_id} · {window.title}"
    hidden, fetched = await opted_out(deps.db, chat), len(window.entries)  # (counted before any filter)
    if args.member:
        window.entries, who = _one_member(window.entries, args.member)
        if window.entries and window.entries[0].user_id in hidden:
            raise ToolError("that member opted out of summaries", user_message="这位成员选择了不被总结。")
        window.title += f" · {who} 的发言"
        window.newest_id = None  # one member's words: the others' since the mark are still to summarise
    if hidden:  # members who opted out are neither quoted nor sent to the model
        window.entries = [e for e in window.entries if e.from_bot or e.user_id not in hidden]
    entries, meaningful, people = await asyncio.to_thread(_prepare, window.entries, deps.commands)
    head = HEADER if chat.kind == "group" else PRIVATE_HEADER
    if not entries:
        return ToolResult.reply(f"{head}{window.title}：没有可以总结的新消息。", data=_data(Usage(), 0, "empty"))
    await record_authors(deps.db, chat, (e.user_id for e in entries), ctx.now(), deps.history.max_age)
    settings = deps.settings
    # Only the fetch limit cuts: the opted-out and other members' messages are no "cut" (their count is theirs)
    note = f"（这段时间共 {window.total} 条，只看最近 {fetched} 条）" if window.total > fetched else ""

    def extract(extra_note: str) -> str:
        return extractive_summary(entries, zone=zone, title=window.title, note=note + extra_note,
                                  top_members=settings.top_members, salient_count=settings.salient_count,
                                  fact_count=settings.fact_count, link_count=settings.link_count, header=head)

    mode, left = "extractive", None
    if deps.model is not None and not meaningful:
        mode = "noise"  # only stickers and +1s: nothing for a model to read
    elif deps.model is not None and deps.budget is not None:
        try:
            left = await deps.budget.remaining(caller)
        except Exception:  # a budget that cannot be checked refuses the model (and keeps the mark, as a failure)
            log.exception("summary: the budget cannot be read")
            left, window.newest_id = 0, None
        if left is not None and left <= 0:
            mode = "budget"
    if deps.model is None or mode != "extractive":
        budget_note = "（今天的 AI 用量已达上限，以下为自动摘录）" if mode == "budget" else ""
        text = await asyncio.to_thread(extract, budget_note)
        await _set_mark(deps, chat, window)
        return ToolResult.reply(text, data=_data(Usage(), len(entries), mode))
    wait = 0.0 if ctx.via == "scheduled" else _cooling(deps, caller, ctx.now())  # a digest's pace is its schedule
    if wait:
        text = f"你刚总结过，请 {max(1, round(wait))} 秒后再试（每人每次 AI 总结间隔 {settings.user_cooldown_s:g} 秒）。"
        raise ToolError(f"summary cool-down: {wait:.0f} s left", user_message=text)
    cooled = f"{here.group_key}|{caller.user_id}"  # a forum group's topics share it (see _cooling)
    deps.last_run[cooled] = ctx.now()
    where = "群聊" if chat.kind == "group" else "私聊"
    prompt = settings.prompt_for(chat) or None
    try:  # called by the model: within what its request has left too (a typed one: the day's budgets)
        reserved = await map_reduce_reserved(deps.budget, deps.model, deps.settings, caller, meaningful, zone,
                                             where, prompt, ctx.allowance)
    except SummaryFailed as exc:
        text = await asyncio.to_thread(
            extract, "（AI 总结暂时失败，以下为自动摘录；稍后再试会重新总结这些消息）")
        return ToolResult.reply(text, usage=exc.usage, data=_data(exc.usage, len(entries), "fallback",
                                                                   error=exc.reason,
                                                                   largest_request_tokens=exc.largest_request))
    done, why = reserved.done, "这次请求剩余的 AI 用量" if reserved.run_bound else "今天剩余的 AI 用量"
    if done is None:  # the budget cannot pay for even the newest part
        deps.last_run.pop(cooled, None)  # nothing was spent
        text = await asyncio.to_thread(extract, f"（{why}不够总结这些消息，以下为自动摘录）")
        await _set_mark(deps, chat, window)
        return ToolResult.reply(text, data=_data(Usage(), len(entries), "budget"))
    header = f"{head}{window.title} · {len(entries)} 条消息 · {people} 人发言"
    if done.partial and done.covered is not None and done.left_out is not None:
        if done.chunks_used >= settings.max_chunks or not (reserved.run_bound or left is not None):
            why = "单次总结的上限"
        note += (f"（{why}只够总结 {done.covered.describe(zone)} 的 {done.messages_used} 条；"
                 f"{done.left_out.describe(zone)} 的消息没有总结）")
    text = "\n".join(part for part in (header, note, done.text) if part)
    await _set_mark(deps, chat, window)
    return ToolResult.reply(text, usage=done.usage, data=_data(
        done.usage, len(entries), "llm", chunks=done.chunks, chunks_used=done.chunks_used,
        messages_used=done.messages_used, noise=len(entries) - len(meaningful),
        largest_request_tokens=done.largest_request,
    ))


async def _set_mark(deps: SummaryDeps, chat: ChatRef, window: Window) -> None:
    """Only "since the last summary" moves the mark: a day, hours=, messages= or one member's words
    leave it, or the next plain /summary would skip what they did not cover."""
    if window.remote:
        return  # an admin's look from a private chat is not the group's own summary
    if window.newest_id is not None:
        await advance_mark(deps.db, chat, window.newest_id)


toolset = Toolset("summary", [summary])
