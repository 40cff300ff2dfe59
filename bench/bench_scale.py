"""Scale benchmark: messages through the whole pipeline per engine; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_scale.py [--engine sqlite] [--messages 5000] [--chats 50] [--users 1000]``

Messages section (:func:`run_messages`): ``--messages`` group messages from ``--users`` people over
``--chats`` chats, all delivered at once through the real ``Bot.handle`` (dedupe + history in one
unit of work, gate, rate limit, history window, route, budget, tool, outbox, send) to a
``MemoryChannel`` that acknowledges every send, until every reply is delivered.

- model path: each message @-s the bot; the model is an in-process :class:`ScriptedModel`
  (``function_calls.testing``, no HTTP; it forgets each request once answered) that answers every request with one call of the ``note``
  action tool, whose reply ends the run: one model turn, one tool call, one reply per message;
- ``/command`` path: the same messages as ``/n ...``: the same tool, no model.

Printed per path: messages/s (first delivery to last acknowledged send), commits per message
(``db.commits``: transactions the engine committed, each may hold many units of work; SQLite
only), p50/p99 latency of a message (its delivery to its reply's send), CPU per message (the
event loop's and SQLite's writer thread's), the writer's busy time (its CPU plus its waits for the
interpreter lock: ``bench_gil.py``) and the ceiling the event loop's own CPU puts on the path.
With ``--compare-savepoints`` (the default) both paths run again with a savepoint per unit in
every group, SQLite's way before its first pass went without them.

The side-by-side section (:func:`side_by_side`) also fires the reminders with three PostgreSQL
processes and one leased account (``scale_procs.run_processes(leased=True)``: its holder alone sends,
as with Telegram, Weixin or OneBot), and runs the model path with messages arriving
one after another at 200/s (:func:`paced`), in this process, on SQLite and on PostgreSQL (whose
deadlocks it prints): there one message's budget reservation and another's settlement overlap
all the time, which a burst delivered at once hardly shows.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench_robot import note  # the same one-tool bot as bench_robot: an action tool with the alias /n

from function_calls import ModelRequest, ModelResponse, Toolset
from function_calls.model import TextCallback
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.channels.base import SendReceipt
from robot.config import Settings
from robot.message import ChatRef, OutgoingMessage
from robot.plugin import Plugin
from robot.runtime import tune_gc
from robot.testing import MemoryChannel

__all__ = ["main", "reference_speed", "run_messages"]


class TimedChannel(MemoryChannel):
    """A memory channel that acknowledges every send and notes when it happened.

    Trace events are counted, not kept: a record growing with every message would make Python's
    full garbage-collection passes, and so the figures, grow with the run (a bot keeps no such record).
    """

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: list[float] = []
        self.traces = 0

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        receipt = await super().send(message)
        self.sent_at.append(time.perf_counter())
        return receipt

    async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:
        self.traces += 1


@dataclass
class ForgetfulModel(ScriptedModel):
    """:class:`ScriptedModel` that records no request, and counts them (see :class:`TimedChannel`)."""

    answered: int = 0
    record: bool = False

    async def complete(self, request: ModelRequest, *, on_text: TextCallback | None = None) -> ModelResponse:
        try:
            return await super().complete(request, on_text=on_text)
        finally:
            self.answered += 1


def _settings(data_dir: Path, engine_url: str | None, *, caps: bool = True) -> Settings:
    big = 10**9
    limits: dict[str, object] = {"user_burst": big, "user_per_minute": big, "chat_burst": big, "chat_per_minute": big,
                                 "command_burst": big, "command_per_minute": big}
    if not caps:  # the defaults cap tokens per user and per chat (what users run): reserved in the database
        limits.update(user_daily_tokens=None, chat_daily_tokens=None)
    return Settings(bot={"data_dir": data_dir}, storage={"url": engine_url or ""}, limits=limits)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_messages(engine_url: str | None, n: int, processes: int = 1, *,
                       path: Literal["model", "answer", "command"] = "model", chats: int = 50, users: int = 1000,
                       gc_tuned: bool = True, caps: bool = True, savepoints: bool = False,
                       rate: float | None = None) -> dict[str, Any]:
    """Push ``n`` messages through one bot and wait for every reply; returns the figures.

    ``engine_url``: ``[storage] url`` (None or "" = SQLite in a temporary folder; ``postgresql://...``
    = that database, which should be empty). ``path``: "model" (@bot, ScriptedModel calling the
    ``note`` tool), "answer" (@bot, ScriptedModel answering in text: no tool call) or "command"
    (``/n``). ``gc_tuned``: apply :func:`robot.runtime.tune_gc` after start, as ``qunbot run`` does.
    ``caps``: keep the default daily token caps (per user, per chat: reserved in the database).
    ``savepoints``: SQLite takes a savepoint per unit in every group, as before the first pass went
    without them (``SQLiteDatabase.optimistic``), for the comparison. ``rate``: the messages arrive
    one after another at this many per second instead of all at once (latency from each arrival).

    Keys: engine, path, messages, sent, seconds, msgs_per_s, commits_per_msg (None where the
    engine does not count commits), p50_ms, p99_ms, cpu_ms_per_msg (this process, all threads),
    loop_cpu_ms_per_msg (the event loop's thread), writer_cpu_ms_per_msg (SQLite's writer thread; None
    on PostgreSQL), writer_busy_ms_per_msg (the writer's wall time on groups: its CPU plus its waits
    for the interpreter lock; None on PostgreSQL), model_requests.
    """
    if processes != 1:
        raise ValueError("run_messages measures one process; several processes are not built yet")
    with tempfile.TemporaryDirectory() as tmp:
        channel = TimedChannel()
        model = ForgetfulModel(lambda req: call("note", {"text": str(req.messages[-1]["content"])[-40:]})
                               if path == "model" else text("记下了：" + str(req.messages[-1]["content"])[-40:]))
        bot = Bot(_settings(Path(tmp), engine_url, caps=caps), model=model if path != "command" else None,
                  channels=[channel], plugins=[Plugin("bench", Toolset("bench", [note]))])
        await bot.start()
        if savepoints and hasattr(bot.db, "optimistic"):
            bot.db.optimistic = False
        if gc_tuned:
            tune_gc()
        try:
            groups = [ChatRef(platform="memory", chat_id=f"g{i}", kind="group") for i in range(chats)]
            say = "/n 第{i}条" if path == "command" else "记一下 第{i}条"
            begun: dict[str, float] = {}

            async def one(i: int) -> None:
                if rate:
                    await asyncio.sleep(i / rate)
                chat = groups[i % chats]
                begun[f"memory:{chat.chat_id}:bench-{i}:0"] = time.perf_counter()
                await channel.inject(say.format(i=i), chat=chat, user=f"u{i % users}", at_bot=path != "command",
                                     message_id=f"bench-{i}")

            commits_before = getattr(bot.db, "commits", None)
            writer, busy = getattr(bot.db, "thread_cpu_s", None), getattr(bot.db, "thread_busy_s", None)
            start, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
            await asyncio.gather(*(one(i) for i in range(n)))
            await channel.wait_sent(n, timeout=600)
            seconds = channel.sent_at[-1] - start
            cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
            await asyncio.sleep(0.05)  # the writer's last group notes its CPU time after waking us
            writer = None if writer is None else getattr(bot.db, "thread_cpu_s", 0.0) - writer
            busy = None if busy is None else getattr(bot.db, "thread_busy_s", 0.0) - busy
            commits_after = getattr(bot.db, "commits", None)
            latencies = [at - begun[m.key] for m, at in zip(channel.sent, channel.sent_at, strict=True)]
        finally:
            await bot.stop()
    commits = (None if commits_before is None or commits_after is None
               else (commits_after - commits_before) / n)
    return {"engine": bot.db.dialect, "path": path, "messages": n, "sent": len(channel.sent),
            "seconds": seconds, "msgs_per_s": len(channel.sent) / seconds, "commits_per_msg": commits,
            "p50_ms": _percentile(latencies, 0.5) * 1000, "p99_ms": _percentile(latencies, 0.99) * 1000,
            "cpu_ms_per_msg": cpu * 1000 / n, "loop_cpu_ms_per_msg": loop_cpu * 1000 / n,
            "writer_cpu_ms_per_msg": None if writer is None else writer * 1000 / n,
            "writer_busy_ms_per_msg": None if busy is None else busy * 1000 / n, "model_requests": model.answered}


def reference_speed(iterations: int = 2_000_000) -> float:
    """Millions of iterations per second of a plain Python loop on this machine (best of three).

    The figures here are CPU-bound, and shared machines differ several-fold in speed from one day to
    the next: this figure, printed beside them, tells how fast the machine they came from ran Python.
    """
    best = float("inf")
    for _ in range(3):
        start, total = time.perf_counter(), 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - start)
    return iterations / best / 1e6


def _line(result: dict[str, Any]) -> str:
    commits = result["commits_per_msg"]
    return (f"   {result['path']:<7} {result['sent']:>6} replies in {result['seconds']:6.2f} s = "
            f"{result['msgs_per_s']:7,.0f} msg/s; commits/msg {'n/a' if commits is None else f'{commits:.3f}'}; "
            f"latency p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms; "
            f"CPU {result['cpu_ms_per_msg']:.2f} ms/msg (event loop {result['loop_cpu_ms_per_msg']:.2f}"
            + ("" if result["writer_cpu_ms_per_msg"] is None else f", SQLite writer {result['writer_cpu_ms_per_msg']:.2f}")
            + ")" + ("" if result["writer_busy_ms_per_msg"] is None else
                     f"; the writer was busy {result['writer_busy_ms_per_msg']:.2f} ms/msg; the event loop's CPU "
                     f"alone caps this path at {1 / result['loop_cpu_ms_per_msg'] * 1000:,.0f} msg/s"))


async def main_async(args: argparse.Namespace) -> None:
    n = args.messages
    print(f"This machine runs a plain Python loop at {reference_speed():.1f} M iterations/s: the CPU-bound "
          "figures below scale with it")
    if args.engine == "sqlite":
        print(f"SQLite, one process: {n} messages over {args.chats} group chats from {args.users} people, "
              f"delivered at once (model: in-process ScriptedModel, one `note` call per message; answer: the "
              f"same model answering in text, no tool call; "
              f"gc {'as Python sets it' if args.default_gc else 'tuned as qunbot run does'}; daily token caps "
              f"{'off' if args.no_caps else 'as by default'})")
        for path, savepoints in (("model", False), ("answer", False), ("command", False), ("model", True),
                                 ("command", True)):
            if savepoints and not args.compare_savepoints:
                continue
            result = await run_messages(None, n, path=path, chats=args.chats, users=args.users,
                                        gc_tuned=not args.default_gc, caps=not args.no_caps, savepoints=savepoints)
            print(_line(result) + ("  <- a savepoint per unit in every group" if savepoints else ""))


def paced(new_database: Callable[[], str], n: int, rate: float) -> None:
    """Messages arriving one after another (not all at once), one process per engine: a reservation
    and another message's settlement overlap all the time, as in a busy chat."""
    import psycopg

    print(f"   paced: {n} @-messages (model path) arriving at {rate:.0f}/s, in this process")
    for label in ("SQLite", "PostgreSQL"):
        url = "" if label == "SQLite" else new_database()
        r = asyncio.run(run_messages(url, n, rate=rate))
        deadlocks = ""
        if url:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
                deadlocks = f"; deadlocks {row[0] if row else '?'}"
        print(f"   {label:<24} {r['msgs_per_s']:7,.0f} msg/s; reply latency p50 {r['p50_ms']:,.0f} ms, "
              f"p99 {r['p99_ms']:,.0f} ms{deadlocks}")


