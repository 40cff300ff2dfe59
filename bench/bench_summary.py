"""Summary of 10,000 messages: model calls, largest request, wall time, longest event-loop stall.

Run: ``.venv/bin/python bench/bench_summary.py [messages]``. The model is a ScriptedModel that
answers every request with a short text, so the figures measure the plugin, not an LLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlite_utils

import summary
from function_calls import Caller, ModelRequest, ModelResponse, ToolContext, estimate_messages
from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.config import Settings
from robot.history import HistoryStore
from robot.message import ChatRef
from robot.testing import MemoryChannel
from summary.tools import estimate_cost

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CHAT = ChatRef(platform="memory", chat_id="g1", kind="group")
PHRASES = ["周六下午三点去打球吗？", "收到", "我来订场地", "看这个 https://example.com/a", "明天8点在东门集合",
           "哈哈哈", "这个方案我觉得还可以再改改，尤其是预算那部分", "谁有会议室的钥匙？", "+1", "晚上一起吃饭"]


def fill(db: sqlite_utils.Database, count: int) -> None:
    rng = random.Random(7)
    with db.atomic():
        for i in range(count):
            user = rng.randrange(30)
            name = f"成员{user}" if i < count // 2 or user % 5 else f"新名字{user}"
            at = NOW - timedelta(hours=20) + timedelta(seconds=7 * i)
            HistoryStore.insert_sync(db, CHAT, str(10000 + user), name, f"{rng.choice(PHRASES)} #{i}", at)


def short_answer(request: ModelRequest) -> ModelResponse:
    return text("要点：讨论了打球、订场地和聚餐，约定周六下午三点。")


async def _heartbeat(gaps: list[float]) -> None:
    """Wakes every millisecond; a long gap means something held the event loop."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def timed(bot: Bot, deps: Any) -> tuple[float, float, dict[str, object]]:
    """Wall time, longest event-loop stall, and the tool's data."""
    caller = Caller(platform="memory", user_id="10001", user_name="bench", chat_id="g1", chat_kind="group")
    ctx: ToolContext[Any] = ToolContext(deps=deps, caller=caller, zone=bot.zone, clock=lambda: NOW)
    gaps: list[float] = []
    beat = asyncio.create_task(_heartbeat(gaps))
    await asyncio.sleep(0)
    start = time.perf_counter()
    try:
        result = await summary.summary.invoke(ctx, summary.SummaryArgs(hours=24))
    finally:
        beat.cancel()
    return time.perf_counter() - start, max(gaps, default=0.0), dict(result.data or {})


async def main(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = ScriptedModel(short_answer)
        settings = Settings(bot={"data_dir": Path(tmp)}, history={"max_messages": max(count, 10)},
                            summary={"max_fetch": max(count, 100)})
        bot = Bot(settings, model=model, channels=[MemoryChannel()], plugins=[summary.plugin], clock=lambda: NOW)
        await bot.start()
        try:
            await bot.db.run(lambda db: fill(db, count))
            deps = bot.deps_for(summary.summary)
            wall, stall, data = await timed(bot, deps)
            largest = max(estimate_messages(r.messages) for r in model.requests)
            cfg = deps.settings
            print(f"messages in window:        {data['messages']}")
            print(f"max_request_tokens:        {cfg.max_request_tokens}   max_chunks: {cfg.max_chunks}")
            print(f"chunks needed / used:      {data['chunks']} / {data['chunks_used']} "
                  f"({data['messages_used']} messages summarised)")
            print(f"model calls:               {data['model_calls']} (scripted model saw {len(model.requests)})")
            print(f"largest request (tokens):  {largest} (reported {data['largest_request_tokens']})")
            print(f"prompt / completion tokens: {data['prompt_tokens']} / {data['completion_tokens']}")
            window = await bot.history.since(CHAT, NOW - timedelta(hours=24), limit=cfg.max_fetch)
            spent = int(str(data["prompt_tokens"])) + int(str(data["completion_tokens"]))
            print(f"reserved beforehand:       {estimate_cost(window, cfg)} tokens (spent {spent})")
            print(f"map-reduce wall time:      {wall * 1000:.1f} ms (longest event-loop stall {stall * 1000:.1f} ms)")
            wall_x, stall_x, data_x = await timed(bot, dataclasses.replace(deps, model=None))
            print(f"extractive wall time:      {wall_x * 1000:.1f} ms ({data_x['messages']} messages, mode {data_x['mode']}; "
                  f"longest event-loop stall {stall_x * 1000:.1f} ms)")
        finally:
            await bot.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000))
