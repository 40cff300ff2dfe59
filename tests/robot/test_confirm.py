"""``confirm=True`` tools never run unapproved: from a /command or the model, they wait for an approval."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from function_calls import ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call
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


async def test_a_confirm_tool_waits_for_approval_on_the_command_path(make_bot: Any) -> None:
    ran: list[str] = []
    _bot, ch = await make_bot(plugins=[dangerous(ran)], bot={"admins": ["memory:boss"]})
    await ch.inject("/wipe alice", user="u1", at_bot=True)
    await ch.inject("/清空 bob", user="u1", chat=ch.chat("u1", "private"))
    sent = await ch.wait_sent(4)  # two requests, and the admin's notice of each (@ in the group, privately)
    assert ran == []
    requests = [m for m in sent if m.mention != ("boss",) and m.chat.chat_id != "boss"]
    assert len(requests) == 2
    for out in requests:
        assert "需要管理员批准" in out.text and "/approve " in out.text


async def test_a_confirm_tool_waits_for_approval_on_the_model_path(make_bot: Any) -> None:
    ran: list[str] = []
    model = ScriptedModel([call("wipe", {"who": "alice"})])
    _bot, ch = await make_bot(model, plugins=[dangerous(ran)])
    await ch.inject("帮我清空 alice 的数据", user="u1", chat=ch.chat("u1", "private"))
    sent = await ch.wait_sent(1)
    assert ran == [] and len(model.requests) == 1  # paused before the call: no second model turn
    assert "需要管理员批准" in sent[-1].text and 'wipe(who="alice")' in sent[-1].text
