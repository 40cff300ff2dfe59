"""Web search through Perplexity (Agent API or classic Sonar chat completions), with citations, and
deep research in Perplexity's background mode (see :mod:`search.research`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from function_calls import Toolset
from robot import ChatRef, Forgetter, Plugin
from search.client import PerplexityClient, SearchAnswer, SearchError, Source
from search.commands import SEARCH_SYNTAX
from search.format import format_answer, format_for_model
from search.research import ResearchService
from search.settings import SearchSettings
from search.tools import (
    HOW_TO_ENABLE,
    SearchDeps,
    WindowLimiter,
    deep_research,
    disabled_reason,
    perplexity_search,
)

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "PerplexityClient",
    "SearchAnswer",
    "SearchDeps",
    "SearchError",
    "SearchSettings",
    "Source",
    "chat_moved",
    "deep_research",
    "format_answer",
    "format_for_model",
    "perplexity_search",
    "plugin",
]


async def _setup(bot: Bot) -> SearchDeps:
    settings = bot.settings.section("search", SearchSettings)
    client = PerplexityClient(settings)
    research = ResearchService(bot, client, settings)
    await research.start()
    bot.forgetters.append(Forgetter("search", "个深度研究", research.forget))  # the questions asked
    return SearchDeps(settings=settings, client=client, per_user=WindowLimiter(settings.user_rate_per_hour),
                      per_chat=WindowLimiter(settings.chat_rate_per_hour),
                      per_bot=WindowLimiter(settings.bot_rate_per_hour), research=research)


async def _teardown(deps: SearchDeps) -> None:
    if deps.research is not None:
        await deps.research.stop()
    await deps.client.aclose()


def _unavailable(deps: SearchDeps) -> str | dict[str, str] | None:
    reason = disabled_reason(deps) if deps.client.configured else HOW_TO_ENABLE
    if reason is None and (deps.research is None or not deps.research.offered):
        return {"deep_research": "深度研究未启用（管理员可在 [search] 设置 research_per_user_day）。"}
    return reason


async def chat_moved(deps: SearchDeps, old: ChatRef, new: ChatRef) -> None:
    """A chat got a new id (a Telegram group became a supergroup): its research jobs follow it (a /forget me
    there missed them, and their reports went to the old id)."""
    if deps.research is not None:
        await deps.research.move_chat(old.key, new.key)


plugin: Plugin[SearchDeps] = Plugin(
    name="search", tools=Toolset("search", [perplexity_search, deep_research]), setup=_setup, teardown=_teardown,
    unavailable=_unavailable, settings_model=SearchSettings, chat_moved=chat_moved,
    commands={"perplexity_search": SEARCH_SYNTAX},
)
