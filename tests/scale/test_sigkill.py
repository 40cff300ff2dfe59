"""Three qunbot processes, one PostgreSQL, SIGKILL at random: 1,000 reminders across two minutes.

Each process is the real ``qunbot run`` (a subprocess) with the reminders plugin and one Telegram
bot account served by a fake Bot API on loopback. One of them reaches the database through a
PgBouncer in transaction mode (``listen_url`` direct), as on a host that offers a pooler: a kill
there leaves its transaction to the pooler to end. The account is leased: one process polls and
sends at a time; when it is killed another takes the account over once the lease expires. Every
reminder must fire exactly once (one outbox row, 0 lost, 0 doubled) and reach the chat. A send
cut by SIGKILL after the platform took it but before the row was marked sent is the one window
where a platform without idempotency keys can see a message twice: such a repeat must follow a
kill, and is counted and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reminders.store import Reminder, ReminderStore, new_id
from robot.channels.telegram.testing import FakeBotAPI
from robot.storage.pgtesting import pgbouncer
from robot.storage.postgres import PostgresDatabase

N = 1000
SPREAD_S = 120.0
LEAD_S = 12.0  # time for the three processes to start before the first reminder is due
LEASE_S = 3.0
CHAT = 777
TOKEN = "424242:KILL-test-token"

pytestmark = pytest.mark.timeout(360)


def config(folder: Path, url: str, api: str, listen_url: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "qunbot.toml"
    path.write_text(f"""
[bot]
data_dir = "data"
plugins = ["reminders"]

[storage]
url = "{url}"
listen_url = "{listen_url}"
lease_s = {LEASE_S}
pool_size = 4

[channels.web]
enabled = false

[channels.telegram]
enabled = true
token = "{TOKEN}"
api_base = "{api}"
poll_timeout_s = 1
set_commands = false
typing = false
retry_delay_s = 0.2
backoff_max_s = 1.0
""", "utf-8")
    return path


def spawn(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    qunbot = Path(sys.executable).with_name("qunbot")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen([str(qunbot), "run", "--config", str(cfg), "--log-level", "INFO"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=cfg.parent, env=env)


def reminders(start: datetime) -> list[Reminder]:
    rows = []
    for i in range(N):
        due = start + timedelta(seconds=SPREAD_S * i / N)
        local = due.astimezone(UTC)
        rows.append(Reminder(
            id=new_id(), owner=f"telegram:{1000 + i % 50}", owner_name=f"u{i % 50}",
            chat=f"telegram:private:{CHAT}", type="once", wall=local.strftime("%Y-%m-%d %H:%M:%S"), zone="UTC",
            weekday=None, content=f"kill-{i:04d}", mode="text", created_at=start, updated_at=start,
            next_fire=due, account=TOKEN.split(":")[0]))
    return rows


async def test_three_processes_killed_at_random_lose_and_double_no_reminder(pg_url: str, tmp_path: Path) -> None:
    async with FakeBotAPI(TOKEN, max_hold_s=0.5) as api:
        stack = contextlib.ExitStack()  # the pooler, stopped once the processes are
        # The schema first (what the first process to start would do), then the reminders.
        db = PostgresDatabase(pg_url, max_size=2)
        db.migrate("reminders", ReminderStore.migrations())
        await db.open()
        start = datetime.now(UTC) + timedelta(seconds=LEAD_S)
        rows = reminders(start)
        due = {r.content: r.next_fire for r in rows}
        await db.run(lambda tx: ReminderStore.insert_sync(tx, rows))

        pooler = stack.enter_context(pgbouncer(pg_url, "transaction"))
        cfgs = [config(tmp_path / "p0", pooler, api.url, listen_url=pg_url),
                *(config(tmp_path / f"p{i}", pg_url, api.url) for i in (1, 2))]
        key = os.urandom(32)  # every process sharing the database has the same secret.key (README: Scale out)
        for cfg in cfgs:
            (cfg.parent / "data").mkdir()
            (cfg.parent / "data" / "secret.key").write_bytes(key)
        logs = [tmp_path / f"p{i}.log" for i in range(3)]
        procs = [spawn(cfgs[i], logs[i]) for i in range(3)]
        kills: list[float] = []
        rng = random.Random(11)
        try:
            end = start.timestamp() + SPREAD_S
            while time.time() < end:
                await asyncio.sleep(rng.uniform(6, 14))
                victim = rng.randrange(3)
                procs[victim].send_signal(signal.SIGKILL)
                kills.append(time.time())
                procs[victim].wait()
                await asyncio.sleep(rng.uniform(0.5, 3))
                procs[victim] = spawn(cfgs[victim], logs[victim])
            deadline = time.time() + 4 * LEASE_S + 30
            while time.time() < deadline and len({s.text for s in api.sent}) < N:
                await asyncio.sleep(0.5)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
            stack.close()

        # A sent outbox row keeps no text (the history has it, written with the row: one per outbox row).
        fired = Counter(str(r[0]) for r in await db.run(lambda tx: tx.execute(
            "SELECT text FROM history WHERE chat = ? AND from_bot = 1", [f"telegram:private:{CHAT}"]).fetchall()))
        await db.close()

    def contents(text: str) -> list[str]:  # one message may carry several reminders due together
        return re.findall(r"kill-\d{4}", text)

    outbox = Counter(c for t, n in fired.items() for _ in range(n) for c in contents(t))
    delivered = Counter(c for s in api.sent for c in contents(s.text))
    first_at: dict[str, float] = {}
    for s in api.sent:
        for c in contents(s.text):
            first_at.setdefault(c, s.at)
    late = sorted(first_at[c] - due[c].timestamp() for c in first_at)
    repeats = {c: n for c, n in delivered.items() if n > 1}
    print(f"\n{len(kills)} SIGKILLs; fired {sum(outbox.values())} times for {N} reminders; delivered "
          f"{len(delivered)} distinct, {sum(repeats.values()) - len(repeats)} repeats after a kill; lateness "
          f"p50 {late[len(late) // 2]:.2f}s p99 {late[int(len(late) * 0.99)]:.2f}s max {late[-1]:.2f}s")
    assert len(kills) >= 6
    assert sorted(outbox) == sorted(due) and max(outbox.values()) == 1  # fired once each: 0 lost, 0 doubled
    assert sorted(delivered) == sorted(due), (  # every one reached the chat
        f"missing: {sorted(set(due) - set(delivered))[:10]}; logs in {tmp_path}")
    for c in repeats:  # a repeat only where a send was cut by a kill
        sends = [s.at for s in api.sent if c in contents(s.text)]
        assert any(sends[0] - 1.0 <= k <= sends[-1] for k in kills), c
