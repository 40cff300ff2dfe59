"""``perplexity_search``: web search with citations, as a data tool the model words itself."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from function_calls import ToolContext, ToolError, ToolResult, tool_function
from robot import group_key
from search.client import (
    PerplexityClient,
    SearchAnswer,
    SearchAuthError,
    SearchError,
    SearchRateLimited,
    SearchUnavailable,
)
from search.format import format_answer, format_for_model
from search.research import ResearchService
from search.settings import MAX_TIMEOUT_S, Recency, SearchSettings

__all__ = ["ResearchArgs", "SearchArgs", "SearchDeps", "WindowLimiter", "deep_research", "disabled_reason",
           "perplexity_search"]

log = logging.getLogger(__name__)

HOW_TO_ENABLE = (
    "联网搜索未启用：请在 qunbot.toml 的 [search] 中设置 api_key（Perplexity API key），"
    "或设置环境变量 PERPLEXITY_API_KEY 后重启。"
)
# A tool's timeout is fixed when it is defined, before [search] is read: these leave room for the largest
# timeout_s, twice (a search's fallback or retry, a research submission's retry), and keep to the setting
# themselves (the search's own deadline, the client's per-request one); the bot's cut would waste a paid answer.
_TOOL_TIMEOUT_S = 2 * MAX_TIMEOUT_S + 30
_MODEL_NOTE = (
    "\n\n[qunbot] Answer the user in your own words from these results. Keep the [n] citation markers "
    "and finish with the source lines you cited, formatted `[n] title url`."
)


@dataclass
class WindowLimiter:
    """At most ``limit`` events per ``window_s`` per key (a sliding window); ``limit`` 0 allows none.

    Checking (:meth:`wait_time`) and recording (:meth:`acquire`) are separate, so a caller can
    check several limiters before using a slot in any, and give a slot back (:meth:`release`)
    when the work it was for failed before anything was billed.
    """

    limit: int
    window_s: float = 3600.0
    monotonic: Callable[[], float] = time.monotonic
    _events: dict[str, deque[float]] = field(default_factory=dict)

    def _live(self, key: str, now: float) -> deque[float]:
        events = self._events.get(key)
        if events is None:
            return deque()
        while events and now - events[0] >= self.window_s:
            events.popleft()
        if not events:
            del self._events[key]  # idle keys cost no memory
        return events

    @property
    def disabled(self) -> bool:
        """True when the limit is 0: nothing is ever allowed."""
        return self.limit <= 0

    def wait_time(self, key: str) -> float:
        """0 if an event is allowed now, else seconds until one is (``inf`` when disabled). Records nothing."""
        if self.disabled:
            return math.inf
        now = self.monotonic()
        events = self._live(key, now)
        if len(events) >= self.limit:
            return self.window_s - (now - events[0])
        return 0.0

    def acquire(self, key: str) -> float:
        """Record an event now (after :meth:`wait_time` said 0); returns its stamp for :meth:`release`."""
        stamp = self.monotonic()
        self._events.setdefault(key, deque()).append(stamp)
        return stamp

    def release(self, key: str, stamp: float) -> None:
        """Give back the event recorded at ``stamp`` (the work it was for failed unbilled)."""
        events = self._events.get(key)
        if events is not None and stamp in events:
            events.remove(stamp)
            if not events:
                del self._events[key]


@dataclass
class SearchDeps:
    """What the search tool needs: the client, the display limits and the cost limits."""

    settings: SearchSettings
    client: PerplexityClient
    per_user: WindowLimiter
    per_chat: WindowLimiter
    #: Bot-wide: every chat together (key "bot").
    per_bot: WindowLimiter = field(default_factory=lambda: WindowLimiter(200))
    research: ResearchService | None = None
    """Deep research runs (``deep_research``), when the plugin was set up in a bot."""


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=300,
                       description="what to look up on the web, in the user's language; self-contained")
    recency: Recency | None = Field(
        default=None,
        description="only pages from the last hour/day/week/month/year, when the user asks for recent "
                    "news (\"最近一周的新闻\" -> week); omit otherwise")


def disabled_reason(deps: SearchDeps) -> str | None:
    """Why search is off because a rate limit is set to 0 (users see it), or None."""
    for limiter, setting in ((deps.per_user, "user_rate_per_hour"), (deps.per_chat, "chat_rate_per_hour"),
                             (deps.per_bot, "bot_rate_per_hour")):
        if limiter.disabled:
            return f"联网搜索已被管理员关闭（[search] {setting} = 0）。"
    return None


def _minutes(seconds: float) -> int:
    return max(1, round(seconds / 60))


async def _search(client: PerplexityClient, query: str, recency: Recency | None, within_s: float,
                  give_back: Callable[[], None]) -> SearchAnswer:
    """The search's answer, or a ToolError; ``give_back`` runs when nothing can have been billed (a refusal,
    a 5xx, nothing sent). A timeout or an unusable HTTP 200 keeps the slot: Perplexity bills those."""
    try:
        async with asyncio.timeout(within_s):
            return await client.search(query, recency=recency)
    except TimeoutError:  # the client turns its own timeouts into SearchUnavailable: this is the deadline
        raise ToolError(f"the search took longer than {within_s:g} s; tell the user to retry later",
                        user_message=f"搜索超时（{within_s:g} 秒内没有结果），请稍后再试。") from None
    except SearchError as exc:
        if not exc.billed:
            give_back()
        raise _tool_error(exc) from None


def _tool_error(exc: SearchError) -> ToolError:
    if isinstance(exc, SearchAuthError):
        log.warning("perplexity rejected the key: %s", exc)
        return ToolError("the search service rejected the bot's API key; tell the user search is unavailable",
                         user_message="搜索服务拒绝了本机器人的 API key，请管理员检查 [search] api_key。")
    if isinstance(exc, SearchRateLimited):
        return ToolError("the search service is rate limiting; tell the user to retry in a minute",
                         user_message="搜索服务繁忙（被限流），请稍后再试。")
    if isinstance(exc, SearchUnavailable):
        # The owner's log gets the cause (e.g. "raise [search] max_output_tokens"); SearchError text has no key.
        log.warning("perplexity search failed: %s", exc)
        return ToolError(f"the search service is unavailable ({exc}); tell the user to retry later",
                         user_message="搜索服务暂时不可用（超时或故障），请稍后再试。")
    return ToolError(f"search failed: {exc}", user_message=f"搜索失败：{exc}")


@tool_function(examples=["搜一下今天上海的天气", "查查 Python 3.14 有什么新特性"], aliases=["search"],
               timeout_s=_TOOL_TIMEOUT_S, read_only=True)  # (a search spends quota, and changes nothing)
async def perplexity_search(ctx: ToolContext[SearchDeps], args: SearchArgs) -> ToolResult:
    """联网搜索 (web search through Perplexity): current facts, news, prices, weather; returns an answer with
    numbered citations [n] and its sources."""
    deps = ctx.deps
    if not deps.client.configured:
        raise ToolError("web search is not configured on this bot", user_message=HOW_TO_ENABLE)
    caller = ctx.caller
    # A forum group's topics share the group's allowance (each topic had a fresh one: N topics, N times the bill).
    chat_key = group_key(f"{caller.platform}:{caller.chat_kind}:{caller.chat_id}")
    chat_word = "本群" if caller.chat_kind == "group" else "本聊天"
    off = disabled_reason(deps)
    if off is not None:
        raise ToolError(f"web search is switched off on this bot; tell the user: {off}", user_message=off)
    checks = ((deps.per_user, caller.qualified_user, "你"), (deps.per_chat, chat_key, chat_word),
              (deps.per_bot, "bot", "本机器人"))
    for limiter, key, who in checks:  # every limit is checked before any slot is used
        wait = limiter.wait_time(key)
        if wait:
            text = f"{who}的搜索次数已达上限（每小时 {limiter.limit} 次），请 {_minutes(wait)} 分钟后再试。"
            raise ToolError(f"search limit reached; tell the user: {text}", user_message=text)
    # Slots are taken now (no await since the checks, so concurrent searches cannot overshoot) and given
    # back only if the search cannot have been billed; a cut (timeout, stop) may follow a sent request: kept.
    taken = [(limiter, key, limiter.acquire(key)) for limiter, key, _ in checks]

    def give_back() -> None:
        for limiter, key, stamp in taken:
            limiter.release(key, stamp)

    answer = await _search(deps.client, args.query, args.recency, 2 * deps.settings.timeout_s, give_back)
    settings = deps.settings
    if ctx.via != "model":  # a typed /command, or one a reminder runs: posted to the chat as it is
        return ToolResult.reply(format_answer(answer, max_chars=settings.max_answer_chars,
                                              max_sources=settings.max_sources))
    data: dict[str, object] = {"sources": [s.url for s in answer.sources], "endpoint": answer.endpoint,
                               "citation_tokens": answer.usage.citation_tokens,
                               "search_queries": answer.usage.num_search_queries,
                               "truncated": answer.truncated}
    return ToolResult(content=format_for_model(answer) + _MODEL_NOTE, data=data)


class ResearchArgs(BaseModel):
    question: str = Field(min_length=2, max_length=500,
                          description="the research question, in the user's language; self-contained")


@tool_function(require_at=True, aliases=["research"], examples=["/research 2026 年固态电池商业化进展"],
               timeout_s=_TOOL_TIMEOUT_S)
async def deep_research(ctx: ToolContext[SearchDeps], args: ResearchArgs) -> ToolResult:
    """深度研究 (deep research): a Perplexity research report that takes several minutes and arrives later
    in this chat. Only when the person asks for in-depth research, not for quick facts."""
    service = ctx.deps.research
    if service is None or not service.offered:
        raise ToolError("deep research is not enabled on this bot; tell the user",
                        user_message="深度研究未启用（管理员可在 [search] 设置 api_key 和 research_per_user_day）。")
    if ctx.caller.anonymous:
        raise ToolError("anonymous senders cannot start deep research", user_message="匿名消息不能发起深度研究。")
    job = await service.submit(ctx.caller, args.question.strip())
    minutes = service.settings.research_timeout_min
    return ToolResult.reply(f"🔎 深度研究已开始，通常需要几分钟（最长 {minutes:g} 分钟），完成后会把报告发到这里。",
                            content="deep research started; the report will be posted in this chat when done. "
                                    "Tell the user it is running.", data={"job": job.id})
