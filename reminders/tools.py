"""The reminder tools (``reminder_set``, ``reminder_list``, ``reminder_delete``) and their deps.

Identity comes from ``ctx.caller`` only: no argument can name another person. Times are read in
the chat's zone (``ctx.zone``, from ``[bot] zones``). Errors raise :class:`ToolError` with an
English message the model can act on (for a past time, the current time) and a Chinese
``user_message`` for the person.

Deleting: anyone deletes their own reminders; a bot admin (``[bot] admins``) anyone's by id.
``reminder_id="all"`` clears this chat: every reminder in it for a bot admin or the group's
owner/admins, otherwise the caller's own ones there.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from function_calls import Caller, ToolContext, ToolError, ToolResult, Toolset, tool_function
from reminders.prompts import command_name
from reminders.schedule import ScheduleError, days_mask, describe, parse_schedule
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import Reminder, ReminderError, ReminderStore
from robot import KEEP, ChatRef, iso

__all__ = [
    "DeleteArgs",
    "ReminderArgs",
    "ReminderDeps",
    "reminder_delete",
    "reminder_list",
    "reminder_set",
    "toolset",
]

_LISTED = 10
_ALL = frozenset({"all", "全部"})


class ReminderArgs(BaseModel):
    """Arguments of ``reminder_set``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["once", "daily", "weekly", "weekdays"] = Field(
        description="once = 一次性 one time; daily = 每天 every day; weekly = 每周 one day a week; "
        "weekdays = 每周几天 several days a week (days), e.g. 工作日 Monday-Friday")
    time: str = Field(
        description="once: 'YYYY-MM-DD HH:MM' (seconds allowed) in the chat's time zone, e.g. '2026-11-22 15:00'; "
        "daily/weekly/weekdays: 'HH:MM', e.g. '08:00'")
    content: str = Field(
        min_length=1, max_length=500,
        description="提醒内容 text sent to the user when it fires; in prompt mode, the instruction to run then")
    weekday: int | None = Field(
        default=None, ge=0, le=6, description="weekly only (leave out otherwise): 0=Monday 周一 ... 6=Sunday 周日")
    days: list[int] | None = Field(
        default=None, min_length=1, max_length=7,
        description="weekdays only (leave out otherwise): the days, 0=Monday ... 6=Sunday; [0,1,2,3,4] = 工作日")
    mode: Literal["text", "prompt", "command"] = Field(
        default="text",
        description="text = send content as is; prompt = at fire time run content as a request to the assistant "
        "and send its answer (e.g. 'tell me Beijing's weather'); command = at fire time run content as a "
        "/command of this bot (e.g. '/summary': a daily digest; in a group only its admins may schedule that) and "
        "send its reply")


class DeleteArgs(BaseModel):
    """Arguments of ``reminder_delete``."""

    model_config = ConfigDict(extra="forbid")

    reminder_id: str = Field(
        min_length=1, max_length=40,
        description="the reminder's id as shown by reminder_list (e.g. '3f9a'), or any unique prefix of it; "
        "'all' deletes every reminder the person may delete in this chat")


