"""The same-second reminder load through procrastinate (issue #11); prints figures, asserts nothing.

Run: ``.venv/bin/pip install -e '.[bench]'`` once, then
``.venv/bin/python bench/bench_procrastinate.py [--jobs 10000] [--processes 1,3] [--kill]``

Issue #11 allows procrastinate (a PostgreSQL task queue) instead of our own
``SELECT ... FOR UPDATE SKIP LOCKED`` claim if its lateness meets the goal: 10,000 reminders due in
the same second, p99 under 1 s, 0 lost, 0 doubled. On a throwaway cluster (``PgCluster``), a
fresh database per run gets procrastinate's schema and a ``fired`` table; ``jobs`` jobs, one per
reminder, are deferred with ``schedule_at`` = one whole second a few seconds ahead, after the
worker processes (procrastinate workers, separate OS processes) have started. Each job does what
a firing does here: it writes one outbox-like row (``fired``: the job's key and the server's
wall-clock time). Lateness = row written - due instant; lost = keys with no row; doubled = rows
beyond the first per key. Ours (``bench_scale.py``) measures the send after the outbox commit,
so ours includes a little more work per reminder.

Worker settings (``--concurrency``, ``--poll``): procrastinate fetches one job per query, one
fetch at a time per worker, and a job whose ``scheduled_at`` passes wakes no one (the insert's
NOTIFY came seconds earlier): workers find it on their next poll, ``fetch_job_polling_interval``
(default 5 s), here 0.1 s to give it its best chance. Concurrency 10 async jobs per process.

``--kill``: with 3 processes, one worker is SIGKILLed once a third of the rows are written. Its
in-flight jobs stay ``doing`` (procrastinate does not retry them by itself); the bench then does
what its docs recommend (``job_manager.get_stalled_jobs`` after the worker's heartbeat is stale,
then ``retry_job``) and counts again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import psycopg
from bench_scale import _percentile
from procrastinate import App, Blueprint, JobContext, PsycopgConnector
from procrastinate.types import JSONDict

__all__ = ["QueueFigures", "main", "run_procrastinate"]

CONCURRENCY = 10  # async jobs per worker process
POLL_S = 0.1  # fetch_job_polling_interval: how late a worker may notice a job whose time has come
HEARTBEAT_S = 1.0  # update_heartbeat_interval (default 10 s): the kill run waits for it to go stale
LEAD_S = 5  # the due second is this far ahead of the defer

# procrastinate warns when its objects are made in a script's main module (a task name derived from
# ``__main__`` would not resolve in a worker); this task is named explicitly, and workers import it.
logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
tasks = Blueprint()


@tasks.task(name="fire", pass_context=True)
async def fire(context: JobContext, key: str) -> None:
    """One firing: one outbox-like row with the job's key and when it was written."""
    await context.app.connector.execute_query_async(
        "INSERT INTO fired (key, at) VALUES (%(key)s, extract(epoch FROM clock_timestamp()))", key=key)


@dataclass
class QueueFigures:
    """What one run measured; the reminder fields are named as in ``scale_procs.Figures`` (seconds)."""

    processes: int
    reminders: int  # keys fired at least once
    rem_p50: float
    rem_p99: float
    rem_max: float
    lost: int
    doubled: int
    jobs_per_s: float  # rows written / (last row - due instant)
    defer_s: float  # time to defer every job (one batch)
    killed: bool = False
    stalled: int = 0  # jobs left 'doing' by the killed worker, before the retry
    lost_before_retry: int = 0
    doubled_before_retry: int = 0


def _app(url: str, pool: int) -> App:
    app = App(connector=PsycopgConnector(conninfo=url, min_size=1, max_size=pool))
    app.add_tasks_from(tasks, namespace="bench")
    return app


def _worker(url: str, name: str, concurrency: int, poll: float, ready: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_work(url, name, concurrency, poll, ready))


async def _work(url: str, name: str, concurrency: int, poll: float, ready: Any) -> None:
    app = _app(url, concurrency + 3)  # jobs' inserts, the fetch, finish_job and the heartbeat
    async with app.open_async():
        ready.release()
        # SIGTERM (from the parent) stops it gracefully: procrastinate's own signal handlers.
        await app.run_worker_async(name=name, concurrency=concurrency, fetch_job_polling_interval=poll,
                                   update_heartbeat_interval=HEARTBEAT_S, delete_jobs="never")


async def _prepare(url: str) -> None:
    async with _app(url, 2).open_async() as app:
        await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async(
            "CREATE TABLE fired (id bigserial PRIMARY KEY, key text NOT NULL, at double precision NOT NULL)")


async def _defer(url: str, keys: list[str], due: datetime) -> None:
    async with _app(url, 2).open_async() as app:
        batch: list[JSONDict] = [{"key": k} for k in keys]
        await app.configure_task("bench:fire", schedule_at=due).batch_defer_async(*batch)


async def _retry_stalled(url: str, stale_s: float) -> int:
    """procrastinate's documented recovery: retry the jobs of workers whose heartbeat is stale."""
    async with _app(url, 2).open_async() as app:
        stalled = list(await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stale_s))
        for job in stalled:
            await app.job_manager.retry_job(job)
        return len(stalled)


