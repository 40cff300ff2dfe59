"""SIGKILL while `/remind` is being answered: after a restart and the platform's redelivery the user
has exactly one reminder and exactly one confirmation.

This file is also the worker the tests start (``python test_crash_create.py MODE data out``), as in
test_crash.py: the channel appends every sent message to a JSON-lines file that survives the kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests import warm_python

ROOT = Path(__file__).resolve().parents[2]
MESSAGE_ID = "m-remind-1"


async def _worker(mode: str, data_dir: Path, out: Path, when: str) -> None:
    import reminders
    from robot.bot import Bot
    from robot.channels.base import SendReceipt
    from robot.config import Settings
    from robot.message import Message, OutgoingMessage
    from robot.pipeline import Pipeline
    from robot.testing import MemoryChannel

    class FileChannel(MemoryChannel):
        async def send(self, message: OutgoingMessage) -> SendReceipt:
            if mode.startswith("kill"):  # the peer is slow: nothing is out when the kill comes
                await asyncio.Event().wait()
            with out.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": message.key, "text": message.text}, ensure_ascii=False) + "\n")
            return SendReceipt(platform_message_id=message.key)

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "kill_before_reply":  # the reminder is committed; the pipeline is about to queue the reply
        real_reply = Pipeline.reply

        async def reply(self: Pipeline, message: Message, texts: Sequence[str]) -> None:
            if message.message_id == MESSAGE_ID:
                die()
            await real_reply(self, message, texts)

        Pipeline.reply = reply  # type: ignore[method-assign]
    ch = FileChannel()
    bot = Bot(Settings(bot={"data_dir": data_dir, "timezone": "Asia/Shanghai"}), channels=[ch],
              plugins=[reminders.plugin])
    await bot.start()
    if mode == "restart":  # no redelivery: deliver what is owed and stop
        await asyncio.sleep(0.3)
        await bot.outbox.flush()
        await bot.stop()
        return
    if mode == "kill_after_receipt":  # the message's dedupe row is committed, nothing else happened yet
        bot.approvals.intercept = lambda *args: die()  # type: ignore[assignment,method-assign,return-value]
    await ch.inject(f'/remind once "{when}" 交周报', message_id=MESSAGE_ID, at_bot=True)
    await asyncio.sleep(0.3)
    await bot.outbox.flush()
    await bot.stop()


# The redelivered message is the same text: one instant for every run of a test.
WHEN = (datetime.now(UTC) + timedelta(days=1)).astimezone(ZoneInfo("Asia/Shanghai")).strftime("%Y-%m-%d %H:%M")


def _run(mode: str, data: Path, out: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A process of its own each time (killed, restarted), forked by a Python whose third-party imports
    # are done (tests/warm_python.py): this project's modules are imported afresh by each.
    proc = warm_python.popen([sys.executable, __file__, mode, str(data), str(out), WHEN], cwd=ROOT, env=env)
    try:
        return proc.wait(timeout=60)
    finally:
        proc.kill()  # (a no-op once it has exited)


def _sent(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []


def _reminders(data: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(data / "qunbot.sqlite3") as conn:
        return conn.execute("SELECT content, status FROM reminders").fetchall()


def test_a_reminder_is_never_stored_without_its_confirmation(tmp_path: Path) -> None:
    out = tmp_path / "sent.jsonl"
    assert _run("kill_before_reply", tmp_path, out) == -signal.SIGKILL
    assert _sent(out) == [] and _reminders(tmp_path) == [("交周报", "active")]
    assert _run("restart", tmp_path, out) == 0  # no redelivery: the confirmation was committed with it
    sent = _sent(out)
    assert len(sent) == 1 and sent[0]["text"].startswith("好的，已设置提醒") and MESSAGE_ID in sent[0]["key"], sent
    assert _run("redeliver", tmp_path, out) == 0  # a redelivery makes no second reminder, no second answer
    assert len(_sent(out)) == 1 and _reminders(tmp_path) == [("交周报", "active")]


@pytest.mark.parametrize("mode", ["kill_before_reply", "kill_after_receipt"])
def test_a_kill_while_answering_remind_then_redelivery_leaves_one_reminder_and_one_confirmation(
        tmp_path: Path, mode: str) -> None:
    out = tmp_path / "sent.jsonl"
    assert _run(mode, tmp_path, out) == -signal.SIGKILL
    assert _sent(out) == []
    assert _run("redeliver", tmp_path, out) == 0  # restart; the platform delivers the message again
    sent = _sent(out)
    assert len(sent) == 1 and sent[0]["text"].startswith("好的，已设置提醒") and MESSAGE_ID in sent[0]["key"], sent
    assert _reminders(tmp_path) == [("交周报", "active")]
    assert _run("redeliver", tmp_path, out) == 0  # once answered, a further redelivery changes nothing
    assert len(_sent(out)) == 1


if __name__ == "__main__":
    asyncio.run(_worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]))
