"""A process cut off from PostgreSQL, or frozen in the middle of a transaction, fails closed: it
stops serving its accounts and one-process channels before another process may take them over,
its open transaction does not hold the other processes up for longer than its lease, and with the
database down it still stops within seconds.

Real parts: a throwaway PostgreSQL server, a loopback TCP relay that stops relaying without closing
anything (as a cut network does: nothing arrives, nothing is refused) or goes down, a real process
stopped with SIGSTOP, and Telegram's Bot API faked on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import textwrap
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import psycopg
import pytest

from function_calls import Caller
from robot.bot import Bot
from robot.budgets import DailyBudget
from robot.channels.base import Channel
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.storage import SQLiteDatabase, StorageError
from robot.storage.leases import PROCESS_PREFIX, LeaseKeeper, Leases
from robot.storage.postgres import PostgresDatabase
from tests.frozen import frozen_child
from tests.robot.conftest import BotFactory, eventually
from tests.robot.test_accounts_pg import PlaygroundLike, started

pytestmark = pytest.mark.unrehearsed  # times one process against another

BOT_ID = "123456"
ACCOUNT = f"account:telegram:{BOT_ID}"


class Relay:
    """A loopback TCP relay to ``port`` that can stop relaying (:meth:`cut`) with every connection open."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._opened = 0  # connections relayed so far
        self._lost_below = 0  # those numbered lower are silent for good (lose())

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.down()

    async def down(self) -> None:
        """As a database that went down: every connection reset, new ones refused."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # the stuck clients hear a reset now, and give their threads back
            writer.transport.abort()
        await self._server.wait_closed()

    def url(self, url: str) -> str:
        return url.replace(f":{self.target}/", f":{self.port}/")

    def cut(self) -> None:
        self.flowing.clear()

    def mend(self) -> None:
        self.flowing.set()

    def lose(self) -> None:
        """Every connection open now goes silent for good, new ones flow: a NAT or firewall that
        forgot them, or a peer that went away without a word."""
        self._lost_below = self._opened

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError, OSError):  # ends with the relay or the test's loop
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            self._writers += [writer, up_writer]
            number, self._opened = self._opened, self._opened + 1
            await asyncio.gather(self._pump(reader, up_writer, number), self._pump(up_reader, writer, number),
                                 return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while data := await reader.read(65536):
            await self.flowing.wait()  # cut: the bytes go nowhere, and nobody is told
            if number < self._lost_below:
                continue
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.fixture
async def relay(pg_url: str) -> AsyncIterator[Relay]:
    """A relay to the test's PostgreSQL server (use ``relay.url(pg_url)``)."""
    port = urlsplit(pg_url).port
    assert port is not None
    async with Relay(port) as running:
        yield running


def telegram(fake: FakeBotAPI, folder: Path) -> TelegramChannel:
    return TelegramChannel(TelegramSettings(enabled=True, token=fake.token, api_base=fake.url, poll_timeout_s=1,
                                            state_dir=folder / "tg", retry_delay_s=0.05, backoff_max_s=0.1))


async def two_processes(make_bot: BotFactory, pg_url: str, relay: Relay, folder: Path, channel_a: Channel,
                        channel_b: Channel) -> tuple[Bot, Bot]:
    """Bot "processes" A (reaching the database through ``relay``) and B (directly), 3 s leases,
    started in that order."""
    a = await started(make_bot, relay.url(pg_url), folder / "a", "proc-a", channel_a)
    return a, await started(make_bot, pg_url, folder / "b", "proc-b", channel_b)


async def test_a_process_cut_off_from_the_database_stops_polling_before_another_takes_its_account_over(
        make_bot: BotFactory, pg_url: str, relay: Relay, tmp_path: Path) -> None:
    async with FakeBotAPI(f"{BOT_ID}:TEST-token") as fake:
        tg_a, tg_b = telegram(fake, tmp_path / "a"), telegram(fake, tmp_path / "b")
        a, b = await two_processes(make_bot, pg_url, relay, tmp_path, tg_a, tg_b)
        assert tg_a.served == {BOT_ID} and tg_b.served == frozenset()
        polls = len(fake.offsets)
        await eventually(lambda: len(fake.offsets) > polls, timeout=10)

        # A's network to the database goes silent. Its Telegram connection still works, so only
        # its leases can stop it: B takes the account once A's lease expires (3 s after A's last
        # renewal), and A must have stopped polling by then, though its renewal never failed.
        relay.cut()
        cut_at = time.monotonic()
        await eventually(lambda: bool(tg_b.served), timeout=20)  # both change on this loop: one moment
        assert tg_a.served == frozenset(), "A still polled the account when B took it over"
        assert time.monotonic() - cut_at < 10
        polls = len(fake.offsets)
        await eventually(lambda: len(fake.offsets) > polls + 2, timeout=10)  # B polls it now
        assert tg_a.served == frozenset()
        assert await b.leases.leases.holders("account:") == {ACCOUNT: "proc-b"}

        # The network comes back: A's late answers change nothing, B keeps the account.
        relay.mend()
        await asyncio.sleep(2)
        assert tg_a.served == frozenset() and tg_b.served == {BOT_ID}
        assert await a.leases.leases.holders("account:") == {ACCOUNT: "proc-b"}
        await a.stop(flush_timeout_s=0)
        await b.stop(flush_timeout_s=0)


