"""Robot core benchmark; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_robot.py [--messages 2000] [--chats 50] [--slow-chats 500] [--http-chats 200]``

1. Throughput of the whole pipeline (dedupe, record, gate, rate limit, route, tool, outbox, send)
   with a scripted model: ``--messages`` addressed messages over ``--chats`` group chats, each
   answered by an action tool; then the same as ``/commands`` with no LLM. Measured from the first
   delivery to the last ``channel.send``.
2. Concurrency: ``--slow-chats`` chats asking at once a model that takes 1 s per call (the goal
   is close to 1 s of wall time, not N seconds); then ``--http-chats`` chats with the real
   ``OpenAIChatModel`` (streaming, over loopback HTTP) against ``FakeOpenAIServer`` with ``Delay(1.0)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, Field

from function_calls import (
    ChatModel,
    ModelRequest,
    ModelResponse,
    OpenAIChatModel,
    ToolContext,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import Delay, FakeOpenAIServer, Reply, ScriptedModel, call, text
from robot.bot import Bot
from robot.channels.base import SendReceipt
from robot.config import Settings
from robot.message import ChatRef, OutgoingMessage
from robot.plugin import Plugin
from robot.testing import MemoryChannel

__all__ = ["main"]


class NoteArgs(BaseModel):
    text: str = Field(description="what to note")


@tool_function(aliases=["n"])
async def note(ctx: ToolContext[object], args: NoteArgs) -> ToolResult:
    """Take a note."""
    return ToolResult.reply(f"noted: {args.text}")


class TimedChannel(MemoryChannel):
    """A memory channel that notes when each send happened."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: list[float] = []

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        receipt = await super().send(message)
        self.sent_at.append(time.perf_counter())
        return receipt


def settings(data_dir: Path) -> Settings:
    big = 10**9
    return Settings(bot={"data_dir": data_dir}, limits={
        "user_burst": big, "user_per_minute": big, "chat_burst": big, "chat_per_minute": big,
        "user_daily_tokens": None, "chat_daily_tokens": None})


async def run(model: ChatModel | None, count: int, chats: int, say: str, *, users_per_chat: int = 20
              ) -> tuple[float, float, int]:
    """Deliver ``count`` messages at once; returns (wall seconds, p50 latency, sent)."""
    with tempfile.TemporaryDirectory() as tmp:
        channel = TimedChannel()
        bot = Bot(settings(Path(tmp)), model=model, channels=[channel],
                  plugins=[Plugin("bench", Toolset("bench", [note]))])
        await bot.start()
        groups = [ChatRef(platform="memory", chat_id=f"g{i}", kind="group") for i in range(chats)]
        begun: dict[str, float] = {}

        async def one(i: int) -> None:
            chat = groups[i % chats]
            begun[f"memory:{chat.chat_id}:bench-{i}:0"] = time.perf_counter()
            await channel.inject(say.format(i=i), chat=chat, user=f"u{i % users_per_chat}", at_bot=True,
                                 message_id=f"bench-{i}")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        await channel.wait_sent(count, timeout=600)
        wall = channel.sent_at[-1] - start
        latencies = [at - begun[m.key] for m, at in zip(channel.sent, channel.sent_at, strict=True)]
        await bot.stop()
        return wall, statistics.median(latencies), len(channel.sent)


def scripted_action() -> ScriptedModel:
    return ScriptedModel(lambda req: call("note", {"text": str(req.messages[-1]["content"])}))


def slow_model() -> ScriptedModel:
    async def answer(req: ModelRequest) -> ModelResponse:
        await asyncio.sleep(1.0)
        return text("done")

    return ScriptedModel(answer)


async def main_async(args: argparse.Namespace) -> None:
    n, chats = args.messages, args.chats
    print(f"1. pipeline throughput: {n} addressed messages over {chats} group chats, delivered at once")
    wall, p50, sent = await run(scripted_action(), n, chats, "记一下 第{i}条")
    print(f"   LLM path (ScriptedModel -> action tool): {sent} replies in {wall:.2f} s = {sent / wall:,.0f} msg/s; "
          f"median latency {p50 * 1000:.0f} ms")
    wall, p50, sent = await run(None, n, chats, "/n 第{i}条")
    print(f"   /command path (no LLM):                  {sent} replies in {wall:.2f} s = {sent / wall:,.0f} msg/s; "
          f"median latency {p50 * 1000:.0f} ms")

    k = args.slow_chats
    print(f"2. concurrency: {k} chats ask at once; the model takes 1 s per call")
    wall, _, sent = await run(slow_model(), k, k, "第{i}个问题", users_per_chat=k)
    print(f"   ScriptedModel sleeping 1 s: {sent} replies, wall {wall:.2f} s (serial would be {k} s)")

    h = args.http_chats
    async with FakeOpenAIServer(responder=lambda body: Delay(1.0, Reply("done"))) as server:
        for stream in (True, False):
            wall, sent = await http_run(server.base_url, h, stream)
            print(f"   OpenAIChatModel (stream={stream}) vs FakeOpenAIServer Delay(1.0), {h} chats, one process: "
                  f"{sent} replies, wall {wall:.2f} s")
    async with child_server() as base_url:
        wall, sent = await http_run(base_url, h, True)
        print(f"   the same (stream=True), fake server in a child process listening with backlog 1024: "
              f"{sent} replies, wall {wall:.2f} s")


async def http_run(base_url: str, chats: int, stream: bool) -> tuple[float, int]:
    model = OpenAIChatModel(model="fake-model", base_url=base_url, api_key="bench", stream=stream)
    wall, _, sent = await run(model, chats, chats, "第{i}个问题", users_per_chat=chats)
    await model.aclose()
    return wall, sent


# aiohttp's TCPSite listens with backlog=128: a burst of more new connections than that overflows
# the accept queue, and the dropped handshakes come back only with the client's 1 s SYN retry.
_CHILD = """
import asyncio
from aiohttp import web
from function_calls.testing import Delay, FakeOpenAIServer, Reply

_site = web.TCPSite.__init__
web.TCPSite.__init__ = lambda self, *a, **k: _site(self, *a, **{**k, "backlog": 1024})

async def main():
    async with FakeOpenAIServer(responder=lambda body: Delay(1.0, Reply("done"))) as server:
        print(server.base_url, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def child_server() -> AsyncIterator[str]:
    """A FakeOpenAIServer in its own process, so its CPU is not the bot's."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield (await proc.stdout.readline()).decode().strip()
    finally:
        proc.kill()
        await proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--slow-chats", type=int, default=500)
    parser.add_argument("--http-chats", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
