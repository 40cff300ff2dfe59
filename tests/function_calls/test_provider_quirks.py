"""Never crash: what real OpenAI-compatible providers stream, through the real openai SDK.

Each case is replayed as raw SSE / HTTP from FakeOpenAIServer (``Raw`` steps) and run through
``Runner``: the run must end in a typed stop, do the right thing, and never raise.
"""

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel, Field, field_validator

from function_calls import (
    Limits,
    OpenAIChatModel,
    RetryPolicy,
    Runner,
    RunResult,
    StopReason,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import Call, FakeOpenAIServer, Fault, Raw, Reply, chunk
from function_calls.testing.server import Step

USER = [{"role": "user", "content": "北京天气？"}]


class City(BaseModel):
    city: str = Field(max_length=20)


class Picky(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _boom(cls, value: int) -> int:
        if value == 13:
            raise KeyError("unlucky")  # not a ValueError: pydantic lets it escape
        if value == 7:
            raise TypeError("odd")
        return value


class Env:
    """A runner against a fake server, with tools that record what ran."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        self.ran: list[tuple[str, Any]] = []
        self.delays: list[float] = []
        self.events: list[dict[str, Any]] = []

        async def ping() -> str:
            """Ping."""
            self.ran.append(("ping", None))
            return "pong"

        async def weather(args: City) -> str:
            """Weather in a city."""
            self.ran.append(("weather", args.city))
            return f"{args.city}: 晴"

        async def picky(args: Picky) -> str:
            """A tool whose validator misbehaves."""
            self.ran.append(("picky", args.n))
            return "ok"

        async def odd() -> ToolResult:
            """Returns hostile data."""
            self.ran.append(("odd", None))
            return ToolResult(content="bad \ud800 text", data={"mixed": {1: "a", "b": 2}, "s": "\udfff"})

        async def kick() -> str:
            """Remove a member (needs approval)."""
            self.ran.append(("kick", None))
            return "kicked"

        self.tools = Toolset("t", [tool_function(ping), tool_function(weather), tool_function(picky),
                                   tool_function(odd), tool_function(confirm=True)(kick)])

    async def run(self, *steps: Step, stream: bool = True, on_text: Any = None, on_event: Any = None,
                  policy: RetryPolicy | None = None, limits: Limits | None = None, **model_kw: Any) -> RunResult:
        self.server.script(*steps)

        async def sleep(seconds: float) -> None:
            self.delays.append(seconds)

        async def record(event: dict[str, Any]) -> None:
            self.events.append(event)

        model = OpenAIChatModel(model="fake-model", base_url=self.server.base_url, api_key="k", stream=stream,
                                timeout_s=5, **model_kw)
        runner = Runner(model, retry=policy or RetryPolicy(), sleep=sleep, limits=limits or Limits())
        try:
            return await runner.run(USER, self.tools, on_text=on_text, on_event=on_event or record)
        finally:
            await model.aclose()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with FakeOpenAIServer() as server:
        yield Env(server)


def tool_delta(index: int | None = None, id: str | None = None, name: str | None = None,
               arguments: Any = None) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {}}
    if index is not None:
        call["index"] = index
    if id is not None:
        call["id"] = id
    if name is not None:
        call["function"]["name"] = name
    if arguments is not None:
        call["function"]["arguments"] = arguments
    return {"tool_calls": [call]}


def tool_messages(env: Env) -> list[dict[str, Any]]:
    return [m for m in env.server.last_request.messages if m["role"] == "tool"]


async def test_id_less_calls_all_at_index_zero_stay_two_calls(env: Env) -> None:
    stream = Raw([chunk({"role": "assistant"}), chunk(tool_delta(0, name="ping", arguments="")),
                  chunk(tool_delta(0, name="weather", arguments='{"city": ')),
                  chunk(tool_delta(0, arguments='"北京"}')), chunk(None, "tool_calls")])
    result = await env.run(stream, Reply("北京晴"))
    assert result.stop is StopReason.COMPLETED and result.text == "北京晴"
    assert sorted(env.ran) == [("ping", None), ("weather", "北京")]
    assert [t["content"] for t in tool_messages(env)] == ["pong", "北京: 晴"]


async def test_vllm_regenerated_ids_are_one_call(env: Env) -> None:
    stream = Raw([chunk(tool_delta(0, id="chatcmpl-tool-a1", name="weather", arguments="")),
                  chunk(tool_delta(0, id="chatcmpl-tool-b2", arguments='{"ci')),
                  chunk(tool_delta(0, id="chatcmpl-tool-c3", arguments='ty": "上海"}')),
                  chunk(None, "tool_calls")])
    result = await env.run(stream, Reply("上海晴"))
    assert result.stop is StopReason.COMPLETED
    assert env.ran == [("weather", "上海")]
    assert [t.name for t in result.trace] == ["weather"] and not result.trace[0].is_error


async def test_qwen_empty_ids_and_names_on_continuations(env: Env) -> None:
    """DashScope's compatible mode repeats ``id: ""`` and ``name: null`` on every continuation."""
    stream = Raw([chunk({"role": "assistant", "content": None, "reasoning_content": "想一想"}),
                  chunk(tool_delta(0, id="call_q1", name="weather", arguments='{"city"')),
                  chunk(tool_delta(0, id="", name="", arguments=': "杭州"}')),
                  chunk(None, "tool_calls"), chunk(choices=False, usage={"prompt_tokens": 9, "completion_tokens": 3,
                                                                          "total_tokens": 12})])
    result = await env.run(stream, Reply("杭州晴"))
    assert result.stop is StopReason.COMPLETED and env.ran == [("weather", "杭州")]
    assert result.usage.prompt_tokens >= 9 and result.usage.estimated == 0


async def test_ollama_whole_calls_in_one_chunk_with_finish_stop(env: Env) -> None:
    """Ollama sends each call whole, every one at index 0, and may finish with "stop"."""
    stream = Raw([chunk(tool_delta(0, id="call_o1", name="weather", arguments='{"city":"广州"}')),
                  chunk(tool_delta(0, id="call_o2", name="weather", arguments='{"city":"深圳"}')),
                  chunk({"content": ""}, "stop")])
    result = await env.run(stream, Reply("都晴"))
    assert result.stop is StopReason.COMPLETED
    assert sorted(env.ran) == [("weather", "广州"), ("weather", "深圳")]


@pytest.mark.parametrize("stream", [True, False])
async def test_llama_cpp_arguments_as_an_object_and_calls_without_ids(env: Env, stream: bool) -> None:
    if stream:
        step: Step = Raw([chunk(tool_delta(0, name="weather", arguments={"city": "成都"})),
                          chunk(None, "tool_calls")])
    else:
        message = {"role": "assistant", "content": None,
                   "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "成都"}}}]}
        step = Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    result = await env.run(step, Reply("成都晴"), stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "成都晴"
    assert env.ran == [("weather", "成都")]
    assert len(env.server.requests) == 2  # nothing was retried
    assistant = env.server.last_request.messages[1]
    assert assistant["tool_calls"][0]["id"]  # an id was made up, so the tool result can answer it
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "成都"}


async def test_done_without_finish_reason_is_a_finished_answer(env: Env) -> None:
    result = await env.run(Raw([chunk({"role": "assistant", "content": "晴，"}), chunk({"content": "25 度"})]))
    assert result.stop is StopReason.COMPLETED and result.text == "晴，25 度"
    assert len(env.server.requests) == 1 and env.delays == []


async def test_done_without_finish_reason_after_tool_calls_runs_them(env: Env) -> None:
    stream = Raw([chunk(tool_delta(0, id="c1", name="weather", arguments='{"city": "西安"}'))])
    result = await env.run(stream, Reply("西安晴"))
    assert result.stop is StopReason.COMPLETED and env.ran == [("weather", "西安")]


async def test_a_stream_cut_inside_tool_arguments_is_still_retried(env: Env) -> None:
    cut = Raw([chunk(tool_delta(0, id="c1", name="weather", arguments='{"city": "西'))], done=False)
    result = await env.run(cut, Reply("重试后的回答"))
    assert result.stop is StopReason.COMPLETED and result.text == "重试后的回答"
    assert env.ran == [] and len(env.server.requests) == 2


CONTEXT_TOO_LONG = {"error": {"message": "This model's maximum context length is 8192 tokens",
                              "type": "invalid_request_error", "code": "context_length_exceeded"}}


@pytest.mark.parametrize(
    ("event", "retried"),
    [
        (CONTEXT_TOO_LONG, False),
        ({"error": {"message": "bad request", "code": 400}}, False),
        ({"error": {"message": "Invalid API key", "type": "authentication_error"}}, False),
        ({"error": {"message": "overloaded", "type": "server_error"}}, True),
        ({"error": {"message": "slow down", "code": "429"}}, True),
    ],
    ids=["context-too-long", "numeric-code", "auth", "server-error", "rate-limited"],
)
async def test_an_error_event_inside_a_200_stream_is_classified_like_its_status(
    env: Env, event: dict[str, Any], retried: bool
) -> None:
    result = await env.run(Raw([chunk({"role": "assistant"}), event]), Reply("recovered"))
    if retried:
        assert result.stop is StopReason.COMPLETED and len(env.server.requests) == 2
    else:
        assert result.stop is StopReason.MODEL_ERROR and len(env.server.requests) == 1
        assert env.delays == [] and "HTTP 4" in result.detail


def deepseek(body: dict[str, Any]) -> Step:
    """DeepSeek's thinking mode: an assistant tool-call turn sent back without its reasoning is a 400."""
    for message in body["messages"]:
        if message["role"] == "assistant" and message.get("tool_calls") and not message.get("reasoning_content"):
            return Fault(400, "Missing `reasoning_content` field in the assistant message", code="invalid_request_error")
    if any(m["role"] == "tool" for m in body["messages"]):
        return Raw([chunk({"reasoning_content": "结果已有，"}), chunk({"content": "北京晴"}, "stop")])
    return Raw([chunk({"role": "assistant", "content": None, "reasoning_content": "需要查天气。"}),
                chunk({"reasoning_content": "调用 weather。"}),
                chunk(tool_delta(0, id="call_ds", name="weather", arguments='{"city": "北京"}')),
                chunk(None, "tool_calls")])


@pytest.mark.parametrize("stream", [True, False])
async def test_deepseek_reasoning_is_sent_back_when_the_model_option_says_so(env: Env, stream: bool) -> None:
    if not stream:
        env.server.responder = lambda body: _as_body(deepseek(body))
    else:
        env.server.responder = deepseek
    result = await env.run(stream=stream, reasoning_pass_back=True)
    assert result.stop is StopReason.COMPLETED and result.text == "北京晴"
    assistant = env.server.last_request.messages[1]
    assert assistant["reasoning_content"] == "需要查天气。调用 weather。"


async def test_reasoning_is_stripped_by_default(env: Env) -> None:
    env.server.responder = deepseek
    result = await env.run()
    # Without pass-back DeepSeek refuses the second turn: a typed, unretried failure, not a crash.
    assert result.stop is StopReason.MODEL_ERROR and len(env.server.requests) == 2
    assert "reasoning_content" not in env.server.last_request.messages[1]
    assert result.messages[1]["reasoning_content"] == "需要查天气。调用 weather。"  # kept in the run's state


def _as_body(step: Step) -> Step:
    """The same DeepSeek turn as a non-streamed completion."""
    if not isinstance(step, Raw):
        return step
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for event in step.events:
        assert isinstance(event, dict)
        delta = event["choices"][0]["delta"]
        for key in ("content", "reasoning_content"):
            if delta.get(key):
                message[key] = message.get(key) or ""
                message[key] += delta[key]
        if delta.get("tool_calls"):
            tc = delta["tool_calls"][0]
            message["tool_calls"] = [{"id": tc["id"], "type": "function", "function": tc["function"]}]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}]})


