"""Rate limits (token buckets per user and per chat) and daily LLM token budgets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from function_calls import Caller, Usage
from function_calls.testing import ScriptedModel, text
from robot.limits import DailyBudget, RateDecision, RateLimiter, TokenBucket
from robot.message import ChatRef
from robot.pipeline import RATE_NOTICE
from robot.store import Database

ALLOW, NOTICE, SILENT = RateDecision.ALLOW, RateDecision.NOTICE, RateDecision.SILENT
G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")


def test_token_bucket_bursts_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=0.5, burst=2)
    assert [bucket.take(0.0), bucket.take(0.0), bucket.take(0.0)] == [True, True, False]
    assert not bucket.take(1.0)  # half a token
    assert bucket.take(2.0)
    assert bucket.take(100.0) and bucket.take(100.0) and not bucket.take(100.0)  # never above burst


def test_a_flooding_member_gets_one_notice_then_silence_others_unaffected() -> None:
    now = [0.0]
    limiter = RateLimiter(user_per_minute=60, user_burst=2, chat_per_minute=6000, chat_burst=100,
                          monotonic=lambda: now[0])
    flood = [limiter.check("c", "u1") for _ in range(5)]
    assert flood == [ALLOW, ALLOW, NOTICE, SILENT, SILENT]
    assert limiter.check("c", "u2") is ALLOW
    now[0] += 1.0  # one token back
    assert limiter.check("c", "u1") is ALLOW
    assert [limiter.check("c", "u1") for _ in range(2)] == [NOTICE, SILENT]  # a new flood, a new notice


def test_silence_lasts_only_as_long_as_the_wait_the_person_was_told() -> None:
    now = [0.0]
    limiter = RateLimiter(user_per_minute=6, user_burst=1, chat_per_minute=6000, chat_burst=100,
                          monotonic=lambda: now[0])
    assert [limiter.check("c", "u1") for _ in range(3)] == [ALLOW, NOTICE, SILENT]
    assert limiter.wait_s("c", "u1") == 10.0
    now[0] = 10.0
    assert limiter.check("c", "u1") is ALLOW
    assert limiter.check("c", "u1") is NOTICE  # a new window: said again before going quiet
    now[0] = 19.0
    assert limiter.check("c", "u1") is SILENT
    now[0] = 20.5
    limiter.check("c", "u1")  # the token is back
    assert limiter.check("c", "u1") is NOTICE


def test_commands_have_their_own_generous_limit_and_model_work_is_charged_after() -> None:
    limiter = RateLimiter(user_per_minute=6, user_burst=2, chat_per_minute=6000, chat_burst=100,
                          command_per_minute=30, command_burst=20, monotonic=lambda: 0.0)
    assert [limiter.check("c", "u1") for _ in range(3)] == [ALLOW, ALLOW, NOTICE]
    commands = [limiter.check("c", "u1", command=True) for _ in range(22)]
    assert commands == [ALLOW] * 20 + [NOTICE, SILENT]
    limiter.charge("c", "u2")  # a command that called a model spends from the model buckets
    limiter.charge("c", "u2")
    assert limiter.check("c", "u2") is NOTICE


def test_commands_that_called_a_model_are_held_to_the_model_rate() -> None:
    """/deep_think, /summary, /plan are commands, charged to the model buckets after they ran: while
    those are in debt the person's next command waits too (ten went through a model burst of 2)."""
    clock = [0.0]
    limiter = RateLimiter(user_per_minute=6, user_burst=2, chat_per_minute=6000, chat_burst=100,
                          command_per_minute=30, command_burst=20, monotonic=lambda: clock[0])
    ran = 0
    for _ in range(10):
        if limiter.check("c", "u1", command=True) is ALLOW:
            ran += 1
            limiter.charge("c", "u1")  # it called a model
    assert ran == 3  # two tokens, then one into debt: no more until it is paid
    assert 0 < limiter.wait_s("c", "u1", command=True) <= 10
    clock[0] += 10.5  # 6 a minute: the debt of one is paid in 10 s
    assert limiter.check("c", "u1", command=True) is ALLOW


