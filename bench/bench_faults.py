"""Fault bench: the real ``qunbot run`` process, a OneBot peer, SIGKILLs, outages, a stuck chat.

    .venv/bin/python bench/bench_faults.py [--count 300] [--window 80] [--kills 4] [--outages 2] ...

The bench seeds ``--count`` daily reminders (across six IANA zones and ``--groups`` groups, due
on whole seconds over ``--window`` seconds) into a fresh data dir through the bot's own database
API, then runs ``python -m robot.cli run`` with a OneBot channel in reverse mode on a loopback
port with an access token. This process is the OneBot implementation: a raw aiohttp WebSocket
client that dials the bot, answers ``send_group_msg`` and records when each reminder arrives.
While the reminders fall due it applies faults, one at a time, at random instants:

- SIGKILL of the bot (half of them random, half timed to a send the peer has received but not
  yet acknowledged: the duplicate window), then a restart;
- peer outages of ``--outage-s`` seconds (the peer closes its socket, then dials again);
- one group whose sends the peer never acknowledges, for the whole run (the bot's
  ``action_timeout_s`` is ``--action-timeout`` seconds).

``--live`` more reminders are typed during the run as ``/remind once "<wall>" fbN`` by group
members (in each group's ``[bot] zones`` zone), due 3-6 s later. The peer and the process
wrapper live in ``bench/fault_rig.py``.

It prints lost and doubled counts (each double attributed to the kill that caused it), the
lateness of reminders no fault touched (due outside every fault window widened by ``--pre`` s
before and ``--post`` s after), delivery after a reconnect (arrival minus the later of due and
reconnect), and other chats' lateness while the stuck chat had a send awaiting its answer.
Lateness is split into the engine's part (due -> outbox row committed) and delivery's part
(row -> arrival at the peer) from the bot's own ``outbox.created_at``. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import random
import secrets
import shutil
import sqlite3
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from fault_rig import (
    FIRST_GROUP,
    SELF_ID,
    STUCK_GROUP,
    ZONES,
    Arrival,
    BotProcess,
    Peer,
    Planned,
    Window,
    free_port,
    pct,
    summary,
)

import reminders
from reminders.store import Reminder, ReminderStore, new_id
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel


def write_config(tmp: Path, port: int, token: str, args: argparse.Namespace) -> Path:
    config = tmp / "qunbot.toml"
    zones = ", ".join(f'"onebot:group:{FIRST_GROUP + g}" = "{ZONES[g % len(ZONES)]}"' for g in range(args.groups))
    config.write_text(f"""
[bot]
data_dir = "data"
timezone = "Asia/Shanghai"
plugins = ["reminders"]
zones = {{ {zones} }}

[outbox]
max_in_flight = {args.max_in_flight}
max_attempts = {args.max_attempts}

[channels.onebot]
enabled = true
mode = "reverse"
host = "127.0.0.1"
port = {port}
access_token = "{token}"
action_timeout_s = {args.action_timeout}
""", encoding="utf-8")
    config.chmod(0o600)
    return config


async def seed(data: Path, args: argparse.Namespace, first_due: float) -> list[Planned]:
    """Store the reminders through the bot's own Database and ReminderStore (before the bot runs)."""
    bot = Bot(Settings(bot={"data_dir": data, "timezone": "Asia/Shanghai", "plugins": ["reminders"]}),
              channels=[MemoryChannel()], plugins=[reminders.plugin])
    await bot.start()
    now = datetime.now(UTC)
    rows: list[Reminder] = []
    planned: list[Planned] = []
    for i in range(args.count + args.stuck_count):
        stuck = i >= args.count
        group = STUCK_GROUP if stuck else FIRST_GROUP + i % args.groups
        # The stuck chat's reminders come first, so it is stuck from the start of the window on.
        offset = (i - args.count) * 2 if stuck else random.randrange(args.window)
        due = datetime.fromtimestamp(first_due + offset, UTC)
        zone = ZONES[i % len(ZONES)]
        rows.append(Reminder(id=new_id(), owner=f"onebot:{20000 + i}", owner_name=f"user{i}",
                             chat=f"onebot:group:{group}", type="daily",
                             wall=due.astimezone(ZoneInfo(zone)).strftime("%H:%M:%S"), zone=zone, weekday=None,
                             content=f"fb{i}", mode="text", created_at=now, updated_at=now, next_fire=due,
                             account=str(SELF_ID)))
        planned.append(Planned(i, group, due.timestamp(), f"rem:{rows[-1].id}:{due.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"))
    await bot.db.run(lambda db: ReminderStore.insert_sync(db, rows))
    await bot.stop()
    return planned