@pytest.mark.parametrize("stream", [True, False])
async def test_a_reasoning_only_answer_is_not_a_blank_reply(env: Env, stream: bool) -> None:
    thinking = Raw([chunk({"role": "assistant", "reasoning_content": "嗯……"}), chunk(None, "length")])
    if not stream:
        thinking = _as_body(thinking)
    result = await env.run(thinking, stream=stream)
    assert result.stop is StopReason.EMPTY_ANSWER
    assert result.replies == [result.text] and "没能给出回答" in result.text and "只有思考过程" in result.text


@pytest.mark.parametrize(("param", "absent"), [("max_completion_tokens", "max_tokens"),
                                               ("max_tokens", "max_completion_tokens")])
async def test_the_final_answer_uses_the_configured_token_parameter(env: Env, param: str, absent: str) -> None:
    steps = [Reply(tool_calls=[_call("ping")]), Reply("pong 了")]
    result = await env.run(*steps, limits=Limits(max_tool_calls=1), token_param=param)
    assert result.stop is StopReason.TOOL_CALL_LIMIT and result.text == "pong 了"
    final = env.server.last_request.body
    assert final[param] == Limits().final_answer_max_tokens and absent not in final


def _call(name: str, arguments: dict[str, Any] | None = None) -> Call:
    return Call(name, arguments or {})