def test_a_refusal_by_the_chats_limit_costs_the_person_nothing() -> None:
    """The chat's bucket is empty: the member is refused, and their own bucket keeps its tokens
    (it was drained, and they were refused later for a chat that had long refilled)."""
    clock = [0.0]
    limiter = RateLimiter(user_per_minute=1, user_burst=1, chat_per_minute=60, chat_burst=1,
                          monotonic=lambda: clock[0])
    assert limiter.check("g", "u1") is ALLOW  # the chat's one token
    assert limiter.check("g", "u2") is NOTICE  # refused by the chat, not by u2's own bucket
    clock[0] += 1.5  # the chat refilled
    assert limiter.check("g", "u2") is ALLOW


async def test_a_newcomer_working_through_commands_is_not_silenced(make_bot: Any) -> None:
    _bot, ch = await make_bot(None, limits={})  # the default limits
    for _ in range(12):
        await ch.inject("/help")
    sent = await ch.wait_sent(12)
    assert all(m.text.startswith("可用命令") for m in sent)


async def test_the_console_and_playground_are_not_rate_limited_by_default(make_bot: Any) -> None:
    from robot.testing import MemoryChannel

    model = ScriptedModel(lambda req: text("answer"))
    _bot, ch = await make_bot(model, channel=MemoryChannel("console"), limits={})
    for i in range(10):
        await ch.inject(f"question {i}", chat=ch.chat("me", "private"))
    assert [m.text for m in await ch.wait_sent(10)] == ["answer"] * 10


async def test_other_channels_get_a_notice_naming_the_wait(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    _bot, ch = await make_bot(model, limits={})
    for i in range(6):
        await ch.inject(f"question {i}", at_bot=True)
    sent = [m.text for m in await ch.wait_sent(5)]
    assert sent[:4] == ["answer"] * 4
    assert sent[4] in {RATE_NOTICE.format(seconds=s) for s in range(1, 11)}  # 10 s a message, minus time spent


def test_a_busy_chat_is_limited_without_touching_other_chats() -> None:
    limiter = RateLimiter(user_per_minute=600, user_burst=100, chat_per_minute=1, chat_burst=3,
                          monotonic=lambda: 0.0)
    got = [limiter.check("busy", f"u{i}") for i in range(60)]
    # One notice for the chat, then silence: a raid of 60 members got one notice each
    assert got == [ALLOW, ALLOW, ALLOW, NOTICE, *[SILENT] * 56]
    assert limiter.check("busy", "u3") is SILENT
    assert limiter.check("quiet", "u3") is ALLOW


def test_a_raided_group_gets_a_few_notices_not_one_every_refill() -> None:
    """The default limits, 60 members each @-ing the bot once a second for two minutes: the chat's
    answers are what its bucket allows, and the notices a handful (106 before: one every 2 s)."""
    clock = [1000.0]
    limiter = RateLimiter(user_per_minute=6, user_burst=4, chat_per_minute=30, chat_burst=10,
                          monotonic=lambda: clock[0])
    got: list[tuple[str, RateDecision]] = []
    for _ in range(120):
        got += [(f"u{u}", limiter.check("raid", f"u{u}")) for u in range(60)]
        clock[0] += 1.0
    notices = [who for who, decision in got if decision is NOTICE]
    assert sum(decision is ALLOW for _, decision in got) == 10 + 119 // 2  # its burst, then one every 2 s
    assert len(notices) <= 3 + 3 * 2  # the chat's notice bucket: 3, then 3 a minute
    assert limiter.check("quiet", "u1") is ALLOW  # another chat is untouched


def test_after_a_chat_wide_notice_the_chat_stays_quiet_for_a_minute() -> None:
    clock = [0.0]
    limiter = RateLimiter(user_per_minute=600, user_burst=100, chat_per_minute=60, chat_burst=2,
                          monotonic=lambda: clock[0])
    assert [limiter.check("g", f"u{i}") for i in range(4)] == [ALLOW, ALLOW, NOTICE, SILENT]
    clock[0] = 30.0  # refilled; a new burst is refused again, within the minute: no second notice
    assert [limiter.check("g", f"u{i}") for i in range(4)] == [ALLOW, ALLOW, SILENT, SILENT]
    assert limiter.refused_by_chat("g", "u3")  # what the notice would be about: the whole group
    clock[0] = 61.0
    assert [limiter.check("g", f"u{i}") for i in range(4)] == [ALLOW, ALLOW, NOTICE, SILENT]
    assert not limiter.refused_by_chat("quiet", "u1")


def test_personal_notices_in_one_chat_are_capped_by_the_chats_notice_bucket() -> None:
    limiter = RateLimiter(user_per_minute=1, user_burst=1, chat_per_minute=6000, chat_burst=1000,
                          monotonic=lambda: 0.0)
    got = [limiter.check("g", f"u{i}") for i in range(20) for _ in range(2)]
    assert got.count(ALLOW) == 20 and got.count(NOTICE) == 3  # 20 flooders, 3 of them told
    assert limiter.check("other", "u5") is NOTICE  # u5 was not told in g; another chat's notices are its own


async def test_a_flood_in_a_bot_gets_one_notice_and_only_the_flooder_is_slowed(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 2, "user_per_minute": 0.01, "chat_burst": 100})
    for i in range(6):
        await ch.inject(f"spam {i}", at_bot=True, user="flooder")
    await ch.inject("a fair question", at_bot=True, user="calm")
    await ch.inject("/help", user="flooder")  # a command that calls no model has its own limit
    await ch.wait_sent(5)
    await bot.outbox.flush()
    by_user = [(m.mention, m.text) for m in ch.sent]
    assert by_user.count((("flooder",), "answer")) == 2
    assert by_user.count((("flooder",), RATE_NOTICE.format(seconds=6000))) == 1
    assert (("calm",), "answer") in by_user
    assert any(who == ("flooder",) and said.startswith("可用命令") for who, said in by_user)
    assert len(ch.sent) == 5 and len(model.requests) == 3
    assert len(await bot.history.recent(G1)) == 8 + 5  # everything is still recorded


