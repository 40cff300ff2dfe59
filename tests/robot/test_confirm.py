"""``confirm=True`` tools never run unapproved: not from a /command, not from the model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from function_calls import ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.plugin import Plugin


class Target(BaseModel):
    who: str


def dangerous(ran: list[str]) -> Plugin[Any]:
    @tool_function(confirm=True, aliases=["清空"])
    async def wipe(ctx: ToolContext[object], args: Target) -> ToolResult:
        """Wipe someone's data (needs an admin's approval)."""
        ran.append(args.who)
        return ToolResult.reply(f"wiped {args.who}")

    return Plugin("danger", Toolset("danger", [wipe]))


async def test_a_confirm_tool_is_refused_on_the_command_path(make_bot: Any) -> None:
    ran: list[str] = []
    _bot, ch = await make_bot(plugins=[dangerous(ran)], bot={"admins": ["memory:boss"]})
    await ch.inject("/wipe alice", user="boss", at_bot=True)
    await ch.inject("/清空 bob", user="boss", chat=ch.chat("boss", "private"))
    sent = await ch.wait_sent(2)
    assert ran == []
    for out in sent:
        assert "需要管理员批准" in out.text and "没有执行" in out.text
        assert out.text.startswith("/")


async def test_a_confirm_tool_is_refused_on_the_model_path(make_bot: Any) -> None:
    ran: list[str] = []
    model = ScriptedModel([call("wipe", {"who": "alice"}), text("这个操作需要管理员批准，我没有执行。")])
    _bot, ch = await make_bot(model, plugins=[dangerous(ran)])
    await ch.inject("帮我清空 alice 的数据", user="boss", chat=ch.chat("boss", "private"))
    sent = await ch.wait_sent(1)
    assert ran == []
    tool_turn = [m for m in model.requests[-1].messages if m["role"] == "tool"]
    assert "需要管理员批准" in tool_turn[0]["content"] and "没有执行" in tool_turn[0]["content"]
    assert sent[-1].text == "这个操作需要管理员批准，我没有执行。"