async def test_hostile_tool_results_do_not_break_loop_detection_or_the_next_request(env: Env) -> None:
    result = await env.run(Reply(tool_calls=[_call("odd")]), Reply("done"))
    assert result.stop is StopReason.COMPLETED and result.text == "done"
    assert env.ran == [("odd", None)]
    assert tool_messages(env)[0]["content"] == "bad \ufffd text"


async def test_a_validator_raising_keyerror_is_a_tool_error_and_siblings_still_run(env: Env) -> None:
    turn = Reply(tool_calls=[_call("picky", {"n": 13}), _call("weather", {"city": "北京"}), _call("picky", {"n": 7}),
                             _call("picky", {"n": 2})])
    result = await env.run(turn, Reply("done"))
    assert result.stop is StopReason.COMPLETED
    assert sorted(env.ran, key=str) == sorted([("weather", "北京"), ("picky", 2)], key=str)
    contents = [t["content"] for t in tool_messages(env)]
    assert len(contents) == 4
    assert "KeyError" in contents[0] and "TypeError" in contents[2]
    assert contents[1] == "北京: 晴" and contents[3] == "ok"


async def test_a_confirm_tool_is_refused_on_the_model_path_without_an_approver(env: Env) -> None:
    result = await env.run(Reply(tool_calls=[_call("kick")]), Reply("需要管理员批准，没有执行。"))
    assert env.ran == []
    assert result.stop is StopReason.COMPLETED
    refusal = tool_messages(env)[0]["content"]
    assert "需要管理员批准" in refusal and "没有执行" in refusal
    assert result.trace[0].is_error and result.trace[0].note == "needs approval"