async def test_a_chat_over_its_own_limit_is_told_as_a_whole(make_bot: Any) -> None:
    """The chat's limit refused a member: the notice spoke to that one ("你发得有点快") though it meant everyone."""
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 100, "chat_burst": 2, "chat_per_minute": 0.01})
    for i in range(4):
        await ch.inject(f"question {i}", at_bot=True, user=f"u{i}")
    await ch.wait_sent(3)
    await bot.outbox.flush()
    texts = [m.text for m in ch.sent]
    assert texts[:2] == ["answer", "answer"] and len(texts) == 3
    assert texts[2].startswith("群里找我的消息有点多，请大家") and "你发得有点快" not in texts[2]


# --- daily budgets -----------------------------------------------------------------------------

def caller(user: str = "u1", chat: str = "g1") -> Caller:
    return Caller(platform="memory", user_id=user, chat_id=chat, chat_kind="group")


async def test_daily_budget_counts_per_user_and_chat_and_resets_at_local_midnight(tmp_path: Path) -> None:
    db = Database(tmp_path / "b.sqlite3")
    moment = [datetime(2026, 3, 1, 15, 59, tzinfo=UTC)]  # 23:59 in Shanghai
    budget = DailyBudget(db, ZoneInfo("Asia/Shanghai"), user_tokens=100, chat_tokens=150,
                         clock=lambda: moment[0])
    await db.open()
    assert await budget.remaining(caller()) == 100
    await budget.charge(caller(), Usage(prompt_tokens=60, completion_tokens=10, requests=1))
    assert await budget.remaining(caller()) == 30
    assert await budget.remaining(caller("u2")) == 80  # the chat's budget is the tighter one now
    assert await budget.remaining(caller("u2", chat="g2")) == 100
    await budget.charge(caller("u2"), Usage(prompt_tokens=500))
    assert await budget.remaining(caller("u3")) == 0  # never negative
    moment[0] += timedelta(minutes=1)  # a new day in the bot's zone (still March 1st in UTC)
    assert await budget.remaining(caller()) == 100
    await db.close()


async def test_no_budgets_configured_means_no_limit(tmp_path: Path) -> None:
    db = Database(tmp_path / "b.sqlite3")
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=None, chat_tokens=None)
    await db.open()
    await budget.charge(caller(), Usage(prompt_tokens=10**9))
    assert await budget.remaining(caller()) is None
    await db.close()


async def test_runs_are_charged_to_the_daily_budget(make_bot: Any) -> None:
    bot, ch = await make_bot(ScriptedModel(lambda req: text("answer")))
    await ch.inject("hello", at_bot=True)
    await ch.wait_sent(1)
    assert await bot.budget.used("user:memory:u1") > 0
    assert await bot.budget.used("chat:memory:group:g1") == await bot.budget.used("user:memory:u1")


