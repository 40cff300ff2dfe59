"""``[llm]`` model options reach the requests the bot sends: reasoning pass-back, the output-cap parameter."""

from __future__ import annotations

from typing import Any

import pytest

from function_calls import StopReason, Toolset, tool_function
from function_calls.testing import FakeOpenAIServer, Raw, Reply, chunk

USER = [{"role": "user", "content": "现在几点？"}]


async def clock() -> str:
    """The time."""
    return "09:00"


@pytest.mark.parametrize("pass_back", [True, False])
async def test_llm_settings_reach_the_model(make_bot: Any, pass_back: bool) -> None:
    async with FakeOpenAIServer() as server:
        thinking = Raw([chunk({"role": "assistant", "reasoning_content": "要看时间。"}),
                        chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                               "function": {"name": "clock", "arguments": "{}"}}]}, "tool_calls")])
        server.script(thinking, Reply("九点"))
        llm = {"model": "deepseek-reasoner", "base_url": server.base_url, "api_key": "k", "max_tool_calls": 1,
               "reasoning_pass_back": pass_back, "token_param": "max_completion_tokens"}
        bot, _ = await make_bot(plugins=[], llm=llm)  # started: its budget store exists (an unread one refuses)
        assert bot.router is not None
        result = await bot.router.runner.run(USER, Toolset("t", [tool_function(clock)]))
        await bot.model.aclose()
    assert result.stop is StopReason.TOOL_CALL_LIMIT and result.text == "九点"
    final = server.last_request.body
    assert final["max_completion_tokens"] > 0 and "max_tokens" not in final
    assistant = final["messages"][1]
    assert assistant.get("reasoning_content") == ("要看时间。" if pass_back else None)
