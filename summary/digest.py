"""Digests delivered elsewhere or later: ``/summary to me`` and ``/summary daily 22:00``.

``/summary to me`` (group owners and admins, and bot admins) summarises the group without moving
its summary mark and sends the text to the asker in private, through the outbox; the group only
hears that it was sent.

``/summary daily 22:00 [18:00 ...]`` is a command-mode reminder per time, set through the
reminders plugin's ``reminder_set`` tool (resolved by ``bot.call_tool``, never imported): at its
time the reminders scheduler runs the stored ``/summary`` as its owner and delivers the reply in
its firing transaction, so digests survive restarts, show in ``/reminders`` and stop with
``/unremind``. A time the chat already has a digest at is answered with that one's id (the
reminders store keeps one command-mode reminder per chat, command and schedule). In a group
(admins only) the digest covers the time since the group's last summary. With ``to me`` (or
from a private chat with ``#<group>``) the reminder lives in the owner's private chat and stores
``/summary #<group> hours=<time since the previous digest>``, checked again at every run: the
owner must still be a bot admin or, by their newest message in the group, one of its admins.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from function_calls import Caller, Tool, ToolContext, ToolError, ToolResult
from robot import ChatRef, iso

if TYPE_CHECKING:
    from summary.tools import SummaryArgs, SummaryDeps

__all__ = ["gaps", "schedule_digest", "schedule_words", "send_to_me"]

_NOT_ADMIN = "只有群主、群管理员或机器人管理员可以{what}。"


_TO_ME = ("私信我", "发给我", "私聊我")
_DAILY = ("daily", "每天")
_GROUP = re.compile(r"[^\s#＃]{1,64}")
_CLOCK = re.compile(r"^([01]?\d|2[0-3])[:：]([0-5]\d)$")


def schedule_words(args: SummaryArgs) -> None:
    """Read "[#group] [daily HH:MM ...] [to me]" typed as a command line into the fields.

    Its ValueErrors are shown to the person as they are (the plugin's language, Chinese, like the
    other checks of :class:`~summary.tools.SummaryArgs`)."""
    words = (args.period or "").split()
    if [w.lower() for w in words[-2:]] == ["to", "me"]:
        args.to_me, words = True, words[:-2]
    elif words and words[-1] in _TO_ME:
        args.to_me, words = True, words[:-1]
    if len(words) > 1 and words[0][:1] in "#＃" and args.group is None:
        if not _GROUP.fullmatch(words[0][1:]):
            raise ValueError(f"群号「{words[0][:20]}」不对：# 后面直接写群号，例如 #123456")
        args.group, words = words[0][1:], words[1:]
    if words and words[0].lower() in _DAILY:
        args.daily_at, words = [*(args.daily_at or []), *words[1:]], []
        if not args.daily_at:
            raise ValueError("daily 后面要写时间，例如 /summary daily 22:00")
    args.period = " ".join(words) or None
    if args.daily_at is not None:
        times = []
        for raw in args.daily_at:
            found = _CLOCK.match(raw.strip())
            if found is None:
                raise ValueError(f"时间「{raw.strip()[:20]}」不对：请写 HH:MM，例如 22:00")
            times.append(f"{int(found[1]):02d}:{found[2]}")
        if not 1 <= len(set(times)) <= 6:
            raise ValueError("每天最多 6 个时间")
        args.daily_at = sorted(set(times))


def _private(caller: Caller) -> Caller:
    """The same person in their private chat with the bot (no group role there)."""
    return caller.model_copy(update={"chat_id": caller.user_id, "chat_kind": "private", "is_admin": caller.bot_admin,
                                     "message_id": ""})


def gaps(times: list[str]) -> dict[str, float]:
    """Hours since the previous digest time of the day, per ``HH:MM`` (24 for a single time)."""
    minutes = sorted(int(t[:2]) * 60 + int(t[3:]) for t in times)
    out: dict[str, float] = {}
    for i, m in enumerate(minutes):
        gap = (m - minutes[i - 1]) % 1440 or 1440
        out[f"{m // 60:02d}:{m % 60:02d}"] = round(gap / 60, 4)
    return out


async def send_to_me(ctx: ToolContext[SummaryDeps], args: SummaryArgs, tool: Tool) -> ToolResult:
    """Summarise the caller's group and send it to them in private (``tool`` is ``summary`` itself)."""
    deps, caller = ctx.deps, ctx.caller
    if not caller.is_admin:
        what = _NOT_ADMIN.format(what="把本群的总结私信给自己")
        raise ToolError("only the group's admins may have its summary sent to them", user_message=what)
    if deps.send is None:
        raise ToolError("this bot cannot send private messages from a plugin", user_message="这个机器人不能私信发送总结。")
    inner = dataclasses.replace(ctx, caller=_private(caller))
    result = await tool.invoke(inner, args.model_copy(update={"to_me": False, "group": caller.chat_id}))
    text = "\n".join(t for t in result.user_messages if t.strip()) or result.content
    key = f"summary:to-me:{ChatRef.of(caller).key}:{caller.user_id}:{caller.message_id or iso(ctx.now())}"
    private = ChatRef(platform=caller.platform, chat_id=caller.user_id, kind="private", account=caller.account)
    await deps.send(private, text, key=key)
    return ToolResult.reply("已把本群的总结私信发给你。", content="the summary was sent to the user in private",
                            usage=result.usage, data=result.data)


async def schedule_digest(ctx: ToolContext[SummaryDeps], args: SummaryArgs) -> ToolResult:
    """One command-mode reminder per ``args.daily_at`` time (the caller's permission was checked for
    ``#<group>``; a group's own digest needs its admins)."""
    deps, caller = ctx.deps, ctx.caller
    assert args.daily_at is not None
    if deps.call_tool is None:
        raise ToolError("scheduled digests need the bot's tool path", user_message="这个机器人不能设置定时总结。")
    owner, group = caller, args.group
    if caller.chat_kind == "group":
        if not caller.is_admin:
            raise ToolError("only the group's admins may schedule digests here",
                            user_message=_NOT_ADMIN.format(what="设置本群的定时总结"))
        if args.to_me:
            owner, group = _private(caller), caller.chat_id
    hours = gaps(args.daily_at)
    lines: list[str] = []
    for time, gap in hours.items():
        content = "/summary" if group is None else f"/summary #{group} hours={gap:g}"
        try:
            made = await deps.call_tool("reminder_set", owner, {"type": "daily", "time": time, "content": content,
                                                                "mode": "command"}, zone=ctx.zone)
        except ToolError as exc:
            if exc.message.startswith("no tool"):
                raise ToolError("scheduled digests need the reminders plugin",
                                user_message="定时总结需要启用提醒插件（reminders）。") from None
            done = f"（已设置：{'；'.join(lines)}）" if lines else ""
            raise ToolError(f"scheduling the {time} digest failed: {exc.message}",
                            user_message=f"设置 {time} 的定时总结失败：{exc.user_message or exc.message}{done}") from None
        short = (made.data or {}).get("short_id", "")
        lines.append(f"#{short} 每天 {time}")
    where = f"私信发给你（群 {group}）" if group is not None else (
        "在本群发送" if caller.chat_kind == "group" else "在本聊天发送")
    text = (f"好的，已设置定时总结，{where}：\n" + "\n".join(lines)
            + "\n发送 /reminders 查看，/unremind 编号 取消。")
    return ToolResult.reply(text, data={"digests": lines, "group": group})