async def test_a_user_over_budget_gets_the_daily_budget_reply_without_a_model_call(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 100, "chat_burst": 100, "user_daily_tokens": 5000})
    await bot.budget.charge(caller("u1"), Usage(prompt_tokens=5000))
    await ch.inject("one more?", at_bot=True, user="u1")
    await ch.inject("me too", at_bot=True, user="u2")
    over, fine = await ch.wait_sent(2)
    assert "今天的 AI 用量已达上限" in over.text and over.mention == ("u1",)
    assert fine.text == "answer"
    assert len(model.requests) == 1 and model.requests[0].messages[-1]["content"] == "me too"


async def test_a_chat_over_budget_is_refused_for_everyone_in_it_only(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 100, "chat_burst": 100, "chat_daily_tokens": 5000})
    await bot.budget.charge(caller("u1"), Usage(prompt_tokens=5000))
    await ch.inject("in the spent chat", at_bot=True, user="u2")
    await ch.inject("in another chat", at_bot=True, user="u2", chat=G2)
    spent, other = await ch.wait_sent(2)
    assert "今天的 AI 用量已达上限" in spent.text and other.text == "answer"
    assert [r.messages[-1]["content"] for r in model.requests] == ["in another chat"]


async def test_a_nearly_spent_budget_buys_no_model_call(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 100, "chat_burst": 100, "user_daily_tokens": 5000})
    await bot.budget.charge(caller("u1"), Usage(prompt_tokens=4990))  # 10 tokens left: no prompt fits
    await ch.inject("one more?", at_bot=True, user="u1")
    (sent,) = await ch.wait_sent(1)
    assert "今天的 AI 用量已达上限" in sent.text
    assert model.requests == []
    assert await bot.budget.used("user:memory:u1") <= 5000


def test_idle_rate_buckets_are_forgotten_so_memory_stays_bounded() -> None:
    from robot.limits import RateDecision, RateLimiter

    clock = [0.0]
    limiter = RateLimiter(60, 1, 600, 10, monotonic=lambda: clock[0], max_tracked=100)
    for n in range(1000):
        assert limiter.check(f"chat{n % 7}", f"user{n}") is RateDecision.ALLOW
        clock[0] += 1.0  # each user's bucket refills within a second
    assert len(limiter._users) + len(limiter._chats) <= 110
    assert limiter.check("chat0", "user999") is RateDecision.ALLOW


def test_many_active_buckets_are_not_all_scanned_on_every_check() -> None:
    """More than ``max_tracked`` buckets, none refilled yet (all active in the last seconds): a check
    scanned all of them each time, freeing nothing; pruning is amortised, memory stays bounded."""
    clock = [5000.0]
    limiter = RateLimiter(6, 4, 30, 10, monotonic=lambda: clock[0], max_tracked=1000)
    scanned = [0]
    prune = limiter._prune

    def counted(now: float) -> None:
        scanned[0] += len(limiter._users) + len(limiter._chats) + len(limiter._commands)
        prune(now)

    limiter._prune = counted  # type: ignore[method-assign]
    for i in range(1500):
        limiter.check(f"p{i}", f"u{i}")
    scanned[0] = 0
    for j in range(1000):
        limiter.check(f"g{j % 50}", f"x{j}")
    assert scanned[0] <= 2 * 5000  # it was 1000 scans of 3000+ buckets
    tracked = lambda: len(limiter._users) + len(limiter._chats) + len(limiter._commands)  # noqa: E731
    # Every bucket that spent a token is kept (forgetting it would lift its limit)
    assert all(f"u{i}" in limiter._users and f"p{i}" in limiter._chats for i in range(1500))
    assert all(f"g{j}" in limiter._chats for j in range(50))
    clock[0] += 3600.0  # all idle and refilled: the next prune frees them
    for j in range(5000):
        limiter.check(f"late{j}", f"late{j}")
        if tracked() < 1000:
            break
    assert tracked() < 1000


def test_a_drained_bucket_outlives_pruning_so_its_flood_stays_refused() -> None:
    clock = [0.0]
    limiter = RateLimiter(1, 1, 6000, 1000, monotonic=lambda: clock[0], max_tracked=10)
    assert [limiter.check("g", "flooder") for _ in range(2)] == [ALLOW, NOTICE]
    for i in range(200):  # many others come and go, each refilled within a second
        clock[0] += 0.2
        limiter.check(f"c{i}", f"u{i}", command=True)
        assert limiter.check("g", "flooder") is SILENT


