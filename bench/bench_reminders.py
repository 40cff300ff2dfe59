"""Reminders benchmark: lateness under a burst, loss/duplication, start-up time and memory.

    .venv/bin/python bench/bench_reminders.py [--count 10000] [--spread 60 0] [--stored 100000] [--prompts 2000]
                                              [--pg-services 1 3] [--merge-chat 0 1]

1. ``--count`` daily reminders due within one minute (whole seconds spread over ``--spread``
   seconds; ``0`` puts them all on the same second, the worst case) on one bot with the real
   clock, APScheduler, the outbox and a recording channel. Lateness is measured from the due
   instant to the moment the channel's ``send()`` is called. The reminders are stored ``LEAD``
   plus 4 s before they fall due, so the timer composes a busy instant's messages ahead
   (``reminders.ahead``); the same-second burst runs again stored only 4 s before (too late for
   that), side by side.
2. Start-up of a bot whose database holds ``--stored`` active reminders spread over the next
   ``--window`` seconds (24 h; the timer arms only those due within its one-hour horizon).
3. ``--prompts`` prompt-mode reminders due at once, answered by a fake model that takes
   ``--model-ms``: how many model runs overlap (bounded by ``[reminders] prompt_concurrency``)
   and how long the queue takes to drain.
4. The same-second burst on PostgreSQL (a throwaway ``PgCluster``) with ``--pg-services`` bots,
   each a process of its own, claiming due rows with ``SKIP LOCKED``; due -> send() as in 1 (the
   reminders are ``once``, over 500 chats, merged per chat as by default: ``scale_procs.py``).

With ``[reminders] merge_chat`` (the default) a chat's on-time reminders due together share one message
(``reminders.firing.merge``; with it off only one person's do, and every bench row has its own owner):
a send counts for every reminder it carries; lost and doubled are counted per reminder.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import random
import re
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

import psutil  # type: ignore[import-untyped]

import reminders
from function_calls import ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, text
from reminders.ahead import LEAD
from reminders.store import Reminder, ReminderStore, new_id
from reminders.tools import ReminderDeps
from robot.bot import Bot
from robot.channels.base import SendReceipt
from robot.config import Settings
from robot.message import OutgoingMessage
from robot.storage.pgtesting import PgCluster
from robot.testing import MemoryChannel

ZONE = "Asia/Shanghai"


class RecordingChannel(MemoryChannel):
    """Records (key, wall-clock instant of the send call); no per-message condition variable."""

    def __init__(self) -> None:
        super().__init__(platform="bench")
        self.calls: list[tuple[str, datetime]] = []

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        at = datetime.now(UTC)
        # A chat's reminders due together share a message: one entry per reminder in it ("提醒 <n>").
        self.calls.extend((number, at) for number in re.findall(r"提醒 (\d+)", message.text))
        return SendReceipt(platform_message_id=None)


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def make_rows(dues: list[datetime], mode: Literal["text", "prompt"] = "text") -> list[Reminder]:
    tz = ZoneInfo(ZONE)
    now = datetime.now(UTC)
    return [Reminder(id=new_id(), owner=f"bench:user{i}", owner_name=f"user{i}", chat=f"bench:group:{i % 500}",
                     type="daily", wall=due.astimezone(tz).strftime("%H:%M:%S"), zone=ZONE, weekday=None,
                     content=f"提醒 {i}", mode=mode, created_at=now, updated_at=now, next_fire=due)
            for i, due in enumerate(dues)]


def settings(data: Path, merge_chat: bool = False) -> Settings:
    return Settings(bot={"data_dir": data, "timezone": ZONE},
                    reminders={"max_per_user": 10**6, "max_per_chat": 10**6, "merge_chat": merge_chat})


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def burst(count: int, spread: int, merge_chat: bool, ahead: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ch = RecordingChannel()
        bot = Bot(settings(Path(tmp), merge_chat), channels=[ch], plugins=[reminders.plugin])
        await bot.start()
        deps = bot.deps_for(reminders.reminder_set)
        assert isinstance(deps, ReminderDeps)
        # Stored 4 s before they fall due (time to store and arm them), or also ``LEAD`` earlier, as
        # reminders set well ahead are: the timer then composes a busy instant's messages ahead.
        start = (datetime.now(UTC) + timedelta(seconds=4) + (LEAD if ahead else timedelta(0))).replace(microsecond=0)
        dues = [start + timedelta(seconds=random.randrange(spread) if spread else 0) for _ in range(count)]
        rows = make_rows(dues)
        gc.collect()
        before = rss_mb()
        await bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
        armed = await deps.service.arm_window()
        assert deps.service.scheduler is not None
        jobs = len(deps.service.scheduler.get_jobs())
        after_arm = rss_mb()
        expected = {r.content.split()[1]: r.next_fire for r in rows if r.next_fire is not None}
        deadline = max(dues) + timedelta(seconds=60)
        while len(ch.calls) < count and datetime.now(UTC) < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # anything sent twice would show up now
        peak = rss_mb()
        await bot.stop()
    label = ("same second" if spread == 0 else f"spread over {spread} s") + ("" if ahead else ", stored 4 s before")
    print(f"[burst] {count} reminders due within one minute ({label}); {armed} reminders armed, "
          f"{jobs} timer jobs")
    summary(f"[burst] SQLite, merge_chat={str(merge_chat).lower()}, lateness due->send()", expected, ch.calls)
    print(f"[burst] RSS: +{after_arm - before:.1f} MB after storing and arming, +{peak - before:.1f} MB at the end")


def summary(label: str, expected: Mapping[str, datetime | None], calls: list[tuple[str, datetime]]) -> None:
    seen = collections.Counter(key for key, _ in calls)
    late_ms = [(at - due).total_seconds() * 1000 for key, at in calls if (due := expected.get(key)) is not None]
    lost = sum(1 for key in expected if key not in seen)
    dup = sum(n - 1 for n in seen.values() if n > 1)
    if late_ms:
        print(f"{label}: p50 {statistics.median(late_ms):.1f} ms, p99 {pct(late_ms, 0.99):.1f} ms, "
              f"max {max(late_ms):.1f} ms; lost {lost}, doubled {dup}")
    else:
        print(f"{label}: nothing arrived; lost {lost}")


def burst_pg(count: int, processes: int) -> None:
    """The same-second burst on a throwaway PostgreSQL: ``processes`` real bots, each in a process
    of its own (``bench/scale_procs.py``: reminders plugin, the outbox, a channel that acknowledges
    every send), claiming due rows with SKIP LOCKED. Lateness: due -> the channel's send()."""
    from scale_procs import run_processes

    with PgCluster() as pg:
        f = run_processes(str(pg.create_database()), processes, 0, count)
    print(f"[burst] PostgreSQL, {processes} process(es), merge_chat=true, lateness due->send(): "
          f"p50 {f.rem_p50 * 1000:.1f} ms, p99 {f.rem_p99 * 1000:.1f} ms, max {f.rem_max * 1000:.1f} ms; "
          f"lost {f.lost}, doubled {f.doubled}")


