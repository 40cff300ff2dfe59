"""Daily budgets in the database, on SQLite and a real PostgreSQL: reservations from several
processes never exceed a cap, and a dead process's holds do not leak."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from function_calls import Caller, Usage
from robot.budgets import BudgetExceeded, DailyBudget
from robot.storage import Engine
from robot.storage.leases import PROCESS_PREFIX, Leases
from robot.storage.postgres import PostgresDatabase

WHO = Caller(platform="memory", user_id="u1", chat_id="g1", chat_kind="group")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def budget_for(db: Engine, holder: str, clock: list[datetime] | None = None, **caps: int | None) -> DailyBudget:
    moment = clock or [T0]
    return DailyBudget(db, ZoneInfo("UTC"), user_tokens=caps.get("user", 1000), chat_tokens=caps.get("chat"),
                       bot_tokens=caps.get("bot"), clock=lambda: moment[0], leases=Leases(db, holder=holder))


async def test_two_processes_racing_for_one_budget_never_exceed_its_cap(pg_url: str) -> None:
    engines = [PostgresDatabase(pg_url, max_size=4), PostgresDatabase(pg_url, max_size=4)]
    budgets = [budget_for(db, f"host:{n}:p", chat=1500) for n, db in enumerate(engines)]
    for db in engines:
        await db.open()
    for budget in budgets:  # both alive (their LeaseKeepers renew this): neither releases the other's holds
        assert await budget.leases.acquire(PROCESS_PREFIX + budget.leases.holder)
    try:
        release = asyncio.Event()
        tried: list[int] = []

        async def take(budget: DailyBudget, tokens: int, at_least: int | None = None) -> None:
            try:
                async with budget.reserve(WHO, tokens, at_least=at_least) as hold:
                    tried.append(hold.held)
                    await release.wait()  # every admitted spend holds at once
            except BudgetExceeded as exc:
                assert exc.scope == "user:memory:u1" and exc.user_message == "今天的 AI 用量已达上限，明天再来吧。"
                tried.append(0)

        first = [asyncio.create_task(take(budgets[i % 2], 70 + i % 3)) for i in range(40)]
        while len(tried) < 40:
            await asyncio.sleep(0.01)
        got = sum(tried)
        assert 1000 - 72 < got <= 1000  # the cap is filled, never exceeded
        assert await budgets[0].remaining(WHO) == 1000 - got
        tried.clear()
        rest = [asyncio.create_task(take(budgets[i % 2], 500, at_least=1)) for i in range(4)]
        while len(tried) < 4:
            await asyncio.sleep(0.01)
        assert sum(tried) == 1000 - got  # "what is left" was shared, not given twice
        release.set()
        await asyncio.gather(*first, *rest)
        assert await budgets[1].remaining(WHO) == 1000  # all released on exit, nothing was spent
    finally:
        for db in engines:
            await db.close()


async def test_holds_settle_to_what_was_spent_and_a_new_day_starts_empty(engine: Engine) -> None:
    clock = [T0]
    budget = budget_for(engine, "me", clock, chat=5000)
    await engine.open()
    try:
        async with budget.reserve(WHO, 600) as hold:
            assert await budget.remaining(WHO) == 1000  # its own hold counts as left inside
            await budget.charge(WHO, Usage(prompt_tokens=200))
            assert await budget.remaining(WHO) == 800  # what it was charged is spent, the rest still its own
            assert await budget.used("user:memory:u1") == 0  # recorded when it closes: one write per call
            hold.spend(100)
        assert await budget.used("user:memory:u1") == 300 and await budget.used("chat:memory:group:g1") == 300
        assert await budget.remaining(WHO) == 700
        try:
            async with budget.reserve(WHO, 800):
                raise AssertionError("800 does not fit in 700")
        except BudgetExceeded as exc:
            assert (exc.left, exc.needed) == (700, 800)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(budget.reserve(WHO, 650))  # held over midnight...
            clock[0] += timedelta(days=1)
            assert await budget.remaining(WHO) == 1000  # ...counts on its own day only
            await budget.charge(WHO, Usage(prompt_tokens=50))
        # ...and so does what it spent: today's cap was free for others to hold, yesterday's held it
        assert await budget.used("user:memory:u1") == 0 and await budget.remaining(WHO) == 1000
        clock[0] -= timedelta(days=1)
        assert await budget.remaining(WHO) == 650  # yesterday: its hold was released, its 50 recorded
        assert await engine.run(lambda tx: tx.query("SELECT * FROM budget_holds")) == []  # settled: deleted
        assert await budget.prune() == 0
    finally:
        await engine.close()


async def test_inside_a_reservation_what_is_left_is_right_without_reading_again(engine: Engine) -> None:
    # A run's reservation (at_least) read its rows; remaining() inside it answers from them until a
    # nested spend settles, and one statement records every scope of every caller charged.
    budget = budget_for(engine, "me", chat=5000)
    other = Caller(platform="memory", user_id="u2", chat_id="g1", chat_kind="group")
    await engine.open()
    try:
        async with budget.reserve(WHO, 600, at_least=1) as hold:
            assert hold.held == 600 and await budget.remaining(WHO) == 1000
            await budget.charge(WHO, Usage(prompt_tokens=200))
            assert await budget.remaining(WHO) == 800
            async with budget.reserve(WHO, 0):  # a tool's own spending, recorded when it closes
                await budget.charge(other, Usage(prompt_tokens=50))
                await budget.charge(WHO, Usage(prompt_tokens=30))
            assert await budget.remaining(WHO) == 770  # read again: the nested spend is recorded
            assert await budget.remaining(other) == 950
        assert [await budget.used(s) for s in ("user:memory:u1", "user:memory:u2", "chat:memory:group:g1", "bot")] \
            == [230, 50, 280, 280]
        assert await budget.remaining(WHO) == 770
        held = await engine.run(lambda tx: tx.query("SELECT scope, held FROM usage_daily ORDER BY scope"))
        assert {r["scope"]: r["held"] for r in held} == {"bot": 0, "chat:memory:group:g1": 0, "user:memory:u1": 0,
                                                          "user:memory:u2": 0}
        async with budget.reserve(WHO, 2000, at_least=1) as hold:  # what is left, and no more
            assert hold.held == 770 and await budget.remaining(WHO) == 770
    finally:
        await engine.close()


async def test_the_holds_of_a_process_that_died_are_charged_as_spent_when_they_would_refuse(engine: Engine) -> None:
    # What a process killed mid-call spent is unknown (the provider bills the call all the same):
    # its hold counts as spent, not as free again.
    dead = budget_for(engine, "host:9:dead")
    alive = budget_for(engine, "host:1:me")
    await engine.open()
    try:
        if isinstance(engine, PostgresDatabase):  # on SQLite another holder is a dead predecessor at once
            assert await dead.leases.acquire(PROCESS_PREFIX + "host:9:dead")
            await alive.leases.acquire(PROCESS_PREFIX + "host:1:me")
        crashed = dead.reserve(WHO, 900)
        await asyncio.create_task(crashed.__aenter__())  # killed mid-call: never settles
        if isinstance(engine, PostgresDatabase):
            try:
                async with alive.reserve(WHO, 500):
                    raise AssertionError("the living process's hold must still count")
            except BudgetExceeded as exc:
                assert exc.left == 100
            await dead.leases.release([PROCESS_PREFIX + "host:9:dead"])  # it stops renewing: dead
        assert await alive.remaining(WHO) == 100  # held until someone needs the room
        with pytest.raises(BudgetExceeded) as refused:
            async with alive.reserve(WHO, 500):
                raise AssertionError("a dead process's hold is not room for others")
        assert refused.value.left == 100
        assert await alive.used("user:memory:u1") == 900  # charged, no longer held
        assert await engine.run(lambda tx: tx.query("SELECT tokens, charged FROM budget_holds")) == [
            {"tokens": 0, "charged": 900}]
        async with alive.reserve(WHO, 100) as hold:
            assert hold.held == 100
        assert await alive.remaining(WHO) == 100
    finally:
        await engine.close()


async def test_without_caps_nothing_is_written(engine: Engine) -> None:
    budget = budget_for(engine, "me", user=None)
    await engine.open()
    try:
        async with budget.reserve(WHO, 10**6) as hold:
            await budget.charge(WHO, Usage(prompt_tokens=10**9))
            hold.spend(10)
        assert await budget.remaining(WHO) is None
        rows = await engine.run(lambda tx: tx.query("SELECT * FROM usage_daily"))
        assert rows == []
    finally:
        await engine.close()


async def test_holds_charged_for_a_stalled_process_are_given_back_when_it_settles_once(pg_url: str) -> None:
    # A process stalled past its lease: another charged its holds as spent; when it wakes and
    # settles, what it really spent is recorded instead, and nothing is released twice.
    engines = [PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)]
    stalled, other = budget_for(engines[0], "host:1:stalled"), budget_for(engines[1], "host:2:other")
    for db in engines:
        await db.open()
    try:
        await other.leases.acquire(PROCESS_PREFIX + "host:2:other")
        async with stalled.reserve(WHO, 600):  # its process lease is not renewed: it counts as dead
            with pytest.raises(BudgetExceeded):  # charges the stalled one's hold: still no room
                async with other.reserve(WHO, 800):
                    pass
            assert await other.used("user:memory:u1") == 600
            async with other.reserve(WHO, 300) as second:
                assert second.held == 300
                await other.charge(WHO, Usage(prompt_tokens=100))
            await stalled.charge(WHO, Usage(prompt_tokens=250))  # what it really spent, recorded at its end
        assert await other.used("user:memory:u1") == 350  # 250 + 100: the 600 charged is given back
        assert await other.remaining(WHO) == 650  # nothing released twice
    finally:
        for db in engines:
            await db.close()


async def test_a_budget_day_turns_at_local_midnight_in_odd_offsets_and_daylight_saving(engine: Engine) -> None:
    # Kathmandu is UTC+05:45 (its midnight is 18:15 UTC); New York changed to daylight time on
    # 2026-03-08, so its midnights that week are 05:00 and then 04:00 UTC.
    moment = [T0]
    cases = [(DailyBudget(engine, ZoneInfo(zone), user_tokens=1000, chat_tokens=None, bot_tokens=None,
                          clock=lambda: moment[0], leases=Leases(engine, holder="host:1:p")), zone, last, first)
             for zone, last, first in (
                 ("Asia/Kathmandu", datetime(2026, 3, 1, 18, 14, 59, tzinfo=UTC), datetime(2026, 3, 1, 18, 15, tzinfo=UTC)),
                 ("America/New_York", datetime(2026, 3, 9, 3, 59, 59, tzinfo=UTC), datetime(2026, 3, 9, 4, tzinfo=UTC)))]
    await engine.open()
    try:
        for budget, zone, before_midnight, after_midnight in cases:
            who = WHO.model_copy(update={"user_id": zone})
            moment[0] = before_midnight - timedelta(minutes=20)  # the day is read (and kept) well before midnight
            async with budget.reserve(who, 10):
                await budget.charge(who, Usage(prompt_tokens=900, requests=1))
            moment[0] = before_midnight
            assert await budget.remaining(who) == 100, zone  # still the same local day, one second before
            moment[0] = after_midnight
            assert await budget.remaining(who) == 1000, zone  # a new day: nothing spent yet
            moment[0] = before_midnight  # a clock set back: yesterday's spending shows again
            assert await budget.remaining(who) == 100, zone
    finally:
        await engine.close()


async def test_a_hold_refused_by_one_scope_is_undone_in_the_others_before_the_retry(engine: Engine) -> None:
    # u2's attempt fits the chat's budget (taken first) but not their own (a dead process holds most
    # of it): the chat's hold must be undone before the dead holds are charged and again after the
    # retry (refused too: the charge leaves no more room), or the chat would carry it for the day.
    dead = budget_for(engine, "host:9:dead", user=100, chat=1000)
    alive = budget_for(engine, "host:1:me", user=100, chat=1000)
    other = WHO.model_copy(update={"user_id": "u2"})
    await engine.open()
    try:
        if isinstance(engine, PostgresDatabase):  # on SQLite another holder is a dead predecessor at once
            assert await dead.leases.acquire(PROCESS_PREFIX + "host:9:dead")
            await dead.leases.release([PROCESS_PREFIX + "host:9:dead"])
        crashed = dead.reserve(other, 60)
        await asyncio.create_task(crashed.__aenter__())  # killed mid-call: never settles
        with pytest.raises(BudgetExceeded) as refused:
            async with alive.reserve(other, 50):
                pass
        assert (refused.value.scope, refused.value.left) == ("user:memory:u2", 40)
        rows = await engine.run(lambda tx: tx.query("SELECT scope, tokens, held FROM usage_daily ORDER BY scope"))
        assert {r["scope"]: (r["tokens"], r["held"]) for r in rows} == {
            "chat:memory:group:g1": (60, 0), "user:memory:u2": (60, 0)}  # charged; nothing held
        async with alive.reserve(other, 40) as hold:
            assert hold.held == 40
        assert await alive.remaining(other) == 40
    finally:
        await engine.close()


async def test_reservations_and_settlements_of_one_chat_interleaving_never_deadlock(pg_url: str) -> None:
    # Messages arriving all the time (not in one burst): one message's reservation and another's
    # settlement in the same chat run at once. Both lock the day's rows, then the holds; when a
    # settlement took the holds first, the two waited on each other (PostgreSQL's deadlock detector
    # broke it after a second, and a settlement that failed three times left its hold for the day).
    db = PostgresDatabase(pg_url, max_size=8)
    budget = budget_for(db, "host:1:p", user=10**9, chat=10**9, bot=10**9)
    await db.open()
    assert await budget.leases.acquire(PROCESS_PREFIX + budget.leases.holder)
    try:
        async def message(n: int) -> None:
            who = Caller(platform="memory", user_id=f"u{n % 7}", chat_id="g1", chat_kind="group")
            await asyncio.sleep(n * 0.002)  # arriving one after another, overlapping
            async with budget.reserve(who, 5000, at_least=100) as hold:
                await asyncio.sleep(0.001 * (n % 5))
                hold.spend(10)

        await asyncio.gather(*(message(n) for n in range(400)))
        deadlocks = await db.run(lambda tx: tx.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0])
        assert deadlocks == 0
        assert await budget.used("chat:memory:group:g1") == 4000 and await budget.used("bot") == 4000
        assert await db.run(lambda tx: tx.execute("SELECT sum(held) FROM usage_daily").fetchone()[0]) == 0
    finally:
        await db.close()


async def test_a_run_closing_with_a_loan_out_keeps_only_the_loan_held(engine: Engine) -> None:
    """A background plan borrowed from a run that then ended: the run's hold stays only for what it lent
    (the whole hold stayed, its spent part counted twice, and the member was refused with room left)."""
    budget = budget_for(engine, "me", user=10_000)
    await engine.open()
    try:
        async with AsyncExitStack() as background:
            async with budget.for_run(WHO, 4000) as run:
                await budget.charge(WHO, Usage(prompt_tokens=1000))  # the run's turn
                plan = await background.enter_async_context(budget.reserve(WHO, 9000, at_least=1))
                plan.detach()  # the day's fresh 6,000, then the run's unspent 3,000
                assert (run.held, run.lent, plan.held, plan.borrowed) == (4000, 3000, 9000, 3000)
            assert await budget.used("user:memory:u1") == 1000
            assert await budget.remaining(WHO) == 0  # its 1,000 recorded, the loan and the plan's own held
            held = await engine.run(lambda tx: tx.query("SELECT held FROM usage_daily WHERE scope = 'user:memory:u1'"))
            assert held[0]["held"] == 6000 + 3000  # it was 6,000 + 4,000: the run's spent 1,000 held too
        assert await budget.remaining(WHO) == 9000
        assert await engine.run(lambda tx: tx.query("SELECT * FROM budget_holds")) == []
    finally:
        await engine.close()
