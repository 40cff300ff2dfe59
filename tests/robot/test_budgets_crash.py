"""PostgreSQL crashes twice while a bot answers a stream of messages: every message is answered
once, and the daily budgets come out even (no hold left behind, none released twice).

Before reservations and settlements waited for the log's flush and a settlement could tell whether
an earlier try was written, most such runs left one or two 24,000-token holds for the rest of the
day, and one released a hold the crash had undone (the budget grew).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.config import Settings
from robot.message import ChatRef
from robot.storage.pgtesting import PgCluster
from robot.testing import MemoryChannel
from tests.robot.conftest import eventually

pytestmark = pytest.mark.timeout(180)
MESSAGES = 600
SECONDS = 6.0


async def test_budgets_come_out_even_after_database_crashes_mid_traffic(own_pg_cluster: PgCluster,
                                                                         tmp_path: Path) -> None:
    channel = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path}, storage={"url": own_pg_cluster.create_database()},
                        limits={"exempt_platforms": ["memory"]})  # (30 a minute per chat: 600 in 6 s would not pass)
    bot = Bot(settings, model=ScriptedModel(lambda req: text("记下了：" + str(req.messages[-1]["content"])[-12:])),
              channels=[channel], plugins=[])
    await bot.start()
    bot.pending.first_s, bot.pending.max_s = 0.1, 0.5
    groups = [ChatRef(platform="memory", chat_id=f"g{i}", kind="group") for i in range(20)]
    begun = time.monotonic()

    async def one(i: int) -> None:
        await asyncio.sleep(i * SECONDS / MESSAGES)
        await channel.inject(f"记一下 第{i}条", chat=groups[i % 20], user=f"u{i % 200}", at_bot=True,
                             message_id=f"m-{i}")

    async def crashes() -> None:
        loop = asyncio.get_running_loop()
        for at, down in ((2.0, 1.0), (4.0, 1.5)):
            await asyncio.sleep(max(0.0, at - (time.monotonic() - begun)))
            await loop.run_in_executor(None, own_pg_cluster.crash)
            await asyncio.sleep(down)
            await loop.run_in_executor(None, own_pg_cluster.restart)

    try:
        await asyncio.gather(crashes(), *(one(i) for i in range(MESSAGES)))
        await channel.wait_sent(MESSAGES, timeout=90)
        await eventually(lambda: not bot.pending, timeout=60)
        holds = await bot.db.run(lambda db: db.query("SELECT scope, holder, tokens FROM budget_holds WHERE tokens != 0"))
        held = await bot.db.run(lambda db: db.query("SELECT scope, held FROM usage_daily WHERE held != 0"))
        used = await bot.db.run(lambda db: db.query("SELECT scope, tokens FROM usage_daily WHERE scope = 'bot'"))
    finally:
        await bot.stop()
    answered = {m.key.split(":")[2] for m in channel.sent}
    assert answered == {f"m-{i}" for i in range(MESSAGES)} and len(channel.sent) == MESSAGES  # each once
    assert holds == [] and held == []
    assert used and used[0]["tokens"] > 0