@pytest.mark.parametrize(
    ("headers", "retried"),
    [({"Retry-After": "soon"}, True), ({"Retry-After": "nan"}, True), ({"retry-after-ms": "-"}, True),
     ({"Retry-After": "Wed, 21 Oct 2015 07:28:00"}, True)],
    ids=["soon", "nan", "bad-ms", "past-date-no-zone"],
)
async def test_unreadable_retry_after_falls_back_to_backoff(env: Env, headers: dict[str, str], retried: bool) -> None:
    result = await env.run(Fault(503, headers=headers), Reply("ok"))
    assert result.stop is StopReason.COMPLETED and len(env.server.requests) == 2
    assert len(env.delays) == 1 and 0 <= env.delays[0] <= 0.5


async def test_a_long_retry_after_tells_the_user_instead_of_waiting(env: Env) -> None:
    result = await env.run(Fault(429, retry_after=3600), Reply("too late"))
    assert result.stop is StopReason.MODEL_ERROR
    assert env.delays == [] and len(env.server.requests) == 1
    assert result.replies == ["AI 服务繁忙，请约 60 分钟后再试。"]


async def test_retries_stop_when_the_runs_patience_is_spent(env: Env) -> None:
    steps = [Fault(503, retry_after=20), Fault(503, retry_after=20), Fault(503, retry_after=20), Reply("ok")]
    result = await env.run(*steps)
    assert result.stop is StopReason.MODEL_ERROR
    assert env.delays == [20.0, 20.0]  # a third 20 s wait would pass the 45 s patience
    assert "约" not in result.text and "20 秒" in result.text