# --- reservations -------------------------------------------------------------------------------

async def test_concurrent_spends_see_each_others_holds_and_settle_to_what_was_spent(tmp_path: Path) -> None:


    from robot.limits import BudgetExceeded

    db = Database(tmp_path / "b.sqlite3")
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=1000, chat_tokens=None)
    await db.open()
    who = caller("u1")
    release = asyncio.Event()
    admitted: list[int] = []

    async def spend(n: int) -> None:
        try:
            async with budget.reserve(who, 400) as hold:
                admitted.append(n)
                await release.wait()
                hold.spend(300)
        except BudgetExceeded as exc:
            assert exc.left < 400 and "用量已达上限" in exc.user_message

    tasks = [asyncio.create_task(spend(n)) for n in range(5)]
    await asyncio.sleep(0.05)
    assert len(admitted) == 2  # 2 x 400 held; a third would not fit in 1000
    release.set()
    await asyncio.gather(*tasks)
    assert await budget.used("user:memory:u1") == 600  # what was spent, recorded on exit
    assert await budget.remaining(who) == 400
    async with budget.reserve(who, 5000, at_least=100) as hold:  # "what is left, if at least 100"
        assert hold.held == 400
        assert await budget.remaining(who) == 400  # inside, its own hold still counts as left
        async with budget.reserve(who, 0):  # an empty reservation never refuses
            pass
    await db.close()


async def test_a_run_lends_what_it_has_not_spent_and_keeps_it_while_a_background_borrower_spends(
        tmp_path: Path) -> None:
    """The day's last 1,000 tokens, all held by a run: a tool in it borrows what the run has not spent (no
    fresh room is left); a borrower that outlives the run keeps the run's hold in the store till it ends,
    and records its own spend once."""
    from robot.limits import BudgetExceeded

    db = Database(tmp_path / "b.sqlite3")
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=10_000, chat_tokens=None)
    await db.open()
    who = caller("u1")
    await budget.charge(who, Usage(prompt_tokens=9000))
    done, spent = asyncio.Event(), asyncio.Event()

    async def background() -> None:
        async with budget.reserve(who, 5000, at_least=1) as hold:
            assert hold.held == 500  # what the run had not spent: nothing fresh
            spent.set()
            await done.wait()
            hold.spend(450)
            hold.detach()  # its tool returned long ago: the run will not count it

    async with budget.for_run(who, 4000) as run:
        assert run.held == 1000
        await budget.charge(who, Usage(prompt_tokens=300))  # the run's first turn, charged as it ends
        async with budget.reserve(who, 5000, at_least=1) as tool:
            assert tool.held == 700 and await budget.remaining(who) == 700
            tool.spend(200)
        assert await budget.remaining(who) == 500  # the tool's 200 counts as the run's spend
        with pytest.raises(BudgetExceeded):  # not lent by a reservation that does not say it may
            async with budget.reserve(who, 100), budget.reserve(who, 100):
                pass
        await budget.charge_tools(who, Usage(prompt_tokens=200))  # the tool's usage, as the loop reports it

        async def cancelled() -> None:
            async with budget.reserve(who, 5000, at_least=1):
                raise AssertionError("cancelled while it reserved")

        nested = asyncio.create_task(cancelled())
        await asyncio.sleep(0)  # it awaits its transaction, with the run's 500 promised to it
        nested.cancel()
        with pytest.raises(asyncio.CancelledError):
            await nested
        assert run.lent == 0 and await budget.remaining(who) == 500  # the promise was given back
        task = asyncio.create_task(background())
        await asyncio.wait_for(spent.wait(), 5)
        assert await budget.remaining(who) == 0  # what the run had left is the background's now
    assert await budget.used("user:memory:u1") == 9500  # the run's 300 and its tool's 200
    assert await budget.remaining(who) == 0  # the run's hold stays while the background spends it
    with pytest.raises(BudgetExceeded):
        async with budget.reserve(who, 1):
            pass
    done.set()
    await task
    assert await budget.used("user:memory:u1") == 9950  # its 450, once
    assert await budget.db.run(lambda d: d.execute("SELECT COUNT(*) FROM budget_holds").fetchone()[0]) == 0
    assert await budget.db.run(lambda d: d.execute("SELECT SUM(held) FROM usage_daily").fetchone()[0]) == 0
    await db.close()


