"""Rate limits (token buckets per user and per chat) and daily LLM token budgets.

Rate limits live in each process's memory: with N processes on one database a person's limit is
up to N times the configured rate (messages of one chat usually reach one process: its account's).
Budgets are reserved, not just checked: a spend holds its estimated cost against every budget
it draws on (the user's, the chat's, the bot's) before the model is called, and settles after,
in the database, so concurrent requests in every process see each other's holds (see
:mod:`robot.budgets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from robot.budgets import BudgetExceeded, DailyBudget, Reservation

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

    def level(self, now: float) -> float:
        """The tokens it holds at ``now`` (negative: in debt), without taking any."""
        return self.burst if self.fresh else min(self.burst, self.tokens + (now - self.stamp) * self.rate)

    def wait_s(self, now: float, tokens: float = 1) -> float:
        """Seconds until it holds ``tokens`` (1: until :meth:`take` would succeed)."""
        return max(0.0, (tokens - self.level(now)) / self.rate)


class RateDecision(StrEnum):
    ALLOW = "allow"
    NOTICE = "notice"  # refused: tell the person, with how long to wait (:meth:`RateLimiter.wait_s`)
    SILENT = "silent"  # refused again within the wait they were told: say nothing


@dataclass
class RateLimiter:
    """Per-user and per-chat buckets for model requests, per-user buckets for commands that call
    no model (a separate, generous limit).

    A refused member is told how long to wait (:meth:`wait_s`) and is silent only until then: a
    message refused after that wait gets a new notice. A refusal by the chat's limit gets one notice for
    the whole chat (:meth:`refused_by_chat`), then silence until the chat's bucket has refilled, at least
    ``chat_quiet_s``. Every notice in a chat, personal ones included, spends from the chat's notice bucket
    (``notice_per_minute``, ``notice_burst``): with it empty a refusal is silent, so a raid's notices never
    outnumber its answers.
    A command that did call a model is charged afterwards (:meth:`charge`) to the model buckets;
    while those are in debt, the person's commands are refused too. A refusal takes no token.
    """

    user_per_minute: float
    user_burst: int
    chat_per_minute: float
    chat_burst: int
    monotonic: Callable[[], float] = time.monotonic
    max_tracked: int = 10_000
    command_per_minute: float = 30.0
    command_burst: int = 20
    notice_per_minute: float = 3.0
    notice_burst: int = 3
    chat_quiet_s: float = 60.0
    _users: dict[str, TokenBucket] = field(default_factory=dict)
    _chats: dict[str, TokenBucket] = field(default_factory=dict)
    _commands: dict[str, TokenBucket] = field(default_factory=dict)
    _notices: dict[str, TokenBucket] = field(default_factory=dict)  #: per chat: each notice in it spends one
    #: (user, command?) -> the monotonic time until which the person was told to wait.
    _noticed: dict[tuple[str, bool], float] = field(default_factory=dict)
    #: Prune again only above this many (and max_tracked) or after _prune_at: while more than max_tracked
    #: are active a prune frees nothing, and scanning them all on every check cost milliseconds each.
    _prune_above: int = 0
    _prune_at: float = float("-inf")

    def _buckets(self, chat_key: str, user_key: str, command: bool) -> list[TokenBucket]:
        if command:
            return [self._commands.setdefault(user_key, TokenBucket(self.command_per_minute / 60, self.command_burst))]
        return [self._users.setdefault(user_key, TokenBucket(self.user_per_minute / 60, self.user_burst)),
                self._chats.setdefault(chat_key, TokenBucket(self.chat_per_minute / 60, self.chat_burst))]

    def check(self, chat_key: str, user_key: str, *, command: bool = False) -> RateDecision:
        """``command``: a /command, which calls no model (its own limit)."""
        now = self.monotonic()
        tracked = self._tracked()
        if tracked > self.max_tracked and (tracked > self._prune_above or now >= self._prune_at):
            self._prune(now)
        buckets = self._buckets(chat_key, user_key, command)
        # Every bucket has a token before any is taken: a refusal by the chat's costs the person's nothing.
        # A command is refused too while the person's model requests are in debt (commands that called
        # a model, charged after the fact: /deep_think, /summary ... went on at the command rate).
        if all(b.wait_s(now) <= 0 for b in buckets) and not (command and self._debt_s(user_key, now)):
            for bucket in buckets:
                bucket.take(now)
            self._noticed.pop((user_key, command), None)
            return RateDecision.ALLOW
        key = (user_key, command)
        chat_wide = not command and buckets[0].wait_s(now) <= 0  # the chat's limit, not the person's: one notice
        if chat_wide:  # for the chat (a raid of 60 members got 50 notices for a burst of 10)
            key = (f"chat>{chat_key}", False)
        told = self._noticed.get(key)
        if told is not None and now < told:
            return RateDecision.SILENT
        notices = self._notices.setdefault(chat_key, TokenBucket(self.notice_per_minute / 60, self.notice_burst))
        if not notices.take(now):  # a raid told one member after another got more notices than answers
            return RateDecision.SILENT
        wait = self.wait_s(chat_key, user_key, command=command)
        if chat_wide:  # a sustained raid drains the chat again at each token: not a notice every refill
            wait = max(wait, buckets[1].wait_s(now, tokens=buckets[1].burst), self.chat_quiet_s)
        self._noticed[key] = now + wait
        return RateDecision.NOTICE

    def refused_by_chat(self, chat_key: str, user_key: str) -> bool:
        """Whether this person's model requests are refused by the chat's limit, not their own: its notice is
        for the whole chat."""
        now = self.monotonic()
        chat, user = self._chats.get(chat_key), self._users.get(user_key)
        return chat is not None and chat.wait_s(now) > 0 and (user is None or user.wait_s(now) <= 0)

    def wait_s(self, chat_key: str, user_key: str, *, command: bool = False) -> float:
        """Seconds until this person's next message (or command) would be allowed."""
        now = self.monotonic()
        waits = [b.wait_s(now) for b in self._buckets(chat_key, user_key, command)]
        return max(*waits, self._debt_s(user_key, now) if command else 0.0)

    def _debt_s(self, user_key: str, now: float) -> float:
        """Seconds until the person's model bucket is out of debt (0: it is not in debt)."""
        bucket = self._users.get(user_key)
        return 0.0 if bucket is None else bucket.wait_s(now, tokens=0)

    def charge(self, chat_key: str, user_key: str) -> None:
        """A command that called a model counts against the model buckets after the fact."""
        now = self.monotonic()
        for bucket in self._buckets(chat_key, user_key, False):
            bucket.spend(now)

    def _tracked(self) -> int:
        return (len(self._users) + len(self._chats) + len(self._commands) + len(self._notices)
                + len(self._noticed))

    def _prune(self, now: float) -> None:
        """Forget buckets that have refilled completely (they behave exactly like new ones) and waits that are
        over. A drained bucket is kept, however many there are: forgetting it would lift its limit. The next
        prune waits until twice as many are tracked, or 30 s: a check costs O(1) amortised, memory stays
        within twice what is active."""
        for buckets in (self._users, self._chats, self._commands, self._notices):
            full = [k for k, b in buckets.items() if b.level(now) >= b.burst]
            for key in full:
                del buckets[key]
        for told in [k for k, until in self._noticed.items() if until <= now]:
            del self._noticed[told]
        self._prune_above, self._prune_at = 2 * self._tracked(), now + 30.0
