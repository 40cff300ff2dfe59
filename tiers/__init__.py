"""Model tiers: ``deep_think`` (M0, ``[llm.think]``) and ``plan`` (M2, ``[llm.plan]``).

``[llm]`` stays the default tier, M1 (execute). A tier that is not configured has its tool
withheld from the model (and its command explains why). See :mod:`tiers.tools`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from function_calls import ChatModel, Limits, OpenAIChatModel
from robot import Plugin
from tiers.tools import (
    ExecuteArgs,
    PlanArgs,
    ThinkArgs,
    Tier,
    TierDeps,
    deep_think,
    execute,
    plan,
    strip_reasoning,
    toolset,
)

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["ExecuteArgs", "PlanArgs", "ThinkArgs", "Tier", "TierDeps", "deep_think", "execute", "plan", "plugin",
           "setup", "strip_reasoning", "teardown", "toolset", "unavailable"]


def _tier(bot: Bot, section: Any) -> Tier | None:
    if section is None:
        return None
    llm = bot.settings.llm
    key = section.api_key or llm.api_key
    # The tier's own settings, else [llm]'s: a reasoning model refused max_tokens (HTTP 400) on the think tier.
    # Streamed as [llm] is unless it says otherwise (a provider may refuse to stream one model): a streamed turn
    # is left once it writes past what the run has left (one that is not streamed is read whole, however far
    # past its cap a provider that ignores max_tokens goes).
    pass_back = llm.reasoning_pass_back if section.reasoning_pass_back is None else section.reasoning_pass_back
    stream = llm.stream if section.stream is None else section.stream
    model: ChatModel = OpenAIChatModel(model=section.model, base_url=section.base_url or llm.base_url,
                                       api_key=key.get_secret_value() if key else None,
                                       temperature=section.temperature, timeout_s=section.timeout_s, stream=stream,
                                       strict_tools=llm.strict_tools, reasoning_pass_back=pass_back,
                                       token_param=section.token_param or llm.token_param)
    limits = Limits(max_iterations=section.max_iterations, max_tool_calls=section.max_tool_calls,
                    max_run_tokens=section.max_run_tokens)
    return Tier(model, limits, section.reply_within_s)


async def setup(bot: Bot) -> TierDeps:
    """Build the configured tiers' models."""
    llm = bot.settings.llm
    return TierDeps(bot, _tier(bot, llm.think), _tier(bot, llm.plan),
                    Limits(max_iterations=llm.max_iterations, max_tool_calls=llm.max_tool_calls,
                           max_run_tokens=llm.max_run_tokens))


def unavailable(deps: TierDeps) -> Mapping[str, str] | None:
    """Withhold the tools of tiers that are not configured (and everything without the bot's model)."""
    out: dict[str, str] = {}
    if deps.think is None:
        out["deep_think"] = "没有配置 [llm.think]"
    if deps.plan is None:
        out["plan"] = "没有配置 [llm.plan]"
    elif deps.bot.model is None:
        out["plan"] = "没有配置 [llm]（执行模型）"
    return out or None


async def teardown(deps: TierDeps) -> None:
    """Cancel plans still running in the background (each tells its chat, through the outbox, which the bot
    stops after its plugins), and close the tiers' clients."""
    for task in list(deps.tasks):
        task.cancel()
    for task in list(deps.tasks):
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    for tier in (deps.think, deps.plan):
        close = getattr(tier.model, "aclose", None) if tier is not None else None
        if close is not None:
            await close()


plugin: Plugin[TierDeps] = Plugin(name="tiers", tools=toolset, setup=setup, teardown=teardown,
                                  unavailable=unavailable)