def _row(label: str, msgs: Any | None, rems: Any) -> None:
    """One line of the side-by-side table: messages from ``msgs`` (n/a when None), reminders from ``rems``
    (both ``scale_procs.Figures``; the same run when both loads ran at once)."""
    rate, last = ("n/a", "n/a") if msgs is None else (f"{msgs.msgs_per_s:,.0f}", f"{msgs.msg_p99:.2f}s")
    print(f"   {label:<24} {rate:>7} {last:>10}   {rems.rem_p50:10.2f}s / {rems.rem_p99:6.2f}s / "
          f"{rems.rem_max:6.2f}s {rems.lost:5d} {rems.doubled:7d}")


def side_by_side(messages: int, reminders: int) -> None:
    """SQLite/1 process, PostgreSQL/1 and PostgreSQL/3 processes, one after the other in this run."""
    from scale_procs import run_processes

    from robot.storage.pgtesting import PgCluster, pgbouncer

    print(f"\nSide by side: {messages} @-messages (model path) delivered at once; then, on a fresh database, "
          f"{reminders} reminders due in the same second. Real bots in separate processes (reminders plugin, "
          "scripted in-process model, a channel that acknowledges every send)")
    print(f"   {'engine':<24} {'msg/s':>7} {'last reply':>10}   {'reminder lateness p50 / p99 / max':>34} {'lost':>5} "
          f"{'doubled':>7}")
    with PgCluster() as pg:
        def url(label: str) -> str:
            return "" if label.startswith("SQLite") else str(pg.create_database())

        for label, procs in (("SQLite, 1 process", 1), ("PostgreSQL, 1 process", 1), ("PostgreSQL, 3 processes", 3)):
            _row(label, run_processes(url(label), procs, messages, 0), run_processes(url(label), procs, 0, reminders))
        # A leased account (Telegram, Weixin, OneBot): whoever fires, its holder alone sends.
        _row("PostgreSQL, 3, 1 account", None, run_processes(str(pg.create_database()), 3, 0, reminders, leased=True))
        # Through PgBouncer in transaction mode (listen_url direct): settings per transaction, nothing prepared.
        direct = [str(pg.create_database()), str(pg.create_database())]
        with pgbouncer(direct[0], "transaction") as m_url, pgbouncer(direct[1], "transaction") as r_url:
            m = run_processes(m_url, 3, messages, 0, listen_url=direct[0])
            r = run_processes(r_url, 3, 0, reminders, listen_url=direct[1])
        _row("PG, 3, PgBouncer (txn)", m, r)
        # Both loads at once: the reminders fall due a second after the messages were delivered.
        print(f"   {messages} messages delivered, then {reminders} reminders due a second later "
              "(turns: robot.admission; off = every message starts at once, no window for the burst)")
        for label, procs in (("SQLite, 1", 1), ("PostgreSQL, 1", 1), ("PostgreSQL, 3", 3)):
            for turns in (False, True):
                m = run_processes(url(label), procs, messages, reminders, turns=turns)
                _row(f"{label}, turns{'' if turns else ' off'}", m, m)
        paced(pg.create_database, messages // 2, 200.0)  # above what one PostgreSQL process answers here
        # The same firing load through procrastinate (issue #11's alternative): bench_procrastinate.py.
        if importlib.util.find_spec("procrastinate") is None:
            print("   procrastinate: not installed; `pip install -e '.[bench]'` measures the same firing load through it")
        elif reminders:
            from bench_procrastinate import CONCURRENCY, POLL_S, run_procrastinate

            for label, procs in (("procrastinate, 1 process", 1), ("procrastinate, 3 processes", 3)):
                q = run_procrastinate(pg.create_database(), procs, reminders)
                print(f"   {label:<26}{'n/a':>6} {'n/a':>10}   {q.rem_p50:10.2f}s / {q.rem_p99:6.2f}s / "
                      f"{q.rem_max:6.2f}s {q.lost:5d} {q.doubled:7d}")
            print(f"   (procrastinate: one job per reminder, each INSERTs one outbox-like row; lateness = that row's "
                  f"time - due; workers: concurrency {CONCURRENCY} per process, polling every {POLL_S} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["sqlite"], default="sqlite")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--side-by-side", action=argparse.BooleanOptionalAction, default=True,
                        help="also SQLite/PostgreSQL/3 processes in separate processes (starts a throwaway cluster)")
    parser.add_argument("--scale-messages", type=int, default=3000, help="messages in the side-by-side section")
    parser.add_argument("--reminders", type=int, default=10_000, help="same-second reminders in the side-by-side section")
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--default-gc", action="store_true",
                        help="leave Python's garbage collector as it is (qunbot run tunes it: robot.runtime)")
    parser.add_argument("--compare-savepoints", action=argparse.BooleanOptionalAction, default=True,
                        help="also run both paths with a savepoint per unit in every group (SQLite's old way)")
    parser.add_argument("--no-caps", action="store_true",
                        help="turn the default daily token caps off (no budget reservation in the database)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main_async(args))
    if args.side_by_side:
        side_by_side(args.scale_messages, args.reminders)
    # Again at the end: a shared machine's speed drifts within a run too (12.9 to 17.6 M/s in one day here).
    print(f"\nThe same loop at the end of the run: {reference_speed():.1f} M iterations/s")


if __name__ == "__main__":
    main()
