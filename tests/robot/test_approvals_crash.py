"""SIGKILL between the request and the approval: after a restart the approved call runs once.

This file is also the worker the test starts (``python test_approvals_crash.py request|approve``):
a bot whose channel appends every sent message, and whose risky tool appends every run, to files
that survive the kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from function_calls import ModelRequest, ModelResponse, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text

ROOT = Path(__file__).resolve().parents[2]


class PayArgs(BaseModel):
    amount: int = Field(ge=0, description="how much")


@tool_function(confirm="admin")
async def pay(ctx: ToolContext[Path], args: PayArgs) -> ToolResult:
    """Pay (an admin approves)."""
    with (ctx.deps / "runs.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"amount": args.amount}) + "\n")
    return ToolResult(content=f"paid {args.amount}")


async def _worker(mode: str, data_dir: Path, code: str) -> None:
    from robot.bot import Bot
    from robot.channels.base import SendReceipt
    from robot.config import Settings
    from robot.message import OutgoingMessage
    from robot.plugin import Plugin
    from robot.testing import MemoryChannel

    async def setup(bot: Bot) -> Path:
        return data_dir

    class FileChannel(MemoryChannel):
        async def send(self, message: OutgoingMessage) -> SendReceipt:
            with (data_dir / "sent.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": message.key, "text": message.text}, ensure_ascii=False) + "\n")
            return await super().send(message)

    def script(req: ModelRequest) -> ModelResponse:
        results = [m for m in req.messages if m["role"] == "tool"]
        return text(f"done: {results[-1]['content']}") if results else call("pay", {"amount": 42})

    settings = Settings(bot={"data_dir": data_dir, "admins": ["memory:9"]})
    channel = FileChannel()
    bot = Bot(settings, model=ScriptedModel(script), channels=[channel],
              plugins=[Plugin("pay", Toolset("pay", [pay]), setup=setup)])
    await bot.start()
    if mode == "request":
        await channel.inject("pay 42", at_bot=True, user="u1", message_id="req-1")
        await channel.wait_sent(1)
        found = re.search(r"/approve ([A-Z0-9]{5})", channel.sent[0].text)
        print(f"READY {found.group(1) if found else '-'}", flush=True)
        await asyncio.sleep(30)  # the test kills us here
    else:
        await channel.inject(f"/approve {code}", user="9", message_id=f"approve-{os.getpid()}")
        await bot.approvals.idle()
        await bot.outbox.flush()
        await bot.stop()


def _run(mode: str, data: Path, code: str = "-") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, __file__, mode, str(data), code], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text("utf-8").splitlines()] if path.exists() else []


@pytest.mark.unrehearsed(reason="its bots are child processes: a rehearsal in this process reaches none of their units")
def test_killed_after_the_request_the_approval_after_restart_runs_the_call_once(tmp_path: Path) -> None:
    proc = _run("request", tmp_path)
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready and ready[0] == "READY" and len(ready[1]) == 5, ready
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert _lines(tmp_path / "runs.jsonl") == []
    for _ in range(2):  # approved after the restart, then approved again in a third process
        assert _run("approve", tmp_path, ready[1]).wait(timeout=60) == 0
    assert _lines(tmp_path / "runs.jsonl") == [{"amount": 42}]
    texts = [str(m["text"]) for m in _lines(tmp_path / "sent.jsonl")]
    assert texts.count("done: paid 42") == 1 and any("执行过" in t for t in texts)


if __name__ == "__main__":
    asyncio.run(_worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3]))
