"""A settlement the database cannot take (down, full, restarting) is written when it answers
again, once: the spend is recorded and the hold released, not kept for the rest of the day."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import psycopg
import pytest

from function_calls import Usage
from robot.budgets import BudgetExceeded, DailyBudget
from robot.storage import Engine, Pending, Tx
from robot.storage.base import CommitUnknown
from robot.storage.leases import PROCESS_PREFIX
from robot.storage.pgtesting import PgCluster
from robot.storage.postgres import PostgresDatabase
from tests.robot.conftest import eventually
from tests.robot.storage.test_budgets import T0, WHO, budget_for

pytestmark = pytest.mark.timeout(120)
SPENT = {"user:memory:u1": (300, 0), "chat:memory:group:g1": (300, 0), "bot": (300, 0)}  # (recorded, held)


class Outage:
    """Wraps ``engine.transaction``: while ``down``, every unit fails before touching the database
    (as a full disk or a refused connection does). ``unknown`` makes the next unit's connection fail
    while it commits: "written" after the commit went through, "lost" before."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = engine.transaction
        self.down = False
        self.unknown: Literal["", "written", "lost"] = ""
        self.failed = 0
        monkeypatch.setattr(engine, "transaction", self.transaction)

    async def transaction(self, fn: Callable[[Tx], Any], *, durable: bool = False) -> Any:
        if self.down:
            self.failed += 1
            raise sqlite3.OperationalError("database or disk is full")
        unknown, self.unknown = self.unknown, ""
        if unknown != "lost":
            result = await self.real(fn, durable=durable)
        if unknown:
            raise CommitUnknown("the connection failed while committing")
        return result


async def ledger(engine: Engine) -> tuple[dict[str, tuple[int, int]], int]:
    """(per scope: recorded tokens, held tokens), and the tokens still in ``budget_holds``."""
    rows = await engine.run(lambda tx: tx.query("SELECT scope, tokens, held FROM usage_daily"))
    holds = await engine.run(lambda tx: tx.query("SELECT coalesce(sum(tokens), 0) AS n FROM budget_holds"))
    return {r["scope"]: (int(r["tokens"]), int(r["held"])) for r in rows}, int(holds[0]["n"])


async def spend_300_of_600(budget: DailyBudget, outage: Outage) -> None:
    """A spend whose settlement the database refuses."""
    async with budget.reserve(WHO, 600):
        await budget.charge(WHO, Usage(prompt_tokens=300))
        outage.down = True


