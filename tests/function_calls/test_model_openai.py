"""OpenAIChatModel through the real openai SDK against FakeOpenAIServer."""

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from function_calls import ModelAPIError, ModelRequest, OpenAIChatModel, ToolCall
from function_calls.model import ToolCallAccumulator
from function_calls.testing import Call, Delay, Disconnect, FakeOpenAIServer, Fault, Raw, Reply, chunk
from function_calls.testing.server import Usage as WireUsage

SECRET = "sk-test-SECRET-123"
REQUEST = ModelRequest(
    messages=[{"role": "user", "content": "天气？"}],
    tools=[{"type": "function", "function": {"name": "weather", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}],
    tool_choice="auto",
)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as srv:
        yield srv


def make_model(server: FakeOpenAIServer, *, stream: bool, **kw: Any) -> OpenAIChatModel:
    return OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key=SECRET, stream=stream, **kw)


@pytest.mark.parametrize("stream", [False, True])
async def test_text_reply_and_usage_are_captured(server: FakeOpenAIServer, stream: bool) -> None:
    server.script(Reply("你好，今天晴。", usage=WireUsage(prompt_tokens=120, completion_tokens=9)))
    model = make_model(server, stream=stream, temperature=0.2)
    deltas: list[str] = []

    async def on_text(delta: str) -> None:
        deltas.append(delta)

    response = await model.complete(REQUEST, on_text=on_text)
    await model.aclose()
    assert response.text == "你好，今天晴。"
    assert response.tool_calls == []
    assert response.finish_reason == "stop"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (120, 9)
    assert (response.usage.requests, response.usage.estimated) == (1, 0)
    assert "".join(deltas) == "你好，今天晴。"
    body = server.last_request.body
    assert body["model"] == "fake-model"
    assert body["tools"] == REQUEST.tools and body["tool_choice"] == "auto"
    assert body["temperature"] == 0.2
    assert bool(body.get("stream")) is stream
    if stream:
        assert body["stream_options"] == {"include_usage": True}


async def test_streaming_on_text_receives_deltas_as_they_come(server: FakeOpenAIServer) -> None:
    server.script(Reply("abcdefghijkl", chunk_size=4))
    deltas: list[str] = []

    async def on_text(delta: str) -> None:
        deltas.append(delta)

    model = make_model(server, stream=True)
    await model.complete(REQUEST, on_text=on_text)
    await model.aclose()
    assert deltas == ["abcd", "efgh", "ijkl"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("index_mode", ["normal", "omit", "all_zero"])
async def test_parallel_tool_calls_survive_missing_and_reused_indexes(
    server: FakeOpenAIServer, stream: bool, index_mode: Literal["normal", "omit", "all_zero"]
) -> None:
    calls = [Call("weather", {"city": "北京", "days": 3}, id="c1"), Call("time", {"zone": "Asia/Shanghai"}, id="c2")]
    server.script(Reply(tool_calls=calls, index_mode=index_mode, chunk_size=3))
    model = make_model(server, stream=stream)
    response = await model.complete(REQUEST)
    await model.aclose()
    assert response.tool_calls == [
        ToolCall(id="c1", name="weather", arguments='{"city": "北京", "days": 3}'),
        ToolCall(id="c2", name="time", arguments='{"zone": "Asia/Shanghai"}'),
    ]
    assert response.finish_reason == "tool_calls"


def test_accumulator_handles_an_index_reused_for_a_new_call_and_id_less_continuations() -> None:
    acc = ToolCallAccumulator()
    acc.feed(0, "a", "first", '{"x"')
    acc.feed(1, "b", "second", "{")
    acc.feed(0, None, None, ": 1}")  # continues call a by index
    acc.feed(1, None, None, "}")
    acc.feed(0, "c", "third", "{}")  # a provider reusing index 0 for a new call
    acc.feed(None, None, None, "")  # empty keep-alive delta
    assert acc.result() == [
        ToolCall(id="a", name="first", arguments='{"x": 1}'),
        ToolCall(id="b", name="second", arguments="{}"),
        ToolCall(id="c", name="third", arguments="{}"),
    ]
    no_ids = ToolCallAccumulator()
    no_ids.feed(None, None, "solo", '{"a"')
    no_ids.feed(None, None, None, ": 2}")
    made_up = no_ids.result()
    assert [(c.name, c.arguments) for c in made_up] == [("solo", '{"a": 2}')]
    assert made_up[0].id.startswith("call_") and no_ids.result() == made_up  # asked twice: the same id
    again = ToolCallAccumulator()  # the next turn's id-less call gets another id (see test_approvals)
    again.feed(None, None, "solo", '{"a": 2}')
    assert again.result()[0].id != made_up[0].id


@pytest.mark.parametrize("stream", [False, True])
async def test_sdk_retries_are_off_so_a_500_is_seen_once(server: FakeOpenAIServer, stream: bool) -> None:
    server.script(Fault(500), Reply("would be the SDK's retry"))
    model = make_model(server, stream=stream)
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST)
    await model.aclose()
    assert len(server.requests) == 1
    assert (info.value.status, info.value.retryable) == (500, True)


