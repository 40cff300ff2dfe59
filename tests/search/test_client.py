"""PerplexityClient against the fake Perplexity server, through the real openai SDK."""

from __future__ import annotations

import inspect
import json
import traceback
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest

from search import _wire as wire_module
from search import client as client_module
from search import settings as settings_module
from search import testing as testing_module
from search.client import (
    PerplexityClient,
    SearchAuthError,
    SearchNotConfigured,
    SearchRateLimited,
    SearchRejected,
    SearchUnavailable,
    Source,
)
from search.settings import SearchSettings
from search.testing import FakePerplexityServer

KEY = "pplx-SECRET-key-0123456789abcdef"
PARIS = [
    Source(title="Paris - Wikipedia", url="https://en.wikipedia.org/wiki/Paris", date="2025-03-01"),
    Source(title="Population de Paris | Insee", url="https://www.insee.fr/fr/statistiques/paris"),
]
PARIS_TEXT = "巴黎是法国的首都[1]，人口约210万[2]。"


@pytest.fixture
async def server() -> AsyncIterator[FakePerplexityServer]:
    async with FakePerplexityServer(api_key=KEY) as fake:
        fake.answer(PARIS_TEXT, PARIS)
        yield fake


def make_client(server: FakePerplexityServer, *, key: str = KEY, **settings: Any) -> PerplexityClient:
    return PerplexityClient(
        SearchSettings(api_key=key, base_url=server.base_url, **settings), retry_backoff_s=0
    )


async def test_agent_endpoint_answer_sources_and_usage(server: FakePerplexityServer) -> None:
    async with make_client(server, endpoint="agent") as client:
        answer = await client.search("法国的首都是哪里？", system="简短回答")

    assert answer.endpoint == "agent"
    assert answer.text == PARIS_TEXT
    assert [(s.title, s.url, s.date) for s in answer.sources] == [(s.title, s.url, s.date) for s in PARIS]
    assert answer.model == "perplexity/sonar"
    assert answer.usage.num_search_queries == 1
    assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
    request = server.last_request
    assert request.path == "/v1/responses"
    assert request.body == {
        "input": "法国的首都是哪里？",
        "model": "perplexity/sonar",
        "instructions": "简短回答",
    }
    assert request.authorization == f"Bearer {KEY}"


async def test_chat_endpoint_answer_sources_and_usage(server: FakePerplexityServer) -> None:
    async with make_client(server, endpoint="chat", model="sonar-pro") as client:
        answer = await client.search("法国的首都是哪里？", system="简短回答")

    assert answer.endpoint == "chat"
    assert answer.model == "sonar-pro"
    assert answer.text == PARIS_TEXT
    assert answer.sources == PARIS
    assert answer.usage.citation_tokens > 0
    assert answer.usage.num_search_queries == 1
    request = server.last_request
    assert request.path == "/chat/completions"
    assert request.body["model"] == "sonar-pro"
    assert request.body["messages"] == [
        {"role": "system", "content": "简短回答"},
        {"role": "user", "content": "法国的首都是哪里？"},
    ]
    assert request.authorization == f"Bearer {KEY}"


async def test_auto_prefers_the_agent_api(server: FakePerplexityServer) -> None:
    async with make_client(server) as client:
        assert client.endpoint_in_use is None
        answer = await client.search("q")
    assert answer.endpoint == "agent"
    assert client.endpoint_in_use == "agent"
    assert server.requests_to("chat") == []


async def test_auto_falls_back_to_chat_when_agent_is_missing_and_remembers(
    server: FakePerplexityServer,
) -> None:
    server.disable_endpoint("agent")
    async with make_client(server) as client:
        first = await client.search("first")
        second = await client.search("second")

    assert first.endpoint == second.endpoint == "chat"
    assert first.sources == PARIS
    assert client.endpoint_in_use == "chat"
    assert [r.endpoint for r in server.requests] == ["agent", "chat", "chat"]


@pytest.mark.parametrize("status", [404, 405, 501])
async def test_auto_remembers_chat_when_the_agent_endpoint_is_missing(
    server: FakePerplexityServer, status: int
) -> None:
    tries = 2 if status >= 500 else 1  # a 5xx is retried once first
    for _ in range(tries):
        server.next_status(status)
    async with make_client(server) as client:
        first = await client.search("q")
        second = await client.search("q2")
    assert first.endpoint == second.endpoint == "chat"
    assert client.endpoint_in_use == "chat"
    assert [r.endpoint for r in server.requests] == ["agent"] * tries + ["chat", "chat"]


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_auto_falls_back_for_one_refused_query_only(server: FakePerplexityServer, status: int) -> None:
    server.next_status(status)  # one odd query (or a passing refusal) must not switch for good
    async with make_client(server) as client:
        odd = await client.search("an odd query")
        assert odd.endpoint == "chat"
        assert client.endpoint_in_use is None
        normal = await client.search("q")
    assert normal.endpoint == "agent"
    assert client.endpoint_in_use == "agent"
    assert [r.endpoint for r in server.requests] == ["agent", "chat", "agent"]


