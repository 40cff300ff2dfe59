"""The retry policy against real HTTP faults: which are retried, how long to wait, one budget per run."""

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from function_calls import OpenAIChatModel, RetryPolicy, Runner, RunResult, StopReason, Toolset, tool_function
from function_calls.testing import Call, Delay, Disconnect, FakeOpenAIServer, Fault, Reply
from function_calls.testing.server import Step

SECRET = "sk-live-DO-NOT-LOG"
USER = [{"role": "user", "content": "hi"}]


async def look() -> str:
    """Look something up."""
    return "found it"


TOOLS = Toolset("s", [tool_function(look)])


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as srv:
        yield srv


async def run(server: FakeOpenAIServer, *steps: Step, policy: RetryPolicy | None = None, stream: bool = False,
              on_text: Any = None, timeout_s: float = 5.0) -> tuple[RunResult, list[float], list[dict[str, Any]]]:
    """Run once against ``steps``; returns the result, the recorded back-off delays and the events."""
    server.script(*steps)
    delays: list[float] = []
    events: list[dict[str, Any]] = []

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)

    async def on_event(event: dict[str, Any]) -> None:
        events.append(event)

    model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key=SECRET, stream=stream,
                            timeout_s=timeout_s)
    runner = Runner(model, retry=policy or RetryPolicy(), sleep=fake_sleep)
    try:
        result = await runner.run(USER, TOOLS, on_text=on_text, on_event=on_event)
    finally:
        await model.aclose()
    return result, delays, events


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_transient_statuses_are_retried(server: FakeOpenAIServer, status: int, stream: bool) -> None:
    result, delays, events = await run(server, Fault(status), Reply("recovered"), stream=stream)
    assert result.stop is StopReason.COMPLETED and result.text == "recovered"
    assert len(server.requests) == 2 and len(delays) == 1
    assert [e["type"] for e in events] == ["retry"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "fault",
    [Fault(400), Fault(401), Fault(403), Fault(404), Fault(422), Fault(429, code="insufficient_quota")],
    ids=["400", "401", "403", "404", "422", "429-quota"],
)
async def test_permanent_failures_are_not_retried(server: FakeOpenAIServer, fault: Fault, stream: bool) -> None:
    result, delays, _ = await run(server, fault, Reply("should not be reached"), stream=stream)
    assert result.stop is StopReason.MODEL_ERROR
    assert len(server.requests) == 1 and delays == []
    assert result.replies and "AI 服务暂时不可用" in result.replies[0]
    assert str(fault.status) in result.replies[0]
    assert result.replies[0] == f"AI 服务暂时不可用（接口返回 HTTP {fault.status}），请稍后再试。"  # no English
    assert SECRET not in result.model_dump_json()


async def test_dropped_connections_and_timeouts_are_retried(server: FakeOpenAIServer) -> None:
    result, delays, _ = await run(server, Disconnect(), Delay(3), Reply("third time lucky"), timeout_s=0.2)
    assert result.stop is StopReason.COMPLETED and result.text == "third time lucky"
    assert len(server.requests) == 3 and len(delays) == 2


@pytest.mark.parametrize(
    ("fault", "policy", "expected"),
    [
        (Fault(429, retry_after=2), RetryPolicy(), 2.0),
        (Fault(503, retry_after_ms=1500), RetryPolicy(), 1.5),
        (Fault(429, retry_after=25), RetryPolicy(), 25.0),
        (Fault(429, retry_after=4), RetryPolicy(max_retry_after_s=5), 4.0),
        (Fault(429, retry_after=2, retry_after_ms=700), RetryPolicy(), 0.7),
    ],
    ids=["retry-after", "retry-after-ms", "within-patience", "custom-cap", "ms-wins"],
)
async def test_retry_after_is_honoured_up_to_the_cap(
    server: FakeOpenAIServer, fault: Fault, policy: RetryPolicy, expected: float
) -> None:
    result, delays, _ = await run(server, fault, Reply("ok"), policy=policy)
    assert result.stop is StopReason.COMPLETED
    assert delays == [expected]


