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

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.stamp = float(self.burst), now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class RateDecision(StrEnum):
    ALLOW = "allow"
    NOTICE = "notice"  # refused: tell the person once
    SILENT = "silent"  # refused again: say nothing


@dataclass
class RateLimiter:
    """Per-user and per-chat buckets; a flooding member gets one notice, then silence."""

    user_per_minute: float
    user_burst: int
    chat_per_minute: float
    chat_burst: int
    monotonic: Callable[[], float] = time.monotonic
    max_tracked: int = 10_000
    _users: dict[str, TokenBucket] = field(default_factory=dict)
    _chats: dict[str, TokenBucket] = field(default_factory=dict)
    _noticed: set[str] = field(default_factory=set)

    def check(self, chat_key: str, user_key: str) -> RateDecision:
        now = self.monotonic()
        if len(self._users) + len(self._chats) > self.max_tracked:
            self._prune(now)
        user = self._users.setdefault(user_key, TokenBucket(self.user_per_minute / 60, self.user_burst))
        chat = self._chats.setdefault(chat_key, TokenBucket(self.chat_per_minute / 60, self.chat_burst))
        if user.take(now) and chat.take(now):
            self._noticed.discard(user_key)
            return RateDecision.ALLOW
        if user_key in self._noticed:
            return RateDecision.SILENT
        self._noticed.add(user_key)
        return RateDecision.NOTICE


    def _prune(self, now: float) -> None:
        """Forget buckets that have refilled completely: they behave exactly like new ones."""
        for buckets in (self._users, self._chats):
            full = [k for k, b in buckets.items() if b.tokens + (now - b.stamp) * b.rate >= b.burst]
            for key in full:
                del buckets[key]
        self._noticed.intersection_update(self._users)


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