async def test_a_one_process_channel_cut_off_from_the_database_stops_before_another_process_starts_it(
        make_bot: BotFactory, pg_url: str, relay: Relay, tmp_path: Path) -> None:
    web_a, web_b = PlaygroundLike(), PlaygroundLike()  # keep their pages in their process's memory
    a, b = await two_processes(make_bot, pg_url, relay, tmp_path, web_a, web_b)
    assert web_a.running and not web_b.running  # B stands by
    relay.cut()
    await eventually(lambda: web_b.running, timeout=20)
    assert not web_a.running, "A still ran the channel when B started it"
    relay.mend()
    await a.stop(flush_timeout_s=0)
    await b.stop(flush_timeout_s=0)


async def test_a_process_stops_within_seconds_while_the_database_is_down(
        make_bot: BotFactory, pg_url: str, relay: Relay) -> None:
    bot, _ = await make_bot(plugins=[], storage={"url": relay.url(pg_url), "lease_s": 3})
    await relay.down()
    began = time.monotonic()
    # The outbox's flush and its workers get their second each; giving up its claims and leases
    # (an optimisation: they expire anyway) may not wait out the pool's reconnects.
    await asyncio.wait_for(bot.stop(flush_timeout_s=1), 60)
    assert time.monotonic() - began < 10


async def test_a_process_cut_off_from_the_database_stops_and_leaves_no_thread_waiting_on_it(
        make_bot: BotFactory, pg_url: str, relay: Relay) -> None:
    bot, _ = await make_bot(plugins=[], storage={"url": relay.url(pg_url), "lease_s": 3})
    assert isinstance(bot.db, PostgresDatabase) and bot.db._threads is not None
    relay.cut()
    stuck = asyncio.create_task(bot.db.run(lambda tx: tx.execute("SELECT 1").fetchone()))
    await asyncio.sleep(0.5)
    assert not stuck.done()
    threads = set(bot.db._threads._threads)  # type: ignore[attr-defined]
    await asyncio.wait_for(bot.stop(flush_timeout_s=1), 60)
    # Python waits for these at exit: none may wait on the silent database (TCP would give up after
    # a quarter of an hour), while the relay still holds every connection open.
    await eventually(lambda: not any(thread.is_alive() for thread in threads), timeout=10)
    with pytest.raises((psycopg.OperationalError, StorageError)):  # the unit fails, and says so
        await stuck


@dataclass
class Kept:
    """A process's engine and lease keeper, and what the keeper told ``ACCOUNT``'s channel, when."""

    db: PostgresDatabase
    keeper: LeaseKeeper
    changes: list[bool] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def told(self, held: bool) -> None:
        self.changes.append(held)
        self.times.append(time.monotonic())


@contextlib.asynccontextmanager
async def keeping(url: str, ttl_s: float) -> AsyncIterator[Kept]:
    """A process (``proc-a``) holding ``ACCOUNT`` on ``url`` with leases of ``ttl_s``."""
    db = PostgresDatabase(url, max_size=2)
    kept = Kept(db, LeaseKeeper(Leases(db, ttl_s=ttl_s, holder="proc-a")))
    await db.open()
    await kept.keeper.start()
    try:
        assert await kept.keeper.want(ACCOUNT, kept.told)
        yield kept
    finally:
        if kept.keeper._task is not None:  # not stop(): its release may go through a silent connection
            kept.keeper._task.cancel()
        await db.close()


