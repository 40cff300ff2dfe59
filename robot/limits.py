"""Rate limits (token buckets per user and per chat) and daily LLM token budgets.

Budgets are reserved, not just checked: a spend holds its estimated cost against every budget
it draws on (the user's, the chat's, the bot's) before the model is called, and settles after.
Concurrent requests therefore see each other's holds: ten ``/summary`` runs at once cannot
spend more than the day allows. Holds live in memory (one process owns the database); what was
spent is recorded in ``usage_daily``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from zoneinfo import ZoneInfo

from function_calls import Caller, Usage
from robot.storage import Tx
from robot.store import Engine

log = logging.getLogger(__name__)

__all__ = ["BudgetExceeded", "DailyBudget", "RateDecision", "RateLimiter", "Reservation", "TokenBucket"]


@dataclass
class TokenBucket:
    """``rate`` tokens per second refill, up to ``burst``."""

    rate: float
    burst: int
    tokens: float = -1.0
    stamp: float = 0.0
    fresh: bool = True

    def _refill(self, now: float) -> None:
        if self.fresh:
            self.tokens, self.stamp, self.fresh = float(self.burst), now, False
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def spend(self, now: float) -> None:
        """Take a token even when none is left (work already done); the debt delays the next take."""
        self._refill(now)
        self.tokens = max(self.tokens - 1, -float(self.burst))

    def wait_s(self, now: float) -> float:
        """Seconds until :meth:`take` would succeed."""
        tokens = self.burst if self.fresh else min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        return max(0.0, (1 - tokens) / self.rate)


class RateDecision(StrEnum):
    ALLOW = "allow"
    NOTICE = "notice"  # refused: tell the person, with how long to wait (:meth:`RateLimiter.wait_s`)
    SILENT = "silent"  # refused again within the wait they were told: say nothing


@dataclass
class RateLimiter:
    """Per-user and per-chat buckets for model requests, per-user buckets for commands that call
    no model (a separate, generous limit).

    A refused member is told how long to wait (:meth:`wait_s`) and is silent only until then: a
    message refused after that wait gets a new notice, so the bot never goes quiet unannounced.
    A command that did call a model is charged afterwards (:meth:`charge`) to the model buckets.
    """

    user_per_minute: float
    user_burst: int
    chat_per_minute: float
    chat_burst: int
    monotonic: Callable[[], float] = time.monotonic
    max_tracked: int = 10_000
    command_per_minute: float = 30.0
    command_burst: int = 20
    _users: dict[str, TokenBucket] = field(default_factory=dict)
    _chats: dict[str, TokenBucket] = field(default_factory=dict)
    _commands: dict[str, TokenBucket] = field(default_factory=dict)
    #: (user, command?) -> the monotonic time until which the person was told to wait.
    _noticed: dict[tuple[str, bool], float] = field(default_factory=dict)

    def _buckets(self, chat_key: str, user_key: str, command: bool) -> list[TokenBucket]:
        if command:
            return [self._commands.setdefault(user_key, TokenBucket(self.command_per_minute / 60, self.command_burst))]
        return [self._users.setdefault(user_key, TokenBucket(self.user_per_minute / 60, self.user_burst)),
                self._chats.setdefault(chat_key, TokenBucket(self.chat_per_minute / 60, self.chat_burst))]

    def check(self, chat_key: str, user_key: str, *, command: bool = False) -> RateDecision:
        """``command``: a /command, which calls no model (its own limit)."""
        now = self.monotonic()
        if len(self._users) + len(self._chats) + len(self._commands) > self.max_tracked:
            self._prune(now)
        buckets = self._buckets(chat_key, user_key, command)
        if all(b.take(now) for b in buckets):
            self._noticed.pop((user_key, command), None)
            return RateDecision.ALLOW
        told = self._noticed.get((user_key, command))
        if told is not None and now < told:
            return RateDecision.SILENT
        self._noticed[(user_key, command)] = now + self.wait_s(chat_key, user_key, command=command)
        return RateDecision.NOTICE

    def wait_s(self, chat_key: str, user_key: str, *, command: bool = False) -> float:
        """Seconds until this person's next message (or command) would be allowed."""
        now = self.monotonic()
        return max(b.wait_s(now) for b in self._buckets(chat_key, user_key, command))

    def charge(self, chat_key: str, user_key: str) -> None:
        """A command that called a model counts against the model buckets after the fact."""
        now = self.monotonic()
        for bucket in self._buckets(chat_key, user_key, False):
            bucket.spend(now)


    def _prune(self, now: float) -> None:
        """Forget buckets that have refilled completely: they behave exactly like new ones."""
        for buckets in (self._users, self._chats, self._commands):
            full = [k for k, b in buckets.items() if b.tokens + (now - b.stamp) * b.rate >= b.burst]
            for key in full:
                del buckets[key]
        for told in [k for k, until in self._noticed.items() if until <= now]:
            del self._noticed[told]


