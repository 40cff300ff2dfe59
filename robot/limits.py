"""Rate limits (token buckets per user and per chat) and daily LLM token budgets."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from zoneinfo import ZoneInfo

import sqlite_utils

from function_calls import Caller, Usage
from robot.store import Database

__all__ = ["DailyBudget", "RateDecision", "RateLimiter", "TokenBucket"]


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


class DailyBudget:
    """Per-user and per-chat daily token budgets; the invoke loop's :class:`BudgetHook`."""

    def __init__(self, db: Database, zone: ZoneInfo, *, user_tokens: int | None, chat_tokens: int | None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db = db
        self.zone = zone
        self.user_tokens = user_tokens
        self.chat_tokens = chat_tokens
        self.clock = clock
        db.migrate(lambda d: d.execute(
            "CREATE TABLE IF NOT EXISTS usage_daily (day TEXT NOT NULL, scope TEXT NOT NULL, "
            "tokens INTEGER NOT NULL, PRIMARY KEY (day, scope))"))

    def _day(self) -> str:
        return self.clock().astimezone(self.zone).strftime("%Y-%m-%d")

    @staticmethod
    def _scopes(caller: Caller) -> tuple[str, str]:
        return f"user:{caller.qualified_user}", f"chat:{caller.platform}:{caller.chat_kind}:{caller.chat_id}"

    async def used(self, scope: str) -> int:
        day = self._day()

        def work(db: sqlite_utils.Database) -> int:
            row = db.execute("SELECT tokens FROM usage_daily WHERE day = ? AND scope = ?", [day, scope]).fetchone()
            return int(row[0]) if row else 0

        return await self.db.run(work)

    async def remaining(self, caller: Caller) -> int | None:
        user_scope, chat_scope = self._scopes(caller)
        left: list[int] = []
        if self.user_tokens is not None:
            left.append(self.user_tokens - await self.used(user_scope))
        if self.chat_tokens is not None:
            left.append(self.chat_tokens - await self.used(chat_scope))
        return max(0, min(left)) if left else None

    async def charge(self, caller: Caller, usage: Usage) -> None:
        day, tokens = self._day(), usage.total_tokens

        def work(db: sqlite_utils.Database) -> None:
            for scope in self._scopes(caller):
                db.execute(
                    "INSERT INTO usage_daily (day, scope, tokens) VALUES (?, ?, ?) "
                    "ON CONFLICT(day, scope) DO UPDATE SET tokens = tokens + excluded.tokens", [day, scope, tokens])

        await self.db.transaction(work)
