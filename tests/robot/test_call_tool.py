"""``Bot.call_tool``: one plugin using another's tool, or a stored command, with a typed command's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from function_calls import Caller, ToolContext, ToolError, Toolset, tool_function
from robot.bot import Bot
from robot.config import Settings
from robot.plugin import Plugin
from robot.testing import MemoryChannel


class EchoArgs(BaseModel):
    word: str
    times: int = 1


@tool_function
async def echo(ctx: ToolContext[object], args: EchoArgs) -> str:
    """Echo."""
    return f"{ctx.via}:{ctx.caller.user_id}:" + args.word * args.times


@tool_function(admin_only=True)
async def wipe(ctx: ToolContext[object]) -> str:
    """Admins only."""
    return "wiped"


@tool_function(confirm=True)
async def transfer(ctx: ToolContext[object], args: EchoArgs) -> str:
    """Needs a confirmation."""
    return "sent"


PLUGIN: Plugin[object] = Plugin("tools", Toolset("tools", [echo, wipe, transfer]))
MEMBER = Caller(platform="memory", user_id="u1", chat_id="g1", chat_kind="group")


async def test_call_tool_runs_a_tool_by_command_line_or_object_and_refuses_what_a_command_would(
        tmp_path: Path) -> None:
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[MemoryChannel()], plugins=[PLUGIN])
    await bot.start()
    try:
        assert (await bot.call_tool("echo", MEMBER, "ab times=2", via="scheduled")).content == "scheduled:u1:abab"
        assert (await bot.call_tool("echo", MEMBER, {"word": "x"})).content == "command:u1:x"
        for name, line, why in (("wipe", "", "只有机器人管理员"), ("transfer", "a", "需要确认"), ("nope", "", "没有 /nope"),
                                ("echo", "times=x", "参数有误")):
            with pytest.raises(ToolError) as caught:
                await bot.call_tool(name, MEMBER, line)
            assert why in (caught.value.user_message or ""), name
        admin = MEMBER.model_copy(update={"is_admin": True, "bot_admin": True})
        assert (await bot.call_tool("wipe", admin, "")).content == "wiped"
    finally:
        await bot.stop()
