"""Polling channels against their loopback fakes; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_channels.py [--messages 2000] [--users 50] [--rounds 200]``

For each channel (personal WeChat against ``FakeILinkServer``, Telegram against ``FakeBotAPI``):

1. Receive: ``--messages`` queued on the fake, delivered to a counting sink (channel alone).
2. Through the bot: ``--messages`` private messages from ``--users`` users, each answered by a
   scripted model; from the first injection until the fake has accepted every reply
   (poll, convert, dedupe, record, gate, model, outbox, ``sendmessage`` / ``sendMessage``).
3. Long-poll round trip: one message injected while the poll is held open, timed until the sink
   has it; ``--rounds`` times. The overhead is what it costs beyond an idle HTTP request.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.channels.base import Channel
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.channels.weixin import WeixinAccount, WeixinApi, WeixinChannel, WeixinSettings, WeixinState
from robot.channels.weixin.testing import FakeILinkServer
from robot.config import Settings
from robot.message import Message

__all__ = ["main"]

TOKEN = "bench-token"


def _weixin(tmp: Path, fake: FakeILinkServer) -> WeixinChannel:
    WeixinState(tmp / "wx").save_account_sync(WeixinAccount(
        bot_id="bench@im.bot", bot_token=SecretStr(TOKEN), base_url=fake.url, saved_at=datetime.now(UTC)))
    return WeixinChannel(WeixinSettings(enabled=True, state_dir=tmp / "wx", typing=False))


async def _until(cond: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError("bench did not finish")
        await asyncio.sleep(0.002)


async def weixin_receive(n: int, users: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeILinkServer(hold_s=1.0) as fake:
            fake.add_bot(TOKEN, "bench@im.bot")
            got: list[Message] = []

            async def sink(message: Message) -> None:
                got.append(message)

            channel = _weixin(Path(tmp), fake)
            channel.bind(sink)
            await channel.start()
            start = time.perf_counter()
            for i in range(n):
                fake.inject(TOKEN, f"user{i % users}@im.wechat", text=f"消息 {i}")
                if i % 50 == 49:
                    await asyncio.sleep(0)  # let polls interleave with arrivals, as in life
            await _until(lambda: len(got) >= n)
            elapsed = time.perf_counter() - start
            await channel.stop()
    return n / elapsed


async def weixin_bot(n: int, users: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeILinkServer(hold_s=1.0) as fake:
            fake.add_bot(TOKEN, "bench@im.bot")
            bot = _bot(tmp, _weixin(Path(tmp), fake))
            await bot.start()
            start = time.perf_counter()
            for i in range(n):
                fake.inject(TOKEN, f"user{i % users}@im.wechat", text=f"问题 {i}")
                if i % 50 == 49:
                    await asyncio.sleep(0)
            await _until(lambda: len(fake.sent) >= n)
            elapsed = time.perf_counter() - start
            _check_answers([s.text for s in fake.sent], n)
            await bot.stop()
    return n / elapsed


def _check_answers(texts: list[str], n: int) -> None:
    answered = sum(t == "收到" for t in texts)
    if answered != n:  # a limit or budget answered instead of the model: the figure would mislead
        print(f"  warning: only {answered} of {n} replies came from the model")


async def weixin_round_trip(rounds: int) -> tuple[float, float, float]:
    """(median inject-to-delivery ms, p95 ms, median idle HTTP round trip ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeILinkServer(hold_s=30.0) as fake:
            fake.add_bot(TOKEN, "bench@im.bot")
            arrived: asyncio.Queue[float] = asyncio.Queue()

            async def sink(message: Message) -> None:
                arrived.put_nowait(time.perf_counter())

            channel = _weixin(Path(tmp), fake)
            channel.bind(sink)
            await channel.start()
            await asyncio.sleep(0.1)
            trips: list[float] = []
            for i in range(rounds):
                await asyncio.sleep(0.005)  # the poller is back in its long poll
                sent = time.perf_counter()
                fake.inject(TOKEN, "rt@im.wechat", text=f"往返 {i}")
                trips.append((await arrived.get() - sent) * 1000)
            await channel.stop()
            base = await _idle_http(fake.url, rounds)
    trips.sort()
    return statistics.median(trips), trips[int(len(trips) * 0.95) - 1], base


async def _idle_http(url: str, rounds: int) -> float:
    async with aiohttp.ClientSession() as session:
        api = WeixinApi(session, url, TOKEN)
        times: list[float] = []
        for _ in range(rounds):
            start = time.perf_counter()
            await api.notify(start=True)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _telegram(tmp: Path, fake: FakeBotAPI) -> TelegramChannel:
    return TelegramChannel(TelegramSettings(enabled=True, token=fake.token, api_base=fake.url, poll_timeout_s=30,
                                            state_dir=tmp / "tg", typing=False, set_commands=False))


def _bot(tmp: str, channel: Channel) -> Bot:
    # No rate limits or token budgets: every message must reach the model and be answered.
    settings = Settings(bot={"data_dir": tmp}, limits={"user_burst": 10**6, "chat_burst": 10**6,
                                                        "user_per_minute": 10**6, "chat_per_minute": 10**6,
                                                        "user_daily_tokens": None, "chat_daily_tokens": None})
    return Bot(settings, model=ScriptedModel(lambda request: text("收到")), channels=[channel], plugins=[])


async def telegram_receive(n: int, users: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeBotAPI(max_hold_s=1.0) as fake:
            got: list[Message] = []

            async def sink(message: Message) -> None:
                got.append(message)

            channel = _telegram(Path(tmp), fake)
            channel.bind(sink)
            await channel.start()
            start = time.perf_counter()
            for i in range(n):
                fake.message({"id": 1000 + i % users, "type": "private"}, 1000 + i % users, f"消息 {i}")
                if i % 50 == 49:
                    await asyncio.sleep(0)
            await _until(lambda: len(got) >= n)
            elapsed = time.perf_counter() - start
            await channel.stop()
    return n / elapsed


async def telegram_bot(n: int, users: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeBotAPI(max_hold_s=1.0) as fake:
            bot = _bot(tmp, _telegram(Path(tmp), fake))
            await bot.start()
            start = time.perf_counter()
            for i in range(n):
                fake.message({"id": 1000 + i % users, "type": "private"}, 1000 + i % users, f"问题 {i}")
                if i % 50 == 49:
                    await asyncio.sleep(0)
            await _until(lambda: len(fake.sent) >= n)
            elapsed = time.perf_counter() - start
            _check_answers([s.text for s in fake.sent], n)
            await bot.stop()
    return n / elapsed


async def telegram_round_trip(rounds: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeBotAPI(max_hold_s=30.0) as fake:
            arrived: asyncio.Queue[float] = asyncio.Queue()

            async def sink(message: Message) -> None:
                arrived.put_nowait(time.perf_counter())

            channel = _telegram(Path(tmp), fake)
            channel.bind(sink)
            await channel.start()
            await asyncio.sleep(0.1)
            trips: list[float] = []
            for i in range(rounds):
                await asyncio.sleep(0.005)
                sent = time.perf_counter()
                fake.message({"id": 5, "type": "private"}, 5, f"往返 {i}")
                trips.append((await arrived.get() - sent) * 1000)
            idle: list[float] = []
            assert channel.api is not None
            for _ in range(rounds):
                start = time.perf_counter()
                await channel.api.call("getMe")
                idle.append((time.perf_counter() - start) * 1000)
            await channel.stop()
    trips.sort()
    return statistics.median(trips), trips[int(len(trips) * 0.95) - 1], statistics.median(idle)


async def _run(args: argparse.Namespace) -> None:
    runs: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("weixin receive (channel alone)", lambda: weixin_receive(args.messages, args.users)),
        ("weixin through the bot (poll -> model -> sendmessage)", lambda: weixin_bot(args.messages, args.users)),
    ]
    runs += [
        ("telegram receive (channel alone)", lambda: telegram_receive(args.messages, args.users)),
        ("telegram through the bot (poll -> model -> sendMessage)", lambda: telegram_bot(args.messages, args.users)),
    ]
    for label, fn in runs:
        print(f"{label}: {await fn():,.0f} messages/s ({args.messages} messages, {args.users} users)")
    for name, trip in (("weixin", weixin_round_trip), ("telegram", telegram_round_trip)):
        median, p95, base = await trip(args.rounds)
        print(f"{name} long-poll round trip: median {median:.2f} ms, p95 {p95:.2f} ms "
              f"(one idle API request on loopback: {base:.2f} ms; overhead ~{median - base:.2f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