async def test_a_settlement_the_database_refused_is_written_when_it_answers(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = budget_for(engine, "host:1:me", chat=5000)
    budget.pending.first_s, budget.pending.max_s = 0.05, 0.1
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        async with budget.reserve(WHO, 600):
            await budget.charge(WHO, Usage(prompt_tokens=300))
            outage.down = True  # the settlement at the block's end fails, and so do its first retries
        assert len(budget.pending) == 1
        await eventually(lambda: outage.failed >= 3, timeout=20)
        assert await budget.remaining(WHO) == 400  # meanwhile the hold still counts: fail closed
        outage.down = False
        await eventually(lambda: not budget.pending, timeout=20)
        used, holds = await ledger(engine)
        assert used == SPENT and holds == 0
        await asyncio.sleep(0.3)  # several retry periods: written once, not again
        assert await ledger(engine) == (used, 0)
        assert await budget.remaining(WHO) == 700
    finally:
        await budget.pending.stop()
        await engine.close()


async def test_stopping_writes_what_waits_or_says_what_is_lost(
        engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    budget = budget_for(engine, "host:1:me", user=5000, chat=5000)
    budget.pending.first_s = 3600.0  # no retry by itself within the test: only the stop's
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        await spend_300_of_600(budget, outage)
        outage.down = False
        await budget.pending.stop()
        assert await ledger(engine) == (SPENT, 0)
        budget.pending = Pending(engine, first_s=3600.0)  # (a bot started again)
        await spend_300_of_600(budget, outage)
        with caplog.at_level(logging.ERROR, logger="robot.storage.pending"):
            await budget.pending.stop()
            assert not budget.pending
            assert "stopping with 1 unwritten units, lost: recording 300 tokens and releasing 600" in caplog.text
            outage.down = False
            await spend_300_of_600(budget, outage)  # refused after the stop: nothing would retry it
        assert not budget.pending and "recording 300 tokens and releasing 600 failed while stopping" in caplog.text
    finally:
        await engine.close()


@pytest.mark.parametrize("outcome", ["written", "lost"])
async def test_a_settlement_whose_commit_was_unknown_is_written_exactly_once(
        engine: Engine, monkeypatch: pytest.MonkeyPatch, outcome: Literal["written", "lost"]) -> None:
    budget = budget_for(engine, "host:1:me", chat=5000)
    budget.pending.first_s = 0.01
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        async with budget.reserve(WHO, 600):
            await budget.charge(WHO, Usage(prompt_tokens=300))
            outage.unknown = outcome  # the connection fails while the settlement commits
        await eventually(lambda: not budget.pending, timeout=20)
        # Once: written, the retry finds its hold's rows gone and writes nothing (a blind retry
        # recorded 600 and released twice); lost, the retry writes it.
        assert await ledger(engine) == (SPENT, 0)
        assert await budget.remaining(WHO) == 700
    finally:
        await engine.close()


@pytest.mark.parametrize("outcome", ["written", "lost"])
@pytest.mark.parametrize("at_least", [None, 1])  # 1: "what is left": it holds 1000 of the 2000 asked
async def test_a_reservation_whose_commit_was_unknown_is_refused_and_holds_nothing(
        engine: Engine, monkeypatch: pytest.MonkeyPatch, outcome: Literal["written", "lost"],
        at_least: int | None) -> None:
    budget = budget_for(engine, "host:1:me", chat=5000)
    budget.pending.first_s = 0.01
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        outage.unknown = outcome
        with pytest.raises(BudgetExceeded) as refused:
            async with budget.reserve(WHO, 600 if at_least is None else 2000, at_least=at_least):
                raise AssertionError("a reservation that cannot be confirmed is refused")
        assert refused.value.scope == "store"
        await eventually(lambda: not budget.pending, timeout=20)
        used, holds = await ledger(engine)
        assert holds == 0 and all(held == 0 for _, held in used.values())  # its hold, if written, released
        assert await budget.remaining(WHO) == 1000
    finally:
        await engine.close()


async def test_a_settlement_during_a_postgresql_crash_is_written_after_the_restart(own_pg_cluster: PgCluster) -> None:
    db = PostgresDatabase(own_pg_cluster.create_database(), max_size=2)
    db.wait_s = 0.5  # a unit gives up on the unreachable server after this (30 s by default)
    budget = budget_for(db, "host:1:me", chat=5000)
    budget.pending.first_s, budget.pending.max_s = 0.05, 0.2
    await db.open()
    try:
        async with budget.reserve(WHO, 600):
            await budget.charge(WHO, Usage(prompt_tokens=300))
            await asyncio.sleep(0.8)  # the reservation's commit reaches the log (flushed within 3 x 200 ms)
            await asyncio.to_thread(own_pg_cluster.crash)
            refused_from = time.monotonic()
        # Refused once the pool has waited wait_s for a connection (not five times that, as a pooled
        # connection found closed would be retried): the reply this settles is held up no longer.
        assert time.monotonic() - refused_from < 1.5
        assert len(budget.pending) == 1  # refused: the server is gone
        await asyncio.sleep(0.3)
        assert len(budget.pending) == 1
        await asyncio.to_thread(own_pg_cluster.restart)
        await eventually(lambda: not budget.pending, timeout=20)
        assert await ledger(db) == (SPENT, 0)
        assert await budget.remaining(WHO) == 700
    finally:
        await budget.pending.stop()
        await db.close()


async def test_a_connection_lost_during_commit_is_reported_as_an_unknown_outcome(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=2)
    await db.open()
    try:
        await db.run(lambda tx: tx.execute("CREATE TABLE t (n INTEGER)"))

        def cut_at_commit(tx: Tx) -> None:
            tx.execute("INSERT INTO t VALUES (1)")
            pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
            with psycopg.connect(pg_url, autocommit=True) as other:  # this unit's session ends before COMMIT
                other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])

        with pytest.raises(CommitUnknown, match="failed while committing"):
            await db.transaction(cut_at_commit)

        def cut_before(tx: Tx) -> None:
            pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            tx.execute("INSERT INTO t VALUES (2)")

        with pytest.raises(psycopg.OperationalError) as caught:  # failed inside: surely not written
            await db.transaction(cut_before)
        assert not isinstance(caught.value, CommitUnknown)
        assert await db.run(lambda tx: tx.query("SELECT n FROM t")) == []
    finally:
        await db.close()


async def test_a_settlement_retried_after_midnight_counts_on_the_day_it_was_spent(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [T0.replace(hour=23, minute=59, second=50)]
    budget = budget_for(engine, "host:1:me", clock, chat=5000)
    budget.pending.first_s = 3600.0
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        await spend_300_of_600(budget, outage)
        clock[0] = T0 + timedelta(days=1)  # the database answers again the next day
        outage.down = False
        await budget.pending.stop()
        rows = await engine.run(lambda tx: tx.query("SELECT day, scope, tokens, held FROM usage_daily"))
        assert {(r["day"], r["scope"]): (r["tokens"], r["held"]) for r in rows} == {
            ("2026-03-01", scope): spent for scope, spent in SPENT.items()}
        assert await budget.remaining(WHO) == 1000  # the new day starts empty: nothing held over
    finally:
        await engine.close()


async def test_a_settlement_retried_after_its_hold_was_charged_and_pruned_records_the_spend_instead(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process stalls past its lease while its settlement's outcome is unknown; another one needs
    # the room, charges its hold (600) as spent, and prunes. The retry must still record the 300
    # tokens really spent, in place of the 600.
    stalled, other = budget_for(engine, "host:1:stalled"), budget_for(engine, "host:2:other")
    stalled.pending.first_s = 3600.0  # retried only when it stops
    await engine.open()
    outage = Outage(engine, monkeypatch)
    try:
        if isinstance(engine, PostgresDatabase):  # on SQLite another holder is a dead predecessor at once
            await other.leases.acquire(PROCESS_PREFIX + "host:2:other")
        async with stalled.reserve(WHO, 600):
            await stalled.charge(WHO, Usage(prompt_tokens=300))
            outage.unknown = "lost"  # the connection fails while the settlement commits, unwritten
        assert len(stalled.pending) == 1
        with pytest.raises(BudgetExceeded):  # 600 of 1000 held: charged, and still no room for 800
            async with other.reserve(WHO, 800):
                pass
        assert (await ledger(engine))[0]["user:memory:u1"] == (600, 0)
        await other.prune()
        await stalled.pending.stop()
        used, holds = await ledger(engine)
        assert holds == 0 and used["user:memory:u1"] == (300, 0)  # recorded, and not released twice
        assert await other.remaining(WHO) == 700
    finally:
        await engine.close()