class BudgetExceeded(Exception):
    """A spend that does not fit in what is left of a daily budget (or a budget that cannot be read)."""

    def __init__(self, scope: str, left: int, needed: int) -> None:
        super().__init__(f"{scope}: {left} tokens left today, {needed} needed")
        self.scope = scope
        self.left = left
        self.needed = needed

    @property
    def user_message(self) -> str:
        """What the person is told (Chinese, no internals)."""
        if self.scope == "store":
            return "暂时无法核对 AI 用量，请稍后再试。"
        if self.scope == "bot":
            return "机器人今天的 AI 用量已达上限，明天再来吧。"
        if self.scope.startswith("chat:"):
            return "本聊天今天的 AI 用量已达上限，明天再来吧。"
        return "今天的 AI 用量已达上限，明天再来吧。"


@dataclass(eq=False)
class Reservation:
    """Tokens held against some budgets for one spend; see :meth:`DailyBudget.reserve`."""

    budget: DailyBudget
    scopes: tuple[str, ...]
    held: int
    parent: Reservation | None = None
    #: Spent (reported by :meth:`spend`) but not yet recorded in the store.
    unsettled: int = 0
    closed: bool = False

    def spend(self, tokens: int | Usage) -> None:
        """Report tokens this spend has used; they stay held until someone records them.

        A spend larger than its estimate holds the difference too, so later requests see it.
        """
        amount = tokens.total_tokens if isinstance(tokens, Usage) else tokens
        self.unsettled += max(0, amount)
        if self.unsettled > self.held:
            self.budget._hold(self.scopes, self.unsettled - self.held)
            self.held = self.unsettled

    def _settled(self, tokens: int) -> None:
        """``tokens`` were recorded in the store: stop holding them."""
        self.unsettled -= min(tokens, self.unsettled)
        drop = min(tokens, self.held)
        self.held -= drop
        self.budget._hold(self.scopes, -drop)


_active: ContextVar[Reservation | None] = ContextVar("qunbot_reservation", default=None)


