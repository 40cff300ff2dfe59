"""The WeCom group-robot webhook: payloads, errors and the sliding-window limiter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from robot.channels.base import ChannelUnavailable, SendRejected
from robot.channels.wecom import WeComSettings, WeComWebhook, WeComWebhookChannel
from robot.channels.wecom.testing import FakeWeComAPI
from robot.channels.wecom.webhook import SlidingWindowLimiter
from robot.message import ChatRef, OutgoingMessage


@pytest.fixture
async def fake() -> AsyncIterator[FakeWeComAPI]:
    async with FakeWeComAPI(webhook_key="hook-key") as api:
        yield api


@pytest.fixture
async def hook(fake: FakeWeComAPI) -> AsyncIterator[WeComWebhook]:
    client = WeComWebhook("hook-key", api_base=fake.base_url)
    yield client
    await client.close()


async def test_text_with_mentions_and_markdown(hook: WeComWebhook, fake: FakeWeComAPI) -> None:
    await hook.send_text("hello", mentioned_list=["alice", "@all"])
    await hook.send_markdown("**bold**")
    calls = fake.calls_to("/cgi-bin/webhook/send")
    assert [c.query["key"] for c in calls] == ["hook-key", "hook-key"]
    assert [c.body for c in calls] == [
        {"msgtype": "text", "text": {"content": "hello", "mentioned_list": ["alice", "@all"]}},
        {"msgtype": "markdown", "markdown": {"content": "**bold**"}},
    ]
    assert "hook-key" not in repr(hook)


async def test_errors_are_clear_and_hide_the_key(fake: FakeWeComAPI) -> None:
    wrong = WeComWebhook("wrong-key", api_base=fake.base_url)
    try:
        with pytest.raises(SendRejected, match="93000") as info:
            await wrong.send_text("x")
        assert "wrong-key" not in str(info.value)
    finally:
        await wrong.close()
    right = WeComWebhook("hook-key", api_base=fake.base_url)
    try:
        fake.fail_webhooks.append(45009)  # WeCom's own rate limit: retry later
        with pytest.raises(ChannelUnavailable):
            await right.send_text("x")
    finally:
        await right.close()


async def test_third_message_waits_instead_of_being_dropped(fake: FakeWeComAPI) -> None:
    hook = WeComWebhook("hook-key", api_base=fake.base_url, limit=2, window=0.2)
    try:
        await asyncio.gather(*(hook.send_text(f"m{i}") for i in range(4)))
    finally:
        await hook.close()
    sent = [c.body["text"]["content"] for c in fake.calls_to("/cgi-bin/webhook/send") if c.body]
    assert sent == ["m0", "m1", "m2", "m3"]


async def test_limiter_sleeps_until_the_window_frees() -> None:
    now = [100.0]
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        now[0] += delay

    limiter = SlidingWindowLimiter(2, 60.0, clock=lambda: now[0], sleep=fake_sleep)
    await limiter.acquire()
    now[0] += 10
    await limiter.acquire()
    assert sleeps == []
    await limiter.acquire()  # must wait until the first stamp (t=100) leaves the window
    assert sleeps == [pytest.approx(50.0)]
    assert now[0] == pytest.approx(160.0)
    with pytest.raises(ValueError):
        SlidingWindowLimiter(0, 1.0)


async def test_webhook_channel_sends_to_its_group_only(fake: FakeWeComAPI) -> None:
    settings = WeComSettings(webhook_key=SecretStr("hook-key"), api_base=fake.base_url)
    channel = WeComWebhookChannel.from_settings(settings, chat_id="ops")
    await channel.start()
    try:
        group = ChatRef(platform="wecom-webhook", chat_id="ops", kind="group")
        await channel.send(OutgoingMessage(key="k", chat=group, text="deploy done", mention=("bob",)))
        body = fake.calls_to("/cgi-bin/webhook/send")[0].body
        assert body == {"msgtype": "text", "text": {"content": "deploy done", "mentioned_list": ["bob"]}}
        with pytest.raises(SendRejected):
            await channel.send(
                OutgoingMessage(key="k2", chat=group.model_copy(update={"chat_id": "other"}), text="x")
            )
        assert channel.platform == "wecom-webhook"
    finally:
        await channel.stop()
    with pytest.raises(ValueError):
        WeComWebhookChannel.from_settings(WeComSettings())