@pytest.mark.parametrize(("status", "header", "requests"), [(500, "false", 1), (503, "FALSE", 1), (400, "true", 2)])
async def test_x_should_retry_overrides_the_status(env: Env, status: int, header: str, requests: int) -> None:
    result = await env.run(Fault(status, headers={"x-should-retry": header}), Reply("ok"))
    assert len(env.server.requests) == requests
    assert result.stop is (StopReason.COMPLETED if requests == 2 else StopReason.MODEL_ERROR)


async def test_a_failing_on_text_callback_is_not_a_provider_fault(env: Env) -> None:
    seen: list[str] = []

    async def on_text(delta: str) -> None:
        seen.append(delta)
        raise RuntimeError("the channel's streaming broke")

    result = await env.run(Reply("第一段，第二段，第三段", chunk_size=4), on_text=on_text)
    assert result.stop is StopReason.COMPLETED and result.text == "第一段，第二段，第三段"
    assert len(env.server.requests) == 1 and env.delays == []
    assert len(seen) == 1  # called once, then left alone


async def test_a_failing_on_event_callback_does_not_end_the_run(env: Env) -> None:
    async def on_event(event: dict[str, Any]) -> None:
        raise RuntimeError("trace sink down")

    result = await env.run(Fault(500), Reply(tool_calls=[_call("ping")]), Reply("done"), on_event=on_event)
    assert result.stop is StopReason.COMPLETED and result.text == "done" and env.ran == [("ping", None)]


async def test_a_too_long_value_keeps_its_reason(env: Env) -> None:
    long_city = "很长的城市名" * 50
    result = await env.run(Reply(tool_calls=[_call("weather", {"city": long_city})]), Reply("name too long"))
    assert env.ran == []
    content = tool_messages(env)[0]["content"]
    assert "city" in content and "too long" in content and "20" in content
    assert len(content) < 600
    assert result.stop is StopReason.COMPLETED


@pytest.mark.parametrize("stream", [True, False])
async def test_unreadable_usage_is_estimated_not_fatal(env: Env, stream: bool) -> None:
    usage = {"prompt_tokens": "many", "completion_tokens": [1]}
    if stream:
        step: Step = Raw([chunk({"content": "晴"}, "stop"), chunk(choices=False, usage=usage)])
    else:
        step = Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "m", "usage": usage,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "晴"},
                                      "finish_reason": "stop"}]})
    result = await env.run(step, stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "晴"
    assert result.usage.estimated == 1 and result.usage.prompt_tokens > 0


async def test_a_chat_model_that_raises_ends_the_run_typed() -> None:
    class Broken:
        name = "broken"

        async def complete(self, request: Any, *, on_text: Any = None) -> Any:
            raise RuntimeError("bug in a custom model")

    result = await Runner(Broken()).run(USER, Toolset("t"))
    assert result.stop is StopReason.MODEL_ERROR and "RuntimeError" in result.detail


@pytest.mark.parametrize("stream", [True, False])
async def test_content_parts_and_extra_choices(env: Env, stream: bool) -> None:
    """Mistral's reasoning models send content as a list of parts; n>1 choices must not be interleaved."""
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}, {"type": "text", "text": "晴天"}]
    if stream:
        other = chunk({"content": "另一个回答"})
        other["choices"][0]["index"] = 1
        step: Step = Raw([chunk({"role": "assistant", "content": parts}), other, chunk({"content": "。"}, "stop")])
    else:
        step = Raw(body={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": parts},
                                      "finish_reason": "stop"}]})
    result = await env.run(step, stream=stream)
    assert result.stop is StopReason.COMPLETED
    assert result.text == ("晴天。" if stream else "晴天")