@dataclass
class ReminderDeps:
    """What the reminder tools receive as ``ctx.deps``."""

    service: ReminderService

    @property
    def store(self) -> ReminderStore:
        return self.service.store

    @property
    def settings(self) -> ReminderSettings:
        return self.service.settings

    @property
    def llm_available(self) -> bool:
        return self.service.bot.router is not None

    @staticmethod
    def owner_scope(caller: Caller) -> str | None:
        """Whose reminders ``caller`` may delete by id: their own (None: anyone's, for a bot admin)."""
        return None if caller.bot_admin else caller.qualified_user

    @staticmethod
    def clears_chat(caller: Caller) -> bool:
        """Whether ``caller``'s "all" deletes everyone's reminders in this chat, not just their own."""
        return caller.group_admin

    async def visible(self, caller: Caller) -> list[Reminder]:
        """The caller's reminders that may be shown where they ask: in a group only this chat's ones
        (another chat's, a private one above all, must not show there); in private all of them."""
        mine = await self.store.for_owner(caller.qualified_user)
        here = ChatRef.of(caller).key
        return [r for r in mine if r.chat == here] if caller.chat_kind == "group" else mine

    async def describe(self, caller: Caller, reminders: list[Reminder]) -> list[str]:
        """One line per reminder: short id, chat, schedule with next fire, content."""
        short = await self.store.short_ids([r.id for r in reminders])
        here = ChatRef.of(caller).key
        lines = []
        for r in reminders:
            chat = r.chat_ref
            where = ("本群" if chat.kind == "group" else "本聊天") if r.chat == here else (
                f"群 {chat.chat_id}" if chat.kind == "group" else "私聊")
            kind = {"prompt": "[定时任务] ", "command": "[定时命令] "}.get(r.mode, "")
            who = f"（{r.owner_name}）" if r.owner != caller.qualified_user else ""
            lines.append(f"#{short[r.id]} [{where}] {describe(r.schedule, r.next_fire)} — {kind}{r.content}{who}")
        return lines

    async def panel(self, chat: ChatRef) -> list[dict[str, str]]:
        """The web playground's side panel: the chat's active reminders."""
        rows = await self.store.for_chat(chat.key)
        short = await self.store.short_ids([r.id for r in rows])
        # Labels are what the playground shows: written for people, not field names.
        return [{"编号": f"#{short[r.id]}", "谁的": r.owner_name, "时间": describe(r.schedule, r.next_fire),
                 "内容": ("[定时任务] " if r.mode == "prompt" else "") + r.content[:80]} for r in rows]


@tool_function(
    require_at=True, aliases=["remind"], timeout_s=45,  # past the database's 30 s lock wait: say "try later"
    examples=["提醒我明天下午3点开会", "/remind 明天8点 开会", "每天早上8点提醒我喝水", "每周一9:30提醒大家交周报",
              "每天8点告诉我北京的天气", "/remind 工作日 9:00 站会"],
)
async def reminder_set(ctx: ToolContext[ReminderDeps], args: ReminderArgs) -> ToolResult:
    """设置提醒 (set a reminder) for the person asking, in this chat; it @-mentions them when it fires.

    Times are wall-clock times in the chat's time zone. Use mode 'prompt' only when the person
    wants fresh information produced at that time (weather, news), not for plain reminders.
    """
    deps = ctx.deps
    if ctx.caller.anonymous:
        # Final, not something the model can fix: the person is told directly.
        return ToolResult(content="refused: the sender is anonymous; a reminder needs a real account to belong to",
                          user_messages=("匿名消息不能设置提醒：提醒需要属于一个真实账号，请取消匿名后再试。",),
                          continue_=False, is_error=True)
    content = args.content.strip()
    if not content:
        raise ToolError("content is empty: say what the reminder should tell the user",
                        user_message="设置提醒失败：提醒内容不能为空。")
    if len(content) > deps.settings.max_content:
        raise ToolError(f"content is {len(content)} characters; the limit is {deps.settings.max_content}. "
                        "Shorten it.",
                        user_message=f"设置提醒失败：内容有 {len(content)} 字，最多 {deps.settings.max_content} 字。")
    if args.mode == "prompt" and not deps.llm_available:
        raise ToolError("mode 'prompt' needs an LLM, and this bot has none configured; use mode 'text'",
                        user_message="这个机器人没有接入大模型，不能设置定时任务（prompt 模式），只能设置普通文字提醒。")
    if args.mode == "command":
        _check_command(deps, content, ctx.caller)
    what = {"prompt": "定时任务", "command": "定时命令"}.get(args.mode, "提醒")

    def confirmation(made: Reminder, short: str) -> str:
        text = f"好的，已设置{what} #{short}：{describe(schedule, made.next_fire)}\n内容：{made.content}"
        if made.status == "active" and made.next_fire is not None and made.next_fire <= ctx.now():
            text += "\n（消息处理晚了，时间已过，马上提醒）"
        return text

    try:
        if args.days is not None and args.type != "weekdays":
            raise ScheduleError(f"days is only for weekdays reminders; leave it out for a {args.type} reminder",
                                user_message="只有每周几天的提醒（weekdays）需要 days。")
        if args.type == "weekdays" and args.weekday is not None:
            raise ScheduleError("weekdays reminders take days (a list), not weekday",
                                user_message="每周几天的提醒请用 days 指定哪几天（例如 工作日），不用 weekday。")
        weekday = days_mask(args.days or ()) if args.type == "weekdays" else args.weekday
        schedule = parse_schedule(args.type, args.time, ctx.zone.key, weekday)
        # A typed /remind (the pipeline's "cmd-" call, not another tool's call_tool) answers exactly this
        # text as the message's first reply: it commits with the reminder.
        typed = ctx.via == "command" and ctx.tool_call_id.startswith("cmd-")
        # Its parser checked a one-time time against when it was sent (kept at most KEEP): one that
        # passed only while the message waited is kept, and fires at once with a late note.
        reminder = await deps.service.create(ctx.caller, schedule, content, args.mode,
                                             confirm=confirmation if typed else None,
                                             ahead_since=ctx.now() - KEEP if typed else None)
    except (ScheduleError, ReminderError) as exc:
        raise ToolError(str(exc), user_message=f"设置提醒失败：{exc.user_message or '时间或参数无效。'}") from None
    short = (await deps.store.short_ids([reminder.id]))[reminder.id]
    text = confirmation(reminder, short)
    assert reminder.next_fire is not None
    return ToolResult.reply(text, data={"id": reminder.id, "short_id": short, "next_fire": iso(reminder.next_fire)})


