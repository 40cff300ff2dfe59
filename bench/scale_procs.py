"""Worker processes for ``bench/bench_scale.py``: N real bots (separate OS processes) on one database.

Each worker builds a whole :class:`Bot` (reminders plugin, the bench's ``note`` tool, an in-process
scripted model, a channel that acknowledges every send) on the engine the URL names, waits for
the common start signal, pushes its share of the messages through ``Bot.handle`` and reports the
wall-clock time of every send it made. Any worker may send any row (the memory channel takes no
account lease), so the parent counts sends over all workers: a row sent twice would show. With
``leased=True`` the channel serves one account under its lease, as Telegram, Weixin and OneBot do:
every row leaves through the worker holding it, whichever worker fired it.
Reminders are written by the parent before the start, due in one second, and fired by whichever
worker claims them.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bench_scale import _percentile

__all__ = ["Figures", "run_processes", "seed_reminders"]

ZONE = "Asia/Shanghai"
_REMINDER = re.compile(r"rem-\d{5}")  # a seeded reminder's content


@dataclass
class Figures:
    """What one run measured (times in seconds)."""

    messages: int
    msgs_per_s: float
    msg_p50: float
    msg_p99: float
    reminders: int
    rem_p50: float
    rem_p99: float
    rem_max: float
    lost: int
    doubled: int


def _settings(data_dir: Path, url: str, listen_url: str = "", turns: bool = True) -> Any:
    from robot.config import Settings

    big = 10**9
    limits: dict[str, Any] = {"user_burst": big, "user_per_minute": big, "chat_burst": big, "chat_per_minute": big}
    outbox: dict[str, Any] = {}
    if not turns:  # every message starts at once, and a burst of sends gets no window (as before robot.admission)
        limits["messages_at_once"], outbox["burst_priority_s"] = big, 0
    return Settings(bot={"data_dir": data_dir, "timezone": ZONE},
                    storage={"url": url, "pool_size": 6, "listen_url": listen_url}, limits=limits, outbox=outbox,
                    reminders={"max_per_user": 10**6, "max_per_chat": 10**6})


async def seed_reminders(url: str, data_dir: Path, count: int, due: datetime, listen_url: str = "") -> None:
    """Write ``count`` reminders due at ``due`` (one second) over 500 memory chats, 2,000 people."""
    from reminders.store import Reminder, ReminderStore, new_id
    from robot.storage import open_database

    db = open_database(url, data_dir, listen_url=listen_url)
    db.migrate("reminders", ReminderStore.migrations())
    await db.open()
    now = datetime.now(UTC)
    local = due.astimezone(ZoneInfo(ZONE))
    rows = [Reminder(id=new_id(), owner=f"memory:p{i % 2000}", owner_name=f"p{i % 2000}",
                     chat=f"memory:group:r{i % 500}", type="once", wall=local.strftime("%Y-%m-%d %H:%M:%S"),
                     zone=ZONE, weekday=None, content=f"rem-{i:05d}", mode="text", created_at=now, updated_at=now,
                     next_fire=due) for i in range(count)]
    await db.run(lambda tx: ReminderStore.insert_sync(tx, rows))
    await db.close()


def _worker(url: str, data_dir: str, index: int, share: int, chats: int, ready: Any, go: Any, stop: Any,
            sent: Any, out: Any, leased: bool = False, listen_url: str = "", turns: bool = True) -> None:
    asyncio.run(_work(url, Path(data_dir), index, share, chats, ready, go, stop, sent, out, leased, listen_url, turns))


async def _work(url: str, data_dir: Path, index: int, share: int, chats: int, ready: Any, go: Any, stop: Any,
                sent: Any, out: Any, leased: bool = False, listen_url: str = "", turns: bool = True) -> None:
    import bench_scale as bs  # the bench's tool, model and channel

    from function_calls import Toolset
    from function_calls.testing import call
    from robot.bot import Bot
    from robot.message import ChatRef, OutgoingMessage
    from robot.plugin import Plugin
    from robot.runtime import tune_gc

    times: list[tuple[str, float]] = []

    class Channel(bs.TimedChannel):
        account_leases = leased

        def default_account(self) -> str | None:
            return "bench" if leased else None

        async def send(self, message: OutgoingMessage) -> Any:
            receipt = await super().send(message)
            times.append((message.text, time.time()))
            with sent.get_lock():  # replies and reminders carried (one message may carry several)
                sent.value += len(_contents(message.text)) or 1
            return receipt

    model = bs.ForgetfulModel(lambda req: call("note", {"text": str(req.messages[-1]["content"])[-40:]}))
    channel = Channel()
    bot = Bot(_settings(data_dir, url, listen_url, turns), model=model, channels=[channel],
              plugins=[Plugin("bench", Toolset("bench", [bs.note])), "reminders"])
    await bot.start()
    if leased:
        await channel.serve_account("bench")  # one worker holds it; the others wait to take it over
    tune_gc()
    ready.release()
    while not go.is_set():
        await asyncio.sleep(0.005)
    begun = time.time()
    groups = [ChatRef(platform="memory", chat_id=f"g{index}-{i}", kind="group") for i in range(chats)]
    await asyncio.gather(*(channel.inject(f"记一下 m{index}-{i:06d}", chat=groups[i % chats], user=f"u{i % 1000}",
                                          at_bot=True, message_id=f"bench-{index}-{i}") for i in range(share)))
    while not stop.is_set():
        await asyncio.sleep(0.05)
    await bot.stop(flush_timeout_s=1)
    out.put((begun, times))


def run_processes(url: str, processes: int, messages: int, reminders: int, *, chats: int = 50,
                  leased: bool = False, listen_url: str = "", turns: bool = True) -> Figures:
    """Start ``processes`` bots on ``url`` (an empty database), fire ``reminders`` due in one second
    while ``messages`` flow, and wait for every reply and reminder to be sent. ``leased``: the
    channel serves one account under its lease (its rows leave through the worker holding it).
    ``listen_url``: ``[storage] listen_url`` (``url`` then goes through a transaction-mode pooler).
    ``turns=False``: every message starts at once and a burst of sends has no priority (see
    :mod:`robot.admission`), for the comparison."""
    ctx = mp.get_context("spawn")
    ready, go, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
    sent, out = ctx.Value("q", 0), ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        # The reminders are written first (this also creates the database's schema for them), due
        # in one second once every worker has had time to start and arm its timer.
        due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=12 + 4 * processes)
        if reminders:
            asyncio.run(seed_reminders(url, data / "p0", reminders, due, listen_url))
        key = os.urandom(32)  # every process sharing the database has the same secret.key
        for k in range(processes):
            (data / f"p{k}").mkdir(exist_ok=True)
            (data / f"p{k}" / "secret.key").write_bytes(key)
        procs = [ctx.Process(target=_worker, args=(url, str(data / f"p{k}"), k, messages // processes, chats,
                                                   ready, go, stop, sent, out, leased, listen_url, turns))
                 for k in range(processes)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.acquire()
        if time.time() > due.timestamp() - 1:
            print(f"   (warning: the workers took {time.time() - due.timestamp() + 12 + 4 * processes:.0f} s to "
                  "start; the reminders' lateness includes it)")
        # The messages start one second before the reminders fall due: both loads overlap.
        while time.time() < due.timestamp() - 1:
            time.sleep(0.01)
        go.set()
        total = messages // processes * processes + reminders
        deadline = time.time() + 600
        while sent.value < total and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # a doubled send would land now
        stop.set()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
    begun = min(b for b, _ in results)
    msg_times = sorted(t for _, ts in results for text, t in ts if "noted:" in text)
    rem_sends = [(text, t) for _, ts in results for text, t in ts if "rem-" in text]
    fired = Counter(c for text, _ in rem_sends for c in _contents(text))
    lateness = sorted(t - due.timestamp() for text, t in rem_sends for _ in _contents(text))
    n = len(msg_times)
    return Figures(
        messages=n, msgs_per_s=n / (msg_times[-1] - begun) if n else 0.0,
        msg_p50=(msg_times[n // 2] - begun) if n else 0.0, msg_p99=(msg_times[int(n * 0.99)] - begun) if n else 0.0,
        reminders=len(fired), rem_p50=_percentile(lateness, 0.5) if lateness else 0.0,
        rem_p99=_percentile(lateness, 0.99) if lateness else 0.0,
        rem_max=lateness[-1] if lateness else 0.0, lost=reminders - len(fired),
        doubled=sum(v - 1 for v in fired.values() if v > 1))


def _contents(text: str) -> list[str]:
    return _REMINDER.findall(text)