@pytest.mark.parametrize("stream", [False, True])
async def test_error_details_are_mapped_and_never_carry_the_key(server: FakeOpenAIServer, stream: bool) -> None:
    server.script(Fault(429, code="insufficient_quota", message=f"quota for {SECRET[:3]}"))
    model = make_model(server, stream=stream)
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST)
    await model.aclose()
    err = info.value
    assert (err.status, err.code, err.retryable) == (429, "insufficient_quota", False)
    assert SECRET not in str(err) and SECRET not in repr(err) and SECRET not in repr(model)
    assert server.last_request.headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize(
    ("fault", "expected"), [(Fault(429, retry_after=3), 3.0), (Fault(503, retry_after_ms=250), 0.25)]
)
async def test_retry_after_headers_are_read(server: FakeOpenAIServer, fault: Fault, expected: float) -> None:
    server.script(fault)
    model = make_model(server, stream=False)
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST)
    await model.aclose()
    assert info.value.retry_after == expected


@pytest.mark.parametrize("stream", [False, True])
async def test_timeouts_and_dropped_connections_are_retryable(server: FakeOpenAIServer, stream: bool) -> None:
    server.script(Delay(5), Disconnect())
    model = make_model(server, stream=stream, timeout_s=0.2)
    for expected in ("timed out", "could not reach"):
        with pytest.raises(ModelAPIError) as info:
            await model.complete(REQUEST)
        assert info.value.retryable and expected in str(info.value)
    await model.aclose()


async def test_a_stream_cut_after_text_reports_that_text_was_shown(server: FakeOpenAIServer) -> None:
    server.script(Reply("a long streamed answer", chunk_size=3, break_after=4))
    shown: list[str] = []

    async def on_text(delta: str) -> None:
        shown.append(delta)

    model = make_model(server, stream=True)
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST, on_text=on_text)
    await model.aclose()
    assert info.value.text_shown and info.value.retryable
    assert shown == ["a l", "ong", " st"]  # break_after counts the opening role chunk too


def test_one_id_reused_under_two_indexes_is_two_calls_with_ids_of_their_own() -> None:
    """Providers that number ids per turn can send index 0 and index 1 both as ``call_0``: two calls,
    not one with two JSON objects glued together (neither would run)."""
    acc = ToolCallAccumulator()
    acc.feed(0, "call_0", "weather", '{"city": ')
    acc.feed(1, "call_0", "weather", '{"city": "上海"}')
    acc.feed(0, "call_0", None, '"北京"}')  # the first call's rest, after the second began
    first, second = acc.result()
    assert (first.name, first.arguments, first.id) == ("weather", '{"city": "北京"}', "call_0")
    assert (second.name, second.arguments) == ("weather", '{"city": "上海"}') and second.id != "call_0"


@pytest.mark.parametrize("index", [0, None])
def test_one_id_sent_for_two_whole_calls_is_two_calls(index: int | None) -> None:
    """Relays that number ids per turn can send every call as ``call_0`` at index 0 (or none): the second
    whole call is not glued onto the first (``{"city": "北京"}{}``: neither would run)."""
    acc = ToolCallAccumulator()
    acc.feed(index, "call_0", "weather", '{"city": "北京"}')
    acc.feed(index, "call_0", "ping", "{}")
    acc.feed(index, "call_0", "ping", "{")
    acc.feed(index, "call_0", None, "}")  # (the rest of the call that id now names)
    first, second, third = acc.result()
    assert (first.id, first.name, first.arguments) == ("call_0", "weather", '{"city": "北京"}')
    assert [(c.name, c.arguments) for c in (second, third)] == [("ping", "{}"), ("ping", "{}")]
    assert len({first.id, second.id, third.id}) == 3


