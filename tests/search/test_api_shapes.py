"""Issue #15: requests shaped as Perplexity's docs and official SDK (``perplexityai``) say, and answers read fully.

The fake server validates every request with the SDK's own request models, so a field or model
name production would refuse fails here too; the official SDK itself is used as a client where
the docs show its calls.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import perplexity as pplx
import pytest
from perplexity.generated import api as sdk_api
from pydantic import ValidationError

import search
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel
from search.client import PerplexityClient, SearchRejected, SearchUnavailable
from search.format import CUT_OFF_NOTE, format_answer, format_for_model
from search.settings import SearchSettings
from search.testing import FakePerplexityServer

KEY = "pplx-shapes-key-0123456789"
TEXT = "巴黎是法国的首都[1]，人口约210万[2]。"
SOURCES = [("Paris - Wikipedia", "https://en.wikipedia.org/wiki/Paris"),
           ("Insee", "https://www.insee.fr/fr/statistiques/paris")]


@pytest.fixture
async def server() -> AsyncIterator[FakePerplexityServer]:
    async with FakePerplexityServer(api_key=KEY) as fake:
        fake.answer(TEXT, SOURCES)
        yield fake


def client_for(server: FakePerplexityServer, **settings: Any) -> PerplexityClient:
    return PerplexityClient(SearchSettings(api_key=KEY, base_url=server.base_url, **settings), retry_backoff_s=0)


async def post(server: FakePerplexityServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}) as response:
        return response.status, await response.json()


# -- the fake is faithful -------------------------------------------------------------------
async def test_official_sdk_documented_effort_call_is_accepted_and_its_answer_parses(
        server: FakePerplexityServer) -> None:
    sdk = pplx.AsyncPerplexity(api_key=KEY, base_url=server.base_url, max_retries=0)
    try:
        response = await sdk.responses.create(input="法国首都", effort="low")
        with pytest.raises(pplx.BadRequestError, match="preset is deprecated"):
            await sdk.responses.create(input="法国首都", preset="pro-search")
        completion = await sdk.chat.completions.create(model="sonar-pro",
                                                       messages=[{"role": "user", "content": "法国首都"}])
    finally:
        await sdk.close()
    assert response.status == "completed" and response.output
    assert completion.choices[0].message.content == TEXT


@pytest.mark.parametrize(("path", "body", "blamed"), [
    ("/v1/responses", {"input": "q", "model": "perplexity/sonar-pro"}, "perplexity/sonar-pro"),
    ("/v1/responses", {"input": "q", "model": "perplexity/sonar-reasoning-pro"}, "sonar-reasoning-pro"),
    ("/v1/responses", {"input": "q", "effort": "ultra"}, "ultra"),
    ("/v1/responses", {"input": "q", "model": "perplexity/sonar", "mystery": 1}, "mystery"),
    ("/chat/completions", {"model": "perplexity/sonar", "messages": [{"role": "user", "content": "q"}]},
     "perplexity/sonar"),
])
async def test_fake_refuses_what_the_docs_rule_out(server: FakePerplexityServer, path: str,
                                                   body: dict[str, Any], blamed: str) -> None:
    status, payload = await post(server, path, body)
    assert status == 400
    assert blamed in payload["error"]["message"]


async def test_fake_answers_sdk_shape_errors_with_a_422_detail_list(server: FakePerplexityServer) -> None:
    body = {"input": "q", "model": "perplexity/sonar",
            "tools": [{"type": "web_search", "filters": {"search_recency_filter": "fortnight"}}]}
    status, payload = await post(server, "/v1/responses", body)
    assert status == 422
    assert any("search_recency_filter" in ".".join(map(str, d["loc"])) for d in payload["detail"])


async def test_fake_bodies_pass_the_sdk_response_models(server: FakePerplexityServer) -> None:
    _, agent = await post(server, "/v1/responses", {"input": "q", "model": "perplexity/sonar"})
    _, chat = await post(server, "/chat/completions",
                         {"model": "sonar", "messages": [{"role": "user", "content": "q"}]})
    sdk_api.ResponsesResponseOutput.model_validate(agent)
    sdk_api.CompletionResponseOutput.model_validate(chat)


# -- model names per endpoint ---------------------------------------------------------------
async def test_sonar_pro_goes_straight_to_chat_completions_in_auto(server: FakePerplexityServer) -> None:
    async with client_for(server, model="sonar-pro") as client:
        await client.search("q1")
        await client.search("q2")
    assert [r.endpoint for r in server.requests] == ["chat", "chat"]  # no rejected Agent API call
    assert {r.body["model"] for r in server.requests} == {"sonar-pro"}


def test_sonar_models_the_agent_api_does_not_list_are_refused_for_it() -> None:
    with pytest.raises(ValidationError, match="Agent API does not offer"):
        SearchSettings(endpoint="agent", model="sonar-pro")
    assert SearchSettings(endpoint="agent", model="perplexity/sonar").model == "sonar"
    with pytest.raises(ValidationError, match="Agent API model"):
        SearchSettings(endpoint="chat", model="openai/gpt-5.1")
    with pytest.raises(ValidationError, match="unknown model"):
        SearchSettings(model="sonar-huge")


async def test_default_sonar_is_sent_as_perplexity_sonar_and_accepted(server: FakePerplexityServer) -> None:
    async with client_for(server) as client:
        answer = await client.search("q")
    assert answer.endpoint == "agent"
    assert server.last_request.body == {"input": "q", "model": "perplexity/sonar"}


async def test_a_400_on_the_model_makes_auto_remember_chat_completions(server: FakePerplexityServer) -> None:
    # A provider model this account's Agent API refuses by name.
    async with client_for(server, model="mistral/mistral-large") as client:
        first = await client.search("q1")
        second = await client.search("q2")
        assert client.endpoint_in_use == "chat"
    assert first.endpoint == second.endpoint == "chat"
    assert [r.endpoint for r in server.requests] == ["agent", "chat", "chat"]  # paid once, not every time


async def test_a_400_not_about_the_model_falls_back_for_that_search_only(server: FakePerplexityServer) -> None:
    server.next_status(400, message="input is too long for this request")
    async with client_for(server) as client:
        await client.search("q1")
        await client.search("q2")
    assert [r.endpoint for r in server.requests] == ["agent", "chat", "agent"]


# -- effort and deep research ---------------------------------------------------------------
def test_deprecated_presets_and_deep_research_are_not_offered() -> None:
    for model in ("fast-search", "pro-search"):
        with pytest.raises(ValidationError, match="effort"):
            SearchSettings(model=model)
    for model in ("sonar-deep-research", "deep-research", "advanced-deep-research"):
        with pytest.raises(ValidationError, match="deep research"):
            SearchSettings(model=model)
    for effort in ("high", "xhigh"):
        with pytest.raises(ValidationError):
            SearchSettings(effort=effort)


async def test_unfinished_agent_status_reads_as_not_finished_not_as_garbage(server: FakePerplexityServer) -> None:
    body = {"id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress",
            "model": "perplexity/sonar", "output": []}
    server.next_status(200, body=json.dumps(body))
    async with client_for(server, endpoint="agent") as client:
        with pytest.raises(SearchUnavailable, match="not finished"):
            await client.search("q")


# -- answers read fully ---------------------------------------------------------------------
async def test_chat_content_as_a_list_of_chunks_is_the_whole_answer(server: FakePerplexityServer) -> None:
    server.answer(TEXT, SOURCES, chunked=True)
    async with client_for(server, endpoint="chat") as client:
        answer = await client.search("q")
    assert answer.text == TEXT
    assert len(answer.sources) == 2


@pytest.mark.parametrize("endpoint", ["chat", "agent"])
async def test_cut_off_answers_are_flagged_to_user_and_model(server: FakePerplexityServer, endpoint: str) -> None:
    server.answer(TEXT, SOURCES, cut_off=True)
    async with client_for(server, endpoint=endpoint) as client:
        answer = await client.search("q")
    assert answer.truncated
    assert format_answer(answer, max_chars=200, max_sources=5).startswith(CUT_OFF_NOTE)
    assert "incomplete" in format_for_model(answer)
    server.answer(TEXT, SOURCES)
    async with client_for(server, endpoint=endpoint) as client:
        assert not (await client.search("q")).truncated


@pytest.mark.parametrize("endpoint", ["chat", "agent"])
async def test_a_reasoning_answer_cut_off_while_thinking_never_shows_the_thinking(
        server: FakePerplexityServer, endpoint: str) -> None:
    thinking = "<think>\nThe user asks about Paris. Let me check [1] and [2]; maybe the user means"
    server.answer(thinking, SOURCES, cut_off=True)
    async with client_for(server, endpoint=endpoint) as client:
        with pytest.raises(SearchUnavailable, match="cut off before any answer") as caught:
            await client.search("q")
    assert "Let me check" not in str(caught.value)
    # Cut off after thinking and a part of the answer: the part shows, never the thinking.
    server.answer("<think>reasoning</think>\n" + TEXT + "<think>more reasoning, unfinished", SOURCES, cut_off=True)
    async with client_for(server, endpoint=endpoint) as client:
        answer = await client.search("q")
    assert answer.text == TEXT and answer.truncated
    assert "reasoning" not in format_answer(answer, max_chars=500, max_sources=5)
    # A finished answer that mentions the tag keeps every word (it was cut at the mention).
    mentions = "DeepSeek-R1 writes its reasoning after a <think> tag, then the answer [1]."
    server.answer(mentions, SOURCES)
    async with client_for(server, endpoint=endpoint) as client:
        assert (await client.search("q")).text == mentions


async def test_422_detail_list_reaches_the_error_text(server: FakePerplexityServer) -> None:
    detail = {"detail": [{"type": "missing", "loc": ["body", "messages", 0, "content"], "msg": "Field required"}]}
    server.next_status(422, body=json.dumps(detail))
    async with client_for(server, endpoint="chat") as client:
        with pytest.raises(SearchRejected) as caught:
            await client.search("q")
    assert "body.messages.0.content: Field required" in str(caught.value)
    assert caught.value.status_code == 422


# -- options -----------------------------------------------------------------------------------
OPTIONS: dict[str, Any] = {"search_recency_filter": "month", "search_domain_filter": ["Gov.cn", "-reddit.com"],
                           "language_preference": "zh", "max_output_tokens": 500}


async def test_settings_filters_reach_sonar_chat_completions(server: FakePerplexityServer) -> None:
    async with client_for(server, endpoint="chat", **OPTIONS) as client:
        await client.search("q")
    body = server.last_request.body
    assert body["search_recency_filter"] == "month"
    assert body["search_domain_filter"] == ["gov.cn", "-reddit.com"]
    assert body["language_preference"] == "zh" and body["max_tokens"] == 500


async def test_settings_filters_reach_the_agent_api_as_web_search_tool_filters(server: FakePerplexityServer) -> None:
    async with client_for(server, endpoint="agent", **OPTIONS) as client:
        await client.search("q", recency="day")  # the argument wins over the setting
    body = server.last_request.body
    assert body["tools"] == [{"type": "web_search", "filters": {"search_recency_filter": "day",
                                                                 "search_domain_filter": ["gov.cn", "-reddit.com"]}}]
    assert body["language_preference"] == "zh" and body["max_output_tokens"] == 500


def test_bad_option_values_are_refused_clearly() -> None:
    with pytest.raises(ValidationError, match="ISO 639-1"):
        SearchSettings(language_preference="chinese")
    with pytest.raises(ValidationError, match="not a domain"):
        SearchSettings(search_domain_filter=["https://gov.cn/path"])
    with pytest.raises(ValidationError):
        SearchSettings(search_recency_filter="fortnight")


async def test_model_can_ask_for_recent_news_through_the_tool_argument(tmp_path: Path,
                                                                       server: FakePerplexityServer) -> None:
    model = ScriptedModel([call("perplexity_search", {"query": "AI 新闻", "recency": "week"}), text("最近一周……[1]")])
    settings = Settings(bot={"data_dir": tmp_path}, search={"api_key": KEY, "base_url": server.base_url,
                                                             "endpoint": "chat"})
    channel = MemoryChannel()
    bot = Bot(settings, model=model, channels=[channel], plugins=[search.plugin])
    await bot.start()
    try:
        await channel.inject("最近一周的 AI 新闻", at_bot=True)
        await channel.wait_sent(1)
    finally:
        await bot.stop()
    schema = model.requests[0].tools[0]["function"]["parameters"]
    assert "week" in json.dumps(schema["properties"]["recency"], ensure_ascii=False)
    assert server.last_request.body["search_recency_filter"] == "week"