async def startup(stored: int, window: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        bot = Bot(settings(data), channels=[RecordingChannel()], plugins=[reminders.plugin])
        await bot.start()
        now = datetime.now(UTC)
        for start in range(0, stored, 10_000):  # in slices, so the rows built here do not inflate RSS
            dues = [now + timedelta(seconds=random.randrange(60, window)) for _ in range(min(10_000, stored - start))]
            await bot.db.run(lambda db, d=dues: ReminderStore.insert_sync(db, make_rows(d)))  # type: ignore[misc]
        await bot.stop()
        for traced in (False, True):  # time without tracemalloc, then Python heap with it
            gc.collect()
            before = rss_mb()
            if traced:
                tracemalloc.start()
            t0 = time.perf_counter()
            bot = Bot(settings(data), channels=[RecordingChannel()], plugins=[reminders.plugin])
            await bot.start()
            took = time.perf_counter() - t0
            heap = tracemalloc.get_traced_memory()[1] / 2**20 if traced else 0.0
            tracemalloc.stop()
            deps = bot.deps_for(reminders.reminder_set)
            assert isinstance(deps, ReminderDeps) and deps.service.scheduler is not None
            jobs = len(deps.service.scheduler.get_jobs())
            grown = rss_mb() - before
            await bot.stop()
            if not traced:
                print(f"[start-up] {stored} stored reminders, next fires spread over {window / 3600:g} h: "
                      f"bot.start() {took * 1000:.0f} ms, {jobs} timer jobs armed (1 h horizon), RSS +{grown:.1f} MB")
            else:
                print(f"[start-up] Python heap allocated during start-up (tracemalloc peak): {heap:.1f} MB")


async def prompts(count: int, model_ms: float) -> None:
    running = peak = 0

    async def answer(request: ModelRequest) -> ModelResponse:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(model_ms / 1000)
        running -= 1
        return text("晴")

    with tempfile.TemporaryDirectory() as tmp:
        ch = RecordingChannel()
        bot = Bot(settings(Path(tmp)), model=ScriptedModel(answer), channels=[ch], plugins=[reminders.plugin])
        await bot.start()
        deps = bot.deps_for(reminders.reminder_set)
        assert isinstance(deps, ReminderDeps)
        due = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        rows = make_rows([due] * count, mode="prompt")
        await bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
        t0 = time.perf_counter()
        report = await deps.service.fire_due()
        took = time.perf_counter() - t0
        await bot.outbox.flush()
        await bot.stop()
    limit = deps.settings.prompt_concurrency
    print(f"[prompts] {count} prompt reminders due at once, fake model {model_ms:g} ms: delivered {report.delivered}, "
          f"failed {report.failed}; at most {peak} model runs at a time (limit {limit}); drained in {took:.1f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--spread", type=int, nargs="+", default=[60, 0],
                        help="seconds the due instants spread over, one run each (0 = all in the same second)")
    parser.add_argument("--stored", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=86_400, help="seconds the stored reminders spread over")
    parser.add_argument("--prompts", type=int, default=2_000, help="prompt reminders due at once (0 = skip)")
    parser.add_argument("--model-ms", type=float, default=20.0, help="the fake model's answer time")
    parser.add_argument("--pg-services", type=int, nargs="*", default=[1, 3],
                        help="same-second burst on PostgreSQL with this many bot processes, one run each")
    parser.add_argument("--merge-chat", type=int, nargs="+", default=[0, 1], choices=[0, 1],
                        help="[reminders] merge_chat for the bursts (the rows have one owner each: 0 = a send each)")
    args = parser.parse_args()
    random.seed(7)
    if args.prompts:
        await prompts(args.prompts, args.model_ms)
    await startup(args.stored, args.window)
    for merge_chat in args.merge_chat:
        for spread in args.spread:
            await burst(args.count, spread, bool(merge_chat))
            if spread == 0 and merge_chat:  # side by side: too late to be composed ahead
                await burst(args.count, spread, bool(merge_chat), ahead=False)
    for processes in args.pg_services:  # (asyncio.run inside: its own thread)
        await asyncio.to_thread(burst_pg, args.count, processes)


if __name__ == "__main__":
    asyncio.run(main())
