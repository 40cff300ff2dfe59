"""The durable outbox: every outgoing message is committed to the database before it is sent.

Each chat is a lane of its own: a worker per channel starts a lane for every chat with due rows
(a queued row names its chat), and the lane sends that chat's rows in order, one at a time. At most
``max_in_flight`` sends are awaiting the platform at once per channel, and as many more slow ones
(:class:`robot.outbox_slots.Slots`), which bounds the duplicates a crash can cause (below): a send unanswered after
``slow_s`` and a retry wait in slots of their own, so chats whose peer never answers delay no other.

Failures are classified (see :mod:`robot.channels.base`):

- :class:`ChannelUnavailable` (not connected): the chat is parked without growing its backoff
  and goes again as soon as the channel reconnects (or after ``park_s`` for channels that do not
  announce it);
- :class:`SendFailed` (no answer in time, a transient refusal): retried with exponential backoff,
  ``max_attempts`` times in all, then marked failed;
- :class:`SendRejected` (final): marked failed at once.

A failed row is logged at ERROR once and counted by ``qunbot doctor``. Backoff is not carried
across a restart: pending rows are due again at start.

Long texts go out in parts within the channel's limit; ``parts_sent`` is committed after each
part, so a restart resumes at the first unsent part and never repeats one. The duplicate window:
a crash between the platform's acknowledgement and the commit that marks a row sent resends that
row once at the next start; at most twice ``max_in_flight`` rows (per channel) can be in that window.
A database that goes away (or crashes and loses its last commits) while the process runs resends
nothing: the keys delivered lately are remembered, and such a row is marked when it comes back.
Platforms that take a client message id can use ``OutgoingMessage.key`` to make that resend
idempotent. A send that may have happened unanswered (a timeout, a OneBot socket closed after the
frame went out) is :class:`SendFailed`: its resend may double it, and ``max_attempts`` bounds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from robot.admission import Crowd
from robot.channels.base import ACCOUNT_LEASE, Channel
from robot.message import OutgoingMessage
from robot.outbox_claims import CLAIM_LIMIT, Claimed, Scope, claim_many_sync, release_sync
from robot.outbox_slots import Slots
from robot.outbox_store import SCHEMA, OutboxRows
from robot.storage import Tx
from robot.storage.batch import Batched
from robot.storage.leases import LeaseKeeper, process_id
from robot.store import Engine, iso, parse_iso
from robot.text_parts import split_text

__all__ = ["Outbox", "split_text"]

log = logging.getLogger(__name__)


class Outbox(OutboxRows):
    """Durable, idempotent, per-channel delivery."""

    look_s = 5.0  #: seconds between the worker's reads of every due row while no lane needs one

    def __init__(
        self,
        db: Engine,
        *,
        bot_id: str = "bot",
        bot_name: str = "qunbot",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        max_in_flight: int = 4,
        max_attempts: int = 6,
        park_s: float = 2.0,
        leases: LeaseKeeper | None = None,
        claim_s: float = 60.0,
        priority_s: float = 0.0,
        slow_s: float = 1.0,
    ) -> None:
        self.db = db
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.clock = clock
        self.retry_base_s, self.retry_max_s = retry_base_s, retry_max_s
        self.max_in_flight, self.max_attempts, self.park_s = max_in_flight, max_attempts, park_s
        self.slow_s = slow_s  #: seconds after which a send unanswered stops holding a slot (see Slots)
        #: Which accounts this process holds: it sends only their rows (see :meth:`scope`).
        self.leases = leases
        self.claim_s = claim_s
        self.crowd = Crowd(priority_s, hold=db.hold_ordinary)  #: how many chats are sending: a burst goes first
        self._scopes: dict[str, Scope] = {}
        self._channels: dict[str, Channel] = {}
        #: Per channel: chats parked (not connected, a retry due later, a failed lane), till a monotonic time.
        self._parked: dict[str, dict[str, float]] = {}
        self._sending: set[str] = set()  # keys a lane is sending now: a lost account's release leaves them
        #: Per channel: how many times it (re)connected; a lane parks only if none happened during its send.
        self._connects: dict[str, int] = {}
        self._wake: dict[str, asyncio.Event] = {}
        #: Per channel, chats with a row queued since their lane looked; channels to look at every row.
        self._hints: dict[str, set[str]] = {}
        self._scan: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._releases: set[asyncio.Task[None]] = set()  # of channels left: see leave()
        self._stopping = True  # until start()
        self._grace_s = 0.0  # while stopping: how long a send under way may take to finish
        # Sending goes ahead of the units queued for incoming messages (``urgent``: see Engine.run).
        self._claims: Batched[tuple[str, str, Scope, str, str], Claimed] = Batched(
            db, lambda tx, items: claim_many_sync(tx, items, self.holder, self._alive), urgent=True)
        self._marks = Batched(db, self._mark_many, urgent=True)
        self._delivered: dict[str, tuple[int, str | None]] = {}  # key: parts sent, receipt (see _send_row)
        db.migrate("outbox", SCHEMA)
        db.subscribe("outbox", self.notify)  # a row another process queued for an account this one holds

    @property
    def holder(self) -> str:
        """This process's id in claims (its lease holder id)."""
        return self.leases.leases.holder if self.leases is not None else process_id()

    def claims_for(self, messages: Sequence[OutgoingMessage]) -> list[tuple[str, str] | None]:
        """Per message, this process's claim ``(holder, until)`` when it may send it now, else None
        (called in a unit of work, on a database thread): each platform's scope read once."""
        if self._stopping:
            return [None] * len(messages)
        claim = self.holder, iso(self.clock() + timedelta(seconds=self.claim_s))
        scopes = {p: self.scope(p) for p in {m.chat.platform for m in messages} if p in self._channels}
        return [claim if (scope := scopes.get(m.chat.platform)) is not None and scope.covers(m.chat.account) else None
                for m in messages]

    def _alive(self, tx: Tx, holder: str) -> bool:
        return self.leases.leases.alive_sync(tx, holder) if self.leases is not None else holder == self.holder

    def scope(self, platform: str) -> Scope:
        """The rows of ``platform`` this process may send now.

        A channel without per-account connections (web, WeCom) sends every row of its platform.
        One with them (``Channel.account_leases``: Telegram, Weixin, OneBot) sends the rows of the
        accounts whose lease ``account:<platform>:<account>`` this process holds; a row naming no
        account goes with the channel's :meth:`~Channel.default_account` (its only account), and
        when it has none, with any account held, on SQLite only (one process: nobody else could).
        """
        channel = self._channels.get(platform)
        if channel is None or not channel.account_leases or self.leases is None:
            return Scope()
        prefix = ACCOUNT_LEASE.format(platform=platform, account="")
        # A copy first (one C call): claims_for asks from a database thread while the event loop changes the set.
        held = tuple(sorted(n[len(prefix):] for n in frozenset(self.leases.held) if n.startswith(prefix)))
        default = channel.default_account()
        empty = default in held if default else bool(held) and not self.leases.leases.exclusive
        return Scope(held, empty)

    def notify(self, platform: str, chat: str = "", account: str = "") -> None:
        """Wake the platform's worker after a commit: for ``chat`` only, or to look for every due row.

        A queued row names its chat (``["platform", "chat", "account"]`` from any process): only that
        lane starts, where reading every due row cost a read per row, growing with the chats waiting.
        """
        if platform.startswith("["):  # a notification: no platform name starts so
            platform, chat, account, *claimed = (str(part) for part in json.loads(platform))
            if claimed and claimed[0] != self.holder:
                return  # queued claimed by the process that sends it (enqueue_many_sync's send_here)
        if not chat:
            self._scan.add(platform)
        elif self.scope(platform).covers(account):  # another process's account: its holder sends it
            self._hints.setdefault(platform, set()).add(chat)
        event = self._wake.get(platform)
        if event is not None:
            event.set()

    async def enqueue(self, *messages: OutgoingMessage) -> int:
        """Commit messages (one transaction) and wake their workers; returns how many were new.

        Flushed to disk first where a database crash could undo a commit: the caller queues them once."""
        added = await self.db.transaction(lambda db: sum(self.enqueue_many_sync(db, messages)),
                                          durable=not self.db.crash_safe)
        for m in messages:
            self.notify(m.chat.platform, m.chat.key, m.chat.account)
        return added

    def register(self, channel: Channel) -> None:
        """Send ``channel``'s rows from this process (at :meth:`start`, or at once once started)."""
        platform = channel.platform
        if platform not in self._wake:  # not again when a one-process channel comes back here
            self._wake[platform], self._parked[platform] = asyncio.Event(), {}
            channel.on_connect(functools.partial(self._reconnected, platform))
            self.db.after_gap(functools.partial(self.notify, platform))  # rows queued elsewhere meanwhile
        self._channels[platform] = channel
        if not self._stopping and platform not in self._workers:
            self._workers[platform] = asyncio.create_task(self._worker(platform, channel), name=f"outbox-{platform}")

    async def leave(self, platform: str) -> None:
        """Send no more of ``platform``'s rows here (its channel moved to another process). This process's
        claims on them are given up in the background (the new holder sends them at once; the caller goes on)."""
        self._channels.pop(platform, None)
        self._scopes.pop(platform, None)
        self._parked.get(platform, {}).clear()  # parked for a channel stopped here: nothing to wait out
        task = self._workers.pop(platform, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        release = asyncio.create_task(self._release(platform))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)

    async def _release(self, platform: str) -> None:
        with contextlib.suppress(Exception):
            await self.db.run(lambda db: release_sync(db, self.holder, platform))

    def _reconnected(self, platform: str) -> None:
        """A channel (re)connected: what was parked for it goes now."""
        self._connects[platform] = self._connects.get(platform, 0) + 1
        self._parked.get(platform, {}).clear()
        self.notify(platform)

    async def start(self) -> None:
        """Start a worker per channel; backoff from a previous run is not inherited (see :meth:`_unwait`)."""
        self._stopping, shared = False, self.leases is not None and self.leases.leases.exclusive
        others = await self.leases.leases.holders() if shared and self.leases is not None else {}
        await self._unwait({name for name, holder in others.items() if holder != self.holder})
        for channel in list(self._channels.values()):
            self.register(channel)

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Give due messages up to ``flush_timeout_s`` to go out, then stop the workers: a send under
        way gets up to ``flush_timeout_s`` more to finish and be marked (0: cut off, as by a kill)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), flush_timeout_s)
        self._stopping, self._grace_s = True, flush_timeout_s  # no lane takes another row
        workers, self._workers = list(self._workers.values()), {}
        if workers and flush_timeout_s > 0:
            # Cut off, a send may have reached the platform unmarked: the next holder would send it again.
            for event in self._wake.values():
                event.set()
            await asyncio.wait(workers, timeout=flush_timeout_s)
        for task in [*workers, *self._releases]:  # (stop's own release below covers a left channel's)
            task.cancel()
        await asyncio.gather(*workers, *self._releases, return_exceptions=True)
        # What this process had claimed, another may send at once (else once this process's lease
        # expires): worth a moment, not a stop that waits for a database that is down.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.db.run(lambda db: release_sync(db, self.holder)), max(flush_timeout_s, 1.0))

    async def _claim(self, platform: str, chat: str) -> Claimed:
        """Claim the chat's pending rows in order (:func:`~robot.outbox_claims.claim_sync`), with other lanes'."""
        scope, now = self.scope(platform), self.clock()
        if scope.nothing:
            return [], False
        return await self._claims((platform, chat, scope, iso(now), iso(now + timedelta(seconds=self.claim_s))))

    async def _worker(self, platform: str, channel: Channel) -> None:
        wake, parked, hints = self._wake[platform], self._parked[platform], self._hints.setdefault(platform, set())
        lanes: dict[str, asyncio.Task[bool]] = {}
        slots = Slots(self.max_in_flight, self.slow_s)
        self._scan.add(platform)  # rows left from before the start
        deadline = 0.0  # (monotonic) when the next row waiting out a retry is due
        try:
            while not self._stopping:
                wake.clear()
                await self._rescope(platform)
                chats: list[str] = []
                if scanned := platform in self._scan or time.monotonic() >= deadline:
                    self._scan.discard(platform)
                    try:
                        chats, wait = await self._due_chats(platform, set(lanes))
                    except Exception:
                        log.exception("outbox %s: reading due rows failed", platform)
                        chats, wait = [], 1.0
                    deadline = time.monotonic() + min(wait if wait is not None else self.look_s, self.look_s)
                fresh = [chat for chat in hints if chat not in lanes]  # a busy chat waits for its lane's end
                hints.difference_update(fresh)
                clock = time.monotonic()
                for chat in dict.fromkeys([*chats, *fresh]):
                    if parked.get(chat, 0.0) > clock or chat in lanes:
                        continue
                    parked.pop(chat, None)
                    lane = asyncio.create_task(self._lane(platform, channel, chat, slots), name=f"outbox-{chat}")
                    lanes[chat] = lane
                    lane.add_done_callback(functools.partial(self._lane_done, lanes, platform, chat, wake))
                if scanned:  # parked till now yet not due: nothing left to send (its rows deleted: /forget me)
                    for chat in [c for c, until in parked.items() if until <= clock and c not in lanes]:
                        del parked[chat]  # (else the worker woke every 10 ms to read every due row)
                self.crowd.sending(platform, len(lanes))
                timeout = max(0.0, deadline - clock)
                if parked:
                    timeout = min(timeout, max(0.01, min(parked.values()) - clock))
                try:
                    await asyncio.wait_for(wake.wait(), timeout=timeout)
                except TimeoutError:
                    self._scan.add(platform)  # a retry or a parked chat is due
            if lanes and self._grace_s > 0:  # stopping: each lane ends after the row it is sending
                await asyncio.wait(list(lanes.values()), timeout=self._grace_s)
        finally:
            for lane in list(lanes.values()):
                lane.cancel()
            await asyncio.gather(*lanes.values(), return_exceptions=True)

    async def _rescope(self, platform: str) -> None:
        """An account was lost: give up this process's claims on its rows, so that its new holder sends them."""
        scope, before = self.scope(platform), self._scopes.get(platform)
        if scope == before:
            return
        try:
            if before is not None:
                busy = tuple(self._sending)  # (read here: the thread must not iterate a set the loop changes)
                await self.db.run(lambda db: release_sync(db, self.holder, platform, keep=scope, busy=busy))
            self._scopes[platform] = scope
        except Exception:
            log.exception("outbox %s: releasing claims failed", platform)

    def _lane_done(self, lanes: dict[str, asyncio.Task[bool]], platform: str, chat: str, wake: asyncio.Event,
                   task: asyncio.Task[bool]) -> None:
        lanes.pop(chat, None)
        self.crowd.sending(platform, len(lanes))
        if task.cancelled() or not task.result():  # a retry or park is due later: the worker looks again
            self._scan.add(platform)
        wake.set()

    async def _lane(self, platform: str, channel: Channel, chat: str, slots: Slots) -> bool:
        """Send one chat's due rows in order: True when none is left, False when one waits (retry, park)."""
        try:
            while not self._stopping:
                rows, blocked = await self._claim(platform, chat)
                if blocked and not rows:  # another living process is sending this chat
                    self._parked[platform][chat] = time.monotonic() + self.park_s
                if not rows:
                    return not blocked
                for row in rows:
                    if (wait := (parse_iso(str(row["next_at"])) - self.clock()).total_seconds()) > 0:
                        # Waiting out a retry: later rows of this chat wait too (order), and the chat
                        # with them, parked till then (rescanned at once, its later rows due, it spun)
                        self._parked[platform][chat] = time.monotonic() + wait
                        return False
                    connects = self._connects.get(platform, 0)
                    send = functools.partial(self._attempt, platform, channel, row)
                    outcome = await slots.run(send, retry=int(str(row["attempts"])) > 0)
                    if outcome == "lost":  # the account was lost meanwhile: its new holder sends the rest
                        return False
                    if outcome == "parked":
                        if self._connects.get(platform, 0) != connects:
                            break  # it reconnected while this send failed: try again now, not after park_s
                        self._parked[platform][chat] = time.monotonic() + self.park_s
                        return False
                    if outcome == "retry":
                        return False
                else:  # every claimed row was sent (not left to try again at once: the break above)
                    if len(rows) < CLAIM_LIMIT and not blocked:
                        # The claim took every row due then. A row queued since has woken the worker
                        # (its notification names this chat), which starts a lane for it once this
                        # one ends: claiming again here cost every send a second, empty claim.
                        return True
        except Exception:  # (a full disk): parked, not restarted at once in a loop of tracebacks
            log.exception("outbox %s: lane failed; it restarts in %g s", chat, self.park_s)
            self._parked[platform][chat] = time.monotonic() + self.park_s
        return False

    async def _attempt(self, platform: str, channel: Channel, row: dict[str, object]) -> str:
        """Send a row, in its slot: :meth:`_send_row`'s outcome, or "lost" when it may not go now."""
        # (checked once it has its slot: lanes wait for one, and meanwhile a stop or lease may come)
        if self._stopping or not self.scope(platform).covers(str(row.get("account") or "")):
            return "lost"
        key = str(row["key"])
        self._sending.add(key)
        try:
            return await self._send_row(channel, row)
        finally:
            self._sending.discard(key)