@pytest.mark.parametrize("status", [404, 410])
async def test_auto_goes_back_to_the_agent_api_when_chat_moves_away(
    server: FakePerplexityServer, status: int
) -> None:
    server.disable_endpoint("agent")
    async with make_client(server) as client:
        assert (await client.search("q1")).endpoint == "chat"  # auto switched to chat
        server.enable_endpoint("agent")
        server.next_status(status)  # chat completions has moved
        answer = await client.search("q2")
        assert answer.endpoint == "agent" and answer.text == PARIS_TEXT
        assert client.endpoint_in_use == "agent"
        await client.search("q3")
    assert [r.endpoint for r in server.requests] == ["agent", "chat", "chat", "agent", "agent"]


async def test_fixed_chat_endpoint_never_tries_the_agent_api(server: FakePerplexityServer) -> None:
    server.next_status(404)
    async with make_client(server, endpoint="chat") as client:
        with pytest.raises(SearchRejected):
            await client.search("q")
    assert [r.endpoint for r in server.requests] == ["chat"]


async def test_agent_answer_with_only_url_annotations_keeps_its_sources(server: FakePerplexityServer) -> None:
    text = "Paris is the capital (Wikipedia)."
    note = {"type": "url_citation", "url": PARIS[0].url, "title": "Paris", "start_index": 21, "end_index": 32}
    body = {
        "status": "completed",
        "model": "openai/gpt-5.1",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": text, "annotations": [note]}]}
        ],
    }
    server.next_status(200, body=json.dumps(body))
    async with make_client(server, endpoint="agent", model="openai/gpt-5.1") as client:
        answer = await client.search("q")
    assert answer.text == text
    assert answer.sources == [Source(title="Paris", url=PARIS[0].url)]
    assert answer.model == "openai/gpt-5.1"
    assert server.last_request.body["tools"] == [{"type": "web_search"}]


async def test_effort_goes_to_agent_as_effort_never_preset_and_to_chat_as_the_model(
    server: FakePerplexityServer,
) -> None:
    async with make_client(server, effort="low", model="sonar-pro") as client:
        await client.search("q")
        server.disable_endpoint("agent")
        await client.search("q")
    agent, chat = server.requests_to("agent"), server.requests_to("chat")
    assert agent[0].body == {"input": "q", "effort": "low"}
    assert chat[0].body["model"] == "sonar-pro"


async def test_wrong_key_is_auth_error_that_never_shows_the_key(server: FakePerplexityServer) -> None:
    wrong = "pplx-WRONG-key-fedcba9876543210"
    client = make_client(server, key=wrong)
    with pytest.raises(SearchAuthError) as caught:
        await client.search("q")
    exc = caught.value
    assert str(exc) == "the Perplexity API key was rejected"
    assert exc.status_code == 401
    shown = str(exc) + repr(exc) + repr(client) + "".join(traceback.format_exception(exc))
    assert wrong not in shown and KEY not in shown
    assert len(server.requests) == 1  # no retry, no fallback on 401
    await client.aclose()


async def test_scripted_401_and_403_are_auth_errors(server: FakePerplexityServer) -> None:
    async with make_client(server, endpoint="chat") as client:
        for code in (401, 403):
            server.next_status(code)
            with pytest.raises(SearchAuthError) as caught:
                await client.search("q")
            assert KEY not in str(caught.value) + repr(caught.value)


async def test_429_is_rate_limited_with_retry_after(server: FakePerplexityServer) -> None:
    server.next_status(429, retry_after=12)
    async with make_client(server) as client:
        with pytest.raises(SearchRateLimited) as caught:
            await client.search("q")
    assert caught.value.retry_after == 12
    assert "12 s" in str(caught.value)
    assert len(server.requests) == 1  # 4xx is never retried


async def test_timeout_is_unavailable(server: FakePerplexityServer) -> None:
    server.delay(30)
    async with make_client(server, endpoint="chat", timeout_s=0.3) as client:
        with pytest.raises(SearchUnavailable, match="did not answer"):
            await client.search("q")
    assert len(server.requests) == 1  # a timed-out search is not retried


async def test_one_server_error_is_retried(server: FakePerplexityServer) -> None:
    server.next_status(503)
    async with make_client(server) as client:
        answer = await client.search("q")
    assert answer.endpoint == "agent"
    assert [r.endpoint for r in server.requests] == ["agent", "agent"]


async def test_persistent_server_error_is_unavailable_after_one_retry(server: FakePerplexityServer) -> None:
    server.next_status(500)
    server.next_status(502)
    async with make_client(server) as client:
        with pytest.raises(SearchUnavailable, match="HTTP 502"):
            await client.search("q")
    assert [r.endpoint for r in server.requests] == ["agent", "agent"]  # no chat fallback on 5xx


async def test_unreachable_server_is_unavailable() -> None:
    async with FakePerplexityServer() as fake:
        base_url = fake.base_url
    client = PerplexityClient(SearchSettings(api_key=KEY, base_url=base_url), retry_backoff_s=0)
    with pytest.raises(SearchUnavailable, match="could not reach"):
        await client.search("q")
    await client.aclose()


