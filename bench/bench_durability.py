"""Durability benchmark: what syncing a confirmed reminder to disk costs (SQLite synchronous FULL vs NORMAL).

    .venv/bin/python bench/bench_durability.py [--count 300] [--users 8] [--dir DIR]

With ``synchronous=NORMAL`` (WAL) a commit returns before the WAL is on disk: a power loss can undo
a reminder the user was already told about. ``[reminders] durable_writes = true`` (the default)
commits creations and deletions with ``FULL``. For each setting this runs, on a real bot with the
reminders plugin, in a directory on the disk under test (``--dir``; default the system temp dir):

1. ``--count`` sequential ``/remind`` commands, timed from injecting the message to the moment the
   reply is committed to the outbox (the answer a person waits for): p50/p99/mean and commands/s.
2. ``--users`` people sending ``/remind`` at the same time: total throughput.
3. Plain committed transactions (one small row) through ``Database.transaction``: the raw cost.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import reminders
from robot.bot import Bot
from robot.config import Settings
from robot.store import Database
from robot.testing import MemoryChannel

ZONE = "Asia/Shanghai"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def remind(count: int, users: int, durable: bool, where: Path) -> None:
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        ch = MemoryChannel()
        bot = Bot(Settings(bot={"data_dir": Path(tmp), "timezone": ZONE},
                           limits={"user_burst": 10**6, "chat_burst": 10**6, "command_burst": 10**6},
                           reminders={"durable_writes": durable, "max_per_user": 10**6, "max_per_chat": 10**6,
                                      "create_per_10min": 10**6}),
                  channels=[ch], plugins=[reminders.plugin])
        await bot.start()
        when = (datetime.now(UTC) + timedelta(days=2)).astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M")
        latencies: list[float] = []
        for i in range(count):
            started = time.perf_counter()
            await ch.inject(f'/remind once "{when}" 喝水第{i}次', user="u1", at_bot=True)  # returns once handled
            latencies.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        per_user = max(1, count // users)

        async def person(u: int) -> None:
            for i in range(per_user):
                await ch.inject(f'/remind once "{when}" 开会{u}-{i}号', user=f"p{u}", at_bot=True)

        await asyncio.gather(*(person(u) for u in range(users)))
        elapsed = time.perf_counter() - started
        stored = await bot.db.run(lambda d: d.execute("SELECT count(*) FROM reminders").fetchone()[0])
        await bot.outbox.flush()
        confirmed = sum(m.text.startswith("好的，已设置提醒") for m in ch.sent)
        assert stored == confirmed == count + per_user * users, (stored, confirmed)
        await bot.stop()
    label = "FULL  " if durable else "NORMAL"
    print(f"[remind {label}] {count} sequential /remind: p50 {statistics.median(latencies):.2f} ms, "
          f"p99 {pct(latencies, 0.99):.2f} ms, mean {statistics.fmean(latencies):.2f} ms "
          f"({1000 / statistics.fmean(latencies):.0f} commands/s)")
    print(f"[remind {label}] {users} people at once: {per_user * users / elapsed:.0f} commands/s")


async def raw(count: int, durable: bool, where: Path) -> None:
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        db = Database(Path(tmp) / "raw.sqlite3")
        await db.open()
        await db.run(lambda d: d.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
        times: list[float] = []
        for i in range(count):
            started = time.perf_counter()
            await db.transaction(lambda d, i=i: d.execute("INSERT INTO t (v) VALUES (?)", [f"row {i}"]),
                                 durable=durable)
            times.append((time.perf_counter() - started) * 1000)
        await db.close()
    label = "FULL  " if durable else "NORMAL"
    print(f"[commit {label}] {count} one-row transactions: p50 {statistics.median(times):.2f} ms, "
          f"p99 {pct(times, 0.99):.2f} ms, mean {statistics.fmean(times):.2f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="a directory on the disk to measure (the bot's data_dir would live there)")
    args = parser.parse_args()
    print(f"disk under test: {args.dir}")
    for durable in (False, True):
        await raw(args.count * 3, durable, args.dir)
    for durable in (False, True):
        await remind(args.count, args.users, durable, args.dir)


if __name__ == "__main__":
    asyncio.run(main())
