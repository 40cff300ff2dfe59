"""PostgreSQL crashes between queueing a reply and sending it: the reply still goes out, once.

qunbot's PostgreSQL commits do not wait for the log's flush, so a crash may undo the last ones.
A reply queued for a message handled once would then be lost with nothing to queue it again: that
unit waits for the flush. The server here flushes such commits only every 10 s (its slowest
``wal_writer_delay``), so a commit that did not wait for it is lost for certain.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.channels.base import ChannelUnavailable, SendReceipt
from robot.config import Settings
from robot.message import OutgoingMessage
from robot.storage.pgtesting import PgCluster
from robot.testing import MemoryChannel

pytestmark = pytest.mark.timeout(120)


class CrashingChannel(MemoryChannel):
    """At its first send the database crashes (and the platform cannot be reached); later sends go."""

    def __init__(self, cluster: PgCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.crashed = False

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if not self.crashed:
            self.crashed = True
            await asyncio.get_running_loop().run_in_executor(None, self.cluster.crash)
            raise ChannelUnavailable("not reachable now")
        return await super().send(message)


@pytest.fixture
def cluster(own_pg_cluster: PgCluster) -> PgCluster:
    """A server of this test's own that flushes commits made without waiting only every 10 s."""
    with psycopg.connect(own_pg_cluster.url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
    return own_pg_cluster


async def test_a_reply_queued_just_before_a_database_crash_is_sent_after_it(cluster: PgCluster,
                                                                           tmp_path: Path) -> None:
    channel = CrashingChannel(cluster)
    settings = Settings(bot={"data_dir": tmp_path}, storage={"url": cluster.create_database()})
    bot = Bot(settings, model=ScriptedModel(lambda req: text("记下了")), channels=[channel], plugins=[])
    await bot.start()
    try:
        await channel.inject("@bot 帮我记一下", at_bot=True, message_id="m1")
        deadline = time.monotonic() + 5
        while not channel.crashed and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert channel.crashed  # the reply was queued, its send began, and the database crashed
        await asyncio.sleep(0.5)
        await asyncio.get_running_loop().run_in_executor(None, cluster.restart)
        sent = await channel.wait_sent(1, timeout=30)
        await asyncio.sleep(1.0)  # a second send would arrive now
    finally:
        await bot.stop()
    assert [m.text for m in sent] == ["记下了"] and len(channel.sent) == 1
