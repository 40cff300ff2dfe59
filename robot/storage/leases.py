"""Leases: which process holds what (an account's connection, its outbox rows), for how long.

A process holds a name (``account:telegram:bot1``) while it keeps renewing it; one that stops
(killed, cut off from the database) loses it ``ttl`` later, and another process may take it.
Every process also holds ``process:<id>`` so that others can tell the living from the dead (a
message claimed by a dead process is taken over; one claimed by a living one is not).

On SQLite one process owns the file, so a lease is always granted: a restart after a crash
takes its accounts back at once instead of waiting out its own dead predecessor's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from robot.storage.base import Engine, Tx, iso, ticks

__all__ = ["LeaseKeeper", "Leases", "process_id"]

log = logging.getLogger(__name__)

PROCESS_PREFIX = "process:"
_ME = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def process_id() -> str:
    """This process's holder id: host, pid and a random suffix (pids are reused)."""
    return _ME


SCHEMA = ["CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, "
          "expires_at TEXT NOT NULL, acquired_at TEXT NOT NULL)"]


class Leases:
    """Acquire, renew and release named leases in the bot's database."""

    def __init__(self, db: Engine, *, ttl_s: float = 15.0, holder: str | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.db = db
        self.ttl = timedelta(seconds=ttl_s)
        self.holder = holder or process_id()
        self.clock = clock or db.now  # the database's time: every process compares the same instants
        db.migrate("leases", SCHEMA)

    @property
    def exclusive(self) -> bool:
        """Whether other processes may share the database (and so leases can be refused)."""
        return self.db.dialect != "sqlite"

    def acquire_sync(self, tx: Tx, name: str) -> bool:
        """Take or renew ``name`` for this process inside ``tx``; False while another process holds it."""
        now = self.clock()
        takeover = "" if self.exclusive else " OR 1 = 1"
        row = tx.execute(
            "INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at, "
            "acquired_at = CASE WHEN leases.holder = excluded.holder THEN leases.acquired_at "
            "ELSE excluded.acquired_at END "
            f"WHERE leases.holder = excluded.holder OR leases.expires_at < ?{takeover} RETURNING holder",
            [name, self.holder, iso(now + self.ttl), iso(now), iso(now)]).fetchone()
        return row is not None

    async def acquire(self, name: str) -> bool:
        """Take or renew ``name``; False while another living process holds it."""
        return await self.db.run(lambda tx: self.acquire_sync(tx, name))

    async def renew(self, names: Iterable[str]) -> set[str]:
        """Extend every lease in ``names`` this process still holds; returns those (the rest are lost).

        Ahead of the process's queued work (:meth:`Engine.run_ahead`): a backlog is no reason to give
        accounts up while the database answers."""
        wanted = sorted(set(names))
        if not wanted:
            return set()

        def work(tx: Tx) -> set[str]:
            return {name for name in wanted if self.acquire_sync(tx, name)}

        return await self.db.run_ahead(work)

    async def release(self, names: Iterable[str]) -> None:
        """Give leases up at once (a clean stop): another process may take them without waiting."""
        gone = sorted(set(names))
        if gone:
            marks = ", ".join("?" for _ in gone)
            await self.db.run(lambda tx: tx.execute(
                f"DELETE FROM leases WHERE holder = ? AND name IN ({marks})", [self.holder, *gone]))

    async def holders(self, prefix: str = "") -> dict[str, str]:
        """Unexpired leases whose name starts with ``prefix``: name -> holder."""
        now = iso(self.clock())
        rows = await self.db.run(lambda tx: tx.execute(
            "SELECT name, holder FROM leases WHERE expires_at >= ?", [now]).fetchall())
        return {str(r[0]): str(r[1]) for r in rows if str(r[0]).startswith(prefix)}

    def alive_sync(self, tx: Tx, holder: str) -> bool:
        """Whether ``holder`` (a process id) is this process or still renews its process lease."""
        if holder == self.holder:
            return True
        if not self.exclusive:
            return False  # one process per SQLite file: any other holder is this one's dead predecessor
        row = tx.execute("SELECT 1 FROM leases WHERE name = ? AND expires_at >= ?",
                         [PROCESS_PREFIX + holder, iso(self.clock())]).fetchone()
        return row is not None


class LeaseKeeper:
    """Renews this process's leases in the background and takes wanted ones as they fall free.

    ``want(name, on_change)``: ``on_change(True)`` once the lease is taken, ``on_change(False)`` if
    it is lost (another process took it after this one failed to renew in time).
    """

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.wanted: dict[str, Callable[[bool], object] | None] = {}
        self.held: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        ttl = leases.ttl.total_seconds()
        # A renewal writes an expiry of (when it ran) + ttl, and it ran after this process sent it:
        # the leases are surely still ours until (when the round began) + ttl. The margin covers
        # the stop of what they guard and the processes' clocks (kept to the database's).
        self.trust_s = max(ttl / 2, ttl - max(0.5, ttl / 10))
        self._until = 0.0  #: the :func:`ticks` until which the held leases are surely ours

    @property
    def process_lease(self) -> str:
        return PROCESS_PREFIX + self.leases.holder

    def holds(self, name: str) -> bool:
        return name in self.held

    async def place(self) -> tuple[int, int]:
        """This process's index among the living processes (by holder id), and how many they are."""
        me = self.leases.holder
        living = sorted({*(await self.leases.holders(PROCESS_PREFIX)).values(), me})
        return living.index(me), len(living)

    async def want(self, name: str, on_change: Callable[[bool], object] | None = None) -> bool:
        """Ask for ``name`` now and keep asking; returns whether it is held now."""
        self.wanted[name] = on_change
        if self._task is not None:
            await self._round()
        return name in self.held

    async def drop(self, name: str) -> None:
        """Stop wanting ``name`` and give it up at once (its connection closed here)."""
        self.wanted.pop(name, None)
        if name in self.held:
            self.held.discard(name)
            await self.leases.release([name])

    async def _round(self) -> None:
        names = [self.process_lease, *self.wanted]
        began = ticks()
        if self.leases.exclusive:
            # Fail closed on time: a renewal the database has not answered (cut off, stalled) by the
            # time the held leases may expire counts as a failure, so the channels stop before another
            # process may take their accounts over. A late answer is not trusted either: what it
            # renewed may expire soon after. Renewals run apart from the process's other work
            # (run_ahead), so that a backlog of it keeps the leases; but work that no longer finishes
            # at all (every pooled connection silent) lets them expire, for another process to serve.
            stalled = self.leases.db.stalled_s()
            if stalled > self.trust_s:
                raise TimeoutError(f"none of this process's database work has finished for {stalled:.1f} s")
            limit = began + self.trust_s
            if self.held:
                limit = min(limit, self._until)
            wait = limit - began
            if wait <= 0.0:  # not the database's doing: this process itself came back too late
                raise TimeoutError(f"this process came back to renew its leases {began - limit:.1f} s after they "
                                   "may have expired (paused, or its event loop busy)")
            try:
                now_held = await asyncio.wait_for(self.leases.renew(names), wait)
            except TimeoutError:
                raise TimeoutError(f"the database did not answer within {wait:.1f} s, before this process's "
                                   "leases may expire") from None
        else:  # one process per file: nobody else can take a lease, so a slow renewal loses nothing
            now_held = await self.leases.renew(names)
        for name, on_change in list(self.wanted.items()):
            was, now = name in self.held, name in now_held
            if was != now:
                log.log(logging.INFO if now else logging.WARNING, "lease %s %s", name, "taken" if now else "LOST")
                if on_change is not None:
                    try:
                        on_change(now)
                    except Exception:
                        log.exception("lease %s: the change handler failed", name)
        # A name dropped while this round was under way (its socket closed): the renewal may have taken it
        # again after drop() gave it up; it is given up again, not held till it expires, blocking others.
        stale = {n for n in now_held if n not in self.wanted and n != self.process_lease}
        self.held = set(now_held) - stale
        self._until = began + self.trust_s
        if stale:
            await self.leases.release(sorted(stale))

    async def start(self) -> None:
        await self._round()
        self._task = asyncio.create_task(self._loop(), name="qunbot-leases")

    async def _loop(self) -> None:
        period = max(self.leases.ttl.total_seconds() / 3, 0.2)
        while True:
            # Not past the time the held leases are surely ours (after a slow round): a round then
            # renews them or, unanswered, gives them up on time.
            wait = min(period, self._until - ticks()) if self.held and self.leases.exclusive else period
            await asyncio.sleep(max(0.0, wait))
            try:
                await self._round()
            except Exception as exc:
                log.warning("leases: cannot renew (%s)", exc)
                if not self.leases.exclusive:  # one bot process per SQLite file: nobody can take them
                    continue
                # Fail closed, as if every lease were lost (another process may take them once they
                # expire), and keep trying.
                for name, on_change in self.wanted.items():
                    if name in self.held and on_change is not None:
                        on_change(False)
                self.held = set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):  # else they expire: a stop does not wait for a database that is down
            await asyncio.wait_for(self.leases.release(self.held), min(5.0, self.trust_s))
        self.held = set()