async def test_the_lease_keeper_gives_up_on_time_a_renewal_the_database_leaves_unanswered(
        pg_url: str, relay: Relay) -> None:
    async with keeping(relay.url(pg_url), 3) as kept:
        try:
            await asyncio.sleep(1.2)  # a renewal round or so
            relay.cut()
            cut_at = time.monotonic()
            await eventually(lambda: kept.changes[-1:] == [False], timeout=10)
            lost_after = kept.times[-1] - cut_at
            # Given up 2.5 s after the last renewal began (the cut came after it): before the 3 s lease
            # could expire, and not at the first sign of slowness either.
            assert 1.0 < lost_after < 3.0, lost_after
            assert not kept.keeper.holds(ACCOUNT) and kept.keeper.held == set()
        finally:
            relay.mend()


async def test_a_process_with_a_backlog_of_work_keeps_its_accounts(pg_url: str) -> None:
    """A burst of messages queues far more units than the pool has connections: the renewal must
    not wait behind them. The database answers, so the leases are this process's own and its
    channels keep running (a renewal queued last gave them up, and Telegram polling stopped)."""
    async with keeping(pg_url, 2) as kept:
        def unit() -> asyncio.Future[object]:
            return asyncio.ensure_future(kept.db.run(lambda tx: tx.execute("SELECT pg_sleep(0.05)")))

        began = time.monotonic()
        backlog = [unit() for _ in range(120)]  # 0.05 s each on 2 connections: 3 s of queued work
        while time.monotonic() - began < 4:  # twice the lease, more queued as it drains
            await asyncio.gather(*backlog[:40])
            backlog = backlog[40:] + [unit() for _ in range(40)]
        await asyncio.gather(*backlog)
        assert kept.changes == [True] and kept.keeper.holds(ACCOUNT)
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            row = await (await conn.execute("SELECT holder, expires_at::timestamptz > now() + interval '1 second' "
                                            "FROM leases WHERE name = %s", [ACCOUNT])).fetchone()
        assert row == ("proc-a", True)  # renewed through the burst, not just remembered


