"""FakeOpenAIServer driven by the real openai SDK over loopback."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from function_calls.testing import server as server_module
from function_calls.testing.server import (
    Call,
    Delay,
    Disconnect,
    FakeOpenAIServer,
    Fault,
    Reply,
    Step,
    Usage,
)

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "reminder_set",
            "description": "set a reminder",
            "parameters": {"type": "object", "properties": {"time": {"type": "string"}}},
        },
    }
]
IndexMode = Literal["omit", "all_zero"]
MESSAGES: list[Any] = [{"role": "user", "content": "提醒我明天下午3点开会"}]


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    yield c
    await c.close()


async def test_base_url_and_default_reply(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    resp = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "ok"
    assert resp.choices[0].finish_reason == "stop"


async def test_non_stream_text_with_estimated_usage(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    server.script(Reply("hello there"))
    resp = await client.chat.completions.create(model="gpt-x", messages=MESSAGES)
    assert resp.model == "gpt-x"
    assert resp.choices[0].message.content == "hello there"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_explicit_usage_wins(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(Reply("x", usage=Usage(prompt_tokens=1000, completion_tokens=7)))
    resp = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        1000,
        7,
        1007,
    )


async def test_non_stream_two_tool_calls(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(
        Reply(tool_calls=[Call("reminder_set", {"time": "15:00"}, id="call_a"), Call("search", '{"q": "bad')])
    )
    resp = await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [
        c for c in choice.message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)
    ]
    assert len(calls) == 2
    assert (calls[0].id, calls[0].function.name) == ("call_a", "reminder_set")
    assert json.loads(calls[0].function.arguments) == {"time": "15:00"}
    assert calls[1].function.name == "search"
    assert calls[1].function.arguments == '{"q": "bad'  # malformed JSON sent verbatim
    assert calls[1].id and calls[1].id != "call_a"


async def test_requests_recorded_with_tools_and_auth(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    [rec] = server.requests
    assert (rec.method, rec.path) == ("POST", "/v1/chat/completions")
    assert rec.messages == MESSAGES
    assert rec.tools == TOOLS
    assert rec.headers["authorization"] == "Bearer test"
    assert "Bearer" not in repr(rec)  # the API key stays out of reprs


async def test_stream_text_assembled(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    text = "明天下午三点提醒你开会, all set!"
    server.script(Reply(text, chunk_size=4))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert "".join(pieces) == text


async def test_stream_tool_call_arguments_arrive_in_pieces(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    args = {"type": "once", "time": "2025-01-02 15:00", "content": "开会"}
    server.script(Reply(tool_calls=[Call("reminder_set", args, id="call_1"), Call("noop", {})]))
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    by_index: dict[int, dict[str, Any]] = {}
    finish, usage, arg_deltas = None, None, 0
    async for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                slot = by_index.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["args"] += tc.function.arguments
                    arg_deltas += 1
    assert by_index[0]["id"] == "call_1"
    assert by_index[0]["name"] == "reminder_set"
    assert by_index[0]["args"] == json.dumps(args, ensure_ascii=False)
    assert (by_index[1]["name"], by_index[1]["args"]) == ("noop", "{}")
    assert arg_deltas > 3
    assert finish == "tool_calls"
    assert usage is not None and usage.total_tokens > 0


@pytest.mark.parametrize("mode", ["omit", "all_zero"])
async def test_stream_index_modes(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI, mode: IndexMode
) -> None:
    server.script(
        Reply(tool_calls=[Call("a", {"x": 1}, id="c1"), Call("b", {"y": 2}, id="c2")], index_mode=mode)
    )
    resp = await client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, tools=TOOLS, stream=True
    )
    raw = await resp.http_response.aread()
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    tool_deltas = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls", [])]
    firsts = [tc for tc in tool_deltas if "id" in tc]
    assert [(tc["id"], tc["function"]["name"]) for tc in firsts] == [("c1", "a"), ("c2", "b")]
    if mode == "omit":
        assert all("index" not in tc for tc in tool_deltas)
    else:
        assert {tc["index"] for tc in tool_deltas} == {0}


async def test_rate_limit_with_retry_after(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(
        Fault(429, "quota gone", code="insufficient_quota", type="insufficient_quota", retry_after=2)
    )
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.code == "insufficient_quota"
    assert info.value.type == "insufficient_quota"
    assert "quota gone" in info.value.message
    assert info.value.response.headers["retry-after"] == "2"


async def test_retry_after_ms_header(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(Fault(429, retry_after_ms=1500))
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.response.headers["retry-after-ms"] == "1500"
    assert info.value.code is None


async def test_server_error(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(Fault(500, "boom"))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == 500
    assert info.value.type == "server_error"


async def test_delay_then_client_timeout(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.script(Delay(30, Reply("too late")))
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=MESSAGES, timeout=0.3)
    # The server keeps working after the client hung up mid-sleep, and logged no error.
    resp = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "ok"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_short_delay_answers(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(Delay(0.05, Reply("late but fine")))
    resp = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "late but fine"


async def test_broken_stream_raises_in_iteration(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(Reply("a long answer that will never finish", chunk_size=3, break_after=3))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    got: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert "".join(got) == "a long"  # role chunk + two 3-char pieces, then the connection drops
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_client_leaving_mid_stream_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async with FakeOpenAIServer() as srv:
        c = openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        srv.script(Reply("x" * 400, chunk_size=2, chunk_delay=0.005))
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for _ in stream:
            break
        await stream.close()
        resp = await c.chat.completions.create(model="m", messages=MESSAGES)
        assert resp.choices[0].message.content == "ok"
        await c.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_disconnect(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    server.script(Disconnect())
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(server.requests) == 1


async def test_script_is_fifo_then_responder(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    seen: list[int] = []

    async def responder(body: dict[str, Any]) -> Step:
        seen.append(len(body["messages"]))
        return Reply(f"responder {len(seen)}")

    server.responder = responder
    server.script(Reply("first"), Reply("second"))
    assert server.pending_steps == 2
    texts = [
        (await client.chat.completions.create(model="m", messages=MESSAGES)).choices[0].message.content
        for _ in range(3)
    ]
    assert texts == ["first", "second", "responder 1"]
    assert seen == [1]
    assert server.pending_steps == 0


async def test_responder_error_is_a_500_not_a_crash(
    server: FakeOpenAIServer, client: openai.AsyncOpenAI
) -> None:
    def responder(body: dict[str, Any]) -> Step:
        raise KeyError("nope")

    server.responder = responder
    with pytest.raises(openai.InternalServerError, match="KeyError"):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    server.responder = None
    resp = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "ok"


async def test_models_list_and_unknown_route(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    models = [m.id async for m in client.models.list()]
    assert models == list(FakeOpenAIServer.MODELS)
    with pytest.raises(openai.NotFoundError):
        await client.embeddings.create(model="m", input="x")
    assert [r.path for r in server.requests] == ["/v1/models", "/v1/embeddings"]


async def test_malformed_body_gets_400(server: FakeOpenAIServer, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not a JSON object"):
        await client.post("/chat/completions", cast_to=object, content=b"{nope")
    assert server.requests[0].raw == b"{nope"
    assert server.pending_steps == 0


async def test_stop_is_idempotent_and_port_needs_start() -> None:
    srv = FakeOpenAIServer()
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    await srv.start()
    await srv.stop()
    await srv.stop()


def test_exports_complete() -> None:
    public = {n for n in vars(server_module) if not n.startswith("_")}
    exported = set(server_module.__all__)
    assert exported <= public
    classes = {
        n
        for n in public
        if isinstance(getattr(server_module, n), type)
        and getattr(server_module, n).__module__ == server_module.__name__
    }
    assert classes <= exported
