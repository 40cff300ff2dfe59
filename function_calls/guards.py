"""Guards that keep a run bounded: loop detection, the retry policy and the run limits.

Defaults are on: warn at 5 identical no-progress calls, block at 8, stop everything at 10
repeats; 6 model turns, 8 tool calls and a token budget per run; 3 API retries per run.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel

from function_calls.context import Caller
from function_calls.model import Usage

__all__ = [
    "BudgetHook",
    "Limits",
    "LoopConfig",
    "LoopDetector",
    "LoopLevel",
    "LoopSignal",
    "RetryPolicy",
    "args_key",
    "result_key",
]


@dataclass(frozen=True)
class Limits:
    """Per-run bounds. ``max_run_tokens`` counts prompt + completion tokens over the run."""

    max_iterations: int = 6
    max_tool_calls: int = 8
    max_run_tokens: int = 24_000
    final_answer_max_tokens: int = 400
    parallel_tools: int = 4


@dataclass(frozen=True)
class RetryPolicy:
    """One retry budget for the whole run; exponential backoff with full jitter.

    ``patience_s`` bounds the run's total waiting: a ``Retry-After`` longer than
    ``max_retry_after_s`` or than the patience left is not waited out; the run ends and
    tells the user when to try again.
    """

    max_retries: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_retry_after_s: float = 30.0
    patience_s: float = 45.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(ceiling / 2, ceiling)


class BudgetHook(Protocol):
    """Per-user / per-chat daily budgets the robot keeps; the loop asks before and charges each turn.

    The usage a run's tools report is charged through ``charge_tools(caller, usage)`` when the hook
    has one (the robot's tells it apart from model turns), else through :meth:`charge`."""

    async def remaining(self, caller: Caller) -> int | None:
        """Tokens this caller may still spend today; ``None`` means unlimited."""
        ...

    async def charge(self, caller: Caller, usage: Usage) -> None: ...


@dataclass(frozen=True)
class LoopConfig:
    window: int = 30
    warn: int = 5
    critical: int = 8
    breaker: int = 10


class LoopLevel(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"
    BREAKER = "breaker"


@dataclass(frozen=True)
class LoopSignal:
    level: LoopLevel
    reason: str = ""


def _digest(value: Any) -> str:
    # Tool data is whatever a tool returned: mixed key types defeat sort_keys, lone surrogates
    # defeat UTF-8. Hashing must still work: fall back to repr, encode surrogates as they are.
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def args_key(raw: str) -> str:
    """A canonical hash of a call's arguments (key order and spacing do not matter)."""
    try:
        return _digest(json.loads(raw or "{}")) if len(raw) <= 64_000 else _digest(raw)
    except (ValueError, RecursionError):
        return _digest(raw)


def result_key(content: str, data: dict[str, object] | None, exclude: tuple[str, ...]) -> str:
    """A hash of a tool result, leaving out fields that change on every call."""
    if data is not None:
        return _digest({k: v for k, v in data.items() if k not in exclude})
    return _digest(content)


class _Entry(BaseModel):
    tool: str
    args: str
    result: str
    unknown: bool = False


@dataclass
class LoopDetector:
    """Watches the last ``window`` calls for no-progress repeats, A-B ping-pong and unknown tools."""

    config: LoopConfig = field(default_factory=LoopConfig)
    entries: deque[_Entry] = field(default_factory=deque)
    repeats: int = 0
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter)

    def before(self, tool: str, args: str, unknown: bool = False) -> LoopSignal:
        """Judge a call before it runs, predicting it returns what it returned last time."""
        if self.repeats + (1 if (tool, args) in self._seen else 0) >= self.config.breaker:
            return LoopSignal(LoopLevel.BREAKER, f"{self.repeats + 1} repeated calls in this run")
        predicted = next((e.result for e in reversed(self.entries) if (e.tool, e.args) == (tool, args)), None)
        signal = self._judge(_Entry(tool=tool, args=args, result=predicted or "?", unknown=unknown), pending=True)
        return signal if signal.level is LoopLevel.CRITICAL else LoopSignal(LoopLevel.OK)

    def record(self, tool: str, args: str, result: str, unknown: bool = False) -> LoopSignal:
        """Add a finished call; returns WARN (or worse) when the pattern is past a threshold."""
        entry = _Entry(tool=tool, args=args, result=result, unknown=unknown)
        if self._seen[(tool, args)]:
            self.repeats += 1
        self._seen[(tool, args)] += 1
        self.entries.append(entry)
        while len(self.entries) > self.config.window:
            self.entries.popleft()
        return self._judge(entry, pending=False)

    def _judge(self, entry: _Entry, pending: bool) -> LoopSignal:
        extra = 1 if pending else 0
        window = list(self.entries)
        same = sum(1 for e in window if (e.tool, e.args, e.result) == (entry.tool, entry.args, entry.result)) + extra
        unknown = sum(1 for e in window if e.unknown) + (extra if entry.unknown else 0)
        pong = self._alternation(window + ([entry] if pending else []))
        count, reason = max(
            (same, f"`{entry.tool}` called {same} times with the same arguments and the same result"),
            (unknown, f"{unknown} calls to tools that do not exist"),
            (pong, f"{pong} calls alternating between two tools without progress"),
        )
        if count >= self.config.critical:
            return LoopSignal(LoopLevel.CRITICAL, reason)
        if count >= self.config.warn:
            return LoopSignal(LoopLevel.WARN, reason)
        return LoopSignal(LoopLevel.OK)

    @staticmethod
    def _alternation(window: list[_Entry]) -> int:
        keys = [(e.tool, e.args, e.result) for e in window]
        if len(keys) < 4 or keys[-1] == keys[-2]:
            return 0
        run = 2
        for i in range(len(keys) - 3, -1, -1):
            if keys[i] != keys[i + 2]:
                break
            run += 1
        return run if run >= 4 else 0

    def snapshot(self) -> dict[str, Any]:
        return {"entries": [e.model_dump() for e in self.entries], "repeats": self.repeats,
                "seen": [[t, a, n] for (t, a), n in self._seen.items()]}

    @classmethod
    def restore(cls, config: LoopConfig, data: dict[str, Any]) -> LoopDetector:
        det = cls(config=config)
        det.entries.extend(_Entry.model_validate(e) for e in data.get("entries", []))
        det.repeats = int(data.get("repeats", 0))
        det._seen.update({(t, a): int(n) for t, a, n in data.get("seen", [])})
        return det