def fault_plan(args: argparse.Namespace, first_due: float) -> list[tuple[float, str]]:
    """One fault per slot of the window, at a random instant in the slot's first half."""
    kinds = (["timed kill"] * (args.kills // 2) + ["kill"] * (args.kills - args.kills // 2)
             + ["outage"] * args.outages)
    random.shuffle(kinds)
    slot = args.window / max(1, len(kinds))
    return [(first_due + 2 + n * slot + random.uniform(0, slot / 2), kind) for n, kind in enumerate(kinds)]


async def wait_connect(peer: Peer, after: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [t for t in peer.connects if t > after]
        if later:
            return later[0]
        await asyncio.sleep(0.01)
    return float("nan")


async def apply_faults(plan: list[tuple[float, str]], peer: Peer, bot: BotProcess, windows: list[Window],
                       args: argparse.Namespace) -> None:
    last_end = 0.0
    for at, kind in plan:
        # Faults never overlap: one starts only after the previous one's window has closed, so
        # every delivery after a reconnect is measured from the reconnect that released it.
        at = max(at, last_end + args.pre + args.post + 0.5)
        await asyncio.sleep(max(0.0, at - time.time()))
        peer.faulting = True
        if kind == "outage":
            peer.allowed = False
            w = Window(kind, time.time())
            await peer.drop()
            await asyncio.sleep(args.outage_s)
            peer.allowed = True
        else:
            if kind == "timed kill":
                peer.held, peer.hold = 0, True
                peer.first_held.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.window):  # bounded: a send comes within the window
                        await peer.first_held.wait()
                await asyncio.sleep(0.05)  # let the other in-flight sends arrive too
            w = Window(kind, time.time())
            bot.kill()
            w.held, peer.hold = peer.held, False
            await asyncio.sleep(random.uniform(0, args.restart_delay))
            bot.start()
        w.end = await wait_connect(peer, w.start, timeout=60)
        windows.append(w)
        last_end = w.end if w.end == w.end else time.time()  # NaN: no reconnect within 60 s
        peer.faulting = False


async def type_reminders(peer: Peer, planned: list[Planned], first_due: float, args: argparse.Namespace) -> int:
    """``--live`` members type ``/remind once "<wall>" fbN`` (in their group's zone), due 3-6 s later.

    Typed only while no fault is under way, so every command reaches a running bot; returns how
    many were skipped because a fault lasted past their turn."""
    skipped = 0
    for k in range(args.live):
        await asyncio.sleep(max(0.0, first_due + k * args.window / max(1, args.live) - time.time()))
        for _ in range(100):  # bounded: give a fault up to 5 s to end
            if not peer.faulting and peer.ws is not None:
                break
            await asyncio.sleep(0.05)
        else:
            skipped += 1
            continue
        index = len(planned)
        g = random.randrange(args.groups)
        due = float(int(time.time() + random.uniform(3, 6)) + 1)
        wall = datetime.fromtimestamp(due, ZoneInfo(ZONES[g % len(ZONES)])).strftime("%Y-%m-%d %H:%M:%S")
        user = 30000 + k
        event = {"time": int(time.time()), "self_id": SELF_ID, "post_type": "message", "message_type": "group",
                 "sub_type": "normal", "message_id": 900000 + k, "group_id": FIRST_GROUP + g, "user_id": user,
                 "anonymous": None, "font": 0,
                 "message": [{"type": "at", "data": {"qq": str(SELF_ID)}},
                             {"type": "text", "data": {"text": f' /remind once "{wall}" fb{index}'}}],
                 "raw_message": f'[CQ:at,qq={SELF_ID}] /remind once "{wall}" fb{index}',
                 "sender": {"user_id": user, "nickname": f"live{k}", "card": "", "role": "member"}}
        planned.append(Planned(index, FIRST_GROUP + g, due, "", typed=time.time()))
        if not await peer.send_event(event):
            planned.pop()
            skipped += 1
    return skipped


def outbox_rows(db: Path) -> tuple[dict[str, float], collections.Counter[str]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        created = {k: datetime.fromisoformat(c).timestamp()
                   for k, c in conn.execute("SELECT key, created_at FROM outbox WHERE key LIKE 'rem:%'")}
        status = collections.Counter(s for (s,) in conn.execute("SELECT status FROM outbox WHERE key LIKE 'rem:%'"))
    return created, status


def report(args: argparse.Namespace, planned: list[Planned], peer: Peer, windows: list[Window], bot: BotProcess,
           created: dict[str, float], status: collections.Counter[str], t0: float, skipped: int) -> None:
    by_index: dict[int, list[Arrival]] = collections.defaultdict(list)
    for a in peer.arrivals:
        if a.index is not None:
            by_index[a.index].append(a)
    normal = [p for p in planned if p.group != STUCK_GROUP]
    stuck = [p for p in planned if p.group == STUCK_GROUP]
    typed = [p for p in normal if p.typed is not None]
    unconfirmed = [p for p in typed if p.index not in peer.confirmations]
    # A /remind the bot was killed before answering may or may not have been stored: not counted as lost.
    lost = [p for p in normal if not by_index.get(p.index) and p not in unconfirmed]
    unconfirmed_fired = sum(1 for p in unconfirmed if by_index.get(p.index))
    kills = [w for w in windows if "kill" in w.kind]
    doubles_by_kill: collections.Counter[int] = collections.Counter()
    unexplained = 0
    for p in normal:
        got = by_index.get(p.index, [])
        for once, again in itertools.pairwise(got):
            killer = next((n for n, w in enumerate(kills) if once.at <= w.start <= again.at), None)
            if killer is None:
                unexplained += 1
            else:
                doubles_by_kill[killer] += 1
    doubled = sum(max(0, len(by_index.get(p.index, [])) - 1) for p in normal)

    def window_of(due: float) -> Window | None:
        return next((w for w in windows if w.start - args.pre <= due <= w.end + args.post), None)

    stuck_busy = [(a.at, a.at + args.action_timeout) for a in peer.arrivals if a.group == STUCK_GROUP]
    clean: list[float] = []
    after: list[float] = []
    while_stuck: list[float] = []
    engine: list[float] = []
    delivery: list[float] = []
    worst: list[tuple[float, Planned, Window, float]] = []
    for p in normal:
        got = by_index.get(p.index, [])
        if not got:
            continue
        first = got[0].at
        w = window_of(p.due)
        if w is None:
            clean.append(first - p.due)
            if p.key in created:
                engine.append(created[p.key] - p.due)
                delivery.append(first - created[p.key])
            if any(s <= p.due <= e for s, e in stuck_busy):
                while_stuck.append(first - p.due)
        else:
            # From the last connection before the arrival (a later fault may have delayed it again).
            reconnect = max((c for c in peer.connects if c <= first), default=w.end)
            after.append(first - max(p.due, reconnect))
            worst.append((first - max(p.due, reconnect), p, w, first))

    print(f"[settings] {args.count} stored + {args.live} typed reminders in {args.groups} groups + {args.stuck_count} in a never-acknowledged "
          f"group, {len(ZONES)} zones, due over {args.window} s from start+{args.lead} s; faults: {args.kills} "
          f"SIGKILLs ({args.kills // 2} timed to an unacknowledged send), {args.outages} peer outages of "
          f"{args.outage_s:g} s; restart delay 0-{args.restart_delay:g} s; [outbox] max_in_flight "
          f"{args.max_in_flight}, max_attempts {args.max_attempts}; onebot action_timeout_s {args.action_timeout:g}; "
          f"fault window = [fault - {args.pre:g} s, reconnect + {args.post:g} s]; seed {args.seed}")
    for w in windows:
        if w.kind == "start":
            print(f"[start] the bot's first start: peer connected {w.end - t0:.1f} s after the bench began")
            continue
        print(f"[fault] {w.kind:<10} at +{w.start - t0:6.1f} s, peer connected again after "
              f"{w.end - w.start:5.2f} s" + (f", {w.held} send(s) unacknowledged at the kill" if "timed" in w.kind
                                             else ""))
    print(f"[run] {time.time() - t0:.0f} s; bot started {bot.starts} times; exited by itself: {bot.unexpected_exits or 'never'}; "
          f"peer connections {len(peer.connects)}; sends received {len(peer.arrivals)}")
    print(f"[loss] lost {len(lost)} of {len(normal) - len(unconfirmed)}" + (f" (e.g. fb{lost[0].index} due "
          f"{datetime.fromtimestamp(lost[0].due, UTC):%H:%M:%S})" if lost else ""))
    per_kill = ", ".join(f"kill #{n + 1} ({kills[n].kind}): {c}" for n, c in sorted(doubles_by_kill.items())) or "none"
    replies = [peer.confirmations[p.index] - p.typed for p in typed if p.typed is not None
               and p.index in peer.confirmations]
    print(f"[live] {len(typed)} reminders typed as /remind during the run ({skipped} turns skipped by a fault): "
          f"reply {summary(replies)}; unanswered {len(unconfirmed)} (of which fired anyway: {unconfirmed_fired})")
    print(f"[doubles] doubled {doubled}: after a kill {sum(doubles_by_kill.values())} ({per_kill}; at most "
          f"{max(doubles_by_kill.values(), default=0)} per kill, bound max_in_flight={args.max_in_flight}), "
          f"with no kill in between {unexplained}")
    print(f"[not hit] lateness due -> arrival of {len(clean)} reminders no fault touched: {summary(clean)}; "
          f"min {min(clean, default=0) * 1000:.0f} ms  (goal p99 < 1 s: "
          f"{'met' if clean and pct(clean, 0.99) < 1 else 'NOT met'})")
    print(f"[not hit]   of which engine due -> outbox row: {summary(engine)}; outbox row -> peer: {summary(delivery)}")
    print(f"[reconnect] arrival - max(due, reconnect) of {len(after)} reminders due in a fault window: "
          f"{summary(after)}  (goal p99 < 2 s: {'met' if after and pct(after, 0.99) < 2 else 'NOT met'})")
    for late, p, w, _first in sorted(worst, key=lambda x: -x[0])[:args.show_worst]:
        row = f"{created[p.key] - w.end:+.2f} s" if p.key in created else "(typed)"
        print(f"[reconnect]   worst: fb{p.index} group {p.group} {late * 1000:.0f} ms after; {w.kind} at "
              f"+{w.start - t0:.1f} s, due {p.due - w.start:+.2f} s from the fault, {p.due - w.end:+.2f} s from the "
              f"reconnect; outbox row committed {row} from the reconnect")
    stuck_sends = sum(1 for a in peer.arrivals if a.group == STUCK_GROUP)
    print(f"[stuck] other chats' lateness while the stuck chat had a send awaiting its answer: {summary(while_stuck)}"
          f"  (goal p99 < 1 s: {'met' if while_stuck and pct(while_stuck, 0.99) < 1 else 'NOT met'}); the stuck "
          f"chat got {stuck_sends} sends for its {len(stuck)} reminders")
    print(f"[outbox] reminder rows by status at the end: {dict(status)}")


async def run(args: argparse.Namespace, tmp: Path) -> None:
    data = tmp / "data"
    port, token = free_port(), secrets.token_urlsafe(24)
    config = write_config(tmp, port, token, args)
    t0 = time.time()
    first_due = float(int(t0 + args.lead) + 1)
    planned = await seed(data, args, first_due)
    peer = Peer(f"ws://127.0.0.1:{port}/onebot/v11/ws", token)
    stop = asyncio.Event()
    windows: list[Window] = []
    with (tmp / "bot.log").open("ab") as log:
        bot = BotProcess(config, log)  # type: ignore[arg-type]
        try:
            start = Window("start", time.time())
            bot.start()
            peer_task = asyncio.create_task(peer.run(stop))
            start.end = await wait_connect(peer, 0, timeout=60)
            start.start = float("-inf")  # everything due before the first connection was hit by the start
            windows.append(start)
            plan = fault_plan(args, first_due)
            faults = asyncio.create_task(apply_faults(plan, peer, bot, windows, args))
            typing = asyncio.create_task(type_reminders(peer, planned, first_due, args))
            deadline = first_due + args.window + args.drain
            while time.time() < deadline:  # bounded by the drain deadline
                bot.check()
                if faults.done() and typing.done():
                    wanted = {p.index for p in planned if p.group != STUCK_GROUP}
                    if wanted <= {a.index for a in peer.arrivals}:
                        await asyncio.sleep(1.0)  # long enough for a late duplicate to show
                        break
                await asyncio.sleep(0.2)
            for task in (faults, typing):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            skipped = typing.result() if not typing.cancelled() else 0
            windows.sort(key=lambda w: w.start)
            stop.set()
            peer.allowed = False
            await peer.drop()
            await asyncio.wait_for(peer_task, timeout=10)
        finally:
            bot.stop(timeout=15)
    created, status = outbox_rows(data / "qunbot.sqlite3")
    report(args, planned, peer, windows, bot, created, status, t0, skipped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=300, help="reminders in the acknowledging groups")
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--stuck-count", type=int, default=3, help="reminders in the never-acknowledged group")
    parser.add_argument("--window", type=int, default=80, help="seconds the due instants spread over")
    parser.add_argument("--lead", type=float, default=10.0, help="seconds from start to the first due instant")
    parser.add_argument("--live", type=int, default=30, help="reminders typed as /remind during the run")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--outages", type=int, default=2)
    parser.add_argument("--outage-s", type=float, default=5.0)
    parser.add_argument("--restart-delay", type=float, default=1.0, help="restart after 0..this many seconds")
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--max-attempts", type=int, default=6)
    parser.add_argument("--action-timeout", type=float, default=5.0, help="onebot action_timeout_s")
    parser.add_argument("--pre", type=float, default=1.0, help="a fault window starts this long before the fault")
    parser.add_argument("--post", type=float, default=2.0, help="... and ends this long after the reconnect")
    parser.add_argument("--drain", type=float, default=25.0, help="seconds after the last due to wait for stragglers")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--show-worst", type=int, default=3, help="print the latest deliveries after a reconnect")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (config, database, bot.log)")
    args = parser.parse_args()
    random.seed(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="qunbot-faults-"))
    try:
        asyncio.run(run(args, tmp))
    finally:
        if args.keep:
            print(f"[files] {tmp} (bot.log, data/qunbot.sqlite3)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