def _body(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", **extra,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_whose_usage_is_not_reported_is_charged_its_estimated_output(env: Env, stream: bool) -> None:
    # Ollama / vLLM builds ignoring stream_options, relays dropping "usage": the output was counted 0,
    # so no budget was ever charged for it.
    long = "很长的回答。" * 500  # 3,000 CJK characters
    step: Step = (Raw([chunk({"content": long[i:i + 100]}) for i in range(0, len(long), 100)] + [chunk({}, "stop")])
                  if stream else Raw(body=_body({"role": "assistant", "content": long})))
    result = await env.run(step, stream=stream)
    assert result.text == long and result.usage.estimated == 1
    assert 3000 <= result.usage.completion_tokens < 3100


@pytest.mark.parametrize("stream", [True, False])
async def test_deepseeks_insufficient_system_resource_is_retried_not_taken_as_the_answer(
        env: Env, stream: bool) -> None:
    broken: Step = (Raw([chunk({"content": "北京今天晴，最"}), chunk({}, "insufficient_system_resource")])
                    if stream else Raw(body=_body({"role": "assistant", "content": "北京今天晴，最"},
                                                  "insufficient_system_resource")))
    result = await env.run(broken, Reply("北京今天晴，最高 12°C。"), stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "北京今天晴，最高 12°C。"
    assert len(env.server.requests) == 2


async def test_an_emoji_split_across_deltas_is_joined_again(env: Env) -> None:
    # A UTF-16 based gateway may cut a surrogate pair between two deltas (JSON "\ud83d" then "\ude00"):
    # joined as they came, the next request could not be encoded, and was retried as a network error.
    def ev(delta: dict[str, Any], finish: str | None = None) -> str:  # JSON escapes: a lone half is \\ud83d
        return json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    stream = Raw([ev(tool_delta(0, id="c1", name="weather", arguments='{"city": "hi \ud83d')),
                  ev(tool_delta(0, arguments='\ude00"}')), ev({}, "tool_calls")])
    text = Raw([ev({"content": "好的 \ud83d"}), ev({"content": "\ude00"}), ev({}, "stop")])
    result = await env.run(stream, text)
    assert result.stop is StopReason.COMPLETED and result.text == "好的 😀"
    assert env.ran == [("weather", "hi 😀")] and len(env.server.requests) == 2 and env.delays == []


async def test_two_calls_a_provider_gave_one_id_get_their_own_answers(env: Env) -> None:
    calls = [{"id": "call_0", "type": "function", "function": {"name": "weather", "arguments": f'{{"city": "{c}"}}'}}
             for c in ("北京", "上海")]
    result = await env.run(Raw(body=_body({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls")),
                           Reply("都晴"), stream=False)
    assert result.stop is StopReason.COMPLETED
    answered = {m["tool_call_id"]: m["content"] for m in tool_messages(env)}
    assert len(answered) == 2 and sorted(answered.values()) == ["上海: 晴", "北京: 晴"]


async def test_arguments_that_are_not_json_are_not_sent_back_as_they_came(env: Env) -> None:
    # vLLM and DashScope answer HTTP 400 to a history whose tool call is not JSON: the model never got
    # to correct itself. The error it reads quotes what it sent.
    result = await env.run(Reply(tool_calls=[_call("weather", '{"city": 北京}')]),
                           Reply(tool_calls=[_call("weather", {"city": "北京"})]), Reply("北京晴"))
    assert result.stop is StopReason.COMPLETED and result.text == "北京晴"
    sent = [m for r in env.server.requests[1:] for m in r.messages if m.get("tool_calls")]
    assert next(m["tool_calls"][0]["function"]["arguments"] for m in sent) == "{}"
    assert "北京" in next(m["content"] for m in env.server.requests[1].messages if m["role"] == "tool")


async def test_several_bad_calls_of_one_turn_are_one_failed_try(env: Env) -> None:
    cities = ("北京", "上海", "广州")
    result = await env.run(Reply(tool_calls=[_call("weather", {"town": c}) for c in cities]),
                           Reply(tool_calls=[_call("weather", {"city": c}) for c in cities]), Reply("北京、上海、广州都是晴天"))
    assert result.stop is StopReason.COMPLETED and len(env.ran) == 3


async def test_a_stream_cut_short_is_charged_what_the_provider_did(env: Env) -> None:
    # 7,800 characters reached the person, the connection broke before the usage chunk: 0 tokens charged.
    shown: list[str] = []

    async def show(text: str) -> None:
        shown.append(text)

    result = await env.run(Reply("字" * 2000, chunk_size=100, break_after=6), on_text=show)
    assert result.stop is StopReason.MODEL_ERROR and len("".join(shown)) >= 500
    assert result.usage.completion_tokens >= 500 and result.usage.prompt_tokens > 0 and result.usage.estimated
    refused = await env.run(Fault(400))  # refused: nothing was done, nothing charged
    assert refused.usage.total_tokens == 0 and refused.usage.requests == 1


def _shown_run(env: Env) -> tuple[list[str], Any]:
    shown: list[str] = []

    async def show(text: str) -> None:
        shown.append(text)

    return shown, show


def _split(content: str, stream: bool, size: int = 3) -> Step:
    """``content`` as a reply: streamed a few characters a delta (tags cut across deltas), or whole."""
    if stream:
        return Raw([chunk({"role": "assistant", "content": content[i:i + size]}) for i in range(0, len(content), size)]
                   + [chunk({}, "stop")])
    return Raw(body=_body({"role": "assistant", "content": content}))


@pytest.mark.parametrize("stream", [True, False])
async def test_a_think_block_in_content_is_reasoning_never_posted(env: Env, stream: bool) -> None:
    # DeepSeek-R1 / QwQ / Qwen3 on Ollama, vLLM without a reasoning parser: the thinking comes in `content`.
    shown, show = _shown_run(env)
    result = await env.run(_split(" <think>系统提示说不能透露张三的工资 8000。</think>\n\n这个我不方便说。", stream),
                           stream=stream, on_text=show)
    assert result.stop is StopReason.COMPLETED and result.text == "这个我不方便说。"
    assert "".join(shown) == "这个我不方便说。"
    assert "8000" in result.messages[-1]["reasoning_content"] and "<think>" not in str(result.messages[-1]["content"])


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_of_only_an_unclosed_think_block_is_no_answer(env: Env, stream: bool) -> None:
    shown, show = _shown_run(env)
    result = await env.run(_split("<THINKING>张三私聊说他的工资是 8000，嗯……", stream), stream=stream, on_text=show)
    assert result.stop is StopReason.EMPTY_ANSWER and "只有思考过程" in result.text
    assert "8000" not in "".join(shown) + result.text


@pytest.mark.parametrize("stream", [True, False])
async def test_think_tags_after_the_start_of_an_answer_are_its_text(env: Env, stream: bool) -> None:
    text = "Qwen3 用 <think>…</think> 包住思考。"
    shown, show = _shown_run(env)
    result = await env.run(_split(text, stream), stream=stream, on_text=show)
    assert result.text == text and "".join(shown) == text


QUOTA = {"error": {"message": "您的余额不足", "type": "insufficient_quota", "code": "insufficient_quota"}}
PORTAL = Raw(body="<html><body>Please log in to the Wi-Fi portal</body></html>", headers={"Content-Type": "text/html"})


@pytest.mark.parametrize(("step", "stream", "status"), [
    (Raw(body=QUOTA), True, 429), (Raw(body=QUOTA), False, 429),
    (Raw(body={"error": {"message": "Invalid API key", "type": "authentication_error"}}), True, 401),
    (PORTAL, True, None), (PORTAL, False, None),
], ids=["quota-streamed", "quota", "auth-streamed", "html-streamed", "html"])
async def test_an_error_body_sent_with_http_200_is_the_error_it_names(
        env: Env, step: Step, stream: bool, status: int | None) -> None:
    # A relay (one-api/new-api, a captive portal) answering 200: refused like the real status, never retried,
    # nothing charged (the provider did no work).
    result = await env.run(step, step, step, step, Reply("不该到这里"), stream=stream)
    assert result.stop is StopReason.MODEL_ERROR and len(env.server.requests) == 1 and env.delays == []
    assert result.usage.total_tokens == 0 and result.usage.requests == 1
    assert (f"HTTP {status}" in result.text) if status else "无法读取" in result.text


async def test_an_unknown_error_body_sent_with_http_200_is_retried_uncharged(env: Env) -> None:
    result = await env.run(Raw(body={"error": {"message": "upstream busy"}}), Reply("好了"))
    assert result.stop is StopReason.COMPLETED and result.text == "好了" and len(env.server.requests) == 2
    assert result.usage.requests == 2 and result.usage.estimated == 0  # the failed try charged nothing


@pytest.mark.parametrize("indexed", [True, False])
async def test_two_streamed_calls_sharing_one_id_both_run(env: Env, indexed: bool) -> None:
    # DeepSeek/GLM/Kimi relays reuse ids; Ollama-style streams put every call at index 0 or omit the index.
    first = tool_delta(0 if indexed else None, id="call_0", name="weather", arguments='{"city": "北京"}')
    second = tool_delta(0 if indexed else None, id="call_0", name="ping", arguments="{}")
    third = tool_delta(0 if indexed else None, id="call_0", name="ping", arguments="{}")
    result = await env.run(Raw([chunk(first), chunk(second), chunk(third), chunk(None, "tool_calls")]), Reply("好了"))
    assert result.stop is StopReason.COMPLETED and result.text == "好了"
    assert sorted(env.ran, key=str) == [("ping", None), ("ping", None), ("weather", "北京")]
    assert len({m["tool_call_id"] for m in tool_messages(env)}) == 3


CALL_TEXT = '<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("content", [CALL_TEXT, "<think>查天气。</think>\n" + CALL_TEXT + "\n" + CALL_TEXT.replace(
    "weather", "ping").replace('{"city": "北京"}', "{}")], ids=["one", "after-thinking-two"])
async def test_tool_calls_written_as_text_are_run_not_posted(env: Env, stream: bool, content: str) -> None:
    # vLLM without a tool parser, Hermes-format models: the call comes in `content`.
    shown, show = _shown_run(env)
    result = await env.run(_split(content, stream), Reply("北京晴"), stream=stream, on_text=show)
    assert result.stop is StopReason.COMPLETED and result.text == "北京晴"
    assert ("weather", "北京") in env.ran and "".join(shown) == "北京晴"
    assert all("tool_call" not in str(m.get("content")) for m in env.server.last_request.messages)


async def test_a_tool_call_written_as_text_is_validated_like_any(env: Env) -> None:
    bad = '<tool_call>{"name": "weather", "arguments": {"town": "北京"}}</tool_call>'
    result = await env.run(_split(bad, True), _split("<tool_call>{not json}</tool_call>", True), Reply("不查了"))
    assert result.stop is StopReason.COMPLETED and result.text == "不查了" and env.ran == []
    told = [m["content"] for r in env.server.requests[1:] for m in r.messages if m["role"] == "tool"]
    assert len(told) == 3 and "town" in told[0]


@pytest.mark.parametrize("stream", [True, False])
async def test_text_that_only_mentions_a_tool_call_is_shown_as_text(env: Env, stream: bool) -> None:
    text = CALL_TEXT + "\n这就是 Hermes 格式的工具调用。"
    shown, show = _shown_run(env)
    result = await env.run(_split(text, stream), stream=stream, on_text=show)
    assert result.stop is StopReason.COMPLETED and result.text == text and "".join(shown) == text
    assert env.ran == []


def _surrogate_call(name: str, call_id: str, stream: bool) -> Step:
    """A call whose name or id holds a lone surrogate, as a relay that cuts UTF-16 sends it (JSON escapes)."""
    call = {"index": 0, "id": "ID", "type": "function", "function": {"name": "NAME", "arguments": "{}"}}
    if stream:
        message: dict[str, Any] = chunk({"tool_calls": [call]}, "tool_calls")
    else:
        message = _body({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")
    text = json.dumps(message).replace('"ID"', f'"{call_id}"').replace('"NAME"', f'"{name}"')
    return Raw([text]) if stream else Raw(body=text)


@pytest.mark.parametrize(("name", "call_id", "stream"), [
    ("ping\\ud83d", "call_1", True), ("ping\\ud83d", "call_1", False), ("ping", "call_\\udc00", False),
    ("ping", "call_\\udc00", True)])
async def test_a_lone_surrogate_in_a_tool_name_or_id_is_told_to_the_model(
        env: Env, name: str, call_id: str, stream: bool) -> None:
    result = await env.run(_surrogate_call(name, call_id, stream), Reply("好了"), stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "好了" and len(env.server.requests) == 2
    assert len(tool_messages(env)) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_a_lone_surrogate_escaped_in_a_call_written_as_text_is_told_to_the_model(env: Env, stream: bool) -> None:
    content = '<tool_call>{"name": "ping\\ud83d", "arguments": {"x": "\\udc00"}}</tool_call>'
    result = await env.run(_split(content, stream), Reply("好了"), stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "好了" and len(env.server.requests) == 2