async def test_a_process_whose_event_loop_froze_past_its_leases_gives_them_up_and_says_so(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # The database answers at once; this process was the slow one (a paused VM, a long blocking
    # call): by the time it renews, the leases may have been another process's for a while.
    async with keeping(pg_url, 3) as kept:
        await asyncio.sleep(0.2)
        time.sleep(kept.keeper.trust_s + 0.5)  # the event loop frozen past the time they were surely ours
        await eventually(lambda: kept.changes == [True, False], timeout=10)
        assert "came back to renew its leases" in caplog.text
        assert "did not answer" not in caplog.text  # not the database's fault
        await eventually(lambda: kept.changes == [True, False, True], timeout=10)  # taken back, nobody else has it


async def test_a_renewal_given_up_on_does_not_hold_up_the_next_one(pg_url: str, relay: Relay) -> None:
    """The renewal's connection goes silent for good while new ones work (a NAT that forgot it): the
    keeper gives the leases up on time, then takes them back through a new connection, instead of
    queueing every later renewal behind the silent one until TCP gives up on it."""
    async with keeping(relay.url(pg_url), 3) as kept:
        try:
            await asyncio.sleep(1.2)
            relay.lose()
            await eventually(lambda: kept.changes == [True, False], timeout=10)
            await eventually(lambda: kept.changes == [True, False, True], timeout=10)
            assert kept.keeper.holds(ACCOUNT)
        finally:
            await relay.down()  # the silent connections reset: the threads waiting on them end


async def test_a_process_whose_work_no_longer_finishes_lets_its_accounts_go(pg_url: str, relay: Relay) -> None:
    """Every connection goes silent for good (new ones would work): the keeper's fresh connection
    could renew the leases forever while the process's own work hangs on its pool. It stops renewing
    once nothing has finished for as long as it trusts a renewal, so another process takes over."""
    other = PostgresDatabase(pg_url, max_size=1)
    other_leases = Leases(other, ttl_s=3, holder="proc-b")
    await other.open()
    hanging: asyncio.Future[object] | None = None
    try:
        async with keeping(relay.url(pg_url), 3) as kept:
            try:
                relay.lose()
                hanging = asyncio.ensure_future(kept.db.run(lambda tx: tx.execute("SELECT 1")))  # a message's unit
                await eventually(lambda: kept.changes == [True, False], timeout=10)
                await eventually(lambda: other_leases.acquire(ACCOUNT), timeout=10)  # once the lease expired
                await asyncio.sleep(1.5)  # renewal rounds: none takes it back, none gives it up twice
                assert kept.changes == [True, False] and not kept.keeper.holds(ACCOUNT)
                assert not hanging.done()  # the unit still hangs: that was no backlog
            finally:
                await relay.down()  # the silent connections reset; closing the pool ends the unit's retries
        if hanging is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(hanging, 10)
    finally:
        await other.close()


async def test_on_sqlite_a_slow_renewal_stops_nothing(tmp_path: Path) -> None:
    """One process per file: nobody can take a lease over, so a busy writer (a backup, a VACUUM)
    longer than the lease must not stop the channels."""
    db = SQLiteDatabase(tmp_path / "qunbot.sqlite3")
    keeper = LeaseKeeper(Leases(db, ttl_s=1, holder="me"))
    await db.open()
    changes: list[bool] = []
    await keeper.start()
    try:
        assert await keeper.want(ACCOUNT, changes.append)
        await db.run_raw(lambda tx: time.sleep(1.5))  # the writer thread is busy past the lease
        await asyncio.sleep(0.8)  # rounds after it
        assert changes == [True] and keeper.holds(ACCOUNT)
    finally:
        await keeper.stop()
        await db.close()


async def test_on_sqlite_a_failed_renewal_stops_nothing(tmp_path: Path) -> None:
    """A disk error on one renewal must not restart the web playground: one bot process per file
    (qunbot run holds it), so no other process can have taken the lease meanwhile."""
    db = SQLiteDatabase(tmp_path / "qunbot.sqlite3")
    keeper = LeaseKeeper(Leases(db, ttl_s=0.6, holder="me"))
    await db.open()
    changes: list[bool] = []
    renew, failed = keeper.leases.renew, []

    async def once_failing(names: Iterable[str]) -> set[str]:
        if not failed:
            failed.append(True)
            raise sqlite3.OperationalError("disk I/O error")
        return await renew(names)

    await keeper.start()
    try:
        assert await keeper.want(ACCOUNT, changes.append)
        keeper.leases.renew = once_failing  # type: ignore[method-assign]
        await eventually(lambda: len(failed) == 1, timeout=5)
        await asyncio.sleep(0.5)  # rounds after it
        assert changes == [True] and keeper.holds(ACCOUNT)
    finally:
        await keeper.stop()
        await db.close()


FROZEN = textwrap.dedent("""
    import asyncio, sys
    from zoneinfo import ZoneInfo
    from function_calls import Caller
    from robot.budgets import DailyBudget
    from robot.storage.leases import Leases
    from robot.storage.postgres import PostgresDatabase

    class Freezes(PostgresDatabase):
        async def transaction(self, fn, *, durable=False):
            def then_freeze(tx):
                result = fn(tx)
                print("holding", flush=True)  # the test stops this process now (SIGSTOP)
                sys.stdin.readline()  # and lets it go on after SIGCONT with a line
                return result
            return await super().transaction(then_freeze, durable=durable)

    async def main():
        db = Freezes(sys.argv[1], max_size=1, stall_s=float(sys.argv[2]))
        budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=None, chat_tokens=None, bot_tokens=10_000,
                             leases=Leases(db, holder="frozen"))
        await db.open()
        who = Caller(platform="memory", user_id="u9", chat_id="g9", chat_kind="group")
        async with budget.reserve(who, 4000, at_least=1):
            print("never", flush=True)

    asyncio.run(main())
""")


async def test_a_frozen_process_s_transaction_holds_the_shared_budget_no_longer_than_its_lease(
        pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=2, stall_s=3)
    budget = DailyBudget(db, ZoneInfo("UTC"), user_tokens=None, chat_tokens=None, bot_tokens=10_000,
                         leases=Leases(db, holder="alive"))
    await db.open()  # the budget's tables exist before the other process reserves
    await budget.leases.acquire(PROCESS_PREFIX + "alive")
    try:
        async with frozen_child(FROZEN, pg_url, "2") as frozen:
            # It holds the bot-wide row locked, and will never commit nor close its connection. A
            # reservation here waits for it only until the server ends its idle transaction (2 s).
            who = Caller(platform="memory", user_id="u1", chat_id="g1", chat_kind="group")
            began = time.monotonic()
            async with asyncio.timeout(30):
                async with budget.reserve(who, 10_000, at_least=1) as hold:
                    waited = time.monotonic() - began
                    assert hold.held == 10_000  # the frozen process's hold was rolled back: all of it is left
            assert 1.0 < waited < 15, waited
            rows = await db.run(lambda tx: tx.execute("SELECT holder, tokens FROM budget_holds").fetchall())
            assert all(str(holder) != "frozen" for holder, _ in rows)
            # Thawed, the process finds its transaction gone; nothing it did is kept.
            os.kill(frozen.pid, signal.SIGCONT)
            _, err = await asyncio.to_thread(frozen.communicate, "go on\n", timeout=30)
            assert frozen.returncode != 0 and "idle-in-transaction timeout" in err, err[-2000:]
            assert await budget.remaining(who) == 10_000
    finally:
        await db.close()


async def test_a_listen_connection_gone_silent_is_replaced_and_what_it_missed_is_re_read(
        pg_url: str, relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    # A NAT that forgot an idle LISTEN connection raises no error: without asking, the process
    # would never hear another process's notification again (a reminder added or deleted there).
    far, near = PostgresDatabase(relay.url(pg_url), max_size=2), PostgresDatabase(pg_url, max_size=2)
    far.listen_check_s, far.listen_answer_s = 0.3, 3.0  # room for a loaded machine
    heard: list[str] = []
    gaps: list[list[str]] = []
    far.subscribe("reminders", heard.append)
    far.after_gap(lambda: gaps.append(list(heard)))
    await far.open()
    await near.open()
    try:
        await near.transaction(lambda tx: tx.notify("reminders", "before"))
        await eventually(lambda: heard == ["before"], timeout=10)
        await asyncio.sleep(1)  # a few checks of a connection that answers: no gap
        assert gaps == []
        relay.lose()
        await near.transaction(lambda tx: tx.notify("reminders", "unheard"))
        await eventually(lambda: bool(gaps), timeout=15)
        assert gaps == [["before"]]  # the stores re-read what was said meanwhile
        assert "did not answer within 3 s" in caplog.text
        await near.transaction(lambda tx: tx.notify("reminders", "after"))
        await eventually(lambda: "after" in heard, timeout=10)
        assert heard == ["before", "after"] and len(gaps) == 1
    finally:
        await far.close()
        await near.close()


def _sockets_to(port: int, *, besides: frozenset[object] = frozenset()) -> list[socket.socket]:
    """This process's TCP sockets connected to ``port`` but for those at the local addresses
    ``besides`` (duplicates: close them)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            if not str(fd.readlink()).startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd.name)))
            try:
                if (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getpeername()[1] == port
                        and sock.getsockname() not in besides):
                    found.append(sock)
                    continue
            except OSError:
                pass
            sock.close()
    return found


@pytest.mark.parametrize(("query", "idle_s"), [("", 30), ("?keepalives_idle=7", 7)])
async def test_every_connection_to_postgresql_probes_a_peer_that_went_quiet(
        pg_url: str, query: str, idle_s: int) -> None:
    # Keepalives on the pool's, the renewals' and the LISTEN connection alike; the URL's own win.
    port = urlsplit(pg_url).port
    assert port is not None
    db = PostgresDatabase(pg_url + query, max_size=2)
    earlier = _sockets_to(port)  # other tests' connections in this worker, if any are left
    before = frozenset(sock.getsockname() for sock in earlier)
    for sock in earlier:
        sock.close()
    await db.open()
    try:
        await db.run(lambda tx: tx.execute("SELECT 1"))
        await db.run_ahead(lambda tx: tx.execute("SELECT 1"))
        sockets = _sockets_to(port, besides=before)
        try:
            assert len(sockets) >= 3  # pooled, run_ahead's, LISTEN
            for sock in sockets:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle_s
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000
        finally:
            for sock in sockets:
                sock.close()
    finally:
        await db.close()


async def test_a_lease_dropped_while_a_renewal_is_under_way_is_given_up_all_the_same(pg_url: str) -> None:
    """A OneBot socket closed here (it may reconnect to another process) during a slow renewal round: the
    round's upsert landed after drop()'s DELETE and took the lease again, for lease_s, for nobody."""
    a, b = PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)
    mine, theirs = Leases(a, ttl_s=15, holder="A"), Leases(b, ttl_s=15, holder="B")
    keeper = LeaseKeeper(mine)
    await a.open()
    await b.open()
    try:
        await keeper.start()
        assert await keeper.want("account:onebot:1")
        acquire = mine.acquire_sync

        def slowly(tx: object, name: str) -> bool:  # a slow round trip on the renewal connection
            time.sleep(0.5)
            return acquire(tx, name)  # type: ignore[arg-type]

        mine.acquire_sync = slowly  # type: ignore[method-assign]
        renewal = asyncio.create_task(keeper._round())
        await asyncio.sleep(0.1)
        await keeper.drop("account:onebot:1")
        await renewal
        mine.acquire_sync = acquire  # type: ignore[method-assign]
        assert not keeper.holds("account:onebot:1")
        assert await theirs.acquire("account:onebot:1")  # the process it reconnected to serves it at once
    finally:
        await keeper.stop()
        await a.close()
        await b.close()
