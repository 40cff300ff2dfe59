"""Daily budget cost per model call; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_budgets.py [--calls 2000] [--users 50]``

One model call's budget work is: reserve (checked UPDATEs), remaining (a read), charge (record
and release part), and the close (release the rest). Measured with ``--calls`` concurrent calls
over ``--users`` people: with caps on SQLite, on PostgreSQL (one process, then two processes
sharing the database), and with no cap configured (no database work at all).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

from function_calls import Caller, Usage
from robot.budgets import DailyBudget
from robot.storage import Engine, SQLiteDatabase
from robot.storage.leases import PROCESS_PREFIX, Leases
from robot.storage.pgtesting import PgCluster
from robot.storage.postgres import PostgresDatabase


async def call(budget: DailyBudget, who: Caller) -> None:
    async with budget.reserve(who, 24_000, at_least=1):
        await budget.remaining(who)
        await budget.charge(who, Usage(prompt_tokens=300, completion_tokens=50, requests=1))


async def measure(engines: list[Engine], calls: int, users: int, capped: bool) -> float:
    caps = 10**12 if capped else None
    budgets = [DailyBudget(db, ZoneInfo("UTC"), user_tokens=caps, chat_tokens=caps,
                           leases=Leases(db, holder=f"bench:{i}")) for i, db in enumerate(engines)]
    for db in engines:
        await db.open()
    for budget in budgets:
        await budget.leases.acquire(PROCESS_PREFIX + budget.leases.holder)
    who = [Caller(platform="bench", user_id=f"u{i}", chat_id=f"g{i % 10}", chat_kind="group") for i in range(users)]
    start = time.perf_counter()
    await asyncio.gather(*(call(budgets[i % len(budgets)], who[i % users]) for i in range(calls)))
    wall = time.perf_counter() - start
    for db in engines:
        await db.close()
    return calls / wall


async def main_async(args: argparse.Namespace) -> None:
    n, users = args.calls, args.users
    print(f"budget work of {n} concurrent model calls over {users} people (reserve, remaining, charge, close)")
    with tempfile.TemporaryDirectory() as tmp:
        rate = await measure([SQLiteDatabase(Path(tmp) / "a.sqlite3")], n, users, capped=False)
        print(f"   no cap configured:           {rate:,.0f} calls/s")
        rate = await measure([SQLiteDatabase(Path(tmp) / "b.sqlite3")], n, users, capped=True)
        print(f"   capped, SQLite:              {rate:,.0f} calls/s")
    with PgCluster() as pg:
        rate = await measure([PostgresDatabase(pg.create_database(), max_size=8)], n, users, capped=True)
        print(f"   capped, PostgreSQL, 1 process: {rate:,.0f} calls/s")
        url = pg.create_database()
        rate = await measure([PostgresDatabase(url, max_size=8), PostgresDatabase(url, max_size=8)], n, users,
                             capped=True)
        print(f"   capped, PostgreSQL, 2 processes' engines in one: {rate:,.0f} calls/s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--users", type=int, default=50)
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
