"""Several processes on one PostgreSQL: every due reminder fires exactly once in total, and a
deletion in one process stops the firing in every other.

Each "process" is its own engine (its own pool and LISTEN connection) and ReminderService on the
same database URL. Their outbox is a table with no unique key, so a doubled firing would show as
two rows instead of being absorbed by the real outbox's idempotent insert.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from function_calls import Caller, Toolset
from reminders.schedule import parse_schedule
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, Reminder, ReminderStore, new_id
from robot import ChatRef, OutgoingMessage, Tx
from robot.storage.leases import SCHEMA as LEASES
from robot.storage.leases import LeaseKeeper, Leases
from robot.storage.pgtesting import pgbouncer
from robot.storage.postgres import PostgresDatabase
from tests.frozen import frozen_child

NOW = datetime(2030, 1, 7, 4, 0, tzinfo=UTC)
SH = "Asia/Shanghai"


class CountingOutbox:
    """What reminders use of the outbox, writing to ``fired`` (no unique key: doubles stay visible)."""

    def enqueue_sync(self, db: Tx, message: OutgoingMessage) -> bool:
        db.execute("INSERT INTO fired (key, chat, text) VALUES (?, ?, ?)", [message.key, message.chat.key,
                                                                           message.text])
        return True

    def enqueue_many_sync(self, db: Tx, messages: Sequence[OutgoingMessage], *, send_here: bool = False) -> list[bool]:
        return [self.enqueue_sync(db, m) for m in messages]


class Host:
    """The part of a Bot a ReminderService uses to fire text reminders (and its place among processes)."""

    def __init__(self, clock: Callable[[], datetime], leases: LeaseKeeper) -> None:
        self.clock = clock
        self.outbox = CountingOutbox()
        self.leases = leases
        self.tools = Toolset("none")  # where the allowed commands and prompt tools are looked up

    def ignores(self, chat: ChatRef) -> bool:
        """No chat is closed by a gate here."""
        return False


FIRED = ["CREATE TABLE fired (n {id}, key TEXT NOT NULL, chat TEXT NOT NULL, text TEXT NOT NULL)"]


@contextlib.asynccontextmanager
async def started(url: str, listen_url: str | None = None) -> AsyncIterator[list[ReminderService]]:
    """Three services, each on its own engine and timer, sharing one PostgreSQL database."""
    services: list[ReminderService] = []
    keepers: list[LeaseKeeper] = []
    try:
        for k in range(3):
            db = PostgresDatabase(url, max_size=3, listen_url=listen_url)
            db.migrate("reminders", SCHEMA)
            db.migrate("fired", FIRED)
            db.migrate("leases", LEASES)
            await db.open()
            keepers.append(LeaseKeeper(Leases(db, holder=f"process-{k}")))
            await keepers[-1].start()  # its process lease: its place among the living
            scheduler = AsyncIOScheduler(timezone=ZoneInfo("UTC"))
            scheduler.start(paused=True)  # jobs are only looked at: the instants are in 2030
            service = ReminderService(ReminderStore(db), Host(lambda: NOW, keepers[-1]),  # type: ignore[arg-type]
                                      ReminderSettings(), scheduler=scheduler)
            await service.start()
            services.append(service)
        yield services
    finally:
        for service, keeper in zip(services, keepers, strict=True):
            await service.stop()
            await keeper.stop()
            await service.store.db.close()


@pytest.fixture
async def processes(pg_url: str) -> AsyncIterator[list[ReminderService]]:
    """Three processes on the database directly."""
    async with started(pg_url) as services:
        yield services


@pytest.fixture(params=["direct", "transaction pooler"])
async def any_processes(request: pytest.FixtureRequest, pg_url: str) -> AsyncIterator[list[ReminderService]]:
    """Three processes on the database directly, or through a PgBouncer in transaction mode (two
    server connections for nine clients) with ``listen_url`` naming the database directly."""
    if request.param == "direct":
        async with started(pg_url) as services:
            yield services
        return
    with pgbouncer(pg_url, "transaction", server_pool=2) as pooled:
        async with started(pooled, listen_url=pg_url) as services:
            yield services


def due_rows(count: int) -> list[Reminder]:
    return [Reminder(id=new_id(), owner=f"memory:u{i}", owner_name=f"u{i}", chat=f"memory:group:g{i % 7}",
                     type="once", wall="2030-01-07 11:59:59", zone=SH, weekday=None, content=f"提醒 {i}",
                     mode="text", created_at=NOW, updated_at=NOW, next_fire=NOW - timedelta(seconds=1))
            for i in range(count)]


async def fired(service: ReminderService) -> list[str]:
    """The contents of every reminder in every message queued (a chat's reminders share messages)."""
    texts = await service.store.db.run(lambda db: [r[0] for r in db.execute("SELECT text FROM fired").fetchall()])
    return [item for text in texts for item in re.findall(r"提醒 \d+|交周报", text)]


async def test_every_due_reminder_fires_exactly_once_across_processes(any_processes: list[ReminderService]) -> None:
    processes = any_processes
    rows = due_rows(600)
    await processes[0].store.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    for service in processes:
        service.batch = 25  # many small claims, so the three passes really interleave
    reports = await asyncio.gather(*(s.fire_due(NOW) for s in processes for _ in range(2)))
    contents = await fired(processes[0])
    assert len(contents) == 600 and len(set(contents)) == 600  # none lost, none doubled
    assert sum(r.delivered for r in reports) == 600
    assert sum(1 for r in reports if r.delivered) >= 2  # the work was shared, not done by one process
    assert not await processes[1].store.db.run(lambda db: ReminderStore.due_sync(db, NOW, "text", 10))


async def test_a_burst_every_process_composed_ahead_fires_exactly_once(any_processes: list[ReminderService]) -> None:
    processes = any_processes
    due = NOW + timedelta(seconds=5)  # composed ahead at NOW
    rows = [r.evolve(next_fire=due) for r in due_rows(900)]
    await processes[0].store.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    for service in processes:
        service.batch = 40  # many batches, claimed in each process's own order
        assert await service.ahead.prepare(due) == 900
    assert await processes[2].delete(rows[7].id)  # after the composing: no process may send it
    reports = await asyncio.gather(*(s.fire_due(due) for s in processes))
    contents = await fired(processes[0])
    assert sorted(contents) == sorted(f"提醒 {i}" for i in range(900) if i != 7)  # none lost, none doubled
    assert sum(r.delivered for r in reports) == 899
    assert sum(1 for r in reports if r.delivered) >= 2  # the work was shared
    assert not await processes[1].store.db.run(lambda db: ReminderStore.due_sync(db, due, "text", 10))


async def test_processes_composing_one_instant_start_firing_at_their_own_share_and_stop_at_the_next(
        processes: list[ReminderService]) -> None:
    due = NOW + timedelta(seconds=5)
    rows = [r.evolve(next_fire=due) for r in due_rows(900)]
    await processes[0].store.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    for service in processes:
        service.batch = 100  # several batches (a chat's together): process k of 3 starts at the k-th third
        assert await service.ahead.prepare(due) == 900
    orders = [[part.ids[0] for part in service.ahead.take(due)] for service in processes]
    n = len(orders[0])
    assert n >= 6 and [orders[0].index(order[0]) for order in orders] == [0, n // 3, 2 * n // 3]
    assert all(sorted(order) == sorted(orders[0]) for order in orders)
    tried: list[list[str]] = [[], [], []]
    for k, service in enumerate(processes):
        assert await service.ahead.prepare(due) == 900

        def claim(db: Tx, ids: list[str], at: datetime, k: int = k) -> list[tuple[str, str]]:
            tried[k].append(ids[0])
            return ReminderStore.claim_sync(db, ids, at)

        service.store.claim_sync = claim  # type: ignore[method-assign]
    # One after another: the first fires every batch; each of the two lanes of the others
    # stops at the first batch it claims nothing of, instead of trying every one.
    reports = [await service.fire_due(due) for service in processes]
    assert [r.delivered for r in reports] == [900, 0, 0]
    assert len(set(tried[0])) == n and len(set(tried[1])) == len(set(tried[2])) == 2  # (units may run twice)
    assert sorted(await fired(processes[0])) == sorted(f"提醒 {i}" for i in range(900))


async def test_reminders_due_behind_a_backlog_of_units_fire_before_it_is_worked_off(
        processes: list[ReminderService]) -> None:
    service = processes[0]
    rows = due_rows(300)
    await service.store.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    service.batch = 100  # three firing transactions
    finished: set[int] = set()  # (a rehearsed unit runs twice)

    def slow(i: int) -> Callable[[Tx], None]:  # a burst of messages' units, holding their connections a while
        def unit(tx: Tx) -> None:
            tx.execute("SELECT 1")
            time.sleep(0.05)
            finished.add(i)
        return unit

    backlog = [asyncio.ensure_future(service.store.db.transaction(slow(i))) for i in range(60)]  # 1 s, 3 threads
    await asyncio.sleep(0.05)
    report = await service.fire_due(NOW)
    assert report.delivered == 300 and len(finished) < 45  # in order, it would have waited for all 60
    await asyncio.gather(*backlog)
    assert sorted(await fired(service)) == sorted(f"提醒 {i}" for i in range(300))


async def test_a_deletion_in_one_process_stops_the_firing_in_the_others(
        any_processes: list[ReminderService]) -> None:
    processes = a, b, c = any_processes
    caller = Caller(platform="memory", user_id="u1", user_name="Alice", chat_id="g1", chat_kind="group")
    made = await a.create(caller, parse_schedule("once", "2030-01-07 12:30", SH, None), "交周报", "text")
    assert made.next_fire == NOW + timedelta(minutes=30)

    async def until(check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                await asyncio.sleep(0.02)

    await until(lambda: all(s.armed_at(made.id) == made.next_fire for s in processes))  # heard by everyone
    assert await b.delete(made.id)
    await until(lambda: all(s.armed_at(made.id) is None for s in processes))
    for service in (a, c):  # their timers would have woken them at 12:30: nothing is left to fire
        report = await service.fire_due(NOW + timedelta(minutes=30))
        assert report.delivered == 0
    assert await fired(a) == []


async def test_rows_claimed_by_a_process_that_dies_mid_firing_are_fired_by_another(
        processes: list[ReminderService]) -> None:
    a, b, _ = processes
    await a.store.db.run(lambda db: ReminderStore.insert_sync(db, due_rows(3)))
    held, release = threading.Event(), threading.Event()

    def dies_before_commit(db: Tx) -> None:
        assert len(ReminderStore.due_sync(db, NOW, "text", 10, claim=True)) == 3
        held.set()
        release.wait(10)
        raise RuntimeError("killed")  # its transaction rolls back, as a SIGKILLed process's does

    dying = asyncio.ensure_future(a.store.db.transaction(dies_before_commit))
    await asyncio.to_thread(held.wait, 10)
    assert (await b.fire_due(NOW)).delivered == 0  # claimed elsewhere: skipped, not waited for
    release.set()
    with pytest.raises(RuntimeError):
        await dying
    async with asyncio.timeout(15):  # b looks again by itself: nobody will wake it for these rows
        while len(await fired(b)) < 3:
            await asyncio.sleep(0.1)
    assert sorted(await fired(b)) == ["提醒 0", "提醒 1", "提醒 2"]


async def test_a_reminder_added_while_a_process_heard_nothing_is_armed_there_once_it_listens_again(
        processes: list[ReminderService], pg_url: str) -> None:
    # The adding process may die before its reminder falls due: the others must have it armed, even
    # if its notification was lost to a cut LISTEN connection (a database restart, a network cut).
    from robot.storage.pgtesting import cut_listeners, listeners

    a, b, c = processes
    for service in processes:
        assert isinstance(service.store.db, PostgresDatabase)
        service.store.db.listen_retry_s = 3.0  # a gap long enough to write into
    await asyncio.to_thread(cut_listeners, pg_url)
    caller = Caller(platform="memory", user_id="u1", user_name="Alice", chat_id="g1", chat_kind="group")
    made = await a.create(caller, parse_schedule("once", "2030-01-07 12:30", SH, None), "交周报", "text")
    assert await asyncio.to_thread(listeners, pg_url) == 0  # its notification reached nobody
    assert a.armed_at(made.id) == made.next_fire and b.armed_at(made.id) is None
    async with asyncio.timeout(20):  # listening again after 3 s, each reads its window again
        while not all(s.armed_at(made.id) == made.next_fire for s in (b, c)):
            await asyncio.sleep(0.02)


FROZEN_FIRER = textwrap.dedent("""
    import asyncio, sys
    from datetime import datetime
    from reminders.store import SCHEMA, ReminderStore
    from robot.storage.postgres import PostgresDatabase

    async def main():
        db = PostgresDatabase(sys.argv[1], max_size=1, stall_s=2.0)  # what a bot with lease_s = 4 sets
        db.migrate("reminders", SCHEMA)
        await db.open()

        def claims_then_freezes(tx):
            assert len(ReminderStore.due_sync(tx, datetime.fromisoformat(sys.argv[2]), "text", 10, claim=True)) == 3
            print("holding", flush=True)  # the test stops this process now (SIGSTOP)
            sys.stdin.readline()

        await db.transaction(claims_then_freezes)

    asyncio.run(main())
""")


@pytest.mark.unrehearsed(reason="times a frozen process's transaction against the server's timeout")
async def test_rows_claimed_by_a_process_frozen_mid_firing_are_fired_by_another_once_its_lease_is_up(
        processes: list[ReminderService], pg_url: str) -> None:
    # Not killed (its connection would close and the server roll back at once) but frozen: a paused
    # VM, a stopped process, a cut network. Its row locks go when the server ends its idle transaction.
    a, b, _ = processes
    await a.store.db.run(lambda db: ReminderStore.insert_sync(db, due_rows(3)))
    async with frozen_child(FROZEN_FIRER, pg_url, NOW.isoformat()):
        assert (await b.fire_due(NOW)).delivered == 0  # claimed elsewhere: skipped, not waited for
        async with asyncio.timeout(20):  # b looks again by itself; the rows are free 2 s after the freeze
            while len(await fired(b)) < 3:
                await asyncio.sleep(0.1)
        assert sorted(await fired(b)) == ["提醒 0", "提醒 1", "提醒 2"]
    assert sorted(await fired(a)) == ["提醒 0", "提醒 1", "提醒 2"]  # once: the frozen one never commits
