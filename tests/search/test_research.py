"""Deep research in background mode: the fake follows the SDK, the bot polls and delivers, across a restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from perplexity import AsyncPerplexity

import search
from robot import iso
from robot.bot import Bot
from robot.config import Settings
from robot.message import OutgoingMessage
from robot.testing import MemoryChannel
from search.client import PerplexityClient
from search.settings import SearchSettings
from search.testing import FakePerplexityServer

KEY = "pplx-research-key"
REPORT = "固态电池 2026 年进入小批量装车阶段[1]，成本仍是主要障碍[2]。"
SOURCES = [("电池日报", "https://battery.example/2026"), ("行业报告", "https://report.example/ssb")]


@pytest.fixture
async def server() -> AsyncIterator[FakePerplexityServer]:
    async with FakePerplexityServer(api_key=KEY) as fake:
        fake.answer(REPORT, SOURCES)
        yield fake


def settings_for(server: FakePerplexityServer, **extra: Any) -> dict[str, Any]:
    return {"api_key": KEY, "base_url": server.base_url, "research_per_user_day": 2, "research_poll_s": 0.05,
            **extra}


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``[storage]`` settings of each engine (the daily limit is counted in the database)."""
    return {} if request.param == "sqlite" else {"url": request.getfixturevalue("pg_url")}


def make_bot(tmp_path: Path, cfg: dict[str, Any], storage: dict[str, Any] | None = None) -> tuple[Bot, MemoryChannel]:
    settings = Settings(bot={"data_dir": tmp_path}, search=cfg, limits={"user_burst": 50, "chat_burst": 50},
                        storage=storage or {})
    channel = MemoryChannel()
    return Bot(settings, channels=[channel], plugins=[search.plugin]), channel


async def ask(ch: MemoryChannel, line: str, user: str = "u1") -> OutgoingMessage:
    before = len(ch.sent)
    await ch.inject(line, user=user, at_bot=True, message_id=uuid.uuid4().hex)
    return (await ch.wait_sent(before + 1))[before]


async def test_the_fake_answers_the_official_sdk_as_documented(server: FakePerplexityServer) -> None:
    sdk = AsyncPerplexity(api_key=KEY, base_url=server.base_url, max_retries=0)
    request = {"model": "sonar-deep-research", "messages": [{"role": "user", "content": "固态电池"}]}
    created = await sdk.async_.chat.completions.create(request=request, idempotency_key="k1")
    assert created.status == "CREATED" and created.response is None
    again = await sdk.async_.chat.completions.create(request=request, idempotency_key="k1")
    assert again.id == created.id  # the same key does not start a second run
    states = [(await sdk.async_.chat.completions.get(created.id)).status for _ in range(3)]
    assert states == ["IN_PROGRESS", "IN_PROGRESS", "COMPLETED"]
    done = await sdk.async_.chat.completions.get(created.id)
    assert done.response is not None and done.response.citations == [url for _, url in SOURCES]
    await sdk.close()


async def test_the_fake_refuses_what_the_sdk_and_docs_rule_out(server: FakePerplexityServer) -> None:
    client = PerplexityClient(SearchSettings(api_key=KEY, base_url=server.base_url))
    sdk = client._sdk
    assert sdk is not None
    for body, status in (({"request": {"model": "sonar-deep-research", "messages": []}, "preset": "x"}, 400),
                         ({"request": {"model": "sonar-ultra", "messages": [{"role": "user", "content": "q"}]}}, 400),
                         ({"request": "固态电池"}, 422)):
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk.post("async/chat/completions", cast_to=object, body=body)
        assert refused.value.status_code == status, body
    await client.aclose()


