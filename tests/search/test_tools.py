"""The perplexity_search tool inside a running bot: offered or not, data-tool flow, errors, limits."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import search
from function_calls import Caller, ToolContext, ToolError
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.message import ChatRef, OutgoingMessage
from robot.testing import MemoryChannel
from search.testing import FakePerplexityServer
from search.tools import SearchDeps, WindowLimiter

KEY = "pplx-secret-key-123"


@pytest.fixture
async def perplexity() -> AsyncIterator[FakePerplexityServer]:
    async with FakePerplexityServer(api_key=KEY) as server:
        server.answer("上海今天多云，最高 18°C[1]，夜间有小雨[2]。",
                      [("上海天气预报", "https://weather.example/sh"), ("中央气象台", "https://nmc.example/sh")])
        yield server


def make_bot(tmp_path: Path, model: ScriptedModel | None, search_cfg: dict[str, Any]) -> tuple[Bot, MemoryChannel]:
    settings = Settings(bot={"data_dir": tmp_path}, search=search_cfg,
                        limits={"user_per_minute": 600, "user_burst": 100, "chat_per_minute": 600, "chat_burst": 100})
    channel = MemoryChannel()
    return Bot(settings, model=model, channels=[channel], plugins=[search.plugin]), channel


Line = str | tuple[str, dict[str, Any]]


def chat_cfg(perplexity: FakePerplexityServer, **extra: Any) -> dict[str, Any]:
    return {"api_key": KEY, "base_url": perplexity.base_url, "endpoint": "chat", **extra}


async def exchange(tmp_path: Path, search_cfg: dict[str, Any], *lines: Line, timeout: float = 5.0) -> list[OutgoingMessage]:
    """Start a bot without an LLM, type ``lines`` (text, or text and inject() options), return its replies."""
    bot, channel = make_bot(tmp_path, None, search_cfg)
    await bot.start()
    try:
        for line in lines:
            text_, options = (line, {}) if isinstance(line, str) else line
            await channel.inject(text_, **options)
        return await channel.wait_sent(len(lines), timeout=timeout)
    finally:
        await bot.stop()


async def test_without_key_the_tool_is_not_offered_and_the_command_explains(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERPLEXITY_API_KEY", raising=False)
    model = ScriptedModel([text("我没法联网搜索。")])
    bot, channel = make_bot(tmp_path, model, {})
    await bot.start()
    try:
        await channel.inject("帮我搜一下上海天气", at_bot=True)
        await channel.inject("/search 上海天气", user="u2")
        sent = await channel.wait_sent(2)
    finally:
        await bot.stop()
    # nothing of search to offer: the model cannot call a dead tool
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["ask_user"]
    assert "PERPLEXITY_API_KEY" in sent[1].text and "api_key" in sent[1].text


async def test_model_gets_results_with_sources_and_answers_in_its_own_voice(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    model = ScriptedModel([call("perplexity_search", {"query": "上海天气"}),
                           text("上海今天多云[1]。\n[1] 上海天气预报 https://weather.example/sh")])
    bot, channel = make_bot(tmp_path, model, {"api_key": KEY, "base_url": perplexity.base_url})
    await bot.start()
    try:
        await channel.inject("上海天气怎么样", at_bot=True)
        sent = await channel.wait_sent(1)
    finally:
        await bot.stop()
    assert model.requests[0].tools[0]["function"]["name"] == "perplexity_search"
    tool_message = model.requests[1].messages[-1]
    assert tool_message["role"] == "tool"
    assert "https://weather.example/sh" in tool_message["content"] and "[1]" in tool_message["content"]
    assert len(model.requests) == 2  # a data tool goes back to the model
    assert sent[0].text.startswith("上海今天多云[1]")
    assert perplexity.last_request.authorization == f"Bearer {KEY}"


async def test_a_typed_question_reaches_perplexity_as_typed_and_recency_only_by_name(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    # "day" in the question filled the recency field: "how many hours in a" was asked of the last day's pages.
    lines = ["/search how many hours in a day", "/search how many hours in a day does a cat sleep",
             "/search 最近的固态电池新闻 recency=week", "/search recency=month 2024 year in review"]
    await exchange(tmp_path, chat_cfg(perplexity), *lines)
    asked = [(r.body["messages"][-1]["content"], r.body.get("search_recency_filter")) for r in perplexity.requests]
    assert asked == [("how many hours in a day", None), ("how many hours in a day does a cat sleep", None),
                     ("最近的固态电池新闻", "week"), ("2024 year in review", "month")]


async def test_search_command_shows_numbered_citations_and_sources(tmp_path: Path,
                                                                   perplexity: FakePerplexityServer) -> None:
    sent = await exchange(tmp_path, {"api_key": KEY, "base_url": perplexity.base_url, "max_answer_chars": 400},
                          "/search 上海天气")
    reply = sent[0].text
    assert "[1]" in reply and "[2]" in reply
    assert "https://weather.example/sh" in reply and "https://nmc.example/sh" in reply
    assert len(reply) <= 400


async def test_a_search_a_reminder_runs_posts_the_same_reply_as_the_typed_command(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    # A command-mode reminder runs "/search ..." with via="scheduled"; its reply goes to the chat as is.
    bot, _ = make_bot(tmp_path, None, chat_cfg(perplexity, max_answer_chars=120, max_sources=1))
    await bot.start()
    try:
        caller = Caller(platform="memory", user_id="alice", chat_id="g1", chat_kind="group", addressed=True)
        typed = await bot.call_tool("perplexity_search", caller, "上海天气", via="command")
        stored = await bot.call_tool("perplexity_search", caller, "上海天气", via="scheduled")
    finally:
        await bot.stop()
    posted = "\n".join(stored.user_messages)
    assert posted == "\n".join(typed.user_messages) and "[1]" in posted
    assert "[qunbot]" not in posted and len(posted) <= 120 and "https://nmc.example/sh" not in posted


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, "api key"), (429, "限流"), (503, "暂时不可用")],
)
async def test_provider_errors_give_a_clear_message_without_secrets(
        tmp_path: Path, perplexity: FakePerplexityServer, status: int, expected: str) -> None:
    for _ in range(4):  # enough for the client's retry and the auto endpoint's fallback
        perplexity.next_status(status)
    sent = await exchange(tmp_path, chat_cfg(perplexity), "/search 上海天气")
    assert expected in sent[0].text.lower()
    assert KEY not in sent[0].text and "Traceback" not in sent[0].text


async def test_timeout_is_reported_not_raised(tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    perplexity.delay(2.0)
    sent = await exchange(tmp_path, chat_cfg(perplexity, timeout_s=0.3), "/search 上海天气", timeout=10)
    assert "暂时不可用" in sent[0].text


def _largest_timeout_s() -> float:
    """The largest ``[search] timeout_s`` the settings accept."""
    return next(float(m.le) for m in search.SearchSettings.model_fields["timeout_s"].metadata
                if getattr(m, "le", None) is not None)


async def test_the_tools_do_not_cut_a_search_the_timeout_setting_still_allows(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    """``timeout_s = 120`` once met the search tool's own fixed 60 s: an answer at 65 s was paid for and thrown
    away. Each tool's timeout (fixed when it is defined) leaves room for the largest accepted setting: two
    requests of it (a fallback or a retry); the search keeps to what the setting says (next test)."""
    largest = _largest_timeout_s()
    bot, _ = make_bot(tmp_path, None, chat_cfg(perplexity, timeout_s=largest, research_per_user_day=1))
    for command in ("search", "research"):
        tool = bot.tools.resolve(command)
        assert tool is not None and tool.timeout_s > 2 * largest, (command, tool and tool.timeout_s)


async def test_a_search_gives_up_after_twice_its_timeout_setting(tmp_path: Path,
                                                                 perplexity: FakePerplexityServer) -> None:
    perplexity.delay(0.2)
    perplexity.disable_endpoint("agent")  # auto: the Agent API answers 404, chat completions then answer
    fallback = await exchange(tmp_path / "a", {**chat_cfg(perplexity, timeout_s=0.3), "endpoint": "auto"},
                              "/search 上海天气")
    assert "上海今天多云" in fallback[0].text  # two requests of 0.2 s fit in 2 x 0.3 s
    perplexity.delay(0.25)
    for _ in range(2):  # a 503 is retried after a 0.5 s pause: past 2 x 0.3 s
        perplexity.next_status(503)
    sent = await exchange(tmp_path / "b", chat_cfg(perplexity, timeout_s=0.3), "/search 上海天气")
    # (a loaded machine may see one request time out first: "超时或故障"; either way it gave up, timed out)
    assert "超时" in sent[0].text and "上海今天多云" not in sent[0].text, sent[0].text


async def test_per_user_and_per_chat_hourly_limits(tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    sent = await exchange(tmp_path, chat_cfg(perplexity, user_rate_per_hour=2, chat_rate_per_hour=3),
                          *[(f"/search q{n}", {"user": "alice"}) for n in range(3)],
                          ("/search q3", {"user": "bob"}), ("/search q4", {"user": "carol"}))
    texts = [m.text for m in sent]
    assert "每小时 2 次" in texts[2]  # alice's third search: her own limit
    assert "[1]" in texts[3]  # bob is unaffected by alice's limit
    assert "本群" in texts[4] and "每小时 3 次" in texts[4]  # the chat's limit (3 searches ran)
    assert len(perplexity.requests_to("chat")) == 3


async def test_a_bot_wide_hourly_cap_holds_across_users_and_chats(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    g2 = ChatRef(platform="memory", chat_id="g2", kind="group")
    sent = await exchange(tmp_path, chat_cfg(perplexity, bot_rate_per_hour=2),
                          ("/search q1", {"user": "alice"}), ("/search q2", {"user": "bob", "chat": g2}),
                          ("/search q3", {"user": "carol", "chat": ChatRef(platform="memory", chat_id="g3",
                                                                         kind="group")}))
    by_chat = {m.chat.chat_id: m.text for m in sent}  # (three chats' replies go out in any order)
    assert "[1]" in by_chat["g1"] and "[1]" in by_chat["g2"]
    assert "本机器人的搜索次数已达上限（每小时 2 次）" in by_chat["g3"]
    assert len(perplexity.requests_to("chat")) == 2


async def test_a_chat_limit_refusal_does_not_use_up_the_users_own_searches(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    g2 = ChatRef(platform="memory", chat_id="g2", kind="group")
    sent = await exchange(tmp_path, chat_cfg(perplexity, user_rate_per_hour=1, chat_rate_per_hour=1),
                          ("/search q1", {"user": "alice"}),
                          ("/search q2", {"user": "bob"}),  # this group's one search is used
                          ("/search q3", {"user": "bob", "chat": g2}))  # bob's own one is still there
    here = [m for m in sent if m.chat != g2]  # (the two chats' replies may go out in either order)
    assert "本群的搜索次数已达上限" in here[1].text
    assert "[1]" in next(m for m in sent if m.chat == g2).text
    assert len(perplexity.requests_to("chat")) == 2


async def test_a_forum_groups_topics_share_the_groups_hourly_search_limit(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    """Each topic of a Telegram forum group (``<group>/<topic>``) had its own chat_rate_per_hour: 5 topics
    got 10 paid searches with a limit of 2."""
    topics = [ChatRef(platform="memory", chat_id=f"-100900/{n}", kind="group") for n in range(1, 4)]
    general = ChatRef(platform="memory", chat_id="-100900", kind="group")
    sent = await exchange(tmp_path, chat_cfg(perplexity, chat_rate_per_hour=2),
                          *[(f"/search q{n}", {"user": f"u{n}", "chat": chat})
                            for n, chat in enumerate([*topics, general])])
    assert len(perplexity.requests_to("chat")) == 2
    assert sum("本群的搜索次数已达上限（每小时 2 次）" in m.text for m in sent) == 2


async def test_a_failed_search_does_not_count_against_the_limits(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    perplexity.next_status(503)
    perplexity.next_status(503)  # the client's one retry fails too
    sent = await exchange(tmp_path, chat_cfg(perplexity, user_rate_per_hour=1, chat_rate_per_hour=1),
                          ("/search q1", {"user": "alice"}), ("/search q1", {"user": "alice"}))
    assert "暂时不可用" in sent[0].text
    assert "[1]" in sent[1].text  # the retry after the failure is answered, not refused


async def test_a_search_perplexity_answered_and_billed_counts_even_when_unusable(
        tmp_path: Path, perplexity: FakePerplexityServer, caplog: pytest.LogCaptureFixture) -> None:
    """Every unusable answer gave its hourly slot back: with all three caps at 1, six paid searches (HTTP 200,
    the reasoning spent max_output_tokens) reached Perplexity in one hour. A billed answer counts; the owner's
    log says why it was unusable."""
    perplexity.answer("", cut_off=True)
    limits = {"user_rate_per_hour": 1, "chat_rate_per_hour": 1, "bot_rate_per_hour": 1}
    with caplog.at_level("WARNING", logger="search.tools"):
        sent = await exchange(tmp_path, chat_cfg(perplexity, **limits),
                              ("/search q1", {"user": "alice"}), ("/search q2", {"user": "alice"}))
    assert "暂时不可用" in sent[0].text and "已达上限" in sent[1].text, [m.text for m in sent]
    assert len(perplexity.requests_to("chat")) == 1
    assert "max_output_tokens" in caplog.text and KEY not in caplog.text


async def test_a_search_that_timed_out_after_sending_counts(tmp_path: Path,
                                                            perplexity: FakePerplexityServer) -> None:
    """Perplexity keeps working (and bills) after the bot stopped waiting: the slot went back, so with the caps
    at 1 every search was sent."""
    perplexity.delay(0.5)
    sent = await exchange(tmp_path, chat_cfg(perplexity, timeout_s=0.1, user_rate_per_hour=1),
                          ("/search q1", {"user": "bob"}), ("/search q2", {"user": "bob"}))
    assert "暂时不可用" in sent[0].text and "已达上限" in sent[1].text, [m.text for m in sent]
    assert len(perplexity.requests_to("chat")) == 1


async def test_a_search_that_never_reached_perplexity_does_not_count() -> None:
    """A connection refused sends nothing, so nothing is billed: the slot goes back."""
    async with FakePerplexityServer(api_key=KEY) as gone:
        base_url = gone.base_url  # (its port is closed once it stops)
    settings = search.SearchSettings(api_key=KEY, base_url=base_url, endpoint="chat")
    async with search.PerplexityClient(settings, retry_backoff_s=0) as client:
        deps = SearchDeps(settings, client, per_user=WindowLimiter(1), per_chat=WindowLimiter(1),
                          per_bot=WindowLimiter(1))
        ctx: ToolContext[Any] = ToolContext(deps=deps, caller=Caller(platform="memory", user_id="carol",
                                                                     chat_id="g1", chat_kind="group"))
        for _ in range(2):
            with pytest.raises(ToolError) as failed:
                await search.perplexity_search.invoke(ctx, search.perplexity_search.parse_arguments({"query": "q"}))
            assert failed.value.user_message is not None and "暂时不可用" in failed.value.user_message


async def test_the_chat_limit_in_a_private_chat_does_not_say_group(
        tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    private = {"user": "alice", "chat": ChatRef(platform="memory", chat_id="alice", kind="private")}
    sent = await exchange(tmp_path, chat_cfg(perplexity, user_rate_per_hour=5, chat_rate_per_hour=1),
                          ("/search q1", private), ("/search q2", private))
    assert "本聊天的搜索次数已达上限（每小时 1 次）" in sent[1].text and "本群" not in sent[1].text


@pytest.mark.parametrize("setting", ["user_rate_per_hour", "chat_rate_per_hour"])
async def test_a_rate_of_zero_switches_search_off_with_a_clear_message(
        tmp_path: Path, perplexity: FakePerplexityServer, setting: str) -> None:
    model = ScriptedModel([text("搜不了。")])
    bot, channel = make_bot(tmp_path, model, chat_cfg(perplexity, **{setting: 0}))
    await bot.start()
    try:
        await channel.inject("/search q1", user="alice")
        await channel.inject("帮我搜一下上海天气", user="alice", at_bot=True)
        sent = await channel.wait_sent(2)
        caller = Caller(platform="memory", user_id="alice", chat_id="g1", chat_kind="group")
        ctx: ToolContext[Any] = ToolContext(deps=bot.deps_for(search.perplexity_search), caller=caller)
        with pytest.raises(ToolError) as refused:  # called anyway (say, by a scheduled run)
            await search.perplexity_search.invoke(ctx, search.perplexity_search.parse_arguments({"query": "q"}))
    finally:
        await bot.stop()
    assert f"[search] {setting} = 0" in sent[0].text and "关闭" in sent[0].text
    # the model is not offered a tool that cannot work
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["ask_user"]
    assert refused.value.user_message is not None and f"{setting} = 0" in refused.value.user_message
    assert perplexity.requests == []


def test_window_limiter_checks_without_recording_and_gives_slots_back() -> None:
    now = [100.0]
    limiter = WindowLimiter(2, window_s=60, monotonic=lambda: now[0])
    assert limiter.wait_time("a") == 0 and limiter.wait_time("a") == 0  # checking records nothing
    first = limiter.acquire("a")
    now[0] += 10
    second = limiter.acquire("a")
    assert limiter.wait_time("a") == 50  # the first slot frees 60 s after it was taken
    limiter.release("a", second)  # that search failed
    assert limiter.wait_time("a") == 0 and limiter.wait_time("b") == 0
    limiter.acquire("a")
    now[0] += 50
    assert limiter.wait_time("a") == 0  # the first one expired
    assert first == 100.0
    assert WindowLimiter(0).disabled and WindowLimiter(0).wait_time("a") == math.inf  # no IndexError
