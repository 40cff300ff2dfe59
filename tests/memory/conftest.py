"""A bot with the summary and memory plugins on a MemoryChannel, with a settable clock."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import memory
import summary
from robot import Tx
from robot.bot import Bot
from robot.config import Settings
from robot.storage.sqlite import SQLiteTx
from robot.testing import MemoryChannel

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def raw_tx(request: pytest.FixtureRequest) -> Iterator[Tx]:
    """A bare transaction (no engine) on each kind of database, the memory schema applied; rolled back after."""
    if request.param == "sqlite":
        conn = sqlite3.connect(":memory:")
        yield SQLiteTx(conn)
        conn.close()
        return
    import psycopg

    from robot.storage.postgres import PostgresTx

    with psycopg.connect(request.getfixturevalue("pg_url")) as pg:
        yield PostgresTx(pg)
        pg.rollback()


@asynccontextmanager
async def running(tmp_path: Path, model: Any = None, clock: Clock | None = None,
                  **sections: Any) -> AsyncIterator[tuple[Bot, MemoryChannel]]:
    clock = clock or Clock()
    ch = MemoryChannel(clock=clock)
    sections["limits"] = {"user_burst": 100, "chat_burst": 100, **sections.get("limits", {})}
    bot_section = {"data_dir": tmp_path, "admins": ["memory:boss"], **sections.pop("bot", {})}
    settings = Settings(bot=bot_section, **sections)
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin, memory.plugin], clock=clock)
    await bot.start()
    try:
        yield bot, ch
    finally:
        await bot.stop()


async def ask(ch: MemoryChannel, text: str, **kw: Any) -> str:
    """Inject a message and return the bot's reply to it."""
    before = len(ch.sent)
    await ch.inject(text, **kw)
    sent = await ch.wait_sent(before + 1)
    return sent[before].text
