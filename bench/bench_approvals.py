"""Approvals benchmark; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_approvals.py [--stored 10000] [--rounds 200]``

With ``--stored`` pending snapshots already in the database (a busy bot's backlog), measures:
1. pause: a model turn calls a ``confirm`` tool; the run stops, the snapshot (HMAC'd state, fresh
   code) is committed and the request is queued — the whole message, from delivery to the reply;
2. resume: ``/approve CODE`` → MAC check, guarded claim, the call runs, the model continues, the
   replies and the end of the snapshot commit together — from delivery to the final reply;
3. the same message with a tool that needs no approval (the baseline the pause is added to).
The model is scripted (no HTTP), so the figures are qunbot's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, Field

from function_calls import (
    Caller,
    ModelRequest,
    ModelResponse,
    RunState,
    ToolCall,
    ToolContext,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.plugin import Plugin
from robot.store import iso
from robot.testing import MemoryChannel

__all__ = ["main"]


class Amount(BaseModel):
    amount: int = Field(ge=0, description="how much")


@tool_function(confirm="admin")
async def transfer(ctx: ToolContext[object], args: Amount) -> ToolResult:
    """Move money (approved by an admin)."""
    return ToolResult(content=f"moved {args.amount}")


@tool_function
async def peek(ctx: ToolContext[object], args: Amount) -> ToolResult:
    """Look (no approval)."""
    return ToolResult(content=f"saw {args.amount}")


def script(req: ModelRequest) -> ModelResponse:
    results = [m for m in req.messages if m["role"] == "tool"]
    if results:
        return text(f"done: {results[-1]['content']}")
    name = "peek" if "peek" in str(req.messages[-1]["content"]) else "transfer"
    return call(name, {"amount": 42})


async def _fill(bot: Bot, n: int) -> None:
    now = bot.clock()
    state = RunState(messages=[{"role": "user", "content": "x" * 400}],
                     pending=[ToolCall(id="c", name="transfer", arguments='{"amount": 1}')]).model_dump_json()
    caller = Caller(platform="memory", user_id="filler").model_dump_json()
    rows = [{"id": uuid.uuid4().hex, "kind": "approval", "approver": "admin", "status": "pending",
             "requester": f"memory:f{i}", "chat": f"memory:group:f{i % 500}", "account": "", "caller": caller,
             "state": state, "origin": "chat", "reply_to": None, "tip": None, "created_at": iso(now),
             "expires_at": iso(now + timedelta(days=1)), "code": f"F{i:07d}"} for i in range(n)]
    for row in rows:
        row["mac"] = bot.approvals.store.mac(row)
    await bot.db.run(lambda db: db["snapshots"].insert_all(rows, batch_size=2000))


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"


async def run(stored: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        channel = MemoryChannel()
        settings = Settings(bot={"data_dir": Path(tmp), "admins": ["memory:admin"]},
                            limits={"user_burst": 100000, "chat_burst": 100000, "user_per_minute": 1e6,
                                    "chat_per_minute": 1e6, "user_daily_tokens": None, "chat_daily_tokens": None})
        bot = Bot(settings, model=ScriptedModel(script), channels=[channel],
                  plugins=[Plugin("b", Toolset("b", [transfer, peek]))])
        await bot.start()
        t0 = time.perf_counter()
        await _fill(bot, stored)
        print(f"stored {stored} pending snapshots in {time.perf_counter() - t0:.2f} s")
        pause, resume, plain = [], [], []
        for i in range(rounds):
            chat = channel.chat(f"g{i % 20}")
            before = len(channel.sent)
            t = time.perf_counter()
            await channel.inject("peek please", at_bot=True, user=f"u{i}", chat=chat)
            await channel.wait_sent(before + 1)
            plain.append(time.perf_counter() - t)
            before = len(channel.sent)
            t = time.perf_counter()
            await channel.inject("move it", at_bot=True, user=f"u{i}", chat=chat)
            sent = await channel.wait_sent(before + 2)  # the request and the approvers' notice
            pause.append(time.perf_counter() - t)
            code = next(m for m in re.finditer(r"/approve ([A-Z0-9]{5})", sent[-1].text + sent[-2].text))
            before = len(channel.sent)
            t = time.perf_counter()
            await channel.inject(f"/approve {code.group(1)}", user="admin", chat=chat)
            await bot.approvals.idle()
            await channel.wait_sent(before + 2)  # "已批准" and the continued answer
            resume.append(time.perf_counter() - t)
        print(f"plain tool message (no approval): {_ms(plain)}")
        print(f"pause (confirm tool -> snapshot -> request): {_ms(pause)}")
        print(f"approve + resume (-> tool -> model -> reply): {_ms(resume)}")
        size = sum(p.stat().st_size for p in Path(tmp).glob("qunbot.sqlite3*"))
        print(f"database with {stored + rounds} snapshots: {size / 1e6:.1f} MB")
        await bot.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args.stored, args.rounds))


if __name__ == "__main__":
    main()