async def test_research_runs_in_the_background_and_the_report_arrives_once(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    try:
        started = await ask(ch, "/research 固态电池的商业化进展")
        assert started.text.startswith("🔎 深度研究已开始")
        report = (await ch.wait_sent(2))[1]
        assert report.text.startswith("🔎 深度研究「固态电池的商业化进展」完成") and "小批量装车" in report.text
        assert "https://battery.example/2026" in report.text and report.mention == ("u1",)
        submitted = [r for r in server.requests_to("research") if r.method == "POST"]
        assert len(submitted) == 1 and submitted[0].body["request"]["model"] == "sonar-deep-research"
        await asyncio.sleep(0.2)
        assert len(ch.sent) == 2  # polled on, delivered once
        await ask(ch, "/research 钠离子电池")
        limited = await ask(ch, "/research 第三个问题")
        assert "每天 2 次" in limited.text
    finally:
        await bot.stop()


async def test_a_submission_slower_than_the_polling_is_sent_once(tmp_path: Path, server: FakePerplexityServer) -> None:
    server.delay(0.6)  # the poller (every 0.05 s) sees the job stored as submitting a dozen times meanwhile
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    try:
        assert (await ask(ch, "/research 固态电池")).text.startswith("🔎 深度研究已开始")
        server.delay(0)
        assert "小批量装车" in (await ch.wait_sent(2))[1].text
    finally:
        await bot.stop()
    assert len([r for r in server.requests_to("research") if r.method == "POST"]) == 1


async def test_a_running_research_is_delivered_after_a_restart(tmp_path: Path, server: FakePerplexityServer) -> None:
    server.research.polls = 10**6  # still running while the first bot lives
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    try:
        assert (await ask(ch, "/research 固态电池")).text.startswith("🔎 深度研究已开始")
        await asyncio.sleep(0.2)
        assert len(ch.sent) == 1
    finally:
        await bot.stop()
    server.research.polls = 0
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    try:
        report = (await ch.wait_sent(1))[0]
    finally:
        await bot.stop()
    assert "小批量装车" in report.text and report.chat == ch.chat("g1")


async def test_a_failed_research_is_reported_and_deep_research_is_off_by_default(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    server.research.failure = "quota exceeded"
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    try:
        await ask(ch, "/research 固态电池")
        failed = (await ch.wait_sent(2))[1]
    finally:
        await bot.stop()
    assert "没能完成（quota exceeded）" in failed.text
    off, ch = make_bot(tmp_path / "off", settings_for(server, research_per_user_day=0))
    await off.start()
    try:
        assert "deep_research" not in off.offered_tools().names()
        assert "perplexity_search" in off.offered_tools().names()
        assert "深度研究未启用" in (await ask(ch, "/research 固态电池")).text
    finally:
        await off.stop()


async def test_a_job_stored_but_maybe_not_submitted_before_a_crash_is_submitted_once_after_restart(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    server.research.polls = 0
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    await bot.db.run(lambda db: db.execute(
        "INSERT INTO research_jobs (id, owner, chat, account, question, status, api_id, created_at, updated_at) "
        "VALUES ('job1', 'memory:u1', 'memory:group:g1', '', '钠电池', 'submitting', NULL, "
        "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')"))
    await bot.stop()
    # The crash came after Perplexity got the request: it knows the key already.
    sdk = AsyncPerplexity(api_key=KEY, base_url=server.base_url, max_retries=0)
    await sdk.async_.chat.completions.create(
        request={"model": "sonar-deep-research", "messages": [{"role": "user", "content": "钠电池"}]},
        idempotency_key="job1")
    await sdk.close()
    bot, ch = make_bot(tmp_path, settings_for(server, research_timeout_min=1440))
    await bot.start()
    try:
        report = (await ch.wait_sent(1))[0]
    finally:
        await bot.stop()
    assert "钠电池" in report.text and "完成" in report.text
    assert len(server.research.jobs) == 1  # the same run, not a second paid one


async def test_a_job_its_dead_process_was_submitting_a_moment_ago_is_submitted_at_once(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    # Stored a second ago by a process killed while submitting it: not left for two request
    # timeouts (65 s by default), as a living process's submission in flight is.
    server.research.polls = 0
    bot, ch = make_bot(tmp_path, settings_for(server))
    await bot.start()
    stamp = iso(bot.clock() - timedelta(seconds=1))
    try:
        await bot.db.run(lambda db: db.execute(
            "INSERT INTO research_jobs (id, owner, chat, account, question, status, api_id, created_at, updated_at, "
            "submitter) VALUES ('job2', 'memory:u1', 'memory:group:g1', '', '钠电池', 'submitting', NULL, ?, ?, "
            "'host:9:killed')", [stamp, stamp]))
        report = (await ch.wait_sent(1, timeout=10))[0]
    finally:
        await bot.stop()
    assert "钠电池" in report.text and "完成" in report.text
    assert len([r for r in server.requests_to("research") if r.method == "POST"]) == 1


async def test_forget_me_takes_the_persons_research_questions_and_their_report_never_comes(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    bot, ch = make_bot(tmp_path, settings_for(server, research_poll_s=600))  # polled by hand below
    await bot.start()
    try:
        assert (await ask(ch, "/research 我的体检报告怎么看")).text.startswith("🔎 深度研究已开始")
        await ask(ch, "/research 别人的问题", user="u2")
        assert "1 个深度研究" in (await ask(ch, "/forget me")).text
        left = await bot.db.run(lambda db: db.execute(
            "SELECT owner, question FROM research_jobs ORDER BY owner").fetchall())
        assert [tuple(r) for r in left] == [("memory:u1", ""), ("memory:u2", "别人的问题")]  # u1's only counts
        research = bot.deps_for(search.deep_research).research
        for _ in range(200):  # the fake reports after a few polls (once u2's submission is through)
            if await research.poll_once():
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        reports = [m.text for m in ch.sent if m.text.startswith("🔎 深度研究「")]
        assert len(reports) == 1 and "别人的问题" in reports[0]
    finally:
        await bot.stop()


async def test_forget_me_keeps_no_question_yet_the_daily_limit_still_holds(
        tmp_path: Path, server: FakePerplexityServer, storage: dict[str, Any]) -> None:
    bot, ch = make_bot(tmp_path, settings_for(server, research_per_user_day=1, research_poll_s=600), storage)
    await bot.start()
    try:
        assert (await ask(ch, "/research 我的体检报告怎么看")).text.startswith("🔎 深度研究已开始")
        assert "1 个深度研究" in (await ask(ch, "/forget me")).text
        refused = await ask(ch, "/research 再来一个")
        again = await ask(ch, "/forget me")
        kept = await bot.db.run(lambda db: db.execute(
            "SELECT owner, chat, account, question, api_id FROM research_jobs").fetchall())
        research = bot.deps_for(search.deep_research).research
        assert await research.poll_once() == 0  # its report never comes
        day_later = bot.clock() + timedelta(days=1, seconds=1)
        bot.clock = lambda: day_later
        await research.poll_once()
        left = await bot.db.run(lambda db: db.execute("SELECT count(*) FROM research_jobs").fetchone()[0])
    finally:
        await bot.stop()
    assert "每天 1 次" in refused.text and len(server.research.jobs) == 1
    assert [tuple(r) for r in kept] == [("memory:u1", "", "", "", None)]  # who, to count; not what, nor where
    assert "深度研究" not in again.text  # nothing of theirs was left to take
    assert left == 0  # kept only while it counts


async def test_a_research_perplexity_refused_to_start_does_not_use_up_the_day(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    bot, ch = make_bot(tmp_path, settings_for(server, research_per_user_day=1, timeout_s=0.3))
    await bot.start()
    try:
        server.next_status(429, retry_after=30)
        refused = await ask(ch, "/research 固态电池")
        server.delay(0.6)  # sent, then no answer in time: Perplexity may have started it, so it counts
        unclear = await ask(ch, "/research 固态电池")
        server.delay(0)
        limited = await ask(ch, "/research 固态电池")
        stored = await bot.db.run(lambda db: db.execute("SELECT status FROM research_jobs").fetchall())
    finally:
        await bot.stop()
    assert "没能开始" in refused.text and "30 s" in refused.text
    assert "没能开始" in unclear.text and "用完" not in unclear.text
    assert "每天 1 次" in limited.text
    assert [tuple(r) for r in stored] == [("failed",)]  # the refused one left nothing behind


async def test_a_refusal_of_the_retry_counts_the_run_the_first_attempt_may_have_started(
        tmp_path: Path, server: FakePerplexityServer) -> None:
    # A 502 (the run started all the same), then a 429 to the retry: the job was deleted as "refused",
    # and a second paid run could start the same day.
    bot, ch = make_bot(tmp_path, settings_for(server, research_per_user_day=1))
    await bot.start()
    try:
        server.next_status(502)
        server.next_status(429)
        first = await ask(ch, "/research 固态电池")
        again = await ask(ch, "/research 固态电池")
    finally:
        await bot.stop()
    assert "没能开始" in first.text and "每天 1 次" in again.text


async def test_a_moved_groups_research_follows_it_and_forget_me_there_reaches_it(tmp_path: Path) -> None:
    async with FakePerplexityServer(api_key=KEY) as server:
        server.answer(REPORT, SOURCES)
        bot, ch = make_bot(tmp_path, settings_for(server, research_poll_s=600))
        await bot.start()
        try:
            old, new = ch.chat("g1"), ch.chat("g9")
            before = len(ch.sent)
            await ch.inject("/research 我的体检报告怎么看", user="u1", chat=old, at_bot=True, message_id=uuid.uuid4().hex)
            assert (await ch.wait_sent(before + 1))[before].text.startswith("🔎 深度研究已开始")
            await bot.move_chat(old, new)
            before = len(ch.sent)
            await ch.inject("/forget me", user="u1", chat=new, at_bot=True, message_id=uuid.uuid4().hex)
            reply = (await ch.wait_sent(before + 1))[before].text
            left = await bot.db.run(lambda db: db.execute("SELECT chat, question FROM research_jobs").fetchall())
            research = bot.deps_for(search.deep_research).research
            assert await research.poll_once() == 0  # nothing left to report (it reported to the old id)
            await asyncio.sleep(0.1)
            reports = [m for m in ch.sent if m.text.startswith("🔎 深度研究「")]
            assert [tuple(r) for r in left] == [("", "")] and reports == [] and "1 个深度研究" in reply, reply
        finally:
            await bot.stop()
