"""Web search through Perplexity (Agent API or classic Sonar chat completions), with citations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from function_calls import Toolset
from robot import Plugin
from search.client import PerplexityClient, SearchAnswer, SearchError, Source
from search.format import format_answer, format_for_model
from search.settings import SearchSettings
from search.tools import HOW_TO_ENABLE, SearchDeps, WindowLimiter, disabled_reason, perplexity_search

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "PerplexityClient",
    "SearchAnswer",
    "SearchDeps",
    "SearchError",
    "SearchSettings",
    "Source",
    "format_answer",
    "format_for_model",
    "perplexity_search",
    "plugin",
]


async def _setup(bot: Bot) -> SearchDeps:
    settings = bot.settings.section("search", SearchSettings)
    return SearchDeps(settings=settings, client=PerplexityClient(settings),
                      per_user=WindowLimiter(settings.user_rate_per_hour),
                      per_chat=WindowLimiter(settings.chat_rate_per_hour),
                      per_bot=WindowLimiter(settings.bot_rate_per_hour))


async def _teardown(deps: SearchDeps) -> None:
    await deps.client.aclose()


def _unavailable(deps: SearchDeps) -> str | None:
    return disabled_reason(deps) if deps.client.configured else HOW_TO_ENABLE


plugin: Plugin[SearchDeps] = Plugin(
    name="search", tools=Toolset("search", [perplexity_search]), setup=_setup, teardown=_teardown,
    unavailable=_unavailable, settings_model=SearchSettings,
)
