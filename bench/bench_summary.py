"""Summary coverage and cost at 1k / 10k / 100k messages, with the default settings.

Run: ``.venv/bin/python bench/bench_summary.py [messages ...]`` (default: 1000 10000 100000).
Each window is one busy day-to-week of group chat in which about two thirds of the messages are
stickers, 哈哈 and +1 (as in the review that opened issue #15). The model is a ScriptedModel that
answers every request with a canned text as long as the request's ``max_tokens`` allows (as a
verbose model would), so the figures measure the plugin and its reduce rounds, not an LLM.

Printed per size: messages in the window, how many were read (``max_fetch``), how many were noise,
how many reached the model's map stage (coverage), map / reduce calls, prompt tokens, the largest
request, whether the daily budget (``[limits] user_daily_tokens``, default 200k) cut the window
short, wall time and the longest event-loop stall; then the extractive summary's wall time.
Only retention is raised to hold the whole window; every ``[summary]`` and ``[limits]`` setting is
the default.
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

import summary
from function_calls import Caller, ModelRequest, ModelResponse, ToolContext, estimate_messages
from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.config import Settings
from robot.history import HistoryStore
from robot.message import ChatRef
from robot.storage import Tx

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
CHAT = ChatRef(platform="memory", chat_id="g1", kind="group")
TALK = ["周六下午三点去打球吗？", "我来订场地，体育馆二号场", "看这个 https://example.com/a/very/long/path?with=query",
        "明天8点在东门集合", "这个方案我觉得还可以再改改，尤其是预算那部分", "谁有会议室的钥匙？", "晚上一起吃饭",
        "结论：v2.3 上线推迟到下周四", "@wxid_7 你负责周三前把报价发出来", "收到", "好的，没问题"]
NOISE = ["[动画表情]", "哈哈哈", "+1", "👍", "[图片]", "哈哈", "6666", "嗯"]


def fill(db: Tx, count: int, span: timedelta) -> int:
    """Store ``count`` messages; returns how many are not noise."""
    rng = random.Random(7)
    step = span / count
    meaningful = 0
    with db.atomic():
        for i in range(count):
            user = rng.randrange(30)
            noise = rng.random() < 0.66
            meaningful += not noise
            said = rng.choice(NOISE) if noise else f"{rng.choice(TALK)} #{i}"
            HistoryStore.insert_sync(db, CHAT, f"wxid_{user}", f"成员{user}", said, NOW - span + step * i)
    return meaningful


_ANSWER = ("结论/决定：v2.3 推迟到下周四上线；周会改到周二。待办：成员7 周三前发报价；成员3 订场地。"
           "话题：打球、聚餐、预算。链接：https://example.com/a/very/long/path?with=query ")


def short_answer(request: ModelRequest) -> ModelResponse:
    # As long as a real model's answer at the cap would be, so reduce rounds are counted honestly.
    return text((_ANSWER * 10)[:max(50, (request.max_tokens or 300) - 20)])


async def _heartbeat(gaps: list[float]) -> None:
    """Wakes every millisecond; a long gap means something held the event loop."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def timed(bot: Bot, deps: Any, hours: float) -> tuple[float, float, dict[str, object], str]:
    caller = Caller(platform="memory", user_id="bench", user_name="bench", chat_id="g1", chat_kind="group")
    ctx: ToolContext[Any] = ToolContext(deps=deps, caller=caller, zone=bot.zone, clock=lambda: NOW)
    gaps: list[float] = []
    beat = asyncio.create_task(_heartbeat(gaps))
    await asyncio.sleep(0)
    start = time.perf_counter()
    try:
        result = await summary.summary.invoke(ctx, summary.SummaryArgs(hours=hours))
    finally:
        beat.cancel()
    return time.perf_counter() - start, max(gaps, default=0.0), dict(result.data or {}), result.content or ""


async def run(count: int) -> None:
    span = timedelta(hours=min(160.0, max(20.0, count / 600)))  # ~600 messages an hour at most
    with tempfile.TemporaryDirectory() as tmp:
        model = ScriptedModel(short_answer)
        settings = Settings(bot={"data_dir": Path(tmp)}, history={"max_messages": max(count, 10)})
        bot = Bot(settings, model=model, channels=[], plugins=[summary.plugin], clock=lambda: NOW)
        await bot.start()
        try:
            in_window = await bot.db.run(lambda db: fill(db, count, span))
            deps = bot.deps_for(summary.summary)
            hours = span.total_seconds() / 3600 + 0.1
            wall, stall, data, reply = await timed(bot, deps, hours)
            read = int(str(data["messages"]))
            noise = int(str(data.get("noise", 0)))
            used = int(str(data.get("messages_used", 0)))
            maps = sum(1 for r in model.requests if "聊天记录：" in str(r.messages[-1]["content"]))
            largest = max((estimate_messages(r.messages) for r in model.requests), default=0)
            meaningful = read - noise
            print(f"--- {count:,} messages over {span.total_seconds() / 3600:.0f} h ---")
            print(f"read from history:          {read:,} (max_fetch {deps.settings.max_fetch:,})")
            print(f"noise dropped:              {noise:,}")
            print(f"reached the map stage:      {used:,} of {meaningful:,} meaningful read "
                  f"({100 * used / max(1, meaningful):.0f}%); coverage of the window: {used:,} of {in_window:,} "
                  f"meaningful ({100 * used / max(1, in_window):.0f}%)")
            print(f"model calls:                {data['model_calls']} ({maps} map, {int(str(data['model_calls'])) - maps} reduce)")
            print(f"prompt / completion tokens: {data['prompt_tokens']:,} / {data['completion_tokens']:,}")
            print(f"largest request (tokens):   {largest} (cap {deps.settings.max_request_tokens})")
            cut = "没有总结" in reply
            print(f"budget cut the window:      {'yes: ' + reply.splitlines()[1] if cut else 'no'}")
            print(f"map-reduce wall time:       {wall * 1000:.0f} ms (longest event-loop stall {stall * 1000:.1f} ms)")
            wall_x, stall_x, data_x, _ = await timed(bot, dataclasses.replace(deps, model=None), hours)
            print(f"extractive wall time:       {wall_x * 1000:.0f} ms ({data_x['messages']:,} messages; "
                  f"longest event-loop stall {stall_x * 1000:.1f} ms)")
        finally:
            await bot.stop()


async def main(counts: list[int]) -> None:
    for count in counts:
        await run(count)


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000]))
