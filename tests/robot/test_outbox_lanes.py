"""The outbox's lanes when something is wrong for a while: a retry due later, a write that keeps
failing, an account moving to another process mid-send. None may spin, and none may double a send."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from robot.channels.base import SendFailed, SendReceipt
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.storage.leases import LeaseKeeper, Leases
from robot.storage.postgres import PostgresDatabase
from robot.store import Database
from robot.testing import MemoryChannel

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")


class FailsFirstOnce(MemoryChannel):
    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if message.text == "first" and not getattr(self, "failed", False):
            self.failed = True
            raise SendFailed("timeout")
        return await super().send(message)


def count_calls(obj: object, name: str) -> list[int]:
    """Wrap ``obj``'s async method ``name`` so that its calls are counted: the list's one item."""
    count, real = [0], getattr(obj, name)

    async def counted(*args: Any) -> Any:
        count[0] += 1
        return await real(*args)

    setattr(obj, name, counted)
    return count


async def test_a_chat_waiting_out_a_retry_sleeps_till_then(tmp_path: Path) -> None:
    """Row A waits out a 2 s backoff, row B behind it is due: the chat is listed as due, but its lane
    must not be started again and again (it claimed 1,300 times a second) until A is due."""
    db = Database(tmp_path / "o.sqlite3")
    outbox = Outbox(db, retry_base_s=2.0, retry_max_s=2.0)
    HistoryStore(db)
    await db.open()
    channel = FailsFirstOnce()
    outbox.register(channel)
    claims = count_calls(outbox, "_claim")
    try:
        await outbox.enqueue(OutgoingMessage(key="a", chat=G1, text="first"),
                             OutgoingMessage(key="b", chat=G1, text="second"))
        await outbox.start()
        await asyncio.sleep(1.0)  # inside the backoff
        assert claims[0] <= 3 and channel.sent == []
        async with asyncio.timeout(10):
            while len(channel.sent) < 2:
                await asyncio.sleep(0.05)
        assert [m.text for m in channel.sent] == ["first", "second"]  # in order, once due
    finally:
        await outbox.stop(0.5)
        await db.close()


async def test_a_chat_whose_waiting_rows_are_deleted_leaves_the_worker_idle(tmp_path: Path) -> None:
    """Rows waiting out a retry deleted meanwhile (/forget me all): the chat stayed parked with a time
    past, and the worker read every due row 84 times a second until that chat got another message."""
    db = Database(tmp_path / "o.sqlite3")
    outbox = Outbox(db, retry_base_s=0.2, retry_max_s=0.2)
    HistoryStore(db)
    await db.open()
    outbox.register(FailsFirstOnce())
    scans = count_calls(outbox, "_due_chats")
    try:
        await outbox.enqueue(OutgoingMessage(key="a", chat=G1, text="first"),
                             OutgoingMessage(key="b", chat=G1, text="second"))
        await outbox.start()
        async with asyncio.timeout(5):
            while G1.key not in outbox._parked["memory"]:  # "a" failed once: the chat waits out its retry
                await asyncio.sleep(0.01)
        await db.run(lambda tx: tx.execute("DELETE FROM outbox WHERE status = 'pending'"))  # (privacy's delete)
        await asyncio.sleep(0.4)  # past the retry
        scans[0] = 0
        await asyncio.sleep(0.5)
        assert scans[0] <= 2  # (it read 40 times)
        assert await outbox.pending() == 0
    finally:
        await outbox.stop(0.1)
        await db.close()


async def test_a_write_that_keeps_failing_parks_the_chat_instead_of_spinning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk (SQLite's max_page_count): the claim's write fails every time; the chat is
    retried every park_s with one traceback each, not in a loop of hundreds a second."""
    db = Database(tmp_path / "o.sqlite3")
    outbox = Outbox(db, park_s=2.0)
    HistoryStore(db)
    await db.open()
    outbox.register(MemoryChannel())
    try:
        await outbox.enqueue(*(OutgoingMessage(key=f"k{i:04d}", chat=G1, text="x" * 900) for i in range(32)))
        await db.run_raw(lambda tx: tx.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        pages = await db.run_raw(lambda tx: tx.execute("PRAGMA page_count").fetchone()[0])
        await db.run_raw(lambda tx: tx.execute(f"PRAGMA max_page_count = {pages}").fetchall())
        caplog.set_level(logging.ERROR, "robot.outbox")
        await outbox.start()
        await asyncio.sleep(1.0)
        failures = [r for r in caplog.records if "lane failed" in r.getMessage()]
        assert 1 <= len(failures) <= 2  # (it spun: 347 a second)
    finally:
        await outbox.stop(0.1)
        await db.close()


class Account(MemoryChannel):
    account_leases = True

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        super().__init__()
        self.gate = gate

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if self.gate is not None and message.text == "slow":
            await self.gate.wait()
        return await super().send(message)


async def _process(url: str, holder: str, channel: Account, lease: str) -> tuple[PostgresDatabase, Outbox,
                                                                                   LeaseKeeper]:
    db = PostgresDatabase(url, max_size=4)
    keeper = LeaseKeeper(Leases(db, ttl_s=30, holder=holder))
    HistoryStore(db)
    outbox = Outbox(db, leases=keeper, max_in_flight=1)
    await db.open()
    for name in (f"process:{holder}", lease):
        assert await keeper.leases.acquire(name)
    keeper.held = {f"process:{holder}", lease}
    outbox.register(channel)
    return db, outbox, keeper


async def test_an_account_moving_to_another_process_mid_send_sends_each_row_once(pg_url: str) -> None:
    """Process A is sending row s (slow) and has row x claimed, waiting for its one send slot, when
    it loses the account; B takes it over. A must neither send x when its slot comes nor have s's
    claim released while it sends it: B would send both again."""
    g1, g2 = (ChatRef(platform="memory", chat_id=c, kind="group", account="111") for c in ("g1", "g2"))
    lease, gate = "account:memory:111", asyncio.Event()
    a_channel, b_channel = Account(gate), Account()
    a_db, a_outbox, a_keeper = await _process(pg_url, "A", a_channel, lease)
    b_db = b_outbox = None
    try:
        await a_outbox.enqueue(OutgoingMessage(key="s", chat=g1, text="slow"),
                               OutgoingMessage(key="x", chat=g2, text="x"))
        await a_outbox.start()
        await asyncio.sleep(0.5)  # A sends s (held) and holds x's claim, waiting for the slot
        a_keeper.held.discard(lease)  # A loses the account ...
        await a_db.run(lambda tx: tx.execute("DELETE FROM leases WHERE name = ?", [lease]))
        a_outbox.notify("memory")
        await asyncio.sleep(0.3)  # ... and gives up its claims
        b_db, b_outbox, _ = await _process(pg_url, "B", b_channel, lease)
        await b_outbox.start()
        await asyncio.sleep(1.0)
        gate.set()  # A's send of s ends; its lane for g2 gets the slot
        await asyncio.sleep(1.0)
        a_sent, b_sent = {m.key for m in a_channel.sent}, {m.key for m in b_channel.sent}
        assert not a_sent & b_sent and a_sent | b_sent == {"s", "x"}, (a_sent, b_sent)
    finally:
        await a_outbox.stop(0.2)
        await a_db.close()
        if b_outbox is not None and b_db is not None:
            await b_outbox.stop(0.2)
            await b_db.close()
