"""Daily LLM token budgets (per user, per chat, bot-wide), atomic across processes.

A spend reserves its estimated cost before the model is called and settles after. The
reservation is one transaction of guarded UPDATEs in the database (``held = held + n WHERE
tokens + held + n <= cap``, per capped scope): concurrent spends in any number of processes see
each other's holds, and a day's budget is never overspent by reservations. Every hold is also
written as rows of its own in ``budget_holds`` (see :mod:`robot.budget_rows`), which its
settlement deletes: the holds of a process that died mid-call are charged as spent (what it spent
is unknown, and a provider bills a call its caller was killed during) when a reservation would
otherwise be refused (its owner no longer renews its lease; on SQLite any other holder is this
process's dead predecessor), a day's holds count only that day, and a settlement retried after
an unknown commit is written once. Without any cap configured the database is not touched
per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from function_calls import Caller, Usage
from robot.budget_rows import SCHEMA, BudgetExceeded, day_before, reap_sync, rows_sync, settle_sync
from robot.message import group_key
from robot.reservation import Reservation
from robot.reservation import active as _active
from robot.storage import Engine, Pending, Tx
from robot.storage.base import CommitUnknown
from robot.storage.leases import Leases

__all__ = ["BudgetExceeded", "DailyBudget", "Reservation"]

log = logging.getLogger(__name__)


class DailyBudget:
    """Per-user, per-chat and bot-wide daily token budgets; the invoke loop's :class:`BudgetHook`.

    Use :meth:`reserve` around every spend. Inside a reservation :meth:`remaining` leaves out the
    caller's own hold (the loop sizes its run by it) and :meth:`charge` settles it.
    """

    def __init__(self, db: Engine, zone: ZoneInfo, *, user_tokens: int | None, chat_tokens: int | None,
                 bot_tokens: int | None = None, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 leases: Leases | None = None, pending: Pending | None = None) -> None:
        self.db = db
        self.zone = zone
        self.user_tokens = user_tokens
        self.chat_tokens = chat_tokens
        self.bot_tokens = bot_tokens
        self.clock = clock
        self.leases = leases if leases is not None else Leases(db)
        self._held: dict[str, int] = {}  # spending beyond estimates, held in this process only
        self._day_span = (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC), "")  # empty
        #: Settlements that failed (the database unreachable), retried until they are written.
        self.pending = pending if pending is not None else Pending(db)
        # Flushed where a crash could undo a commit: an undone reservation would be released all the
        # same (the budget grows), an undone settlement would leave its hold and not record its spend.
        self._durable = not db.crash_safe
        db.migrate("budgets", SCHEMA)

    @property
    def capped(self) -> bool:
        return any(cap is not None for cap in (self.user_tokens, self.chat_tokens, self.bot_tokens))

    def _day(self) -> str:
        now = self.clock()
        start, end, day = self._day_span
        if start <= now < end:  # several times per message: the zone conversion was a hot spot
            return day
        # Zone offsets and their changes fall on quarter hours: within a quarter hour of UTC the
        # local date is one.
        utc = now.astimezone(UTC)
        start = utc.replace(minute=utc.minute - utc.minute % 15, second=0, microsecond=0)
        self._day_span = (start, start + timedelta(minutes=15), now.astimezone(self.zone).strftime("%Y-%m-%d"))
        return self._day_span[2]

    @staticmethod
    def _scopes(caller: Caller) -> tuple[str, str, str]:
        chat = group_key(f"{caller.platform}:{caller.chat_kind}:{caller.chat_id}")  # (a forum topic spends its group's)
        return f"user:{caller.qualified_user}", f"chat:{chat}", "bot"

    def _capped(self, caller: Caller) -> dict[str, int]:
        caps = (self.user_tokens, self.chat_tokens, self.bot_tokens)
        return {scope: cap for scope, cap in zip(self._scopes(caller), caps, strict=True) if cap is not None}

    def _hold(self, scopes: tuple[str, ...], tokens: int) -> None:
        for scope in scopes:
            self._held[scope] = self._held.get(scope, 0) + tokens
            if self._held[scope] <= 0:
                del self._held[scope]

    def _left(self, caps: dict[str, int], taken: dict[str, int], mine: int = 0) -> tuple[str, int]:
        """The tightest scope and what is left of it."""
        return min(((scope, cap - taken[scope] - self._held.get(scope, 0) + mine) for scope, cap in caps.items()),
                   key=lambda item: item[1])

    def _reserve_sync(self, db: Tx, day: str, caps: dict[str, int], tokens: int, need: int,
                      holder: str) -> tuple[int, dict[str, int] | None] | BudgetExceeded:
        """Hold up to ``tokens`` (at least ``need``) in every capped scope; returns the hold and, when
        it read them, the scopes' recorded plus held tokens with this hold; or the refusal (returned,
        not raised: the unit commits, and the dead processes' holds it charged stay charged).

        Every unit locks the day's rows first, in the scopes' order, then the holds (PostgreSQL holds
        row locks until the commit): two units never wait for each other in a cycle.
        """
        scopes = list(caps)
        for reaped in (False, True):
            hold, taken = tokens, None
            if need < tokens:  # "what is left, if at least need": size the hold first, the rows locked
                locked = db.dialect == "postgresql"  # in the scopes' order: two units never deadlock
                if locked:  # (SQLite's one writer holds the whole database: no rows to create and lock first)
                    db.execute("INSERT INTO usage_daily (day, scope, tokens) VALUES "
                               + ", ".join("(?, ?, 0)" for _ in scopes) + " ON CONFLICT (day, scope) DO NOTHING",
                               [v for scope in sorted(scopes) for v in (day, scope)])
                taken = rows_sync(db, day, scopes, lock=locked)  # one statement reads and locks them
                hold = max(0, min(tokens, self._left(caps, taken)[1]))
            if not hold and not need:  # nothing fresh, and it borrows enough (see reserve)
                return 0, taken
            if hold >= need and self._take(db, day, caps, hold):
                db.execute("INSERT INTO budget_holds (day, scope, holder, tokens) VALUES "
                           + ", ".join("(?, ?, ?, ?)" for _ in scopes),
                           [v for s in sorted(scopes) for v in (day, s, holder, hold)])
                return hold, None if taken is None else {scope: n + hold for scope, n in taken.items()}
            if reaped or not reap_sync(db, self.leases, day, scopes):
                scope, left = self._left(caps, rows_sync(db, day, scopes))
                return BudgetExceeded(scope, max(0, left), need)
        raise AssertionError("unreachable")

    def _take(self, db: Tx, day: str, caps: dict[str, int], hold: int) -> bool:
        """The checked UPDATEs (an upsert: the day's first spend creates the row), in the scopes' order:
        every scope takes ``hold`` or none does."""
        ordered = sorted(caps.items())
        for index, (scope, cap) in enumerate(ordered):
            over = hold + self._held.get(scope, 0)
            if over > cap or not db.execute(
                    "INSERT INTO usage_daily (day, scope, tokens, held) VALUES (?, ?, 0, ?) ON CONFLICT (day, scope) "
                    "DO UPDATE SET held = usage_daily.held + excluded.held "
                    "WHERE usage_daily.tokens + usage_daily.held + ? <= ?", [day, scope, hold, over, cap]).rowcount:
                for earlier, _ in ordered[:index]:  # undo this attempt's holds before a retry or refusal
                    db.execute("UPDATE usage_daily SET held = held - ? WHERE day = ? AND scope = ?",
                               [hold, day, earlier])
                return False
        return True

    async def prune(self) -> int:
        """Drop the holds of the days before yesterday (housekeeping); returns how many rows went.

        A hold charged for a dead process keeps its row (at 0 tokens) till then: should that process
        only have stalled, its settlement (retried after an unknown commit, too) finds it, gives the
        charge back and records what it spent (with the row gone, a retry would take itself for
        written and record nothing)."""
        since = day_before(self._day())
        return await self.db.run(lambda db: db.execute("DELETE FROM budget_holds WHERE day < ?", [since]).rowcount)

    # -- the interface -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reserve(self, caller: Caller, tokens: int, *, at_least: int | None = None,
                      lends: bool = False) -> AsyncIterator[Reservation]:
        """Hold ``tokens`` against the caller's budgets for the ``async with`` block, or refuse.

        With ``at_least``, hold what is left (up to ``tokens``) as long as that is ``at_least``.
        Raises :class:`BudgetExceeded` when the spend cannot fit, or when the store cannot be
        read (a budget that cannot be checked refuses). Report spending with
        :meth:`Reservation.spend`; on exit, unrecorded spending passes to the enclosing
        reservation (whose owner records it, e.g. the invoke loop), or is recorded here.

        ``lends``: its owner reports what it spends as it goes (the invoke loop charges each turn), so
        reservations nested in it may borrow what it holds and has not spent, once no fresh room is left.
        """
        tokens = max(0, tokens)
        parent = _active.get()
        caps, day, hold = self._capped(caller), self._day(), tokens
        holder = f"{self.leases.holder}/{os.urandom(6).hex()}"  # its rows in budget_holds
        # Nested in a run of the same scopes (a tool it called): what the run holds and has not spent
        # may be lent, once fresh room runs out (else a deep_think in the day's last run's worth of
        # tokens found none: the run held it).
        lender = parent if (parent is not None and parent.budget is self and parent.lends and not parent.closed
                            and parent.day == day and parent.scopes == tuple(caps)) else None
        borrowed = 0
        if tokens > 0 and caps:  # an empty reservation only collects what nested spends report
            need = tokens if at_least is None else min(tokens, max(at_least, 1))
            lend = min(lender.free(), tokens) if lender is not None else 0
            if lender is not None:  # promised before the await: a sibling cannot borrow it meanwhile
                lender.lent += lend
            got: tuple[int, dict[str, int] | None] | Exception
            unit = asyncio.ensure_future(self.db.transaction(
                lambda db: self._reserve_sync(db, day, caps, tokens, max(0, need - lend), holder),
                durable=self._durable))
            try:
                got = await asyncio.shield(unit)
            except asyncio.CancelledError:  # the unit runs on: a hold it writes would stay all day
                unit.add_done_callback(lambda done: self._orphan(done, caps, day, tokens, holder))
                raise
            except Exception as exc:
                got = exc
            finally:  # (cancelled too: a promise never given back would keep the lender's hold all day)
                if lender is not None:
                    lender.lent -= lend
            if lender is not None and not isinstance(got, Exception):
                borrowed = min(lend, tokens - got[0])
                lender.lent += borrowed
            if isinstance(got, BudgetExceeded):
                raise got
            if isinstance(got, Exception):
                if isinstance(got, CommitUnknown):  # refused, but its hold may be written: release it if so
                    self._release_later(caps, day, tokens, holder, "releasing a refused reservation's hold", got)
                raise BudgetExceeded("store", 0, tokens) from got
            hold, taken = got
        else:
            taken = None
        stored = hold if tokens > 0 and caps else 0
        reservation = Reservation(self, tuple(caps), hold + borrowed, parent, day=day, stored=stored, taken=taken,
                                  holder=holder, borrowed=borrowed, lends=lends)
        token = _active.set(reservation)
        try:
            yield reservation
        finally:
            _active.reset(token)
            await self._close(reservation, caller)

    def _release_later(self, caps: dict[str, int], day: str, tokens: int, holder: str, what: str,
                       error: BaseException) -> None:
        """Release a hold its reservation never got (its unit's outcome unknown, or cancelled), if written."""
        self.pending.add(lambda db: settle_sync(db, {}, Reservation(
            self, tuple(caps), tokens, day=day, stored=tokens, holder=holder), tokens, day, retry=True),
            what, error, idempotent=True)

    def _orphan(self, done: asyncio.Future[tuple[int, dict[str, int] | None] | BudgetExceeded], caps: dict[str, int],
                day: str, tokens: int, holder: str) -> None:
        error = None if done.cancelled() else done.exception()
        result = done.result() if not done.cancelled() and error is None else None
        if isinstance(error, CommitUnknown) or (isinstance(result, tuple) and result[0]):
            self._release_later(caps, day, tokens, holder, "releasing a cancelled reservation's hold",
                                error or asyncio.CancelledError())

    def for_run(self, caller: Caller, tokens: int) -> contextlib.AbstractAsyncContextManager[Reservation]:
        """The hold around an invoke loop's run: ``tokens`` or what is left today, lent to its tools."""
        return self.reserve(caller, tokens, at_least=1, lends=True)

    async def _close(self, res: Reservation, caller: Caller) -> None:
        res.closed, parent = True, res.parent
        to_parent = res.passes and parent is not None and not parent.closed
        spent = res.unsettled + res.passed  # (what was charged in it is recorded by it, under who was charged)
        records = {k: v for k, v in res.charged.items() if v} if self.capped else {}
        if spent and not to_parent and self.capped:
            key = self._scopes(caller)
            records[key] = records.get(key, 0) + spent
        if not res.passes and parent is not None and res.borrowed:  # what it records of its loan is spent
            parent.elsewhere += min(res.owed(), res.borrowed)
        # What it lent stays held (with its rows) until given back; the rest goes now, what it borrowed too.
        shrink, release = bool(res.lent), res._drop(res.held - res.lent)
        if to_parent and spent:
            assert parent is not None
            parent.passed += spent  # the enclosing spend records it, with its tools' usage
            parent._cover()
        res.unsettled, res.passed, res.charged = 0, 0, {}
        await self._settle(res, records, release, shrink=shrink)
        lender = res.parent if res.borrowed == 0 and not res.lent else None
        while lender is not None and lender.closed and not lender.lent and lender.held:
            await self._settle(lender, {}, lender._drop(lender.held))  # it closed first: its hold goes now
            lender = lender.parent if lender.borrowed == 0 else None

    async def _settle(self, res: Reservation, records: dict[tuple[str, ...], int], release: int, *,
                      shrink: bool = False) -> None:
        if records or release:
            outer = res.parent
            while outer is not None:  # what they read is no longer what the database holds
                outer.taken = None
                outer = outer.parent
            # On the day its hold covered: a run across midnight charged today, whose cap others had held.
            day = res.day or self._day()
            try:
                await self.db.transaction(lambda db: settle_sync(db, records, res, release, day, shrink=shrink),
                                          durable=self._durable)
            except Exception as exc:  # the hold stays meanwhile (fail closed), not for the rest of the day
                self.pending.add(lambda db: settle_sync(db, records, res, release, day, retry=True, shrink=shrink),
                                 f"recording {sum(records.values())} tokens and releasing {release}", exc,
                                 idempotent=release > 0 and not shrink)  # (its hold's rows tell if it was written)

    async def used(self, scope: str) -> int:
        """Tokens recorded today for ``scope`` (``user:<platform>:<id>``, ``chat:...``, ``bot``)."""
        day = self._day()
        row = await self.db.run(lambda db: db.execute("SELECT tokens FROM usage_daily WHERE day = ? AND scope = ?",
                                                      [day, scope]).fetchone())
        return int(row[0]) if row else 0

    async def remaining(self, caller: Caller) -> int | None:
        """Tokens left today after every other spend's hold (this task's own hold counts as left)."""
        caps = self._capped(caller)
        if not caps:
            return None
        day = self._day()
        mine: dict[str, int] = {}
        res = _active.get()
        while res is not None:
            if res.budget is self and res.day == day and not res.closed:  # (a hold counts on its own day)
                for scope in res.scopes:  # what it spent is not left, and what it lent counts in the borrower
                    mine[scope] = mine.get(scope, 0) + res.held - res.used() - res.lent
            res = res.parent
        inner = _active.get()
        if (inner is not None and inner.budget is self and inner.taken is not None and inner.day == day
                and not inner.closed and inner.scopes == tuple(caps)):
            # Inside a reservation that read its rows: the run is sized by what it holds (others'
            # holds since cannot take that), so its own transaction's figures answer.
            taken = inner.taken
        else:
            taken = await self.db.run(lambda db: rows_sync(db, day, list(caps)))
        left = min(cap - taken[s] - self._held.get(s, 0) + mine.get(s, 0) for s, cap in caps.items())
        return max(0, left)

    async def charge(self, caller: Caller, usage: Usage, *, tools: bool = False) -> None:
        """Record spent tokens; inside a reservation they are recorded when it closes (held till then).

        ``tools``: the usage tools reported (:meth:`charge_tools`); what reservations nested in this one
        passed to it as they closed is part of it, not more."""
        res = _active.get()
        res = res if res is not None and res.budget is self and not res.closed else None
        if not self.capped and res is None:
            return  # nothing is checked against it: no database write per call
        spent = usage.total_tokens
        if res is not None:  # recorded when the reservation closes, held until then: no write now
            if tools:  # (not a model turn's: a timed-out tool's passed spend, reported by nobody, stays)
                res.reported(spent)
            key = self._scopes(caller)
            res.charged[key] = res.charged.get(key, 0) + max(0, spent)
            res._cover()
            return
        day = self._day()
        await self.db.transaction(lambda db: settle_sync(db, {self._scopes(caller): spent}, None, 0, day),
                                  durable=self._durable)

    async def charge_tools(self, caller: Caller, usage: Usage) -> None:
        """:meth:`charge` for the usage a run's tools reported (the invoke loop calls it so)."""
        await self.charge(caller, usage, tools=True)
