"""Property: whatever chunk sequence a provider streams, a run ends in a typed stop and never raises.

Random sequences of protocol-legal chat-completion chunks (text, reasoning, tool-call deltas with
or without index, id and name, arguments as text or as an object, usage chunks, finish reasons or
none, ``[DONE]`` or a clean close, an error event) are streamed from FakeOpenAIServer to the real
openai SDK, and the run is driven by ``Runner``.
"""

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from function_calls import OpenAIChatModel, RetryPolicy, Runner, RunResult, StopReason, Toolset, tool_function
from function_calls.testing import FakeOpenAIServer, Raw, Reply, chunk
from function_calls.testing.server import Step


class City(BaseModel):
    city: str


async def ping() -> str:
    """Ping."""
    return "pong"


async def weather(args: City) -> str:
    """Weather."""
    return f"{args.city} 晴"


TOOLS = Toolset("t", [tool_function(ping), tool_function(weather)])
TLS = ssl.create_default_context()

texts = st.text(alphabet=st.sampled_from('ab 晴天,{}":[]\\\n'), max_size=8)
fragments = st.sampled_from(['{"city": "北京"}', '{"city"', ': "上海"}', "{}", "{", "}", "", "null", '"x"', "[1]"])
arguments = st.one_of(st.none(), fragments, texts, st.fixed_dictionaries({"city": st.sampled_from(["广州", "x"])}))
tool_call = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2),
        "id": st.sampled_from(["", "call_a", "call_b", "chatcmpl-tool-1", "chatcmpl-tool-2"]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {}, optional={"name": st.sampled_from(["", "ping", "weather", "nope"]), "arguments": arguments}),
    },
)
delta = st.one_of(
    st.fixed_dictionaries({"content": texts}),
    st.fixed_dictionaries({"content": st.none(), "reasoning_content": texts}),
    st.fixed_dictionaries({"role": st.just("assistant")}, optional={"content": st.one_of(st.none(), st.just(""))}),
    st.fixed_dictionaries({"tool_calls": st.lists(tool_call, min_size=1, max_size=2)}),
    st.just({}),
)
counts = st.one_of(st.integers(0, 10**6), st.none(), st.sampled_from([-1, "12", "many", 1.5, [1]]))
finish = st.one_of(st.none(), st.sampled_from(["stop", "tool_calls", "length", "content_filter", "function_call"]))
event = st.one_of(
    st.builds(lambda d, f: chunk(d, f), delta, finish),
    st.builds(lambda d: chunk(d), delta),
    st.builds(lambda p, c: chunk(choices=False, usage={"prompt_tokens": p, "completion_tokens": c}), counts, counts),
)
error_event = st.sampled_from([
    {"error": {"message": "context too long", "type": "invalid_request_error", "code": "context_length_exceeded"}},
    {"error": {"message": "overloaded", "type": "server_error"}},
    {"error": "plain string error"},
])
streams = st.builds(
    lambda events, err, done: Raw([*events, *([err] if err else [])], done=done),
    st.lists(event, max_size=12), st.one_of(st.none(), error_event), st.booleans(),
)


@pytest.fixture(scope="module")
def loop_and_server() -> Iterator[tuple[asyncio.AbstractEventLoop, FakeOpenAIServer]]:
    loop = asyncio.new_event_loop()
    server = FakeOpenAIServer()
    loop.run_until_complete(server.start())
    yield loop, server
    loop.run_until_complete(server.stop())
    loop.close()


async def run_once(server: FakeOpenAIServer, first: Raw, again: Raw, *, stream: bool = True) -> RunResult:
    served: list[Step] = [first, again]

    def responder(body: dict[str, Any]) -> Step:
        return served.pop(0) if served else Reply("好")

    server.responder = responder

    async def no_sleep(seconds: float) -> None:
        return None

    # The client the model would make (timeout 5 s, no retries), but on the module's TLS context: each
    # new client loads the CA bundle otherwise (40 ms of CPU an example, for a plain-HTTP server).
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", timeout=5, max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(verify=TLS))
    model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="k", stream=stream, timeout_s=5,
                            client=client)
    try:
        return await Runner(model, retry=RetryPolicy(), sleep=no_sleep).run(
            [{"role": "user", "content": "hi"}], TOOLS)
    finally:
        await model.aclose()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(first=streams, again=streams)
def test_any_legal_stream_ends_in_a_typed_stop(
    loop_and_server: tuple[asyncio.AbstractEventLoop, FakeOpenAIServer], first: Raw, again: Raw
) -> None:
    loop, server = loop_and_server
    result = loop.run_until_complete(run_once(server, first, again))
    assert isinstance(result.stop, StopReason)
    assert all(isinstance(r, str) for r in result.replies)
    # The user always hears something, and never a blank message.
    assert result.replies and all(r.strip() for r in result.replies)


non_stream_call = st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries({}, optional={"name": st.sampled_from(["ping", "weather", "nope", ""]),
                                                     "arguments": arguments})},
    optional={"id": st.sampled_from(["", "call_1", "call_2"])},
)
bodies = st.builds(
    lambda content, reasoning, calls, finish_reason, usage: Raw(body={
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "usage": {"prompt_tokens": usage, "completion_tokens": 1},
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content, "reasoning_content": reasoning,
                                 **({"tool_calls": calls} if calls is not None else {})}}]}),
    st.one_of(st.none(), texts), st.one_of(st.none(), texts), st.one_of(st.none(), st.lists(non_stream_call, max_size=3)),
    finish, counts,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(first=bodies)
# Found by this test: a blank answer beside a tool call, near the run's token cap, was sent as the reply.
@example(first=Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                         "usage": {"prompt_tokens": 23865, "completion_tokens": 1},
                         "choices": [{"index": 0, "finish_reason": None,
                                      "message": {"role": "assistant", "content": " ", "reasoning_content": None,
                                                  "tool_calls": [{"type": "function", "function": {}}]}}]}))
def test_any_non_streamed_reply_ends_in_a_typed_stop(
    loop_and_server: tuple[asyncio.AbstractEventLoop, FakeOpenAIServer], first: Raw
) -> None:
    loop, server = loop_and_server
    result = loop.run_until_complete(run_once(server, first, first, stream=False))
    assert isinstance(result.stop, StopReason)
    assert result.replies and all(r.strip() for r in result.replies)