_GROUP_DIGESTS = frozenset({"summary"})
"""Commands a group's admins alone may schedule in it: a scheduled ``/summary`` is the group's digest,
posted to everyone and moving the group's summary mark, which ``/summary daily`` leaves to them. (The
summary tool checks that inside ``/summary daily``, where a stored command cannot see it.)"""


def _check_command(deps: ReminderDeps, content: str, caller: Caller) -> None:
    """A command-mode reminder stores one of ``[reminders] command_tools``, as ``/name args``, that
    ``caller`` may run here themselves: it runs as them at its time."""
    name, _ = command_name(content)
    tool = deps.service.bot.tools.resolve(name) if name else None
    allowed = deps.service.allowed
    if tool is None or tool.name not in allowed.command_tools:
        shown = "、".join(f"/{n}" for n in allowed.commands) or "（无）"
        raise ToolError(f"mode 'command' runs one of these commands: {', '.join(allowed.commands) or 'none'}; "
                        f"content must start with it, e.g. '/summary'",
                        user_message=f"设置提醒失败：定时命令只能是 {shown}。")
    # A group_admin tool too: its run cannot see a group role (no live message), only a bot admin passes then.
    if (tool.admin_only or tool.group_admin) and not caller.bot_admin:
        who, en = "机器人管理员", "bot admins"
    elif tool.name in _GROUP_DIGESTS and caller.chat_kind == "group" and not caller.group_admin:
        who, en = "群主、群管理员或机器人管理员", "the group's admins and bot admins"
    elif not tool.allowed_for(caller.model_copy(update={"addressed": True})):  # its scope: group or private only
        raise ToolError(f"/{name} cannot run in this chat", user_message=f"设置提醒失败：/{name} 不能在这个聊天里使用。")
    else:
        return
    raise ToolError(f"refused: only {en} may schedule /{name} here; tell the user so",
                    user_message=f"设置提醒失败：只有{who}可以在这里定时执行 /{name}。")


@tool_function(aliases=["reminders"], read_only=True)
async def reminder_list(ctx: ToolContext[ReminderDeps]) -> ToolResult:
    """列出我的提醒 (list the asking person's active reminders, with ids for reminder_delete: in a group this
    chat's only; in a private chat all of theirs, each marked with where it fires)."""
    deps = ctx.deps
    mine = await deps.visible(ctx.caller)
    if not mine:
        where = "在本群" if ctx.caller.chat_kind == "group" else "目前"
        return ToolResult.reply(f"你{where}没有任何提醒。", content="The user has no active reminders here.")
    lines = await deps.describe(ctx.caller, mine)
    return ToolResult(content=f"你的提醒（共 {len(mine)} 个）：\n" + "\n".join(lines),
                      data={"ids": [r.id for r in mine]})