def _counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """Rows written, jobs 'todo', jobs 'doing'."""
    row = conn.execute("SELECT (SELECT count(*) FROM fired), "
                       "(SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'), "
                       "(SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing')").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _settle(conn: psycopg.Connection[Any], target: int, timeout: float, on_progress: Any = None) -> None:
    """Wait until ``target`` rows are written, or nothing is left to do and nothing moved for 2 s."""
    deadline, last, moved = time.time() + timeout, -1, time.time()
    while time.time() < deadline:
        written, todo, _ = _counts(conn)
        if on_progress is not None:
            on_progress(written)
        if written >= target:
            return
        if written != last:
            last, moved = written, time.time()
        elif todo == 0 and time.time() - moved > 2:
            return
        time.sleep(0.05)


def _measure(conn: psycopg.Connection[Any], keys: list[str], due: float) -> tuple[list[float], int, int]:
    rows = conn.execute("SELECT key, at FROM fired").fetchall()
    fired = Counter(str(k) for k, _ in rows)
    lateness = sorted(float(at) - due for _, at in rows)
    return lateness, sum(1 for k in keys if k not in fired), sum(v - 1 for v in fired.values() if v > 1)


def run_procrastinate(url: str, processes: int, jobs: int, *, concurrency: int = CONCURRENCY,
                      poll: float = POLL_S, kill: bool = False) -> QueueFigures:
    """Fire ``jobs`` jobs due in the same second through ``processes`` procrastinate worker
    processes on ``url`` (an empty database); ``kill``: SIGKILL one worker mid-run (needs 2+)."""
    if kill and processes < 2:
        raise ValueError("the kill run needs at least 2 worker processes")
    asyncio.run(_prepare(url))
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    procs = [ctx.Process(target=_worker, args=(url, f"w{k}", concurrency, poll, ready)) for k in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            if not ready.acquire(timeout=120):
                raise RuntimeError("a procrastinate worker did not start within 120 s")
        keys = [f"rem-{i:05d}" for i in range(jobs)]
        due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=LEAD_S)
        begun = time.time()
        asyncio.run(_defer(url, keys, due))
        defer_s = time.time() - begun
        if time.time() > due.timestamp():
            print(f"   (warning: deferring took {defer_s:.1f} s, past the due instant; lateness includes it)")
        victim = procs[0]

        def maybe_kill(written: int) -> None:
            if kill and victim.exitcode is None and victim.pid is not None and written >= jobs // 3:
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(10)

        with psycopg.connect(url, autocommit=True) as conn:
            while time.time() < due.timestamp():
                time.sleep(0.01)
            _settle(conn, jobs, 600, maybe_kill)
            time.sleep(1.0)  # a doubled row would land now
            figures = QueueFigures(processes=processes, reminders=0, rem_p50=0, rem_p99=0, rem_max=0, lost=0,
                                   doubled=0, jobs_per_s=0, defer_s=defer_s, killed=kill)
            if kill:
                figures.stalled = _counts(conn)[2]
                _, figures.lost_before_retry, figures.doubled_before_retry = _measure(conn, keys, due.timestamp())
                time.sleep(3 * HEARTBEAT_S + 1)  # the dead worker's heartbeat goes stale
                asyncio.run(_retry_stalled(url, 3 * HEARTBEAT_S))
                _settle(conn, jobs, 120)
                time.sleep(1.0)
            lateness, figures.lost, figures.doubled = _measure(conn, keys, due.timestamp())
    finally:
        for p in procs:
            if p.exitcode is None and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(30)
    if lateness:
        figures.reminders = jobs - figures.lost
        figures.rem_p50, figures.rem_p99 = _percentile(lateness, 0.5), _percentile(lateness, 0.99)
        figures.rem_max = lateness[-1]
        figures.jobs_per_s = len(lateness) / max(lateness[-1], 1e-9)
    return figures


def line(label: str, f: QueueFigures) -> str:
    """One row: lateness p50/p99/max, lost, doubled, throughput."""
    return (f"   {label:<34} {f.rem_p50:6.2f}s / {f.rem_p99:6.2f}s / {f.rem_max:6.2f}s   lost {f.lost:5d}   "
            f"doubled {f.doubled:5d}   {f.jobs_per_s:6,.0f} jobs/s (defer {f.defer_s:.1f} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs (reminders) due in the same second")
    parser.add_argument("--processes", default="1,3", help="worker process counts to run, comma-separated")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="async jobs per worker process")
    parser.add_argument("--poll", type=float, default=POLL_S, help="fetch_job_polling_interval, seconds")
    parser.add_argument("--kill", action="store_true", help="also 3 processes, one SIGKILLed mid-run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from robot.storage.pgtesting import PgCluster

    print(f"procrastinate {version('procrastinate')}: {args.jobs} jobs due in the same second (schedule_at), "
          f"one outbox-like INSERT each; workers: concurrency {args.concurrency} per process, polling every "
          f"{args.poll} s. Lateness = row written - due (p50 / p99 / max)")
    with PgCluster() as pg:
        for n in (int(x) for x in args.processes.split(",") if x):
            label = f"{n} process{'es' if n > 1 else ''}"
            print(line(label, run_procrastinate(pg.create_database(), n, args.jobs, concurrency=args.concurrency,
                                                poll=args.poll)), flush=True)
        if args.kill:
            f = run_procrastinate(pg.create_database(), 3, args.jobs, concurrency=args.concurrency, poll=args.poll,
                                  kill=True)
            print(f"   3 processes, one SIGKILLed after a third: {f.stalled} jobs left 'doing' by it; before any "
                  f"retry lost {f.lost_before_retry}, doubled {f.doubled_before_retry}; after get_stalled_jobs + "
                  "retry_job:")
            print(line("", f))


if __name__ == "__main__":
    main()
