"""The memory tools: ``remember`` (U), ``recall`` (R), ``memories`` and ``sleep`` (S, bot admins).

``/forget <id>`` and ``/forget me`` are the core ``forget`` command (:mod:`robot.privacy`), which calls the
bot's forget hooks: this plugin registers one (see :func:`memory.setup`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from function_calls import ToolContext, ToolError, ToolResult, Toolset, tool_function
from memory.service import MemoryService
from memory.store import LISTED, RECALLED, SLEEP_REPORT, describe
from robot import ChatRef

__all__ = ["MemoryDeps", "RecallArgs", "RememberArgs", "memories", "recall", "remember", "sleep", "toolset"]


@dataclass
class MemoryDeps:
    """What the tools use; built by :func:`memory.setup`."""

    service: MemoryService


class RememberArgs(BaseModel):
    """A fact to keep."""

    content: str = Field(min_length=1, max_length=10000, description="the fact, self-contained (up to ~300 words)")
    scope: Literal["me", "group"] = Field(
        default="me", description='"me": about the asker; "group": about this group (group chats only)')


class RecallArgs(BaseModel):
    """What to look for."""

    query: str = Field(min_length=1, max_length=500, description="keywords or a question")


@tool_function(require_at=True, examples=["记住我对花生过敏", "/remember 我们组周会改到周四了 group"])
async def remember(ctx: ToolContext[MemoryDeps], args: RememberArgs) -> ToolResult:
    """记住一件事 (remember): 用户明确要求记住时调用；scope=me 关于提问者本人，scope=group 关于本群。"""
    row = await ctx.deps.service.remember(ctx.caller, args.content, args.scope)
    where = "本群的记忆" if row.kind == "group" else "你的记忆"
    text = f"记住了（{where} #{row.id}）。"
    return ToolResult(content=text, user_messages=(text,) if ctx.via == "command" else (),
                      continue_=ctx.via != "command", data={"id": row.id, "kind": row.kind})


@tool_function(examples=["我对什么过敏？", "/recall 周会"])
async def recall(ctx: ToolContext[MemoryDeps], args: RecallArgs) -> ToolResult:
    """回忆 (recall): 在本聊天保存的记忆中查找与 query 相关的内容，按相关度返回前几条。"""
    rows = await ctx.deps.service.recall(ctx.caller, args.query)
    text = f"{RECALLED}\n" + "\n".join(describe(r, ctx.zone) for r in rows) if rows else "没有找到相关的记忆。"
    if ctx.via == "command":
        return ToolResult.reply(text, data={"ids": [r.id for r in rows]})
    return ToolResult(content=text, data={"ids": [r.id for r in rows]})


@tool_function(examples=["/memories"])
async def memories(ctx: ToolContext[MemoryDeps]) -> ToolResult:
    """列出我的记忆 (memories): 你在这里保存的记忆（群聊中还有本群的记忆），带编号、等级和长期标记。"""
    rows = await ctx.deps.service.listing(ctx.caller)
    if not rows:
        return ToolResult.reply("这里还没有你的记忆。说「记住……」或用 /remember 保存。")
    lines = [describe(r, ctx.zone) for r in rows]
    return ToolResult.reply(f"{LISTED}\n" + "\n".join(lines) + "\n删除一条：/forget <编号>")


@tool_function(admin_only=True, examples=["/sleep"])
async def sleep(ctx: ToolContext[MemoryDeps]) -> ToolResult:
    """让本聊天的记忆睡一觉 (sleep, bot admins only): 抽样削弱久未回忆的记忆，删除遗忘的，并把它们写成梦境。"""
    if not ctx.caller.bot_admin:
        raise ToolError("only bot admins may run sleep", user_message="只有机器人管理员可以使用 /sleep。")
    report = await ctx.deps.service.sleep(ChatRef.of(ctx.caller).key)
    text = f"{SLEEP_REPORT}抽查 {report.sampled} 条，削弱 {report.weakened} 条，遗忘 {report.deleted} 条。"
    if report.dream:
        text += f"\n梦境：{report.dream}"
    return ToolResult.reply(text, data={"sampled": report.sampled, "weakened": report.weakened,
                                        "deleted": report.deleted})


toolset = Toolset("memory", [remember, recall, memories, sleep])
