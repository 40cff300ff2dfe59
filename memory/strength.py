"""The strength rules, as pure functions of a memory's state and the clock.

* **Recall** (the memory is in a recall's top ``n``): ``time := now``; the level rises by one
  when the memory was idle longer than ``interval(level)`` (at level 0 always). At the cap it
  becomes long-term and its level stops changing.
* **Miss** (matched, ranked below ``n``, not long-term): when idle beyond ``interval(level)`` the
  level falls by one; at −1 the memory is deleted. ``time`` stays the last successful recall.
  "Idle" counts from the later of ``time`` and the last decay (``decayed_at``), so one burst of
  questions lowers a memory at most one level: each level gets its own interval of grace.
* **Sleep** applies the miss rule to a sample of a chat's memories.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

__all__ = ["Rules", "Strength"]


@dataclass(frozen=True)
class Strength:
    """The part of a memory the rules change."""

    level: int
    time: datetime
    long_term: bool = False
    decayed_at: datetime | None = None

    @property
    def deleted(self) -> bool:
        return self.level < 0


@dataclass(frozen=True)
class Rules:
    """``interval(level) = base × factor^level``; ``cap`` makes a memory long-term."""

    base: timedelta = timedelta(hours=1)
    factor: float = 3.0
    cap: int = 6

    def interval(self, level: int) -> timedelta:
        return self.base * (self.factor ** max(level, 0))

    def recalled(self, s: Strength, now: datetime) -> Strength:
        if s.long_term:
            return replace(s, time=now)
        level = s.level
        if level <= 0 or now - s.time > self.interval(level):
            level += 1
        if level >= self.cap:
            return Strength(level=self.cap, time=now, long_term=True, decayed_at=None)
        return Strength(level=level, time=now, long_term=False, decayed_at=None)

    def idle_since(self, s: Strength) -> datetime:
        return max(s.time, s.decayed_at) if s.decayed_at is not None else s.time

    def missed(self, s: Strength, now: datetime) -> Strength:
        if s.long_term or now - self.idle_since(s) <= self.interval(s.level):
            return s
        return replace(s, level=s.level - 1, decayed_at=now)
