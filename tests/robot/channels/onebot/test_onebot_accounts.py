"""The bot's own OneBot accounts across processes sharing one PostgreSQL."""

from __future__ import annotations

import asyncio

from robot.channels.onebot.accounts import OwnAccounts
from robot.storage.leases import LeaseKeeper, Leases
from robot.storage.postgres import PostgresDatabase


async def test_an_account_another_process_serves_is_the_bots_own(pg_url: str) -> None:
    # Account 10001 served by process B: its reply, seen by A's account 10002 in the same group, was taken
    # by A for member 10001's words (recorded as such: /forget me left it, the model read it as a member's).
    db = PostgresDatabase(pg_url, max_size=2)
    a, b = LeaseKeeper(Leases(db, ttl_s=30, holder="A")), Leases(db, ttl_s=30, holder="B")
    await db.open()
    try:
        assert await b.acquire("account:onebot:10001")
        own = OwnAccounts(lambda: a)
        own.add("10002")
        assert "10002" in own  # (this process's own, at once; the look-up of the others starts)
        async with asyncio.timeout(5):
            while "10001" not in own:
                await asyncio.sleep(0.01)
        assert "20002" not in own
    finally:
        await db.close()


def test_on_one_sqlite_file_only_this_processs_accounts_count() -> None:
    own = OwnAccounts(lambda: None)
    own.add("10002")
    assert "10002" in own and "10001" not in own