class DailyBudget:
    """Per-user, per-chat and bot-wide daily token budgets; the invoke loop's :class:`BudgetHook`.

    Use :meth:`reserve` around every spend. Inside a reservation :meth:`remaining` leaves out the
    caller's own hold (the loop sizes its run by it) and :meth:`charge` settles it.
    """

    def __init__(self, db: Engine, zone: ZoneInfo, *, user_tokens: int | None, chat_tokens: int | None,
                 bot_tokens: int | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db = db
        self.zone = zone
        self.user_tokens = user_tokens
        self.chat_tokens = chat_tokens
        self.bot_tokens = bot_tokens
        self.clock = clock
        self._held: dict[str, int] = {}
        # Today's recorded totals, read once per scope and kept current by _record: a reservation
        # then checks without a database round trip. Only the database thread writes it.
        self._spent: dict[tuple[str, str], int] = {}
        self._lock = asyncio.Lock()
        db.migrate("budgets", ["CREATE TABLE IF NOT EXISTS usage_daily (day TEXT NOT NULL, scope TEXT NOT NULL, "
                               "tokens INTEGER NOT NULL, PRIMARY KEY (day, scope))"])

    def _day(self) -> str:
        return self.clock().astimezone(self.zone).strftime("%Y-%m-%d")

    @staticmethod
    def _scopes(caller: Caller) -> tuple[str, str, str]:
        return f"user:{caller.qualified_user}", f"chat:{caller.platform}:{caller.chat_kind}:{caller.chat_id}", "bot"

    def _capped(self, caller: Caller) -> list[tuple[str, int]]:
        caps = (self.user_tokens, self.chat_tokens, self.bot_tokens)
        return [(scope, cap) for scope, cap in zip(self._scopes(caller), caps, strict=True) if cap is not None]

    def _hold(self, scopes: tuple[str, ...], tokens: int) -> None:
        for scope in scopes:
            self._held[scope] = self._held.get(scope, 0) + tokens
            if self._held[scope] <= 0:
                del self._held[scope]

    async def _left(self, caller: Caller, *, own: bool) -> tuple[str, int] | None:
        """The tightest budget and what is left of it after every hold (but the caller's own, if ``own``)."""
        capped = self._capped(caller)
        if not capped:
            return None
        mine: dict[str, int] = {}
        res = _active.get() if own else None
        while res is not None:
            if res.budget is self:
                for scope in res.scopes:
                    mine[scope] = mine.get(scope, 0) + res.held
            res = res.parent
        used = await self._used_many([scope for scope, _ in capped])
        return min(((scope, cap - used[scope] - (self._held.get(scope, 0) - mine.get(scope, 0)))
                    for scope, cap in capped), key=lambda item: item[1])

    async def _used_many(self, scopes: list[str]) -> dict[str, int]:
        day = self._day()
        spent = self._spent
        if all((day, scope) in spent for scope in scopes):
            return {scope: spent[(day, scope)] for scope in scopes}

        def work(db: Tx) -> dict[str, int]:
            marks = ",".join("?" * len(scopes))
            rows = db.execute(f"SELECT scope, tokens FROM usage_daily WHERE day = ? AND scope IN ({marks})",
                              [day, *scopes]).fetchall()
            found = {str(scope): int(tokens) for scope, tokens in rows}
            if len(spent) > 50_000:  # yesterday's and idle scopes: reload on demand
                spent.clear()
            for scope in scopes:
                spent.setdefault((day, scope), found.get(scope, 0))
            return {scope: spent[(day, scope)] for scope in scopes}

        return await self.db.run(work)

    @contextlib.asynccontextmanager
    async def reserve(self, caller: Caller, tokens: int, *, at_least: int | None = None) -> AsyncIterator[Reservation]:
        """Hold ``tokens`` against the caller's budgets for the ``async with`` block, or refuse.

        With ``at_least``, hold what is left (up to ``tokens``) as long as that is ``at_least``.
        Raises :class:`BudgetExceeded` when the spend cannot fit, or when the store cannot be
        read (a budget that cannot be checked refuses). Report spending with
        :meth:`Reservation.spend`; on exit, unrecorded spending passes to the enclosing
        reservation (whose owner records it, e.g. the invoke loop), or is recorded here.
        """
        tokens = max(0, tokens)
        parent = _active.get()
        scopes, hold = self._scopes(caller), tokens
        async with self._lock:  # a check and its hold are one step: concurrent spends see each other
            if tokens > 0:  # an empty reservation only collects what nested spends report
                try:
                    tight = await self._left(caller, own=False)
                except Exception as exc:
                    raise BudgetExceeded("store", 0, tokens) from exc
                if tight is not None:
                    scope, left = tight
                    need = tokens if at_least is None else min(tokens, max(at_least, 1))
                    if left < need:
                        raise BudgetExceeded(scope, max(0, left), need)
                    hold = min(tokens, left)
            self._hold(scopes, hold)
        reservation = Reservation(self, scopes, hold, parent)
        token = _active.set(reservation)
        try:
            yield reservation
        finally:
            _active.reset(token)
            await self._close(reservation, caller)

    async def _close(self, res: Reservation, caller: Caller) -> None:
        spent = res.unsettled
        if spent and res.parent is not None and not res.parent.closed:
            res.parent.spend(spent)  # the enclosing spend records it with its own usage
        elif spent:
            try:
                await self._record(caller, spent)
            except Exception:
                log.exception("budget store failed to record %s tokens", spent)
        self._hold(res.scopes, -res.held)
        res.held = res.unsettled = 0
        res.closed = True

    async def used(self, scope: str) -> int:
        day = self._day()

        def work(db: Tx) -> int:
            row = db.execute("SELECT tokens FROM usage_daily WHERE day = ? AND scope = ?", [day, scope]).fetchone()
            return int(row[0]) if row else 0

        return await self.db.run(work)

    async def remaining(self, caller: Caller) -> int | None:
        """Tokens left today after every other spend's hold (this task's own hold counts as left)."""
        tight = await self._left(caller, own=True)
        return None if tight is None else max(0, tight[1])

    async def charge(self, caller: Caller, usage: Usage) -> None:
        """Record spent tokens; inside a reservation this settles that much of its hold."""
        await self._record(caller, usage.total_tokens)
        res = _active.get()
        if res is not None and res.budget is self:
            res._settled(usage.total_tokens)

    async def _record(self, caller: Caller, tokens: int) -> None:
        day = self._day()

        def work(db: Tx) -> None:
            for scope in self._scopes(caller):
                db.execute(
                    "INSERT INTO usage_daily (day, scope, tokens) VALUES (?, ?, ?) "
                    "ON CONFLICT(day, scope) DO UPDATE SET tokens = tokens + excluded.tokens", [day, scope, tokens])
                # Same thread, same step: a cache load runs wholly before or after, never between.
                if (day, scope) in self._spent:
                    self._spent[(day, scope)] += tokens

        await self.db.transaction(work)
