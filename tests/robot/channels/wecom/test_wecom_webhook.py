"""The WeCom group-robot webhook: payloads, errors and the sliding-window limiter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import SecretStr

from robot.channels.base import ChannelUnavailable, SendFailed, SendRejected
from robot.channels.wecom import WeComSettings, WeComWebhook, WeComWebhookChannel
from robot.channels.wecom.testing import FakeWeComAPI
from robot.channels.wecom.webhook import SlidingWindowLimiter
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.store import Database


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
        with pytest.raises(ChannelUnavailable) as limited:
            await right.send_text("x")
        # A per-minute limit: a flood wait (uncapped), not one of this message's bounded retries.
        assert not isinstance(limited.value, SendFailed) and limited.value.retry_after_s == 60
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


async def test_a_rate_limited_message_waits_a_minute_and_is_not_lost(fake: FakeWeComAPI, tmp_path: Path) -> None:
    """45009 after a restart (the old process used the minute's 20 sends): the row waits, never 'failed'."""
    fake.fail_webhooks.extend([45009] * 3)
    channel = WeComWebhookChannel(WeComWebhook("hook-key", api_base=fake.base_url))
    db = Database(tmp_path / "out.sqlite3")
    outbox = Outbox(db, bot_name="qunbot", retry_base_s=0.01, retry_max_s=0.01, max_attempts=2)
    HistoryStore(db)
    await db.open()
    outbox.register(channel)
    await channel.start()
    await outbox.start()
    try:
        group = ChatRef(platform="wecom-webhook", chat_id="webhook", kind="group")
        await outbox.enqueue(OutgoingMessage(key="digest", chat=group, text="今日群聊摘要"))
        for _ in range(200):
            row = next(r for r in await outbox.rows() if r["key"] == "digest")
            if row["status"] != "pending" or row["error"]:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # a capped retry (0.01 s backoff) would have used its attempts by now
        row = next(r for r in await outbox.rows() if r["key"] == "digest")
        assert row["status"] == "pending" and "45009" in str(row["error"])
        wait = datetime.fromisoformat(str(row["next_at"])) - datetime.fromisoformat(str(row["created_at"]))
        assert wait.total_seconds() >= 55
        assert len(fake.calls_to("/cgi-bin/webhook/send")) == 1
    finally:
        await outbox.stop(flush_timeout_s=0.1)
        await db.close()
        await channel.stop()
