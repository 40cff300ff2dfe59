"""The perplexity_search tool inside a running bot: offered or not, data-tool flow, errors, limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import search
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel
from search.testing import FakePerplexityServer

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
    assert model.requests[0].tools == []  # nothing to offer: the model cannot call a dead tool
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


async def test_search_command_shows_numbered_citations_and_sources(tmp_path: Path,
                                                                   perplexity: FakePerplexityServer) -> None:
    bot, channel = make_bot(tmp_path, None, {"api_key": KEY, "base_url": perplexity.base_url,
                                             "max_answer_chars": 400})
    await bot.start()
    try:
        await channel.inject("/search 上海天气")
        sent = await channel.wait_sent(1)
    finally:
        await bot.stop()
    reply = sent[0].text
    assert "[1]" in reply and "[2]" in reply
    assert "https://weather.example/sh" in reply and "https://nmc.example/sh" in reply
    assert len(reply) <= 400


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, "api key"), (429, "限流"), (503, "暂时不可用")],
)
async def test_provider_errors_give_a_clear_message_without_secrets(
        tmp_path: Path, perplexity: FakePerplexityServer, status: int, expected: str) -> None:
    for _ in range(4):  # enough for the client's retry and the auto endpoint's fallback
        perplexity.next_status(status)
    bot, channel = make_bot(tmp_path, None, {"api_key": KEY, "base_url": perplexity.base_url, "endpoint": "chat"})
    await bot.start()
    try:
        await channel.inject("/search 上海天气")
        sent = await channel.wait_sent(1)
    finally:
        await bot.stop()
    assert expected in sent[0].text.lower()
    assert KEY not in sent[0].text and "Traceback" not in sent[0].text


async def test_timeout_is_reported_not_raised(tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    perplexity.delay(2.0)
    bot, channel = make_bot(tmp_path, None, {"api_key": KEY, "base_url": perplexity.base_url, "endpoint": "chat",
                                             "timeout_s": 0.3})
    await bot.start()
    try:
        await channel.inject("/search 上海天气")
        sent = await channel.wait_sent(1, timeout=10)
    finally:
        await bot.stop()
    assert "暂时不可用" in sent[0].text


async def test_per_user_and_per_chat_hourly_limits(tmp_path: Path, perplexity: FakePerplexityServer) -> None:
    bot, channel = make_bot(tmp_path, None, {"api_key": KEY, "base_url": perplexity.base_url, "endpoint": "chat",
                                             "user_rate_per_hour": 2, "chat_rate_per_hour": 3})
    await bot.start()
    try:
        for n in range(3):
            await channel.inject(f"/search q{n}", user="alice")
        await channel.inject("/search q3", user="bob")
        await channel.inject("/search q4", user="carol")
        sent = await channel.wait_sent(5)
    finally:
        await bot.stop()
    texts = [m.text for m in sent]
    assert "每小时 2 次" in texts[2]  # alice's third search: her own limit
    assert "[1]" in texts[3]  # bob is unaffected by alice's limit
    assert "本群" in texts[4] and "每小时 3 次" in texts[4]  # the chat's limit (3 searches ran)
    assert len(perplexity.requests_to("chat")) == 3