async def test_exponential_backoff_with_jitter_otherwise(server: FakeOpenAIServer) -> None:
    result, delays, _ = await run(server, Fault(500), Fault(502), Fault(503), Reply("ok"))
    assert result.stop is StopReason.COMPLETED
    assert len(delays) == 3
    for attempt, delay in enumerate(delays, start=1):
        ceiling = 0.5 * 2 ** (attempt - 1)
        assert ceiling / 2 <= delay <= ceiling


def test_backoff_is_jittered_and_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=4.0)
    rng = random.Random(7)
    samples = {policy.delay(1, None, rng) for _ in range(20)}
    assert len(samples) > 1 and all(0.5 <= s <= 1.0 for s in samples)
    assert all(2.0 <= policy.delay(10, None, rng) <= 4.0 for _ in range(20))
    assert policy.delay(1, 0.0) == 0.0


async def test_one_retry_budget_for_the_whole_run(server: FakeOpenAIServer) -> None:
    steps: list[Step] = [Fault(500), Reply(tool_calls=[Call("look")]), Fault(500), Fault(500), Reply("budget left?")]
    result, delays, _ = await run(server, *steps, policy=RetryPolicy(max_retries=2))
    assert result.stop is StopReason.MODEL_ERROR
    assert len(server.requests) == 4  # 1 retry in turn one + 1 in turn two, then the budget is gone
    assert len(delays) == 2 and result.state.api_retries == 2
    assert server.pending_steps == 1


async def test_a_stream_that_already_showed_text_is_not_replayed(server: FakeOpenAIServer) -> None:
    shown: list[str] = []

    async def on_text(delta: str) -> None:
        shown.append(delta)

    broken = Reply("first part of a long answer", chunk_size=4, break_after=3)
    result, delays, _ = await run(server, broken, Reply("replayed"), stream=True, on_text=on_text)
    assert result.stop is StopReason.MODEL_ERROR
    assert len(server.requests) == 1 and delays == []
    assert "".join(shown) == "first pa"  # the role chunk counts towards break_after


async def test_a_broken_stream_nobody_saw_is_retried(server: FakeOpenAIServer) -> None:
    broken = Reply("first part of a long answer", chunk_size=4, break_after=3)
    result, delays, _ = await run(server, broken, Reply("whole answer"), stream=True)
    assert result.stop is StopReason.COMPLETED and result.text == "whole answer"
    assert len(server.requests) == 2 and len(delays) == 1


class Left:
    """A budget hook with ``left`` tokens today, recording what it is charged."""

    def __init__(self, left: int) -> None:
        self.left, self.charged = left, 0

    async def remaining(self, caller: Any) -> int | None:
        return self.left

    async def charge(self, caller: Any, usage: Any) -> None:
        self.charged += usage.total_tokens


@pytest.mark.parametrize(("left", "attempts"), [(1_570, 1), (4_000, 3)])
async def test_a_retry_never_spends_past_what_is_left(server: FakeOpenAIServer, left: int, attempts: int) -> None:
    """Each attempt streams 1,500 tokens, then the connection drops (the provider billed them). A retry is made
    only while the run has room for its prompt, and may write only what is left: 4 attempts of 2,700 tokens
    each were charged 11,808 against 3,000 left."""
    server.script(*[Reply("想" * 1500, chunk_size=100, break_after=16) for _ in range(4)])
    model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key=SECRET)
    budget = Left(left)

    async def no_wait(seconds: float) -> None:
        pass

    result = await Runner(model, budget=budget, sleep=no_wait).run(USER, TOOLS)
    await model.aclose()
    assert len(server.requests) == attempts
    caps = [r.body["max_tokens"] for r in server.requests]
    assert caps == sorted(caps, reverse=True) and len(set(caps)) == len(caps)  # each retry may write less
    # One streamed chunk past it at most, and half the last cap sent (the provider keeps to that one by its own
    # count, which the estimate may pass: a provider that ignores it is left that much later)
    assert budget.charged == result.usage.total_tokens <= left + caps[-1] // 2 + 100
