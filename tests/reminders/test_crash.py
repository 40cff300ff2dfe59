"""SIGKILL at the worst moments: a reminder is delivered exactly once after a restart.

This file is also the worker the tests start (``python test_crash.py create|run ...``): a bot
whose channel appends every sent message to a JSON-lines file, the observable that survives a kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests import warm_python
from tests.warm_python import WarmProcess

ROOT = Path(__file__).resolve().parents[2]
CONTENT = "崩溃测试"


# --- the worker ----------------------------------------------------------------------------------
async def _worker(mode: str, data_dir: Path, out: Path, delay_s: float) -> None:
    import reminders
    from function_calls import Caller
    from reminders.schedule import parse_schedule
    from reminders.tools import ReminderDeps
    from robot.bot import Bot
    from robot.channels.base import SendReceipt
    from robot.config import Settings
    from robot.message import OutgoingMessage
    from robot.testing import MemoryChannel

    class FileChannel(MemoryChannel):
        async def send(self, message: OutgoingMessage) -> SendReceipt:
            line = json.dumps({"key": message.key, "text": message.text, "mention": list(message.mention)},
                              ensure_ascii=False)
            with out.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            return SendReceipt(platform_message_id=message.key)

    bot = Bot(Settings(bot={"data_dir": data_dir}), channels=[FileChannel()], plugins=[reminders.plugin])
    await bot.start()
    if mode == "create":
        deps = bot.deps_for(reminders.reminder_set)
        assert isinstance(deps, ReminderDeps)
        due = (datetime.now(UTC) + timedelta(seconds=delay_s + 1)).replace(microsecond=0)  # >= now + delay
        wall = due.astimezone(bot.zone).strftime("%Y-%m-%d %H:%M:%S")
        caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group")
        made = await deps.service.create(caller, parse_schedule("once", wall, bot.zone.key, None), CONTENT, "text")
        print(f"READY {made.id} {due.isoformat()}", flush=True)
        await asyncio.sleep(30)  # the test kills us (or the fire path does)
    else:  # run: deliver what is owed, linger to expose any duplicate, stop cleanly
        await asyncio.sleep(delay_s)
        await bot.outbox.flush()
        await bot.stop()


# --- the tests -----------------------------------------------------------------------------------
def _spawn(mode: str, data: Path, out: Path, delay_s: float, crash_at: str | None = None) -> WarmProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("QUNBOT_REMINDERS_CRASH_AT", None)
    if crash_at:
        env["QUNBOT_REMINDERS_CRASH_AT"] = crash_at
    # A process of its own each time (killed, restarted), forked by a Python whose third-party imports
    # are done (tests/warm_python.py): this project's modules are imported afresh by each.
    return warm_python.popen([sys.executable, __file__, mode, str(data), str(out), str(delay_s)], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, text=True)


def _create(data: Path, out: Path, delay_s: float, crash_at: str | None = None) -> tuple[WarmProcess, str, datetime]:
    proc = _spawn("create", data, out, delay_s, crash_at)
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready and ready[0] == "READY", ready
    return proc, ready[1], datetime.fromisoformat(ready[2])


def _restart(data: Path, out: Path, linger_s: float = 0.5) -> None:
    proc = _spawn("run", data, out, linger_s)
    assert proc.wait(timeout=30) == 0


def _delivered(out: Path) -> list[dict[str, object]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _query(data: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(data / "qunbot.sqlite3") as conn:
        return conn.execute(sql).fetchall()


def _expected_key(rid: str, due: datetime) -> str:
    return f"rem:{rid}:{due.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


def test_a_reminder_due_while_the_bot_was_killed_fires_once_after_restart(tmp_path: Path) -> None:
    out = tmp_path / "sent.jsonl"
    proc, rid, due = _create(tmp_path, out, delay_s=0.3)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.2)
    assert _delivered(out) == []
    _restart(tmp_path, out)
    assert [(m["key"], m["text"], m["mention"]) for m in _delivered(out)] == [
        (_expected_key(rid, due), f"⏰ 提醒：{CONTENT}", ["u1"])]


@pytest.mark.parametrize("crash_at", ["after_commit", "before_commit"])
def test_a_reminder_being_fired_at_the_kill_is_neither_lost_nor_doubled(tmp_path: Path, crash_at: str) -> None:
    out = tmp_path / "sent.jsonl"
    proc, rid, due = _create(tmp_path, out, delay_s=0.05, crash_at=crash_at)
    assert proc.wait(timeout=15) == -signal.SIGKILL  # the fire path killed itself
    assert _delivered(out) == []
    queued = _query(tmp_path, f"SELECT status FROM outbox WHERE key LIKE 'rem:{rid}:%'")
    state = _query(tmp_path, f"SELECT status FROM reminders WHERE id = '{rid}'")
    if crash_at == "after_commit":  # committed together: the message waits in the outbox
        assert (queued, state) == ([("pending",)], [("done",)])
    else:  # rolled back together: the reminder is still due
        assert (queued, state) == ([], [("active",)])
    _restart(tmp_path, out)
    assert [(m["key"], m["text"]) for m in _delivered(out)] == [(_expected_key(rid, due), f"⏰ 提醒：{CONTENT}")]
    assert _query(tmp_path, f"SELECT status FROM outbox WHERE key LIKE 'rem:{rid}:%'") == [("sent",)]


if __name__ == "__main__":
    asyncio.run(_worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])))
