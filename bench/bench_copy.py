"""``qunbot copy-db`` speed: a SQLite bot's database with many stored messages into PostgreSQL.

Run: ``.venv/bin/python bench/bench_copy.py [--messages 200000] [--chats 200]`` (starts a throwaway
PostgreSQL cluster). Prints the rows copied, the seconds the whole command took (both bots'
starts included) and rows per second. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from robot import maintenance
from robot.bot import Bot
from robot.config import Settings
from robot.storage import iso
from robot.storage.pgtesting import PgCluster

__all__ = ["main"]


def _settings(data_dir: Path) -> Settings:
    return Settings(bot={"data_dir": data_dir, "plugins": ["reminders", "memory"]})


async def _fill(data_dir: Path, messages: int, chats: int) -> None:
    bot = Bot(_settings(data_dir), channels=[])
    await bot.start()
    try:
        start = datetime.now(UTC) - timedelta(days=1)
        rows = [[f"memory:group:g{i % chats}", f"u{i % 997}", f"成员{i % 997}", f"第 {i} 条消息：今天的会议改到下午三点",
                 iso(start + timedelta(milliseconds=i)), 0, f"m{i}"] for i in range(messages)]
        for at in range(0, len(rows), 10_000):
            chunk = rows[at:at + 10_000]
            await bot.db.run(lambda tx, chunk=chunk: tx.executemany(  # type: ignore[misc]
                "INSERT INTO history (chat, user_id, name, text, ts, from_bot, message_id) VALUES (?,?,?,?,?,?,?)",
                chunk))
    finally:
        await bot.stop()


async def main_async(messages: int, chats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, PgCluster() as pg:
        data = Path(tmp)
        await _fill(data, messages, chats)
        url = str(pg.create_database())
        out = io.StringIO()
        begun = time.perf_counter()
        with contextlib.redirect_stdout(out):
            code = await maintenance.copy_db(_settings(data), url)
        seconds = time.perf_counter() - begun
        copied = int(out.getvalue().split()[1]) if code == 0 else 0
        print(f"copy-db: {messages:,} stored messages over {chats} chats -> {copied:,} rows copied in {seconds:.1f} s "
              f"({copied / seconds:,.0f} rows/s, both bots' starts included); exit code {code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chats", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main_async(args.messages, args.chats))


if __name__ == "__main__":
    main()