@tool_function(aliases=["unremind"])
async def reminder_delete(ctx: ToolContext[ReminderDeps], args: DeleteArgs) -> ToolResult:
    """删除提醒 (delete one of the asking person's reminders by the id reminder_list shows, or a unique
    prefix; 'all' = every reminder they may delete in this chat)."""
    deps, caller = ctx.deps, ctx.caller
    wanted = unicodedata.normalize("NFKC", args.reminder_id).strip()  # an IME's ＃７ｂ and ａｌｌ are #7b, all
    if wanted.lower() in _ALL:
        if ctx.via != "command" and caller.is_admin:
            # Clearing a whole chat is for a person to type, not for a model to infer from chat text.
            raise ToolError("deleting every reminder in the chat needs the person to send `/unremind all` "
                            "themselves; tell them so", user_message="要删除本聊天的全部提醒，请直接发送 /unremind all。")
        return await _delete_all(deps, caller)
    # In a group another chat's reminder is neither deleted nor described from here.
    here = ChatRef.of(caller).key if caller.chat_kind == "group" else None
    found = await deps.store.match(wanted, owner=deps.owner_scope(caller), chat=here)
    # A bot admin may delete anyone's reminder by id, but reads only their own and this chat's: another
    # person's private reminder is theirs (a one-character prefix listed everyone's, content and all).
    def shown(r: Reminder) -> bool:
        return r.owner == caller.qualified_user or r.chat == ChatRef.of(caller).key

    if len(found) == 1:
        target = found[0]
        line = (await deps.describe(caller, [target]))[0] if shown(target) else f"#{wanted.lstrip('#')}（{target.owner} 的）"
        if not await deps.service.delete(target.id):
            raise ToolError(f"reminder {wanted!r} has just fired or was deleted; nothing to delete",
                            user_message=f"提醒 {wanted} 刚刚已经发出或被删除了。")
        return ToolResult.reply(f"已删除提醒 {line}", data={"id": target.id})
    if found:
        lines = [*await deps.describe(caller, [r for r in found if shown(r)]),
                 *([f"……还有 {hidden} 个别人的提醒"] if (hidden := sum(not shown(r) for r in found)) else [])]
        raise ToolError(f"id {wanted!r} is ambiguous: it matches {len(found)} reminders. Use more characters "
                        "of the id:\n" + "\n".join(lines), user_message=f"编号 {wanted} 不唯一：\n" + "\n".join(lines))
    mine = await deps.visible(caller)
    if not mine:
        where = "在本群" if caller.chat_kind == "group" else "目前"
        raise ToolError(f"no reminder with id {wanted!r}: the user has no active reminders here",
                        user_message=f"没有找到编号为 {wanted} 的提醒；你{where}没有任何提醒。")
    lines = await deps.describe(caller, mine[:_LISTED])
    extra = len(mine) - _LISTED
    more, more_zh = (f"\n…and {extra} more (call reminder_list)", f"\n……还有 {extra} 个（发送 /reminders 查看）"
                     ) if extra > 0 else ("", "")
    raise ToolError(f"no reminder of this user has id {wanted!r}. Their reminders are:\n" + "\n".join(lines) + more,
                    user_message=f"没有找到编号为 {wanted} 的提醒。你的提醒：\n" + "\n".join(lines) + more_zh)


async def _delete_all(deps: ReminderDeps, caller: Caller) -> ToolResult:
    everyone = deps.clears_chat(caller)
    here = "本群" if caller.chat_kind == "group" else "本聊天"
    count = await deps.service.delete_chat(ChatRef.of(caller), owner=None if everyone else caller.qualified_user)
    whose = "" if everyone else "你在"
    if count == 0:
        return ToolResult.reply(f"{whose}{here}没有可删除的提醒。",
                                content="nothing to delete: no active reminders of this user in this chat"
                                if not everyone else "nothing to delete: this chat has no active reminders")
    return ToolResult.reply(f"已删除{whose}{here}的全部 {count} 个提醒。",
                            content=f"deleted {count} reminders in this chat"
                            + ("" if everyone else " (only the user's own: they are not an admin here)"),
                            data={"deleted": count})


toolset = Toolset("reminders", [reminder_set, reminder_list, reminder_delete])