async def test_a_cut_short_tools_spend_and_a_detached_borrowers_are_each_counted_once(tmp_path: Path) -> None:
    db = Database(tmp_path / "b.sqlite3")
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=10_000, chat_tokens=None)
    await db.open()
    who = caller("u1")
    await budget.charge(who, Usage(prompt_tokens=6000))  # the run's 4,000 are the day's last: tools borrow
    async with budget.for_run(who, 4000) as run:
        with pytest.raises(TimeoutError):  # a summary cut short by its timeout: its tool reports nothing
            async with asyncio.timeout(0.05), budget.reserve(who, 3000, at_least=1) as tool:
                tool.spend(2500)
                await asyncio.sleep(1)
        await budget.charge(who, Usage(prompt_tokens=1000))  # the run's next turn: no part of the 2,500
        async with budget.reserve(who, 5000, at_least=1) as sub:  # a tier's sub-run spends each turn into it
            await sub.hook().charge(who, Usage(prompt_tokens=100))
            assert sub.owed() == 100 and await sub.hook().remaining(who) == sub.free() == 400  # what it may spend
        await budget.charge_tools(who, Usage(prompt_tokens=100))  # its tool's report: the same 100
        async with budget.reserve(who, 5000, at_least=1) as plan:  # the run's last 400, lent to a plan
            plan.spend(300)
            plan.detach()  # it went on in the background and records its own spend
        assert run.free() == 100  # the 300 it recorded are not the run's to lend again
    assert await budget.used("user:memory:u1") == 6000 + 2500 + 1000 + 100 + 300  # the 2,500 were absorbed
    await db.close()


async def test_a_reservation_cancelled_while_its_hold_is_written_releases_it(tmp_path: Path) -> None:
    """Its unit runs on the database thread after the cancellation: the hold it writes is released, not
    kept for the rest of the day by a process that lives on (nobody reaps a living process's holds)."""
    import time

    db = Database(tmp_path / "b.sqlite3")
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=10_000, chat_tokens=None)
    await db.open()
    reserve_sync = budget._reserve_sync

    def slow(*args: Any) -> Any:
        got = reserve_sync(*args)
        time.sleep(0.2)  # a busy writer, a row lock
        return got

    budget._reserve_sync = slow  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), budget.reserve(caller("u1"), 4000, at_least=1):
            pass
    budget._reserve_sync = reserve_sync  # type: ignore[method-assign]
    for _ in range(50):
        await asyncio.sleep(0.1)
        if await budget.remaining(caller("u1")) == 10_000:
            break
    assert await budget.remaining(caller("u1")) == 10_000  # it was 6,000 for the rest of the day
    assert await db.run(lambda d: d.execute("SELECT COUNT(*) FROM budget_holds").fetchone()[0]) == 0
    await db.close()


async def test_the_bot_wide_daily_cap_refuses_everyone_once_spent(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model, limits={"user_burst": 100, "chat_burst": 100, "bot_daily_tokens": 1000})
    await bot.budget.charge(caller("u1"), Usage(prompt_tokens=1000))
    await ch.inject("hello?", at_bot=True, user="u2", chat=G2)  # another user, another chat
    (sent,) = await ch.wait_sent(1)
    assert "机器人今天的 AI 用量已达上限" in sent.text and model.requests == []


async def test_a_budget_store_that_cannot_be_read_refuses(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("answer"))
    bot, ch = await make_bot(model)

    await bot.db.run(lambda tx: tx.execute("DROP TABLE usage_daily"))  # the budget cannot be read
    await ch.inject("hello?", at_bot=True)
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "暂时无法核对 AI 用量，请稍后再试。" and model.requests == []


async def test_oversized_messages_get_one_notice_not_one_each(make_bot: Any) -> None:
    _bot, ch = await make_bot(None, limits={"user_burst": 2, "chat_burst": 100, "max_message_chars": 100})
    for _ in range(25):
        await ch.inject("长" * 200, at_bot=True)
    await ch.wait_sent(3)
    await asyncio.sleep(0.1)
    texts = [m.text for m in ch.sent]
    assert len(texts) == 3 and texts[2] == RATE_NOTICE.format(seconds=10) and "太长" in texts[0]