def thinking(chunks: int, *, per: int = 10, tail: list[dict[str, Any]] | None = None) -> Raw:
    """A stream of ``chunks`` reasoning deltas of ``per`` tokens each (one CJK character is one token)."""
    events = [chunk({"role": "assistant", "content": None, "reasoning_content": "想" * per})]
    events += [chunk({"reasoning_content": "想" * per}) for _ in range(chunks - 1)]
    return Raw(events + (tail if tail is not None else [chunk({"content": "答案"}, "stop")]))


def long_arguments(chunks: int) -> Raw:
    events = [chunk({"role": "assistant", "tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "'}}]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": "北" * 10}}]}) for _ in range(chunks)]
    return Raw([*events, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}, "tool_calls")])


@pytest.mark.parametrize("case", ["max_tokens ignored", "no max_tokens sent", "tool arguments"])
async def test_a_stream_is_abandoned_once_its_output_passes_its_cap(server: FakeOpenAIServer, case: str) -> None:
    """A provider that ignores max_tokens, or a turn whose cap was not sent (a model refuses one above its own
    limit), is not read to its end: 60,000 tokens were read and charged against a cap of 24,000. A cap that was
    sent is given half more (the provider keeps to it by its own count, which the estimate may pass)."""
    usage = {"prompt_tokens": 10, "completion_tokens": 2000, "total_tokens": 2010}
    server.script(long_arguments(200) if case == "tool arguments" else
                  thinking(200, tail=[chunk({"content": "答案"}, "stop"), chunk(choices=False, usage=usage)]))
    limit = {"max_tokens": 100} if case == "max_tokens ignored" else {"output_limit": 100}
    model = make_model(server, stream=True)
    response = await model.complete(REQUEST.model_copy(update=limit))
    await model.aclose()
    assert response.finish_reason == "length" and response.text == "" and response.tool_calls == []
    cut = 150 if case == "max_tokens ignored" else 100
    assert cut < response.usage.completion_tokens <= cut + 15 and response.usage.estimated == 1
    assert ("max_tokens" in server.last_request.body) is (case == "max_tokens ignored")


@pytest.mark.parametrize("case", ["stream cut", "stream aborted", "reply aborted"])
async def test_a_reply_that_fails_after_it_was_read_is_billed(server: FakeOpenAIServer, case: str) -> None:
    """The provider did the work: 4 broken attempts of 2,700 tokens each were charged 0."""
    usage = {"prompt_tokens": 300, "completion_tokens": 2700, "total_tokens": 3000}
    if case == "stream cut":  # [DONE] with a tool call's JSON unfinished, no finish_reason, no usage
        server.script(thinking(27, per=100, tail=[chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                                           "function": {"name": "w", "arguments": '{"c'}}]})]))
    elif case == "stream aborted":  # DeepSeek short of capacity, its usage reported
        server.script(thinking(27, per=100, tail=[chunk({}, "insufficient_system_resource"),
                                                  chunk(choices=False, usage=usage)]))
    else:
        message = {"role": "assistant", "content": None, "reasoning_content": "想" * 2700}
        server.script(Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model",
                                "choices": [{"index": 0, "message": message,
                                             "finish_reason": "insufficient_system_resource"}], "usage": usage}))
    model = make_model(server, stream=case != "reply aborted")
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST)
    await model.aclose()
    assert info.value.retryable
    if case == "stream cut":
        assert 2700 <= (info.value.billed_output or 0) <= 2710 and info.value.billed_prompt is None
    else:
        assert (info.value.billed_prompt, info.value.billed_output) == (300, 2700)