@pytest.mark.parametrize("endpoint", ["agent", "chat"])
@pytest.mark.parametrize("body", ["<html>oops</html>", '{"choices": 5, "output": 7}', "[1, 2]"])
async def test_garbled_success_is_unavailable(server: FakePerplexityServer, endpoint: str, body: str) -> None:
    server.next_status(200, body=body)
    async with make_client(server, endpoint=endpoint) as client:
        with pytest.raises(SearchUnavailable, match="could not be read"):
            await client.search("q")


ODD_CHAT = {"choices": [{"message": {"content": "Odd[1] but fine."}}], "citations": 5, "usage": "x"}
ODD_AGENT = {
    "status": "completed",
    "output": [
        {"type": "search_results", "queries": 3, "results": [{"id": "one", "url": 7}]},
        {
            "type": "message",
            "content": [{"type": "output_text", "text": "Odd[1] but fine.", "annotations": 1}],
        },
    ],
    "usage": {"tool_calls_details": []},
}


@pytest.mark.parametrize(("endpoint", "body"), [("chat", ODD_CHAT), ("agent", ODD_AGENT)])
async def test_odd_fields_are_ignored_not_fatal(
    server: FakePerplexityServer, endpoint: str, body: dict[str, Any]
) -> None:
    server.next_status(200, body=json.dumps(body))
    async with make_client(server, endpoint=endpoint) as client:
        answer = await client.search("q")
    assert answer.text == "Odd but fine."
    assert answer.sources == []


async def test_failed_agent_response_is_unavailable(server: FakePerplexityServer) -> None:
    failed = {"status": "failed", "error": {"message": "upstream model error"}, "output": []}
    server.next_status(200, body=json.dumps(failed))
    async with make_client(server, endpoint="agent") as client:
        with pytest.raises(SearchUnavailable, match="could not complete"):
            await client.search("q")


async def test_bad_request_is_rejected_with_server_detail(server: FakePerplexityServer) -> None:
    server.next_status(400, message=f"Invalid model 'sonar-x' for key {KEY}")
    async with make_client(server, endpoint="chat") as client:
        with pytest.raises(SearchRejected) as caught:
            await client.search("q")
    assert caught.value.status_code == 400
    assert caught.value.detail is not None and "Invalid model" in caught.value.detail
    assert KEY not in caught.value.detail + str(caught.value)


async def test_markers_without_a_source_are_dropped(server: FakePerplexityServer) -> None:
    server.answer("Paris[1] is big[7].", PARIS[:1])
    for endpoint in ("agent", "chat"):
        async with make_client(server, endpoint=endpoint) as client:
            answer = await client.search("q")
        assert answer.text == "Paris[1] is big."
        assert answer.sources == PARIS[:1]


async def test_no_key_means_not_configured(server: FakePerplexityServer) -> None:
    client = PerplexityClient(SearchSettings(api_key="  ", base_url=server.base_url))
    assert not client.configured
    with pytest.raises(SearchNotConfigured):
        await client.search("q")
    assert server.requests == []


async def test_empty_query_is_rejected_without_a_request(server: FakePerplexityServer) -> None:
    async with make_client(server) as client:
        with pytest.raises(SearchRejected, match="empty"):
            await client.search("   ")
    assert server.requests == []


async def test_openai_org_and_project_from_env_are_not_sent(
    server: FakePerplexityServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-private")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-private")
    async with make_client(server, endpoint="chat") as client:
        await client.search("q")
    headers = server.last_request.headers
    assert "openai-organization" not in headers and "openai-project" not in headers


def test_settings_normalise_base_url_and_reject_bad_ones() -> None:
    assert SearchSettings(base_url="https://api.perplexity.ai/").base_url == "https://api.perplexity.ai"
    with pytest.raises(ValueError):
        SearchSettings(base_url="api.perplexity.ai")
    assert KEY not in repr(SearchSettings(api_key=KEY))


@pytest.mark.parametrize("module", [client_module, settings_module, testing_module, wire_module])
def test_all_lists_every_public_name(module: ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module.__name__
    }
    assert public <= set(module.__all__)
    assert all(hasattr(module, name) for name in module.__all__)


async def test_a_server_message_cut_inside_the_key_shows_no_part_of_it(server: FakePerplexityServer) -> None:
    """The message is cut at 300 characters; masking after the cut left the key's first part."""
    server.next_status(400, message="x" * 280 + " bad key: " + KEY + " rest")
    async with make_client(server, endpoint="chat") as client:
        with pytest.raises(SearchRejected) as refused:
            await client.search("hi")
    assert KEY[:10] not in str(refused.value) and "***" in str(refused.value)


async def test_a_retry_after_of_infinity_is_a_rate_limit_error(server: FakePerplexityServer) -> None:
    server.next_status(429, retry_after=float("inf"))
    async with make_client(server, endpoint="chat") as client:
        with pytest.raises(SearchRateLimited) as limited:
            await client.search("hi")
    assert limited.value.retry_after is None and "later" in str(limited.value)
