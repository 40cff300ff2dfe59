"""PostgreSQL crashes while reminders fire: after each restart every reminder reaches its chat once.

A crash (an immediate shutdown: every connection cut, crash recovery at the next start) loses the
server's last commits, which qunbot makes without waiting for the log's flush: a firing, or the
mark of a message already delivered, may be undone. The bot keeps running through it; the rows
come back as due or pending, and what was delivered already must not be delivered again.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import reminders
from reminders.store import Reminder, ReminderStore, new_id
from robot.bot import Bot
from robot.channels.base import SendReceipt
from robot.config import Settings
from robot.message import OutgoingMessage
from robot.storage.pgtesting import PgCluster
from robot.testing import MemoryChannel

ZONE = "Asia/Shanghai"
N = 500
SPREAD_S = 10.0
CRASHES = ((2.5, 1.5), (6.0, 2.0))  # (seconds after the first is due, seconds down)

pytestmark = pytest.mark.timeout(180)


class Recording(MemoryChannel):
    """Every reminder number each send carries (a chat's reminders due together share a message)."""

    def __init__(self) -> None:
        super().__init__(platform="memory")
        self.delivered: list[str] = []

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        self.delivered += re.findall(r"提醒 (\d+)", message.text)
        return await super().send(message)


@pytest.mark.unrehearsed(reason="two server crashes (15 s); the firing units it runs are rehearsed by test_firing's and "
                               "test_processes' tests")
async def test_reminders_fire_once_each_across_two_database_crashes(own_pg_cluster: PgCluster,
                                                                     tmp_path: Path) -> None:
    cluster = own_pg_cluster
    channel = Recording()
    settings = Settings(bot={"data_dir": tmp_path, "timezone": ZONE}, storage={"url": cluster.create_database()},
                        reminders={"max_per_user": 10**6, "max_per_chat": 10**6})
    bot = Bot(settings, channels=[channel], plugins=[reminders.plugin])
    await bot.start()
    try:
        now = datetime.now(UTC)
        first = (now + timedelta(seconds=3)).replace(microsecond=0)
        dues = [first + timedelta(seconds=SPREAD_S * i / N) for i in range(N)]
        rows = [Reminder(id=new_id(), owner=f"memory:u{i}", owner_name=f"u{i}", chat=f"memory:group:g{i % 20}",
                         type="once", wall=due.astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S"), zone=ZONE,
                         weekday=None, content=f"提醒 {i}", mode="text", created_at=now, updated_at=now, next_fire=due)
                for i, due in enumerate(dues)]
        await bot.db.run(lambda tx: ReminderStore.insert_sync(tx, rows))
        deps = bot.deps_for(reminders.reminder_set)
        assert isinstance(deps, reminders.ReminderDeps)
        await deps.service.arm_window()
        loop = asyncio.get_running_loop()
        for at, down in CRASHES:
            await asyncio.sleep(max(0.0, first.timestamp() + at - time.time()))
            await loop.run_in_executor(None, cluster.crash)
            await asyncio.sleep(down)
            await loop.run_in_executor(None, cluster.restart)
        deadline = time.monotonic() + SPREAD_S + 60
        while len(set(channel.delivered)) < N and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)  # a second delivery would arrive now
        statuses = await bot.db.run(lambda tx: tx.execute("SELECT status, count(*) FROM outbox GROUP BY status")
                                    .fetchall())
    finally:
        await bot.stop()
    counts = Counter(channel.delivered)
    assert sorted(counts, key=int) == [str(i) for i in range(N)]  # none lost
    assert {n: c for n, c in counts.items() if c > 1} == {}  # none delivered twice
    assert {status for status, _ in statuses} == {"sent"}  # every row marked, none left to send again