@pytest.mark.parametrize("stream", [False, True])
async def test_reported_zeros_the_reply_contradicts_are_estimated(server: FakeOpenAIServer, stream: bool) -> None:
    """A relay that reports usage {0, 0} for a long prompt and a long answer: it was charged 0."""
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if stream:
        server.script(Raw([{**event, "usage": zero} for event in thinking(20).events if isinstance(event, dict)]))
    else:
        message = {"role": "assistant", "content": "答案", "reasoning_content": "想" * 200}
        server.script(Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model",
                                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": zero}))
    model = make_model(server, stream=stream)
    response = await model.complete(REQUEST)
    await model.aclose()
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens >= 200
    assert response.usage.estimated == 1
    server.script(Reply("", usage=WireUsage(prompt_tokens=50, completion_tokens=0)))  # an empty answer's 0 is true
    model = make_model(server, stream=stream)
    empty = await model.complete(REQUEST)
    await model.aclose()
    assert (empty.usage.prompt_tokens, empty.usage.completion_tokens, empty.usage.estimated) == (50, 0, 0)


async def test_a_stream_has_a_deadline_in_all(server: FakeOpenAIServer) -> None:
    """The SDK's timeout is per read: a stream that trickles on was read for as long as it went. Five times
    ``timeout_s`` in all by default (a reply that is not streamed has ``timeout_s`` for all of it)."""
    server.script(Reply("想" * 1000, chunk_size=1, chunk_delay=0.01))
    model = make_model(server, stream=True, timeout_s=0.06)
    assert model.deadline_s == pytest.approx(0.3)
    started = asyncio.get_running_loop().time()
    with pytest.raises(ModelAPIError) as info:
        await model.complete(REQUEST)
    await model.aclose()
    assert asyncio.get_running_loop().time() - started < 0.6
    assert "0.3" in str(info.value) and info.value.network and not info.value.retryable
    assert 5 <= (info.value.billed_output or 0) < 100  # what came was billed


ENGLISH = re.findall(r" ?[A-Za-z]+|[^\sA-Za-z]| ", "Okay, so the user asks about the weather today. Let me think: first "
                     "I check whether they want the forecast or the current conditions, because they go out later. ")


@pytest.mark.parametrize("case", ["one English token per delta, no cap sent", "Chinese within the max_tokens sent"])
async def test_a_reply_within_its_cap_is_read_whole(server: FakeOpenAIServer, case: str) -> None:
    """The estimate that cuts a stream is the whole text's, and a cap the provider keeps to is given room: 1,600
    reasoning tokens streamed one per delta (DeepSeek, Qwen) were cut at 1,000 (each delta rounded up on its own)
    and the answer lost; 1,300 characters written within max_tokens=992 (930 tokens) were cut at 994."""
    if case.startswith("one English"):
        deltas, answer, limit = [ENGLISH[i % len(ENGLISH)] for i in range(1600)], "多云，带伞。", {"output_limit": 2000}
        events = [chunk({"role": "assistant", "content": ""}), *(chunk({"reasoning_content": d}) for d in deltas),
                  chunk({"content": answer}, "stop")]
        out = 1610
    else:
        answer, limit = ("这是一个比较长的中文回答，" * 120)[:1300], {"max_tokens": 992, "output_limit": 992}
        events = [chunk({"role": "assistant", "content": ""}),
                  *(chunk({"content": answer[i:i + 2]}) for i in range(0, 1300, 2)), chunk({}, "stop")]
        out = 930
    server.script(Raw([*events, chunk(choices=False, usage={"prompt_tokens": 30, "completion_tokens": out,
                                                            "total_tokens": 30 + out})]))
    model = make_model(server, stream=True)
    response = await model.complete(REQUEST.model_copy(update=limit))
    await model.aclose()
    assert (response.text, response.finish_reason) == (answer, "stop")
    assert (response.usage.completion_tokens, response.usage.estimated) == (out, 0)


async def test_a_cut_stream_is_charged_what_the_provider_counted_by_then(server: FakeOpenAIServer) -> None:
    """A relay that reports its running count on every chunk: a stream cut at its cap is charged that count when
    it is below the estimate (1.4 characters a token), not the estimate."""
    events = [chunk({"role": "assistant", "content": None, "reasoning_content": "想" * 14},
                    usage={"prompt_tokens": 30, "completion_tokens": 10 * (i + 1), "total_tokens": 40 + 10 * i})
              for i in range(100)]
    server.script(Raw(events))
    model = make_model(server, stream=True)
    response = await model.complete(REQUEST.model_copy(update={"output_limit": 200}))
    await model.aclose()
    assert response.finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.estimated) == (30, 150, 0)


@pytest.mark.parametrize(("message", "refused_stream"), [
    ("Your organization must be verified to stream this model.", True),
    ("upstream model rejected the request", False)])
async def test_a_stream_refused_is_asked_again_unstreamed(message: str, refused_stream: bool) -> None:
    """A provider that will not stream a model (OpenAI's o3 for an organisation not verified) answers it
    unstreamed: the request is sent again so, and so are the next. Another HTTP 400 is not sent again."""
    def responder(body: dict[str, Any]) -> Fault | Reply:
        return Fault(400, message, code="unsupported_value") if body.get("stream") else Reply("答案是 42")

    async with FakeOpenAIServer(responder) as srv:
        model = make_model(srv, stream=True)
        if refused_stream:
            assert (await model.complete(REQUEST)).text == (await model.complete(REQUEST)).text == "答案是 42"
            assert [bool(r.body.get("stream")) for r in srv.requests] == [True, False, False]
        else:
            with pytest.raises(ModelAPIError):
                await model.complete(REQUEST)
            assert len(srv.requests) == 1 and model.stream
        await model.aclose()
