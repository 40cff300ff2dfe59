"""A spend's hold on the daily budgets (see :meth:`robot.budgets.DailyBudget.reserve`)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from function_calls import Caller, Usage

if TYPE_CHECKING:
    from robot.budgets import DailyBudget

__all__ = ["Reservation", "active"]


@dataclass(eq=False)
class Reservation:
    """Tokens held against some budgets for one spend; see :meth:`DailyBudget.reserve`."""

    budget: DailyBudget
    scopes: tuple[str, ...]  # the capped scopes it holds tokens in
    held: int
    parent: Reservation | None = None
    #: Spent (reported by :meth:`spend`) but not yet recorded in the store.
    unsettled: int = 0
    closed: bool = False
    day: str = ""
    #: The part of ``held`` written in the database (the rest: what it borrowed, and spending beyond
    #: the estimate, held in this process only until it is recorded).
    stored: int = 0
    #: Charged inside it (:meth:`DailyBudget.charge`), by the charged caller's scopes: recorded
    #: when it closes, in the transaction that releases its hold (held until then).
    charged: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: Recorded plus held tokens per scope as its own transaction left them (its hold included), when
    #: it read them: :meth:`DailyBudget.remaining` inside it answers from these (no read per run)
    #: until a reservation nested in it settles. None: read the database.
    taken: dict[str, int] | None = None
    #: Its rows' ``budget_holds.holder``: this process's lease holder id, "/", its own id.
    holder: str = ""
    #: The part of ``held`` lent by ``parent`` out of its own unspent hold: a tool nested in a run
    #: (deep_think, a summary) may spend what the run holds, which no fresh reservation can find.
    borrowed: int = 0
    #: The part of ``held`` lent to nested reservations: not its to spend, and kept (its rows with
    #: it, should it close first) until they give it back.
    lent: int = 0
    #: Whether it may lend: its owner reports its spending as it goes (see ``reserve(lends=...)``).
    lends: bool = False
    #: Whether what it spent passes to ``parent`` as it closes (whose owner counts it as its own).
    passes: bool = True
    #: Spent out of what it lent by a borrower that recorded it itself (detached): neither free nor its to
    #: record (its hold still covers it in the store until it closes).
    elsewhere: int = 0
    #: Spent by reservations nested in it, passed as they closed: its owner's report of its tools' usage
    #: (``charge_tools``) includes it; what nobody reports (a tool cut short) is recorded as it closes.
    passed: int = 0

    def owed(self) -> int:
        """What it spent and has to record, or pass on: reported by :meth:`spend`, passed and charged."""
        return self.unsettled + self.passed + sum(self.charged.values())

    def used(self) -> int:
        return self.owed() + self.elsewhere

    def free(self) -> int:
        """What it holds and has neither spent nor lent."""
        return max(0, self.held - self.used() - self.lent)

    def hook(self) -> _SpendHook:
        """A budget hook for an invoke loop run inside it (a tier's sub-run): each turn is spent into it as
        it ends, and its tools' reports take in what they passed to it."""
        return _SpendHook(self)

    def reported(self, tokens: int) -> None:
        """Its owner's report of its tools' usage (``charge_tools``) came: what nested reservations passed to
        it is part of that report, counted once."""
        self.passed -= min(max(0, tokens), self.passed)

    def detach(self) -> None:
        """Its spend is its own from now on: the spend it is nested in went on without it (a tool that
        returned and left it working in the background), so nobody there will count it."""
        self.passes = False

    def spend(self, tokens: int | Usage) -> None:
        """Report tokens this spend has used; they stay held until someone records them.

        A spend larger than its estimate holds the difference too, so later requests see it.
        """
        amount = tokens.total_tokens if isinstance(tokens, Usage) else tokens
        self.unsettled += max(0, amount)
        self._cover()

    def _cover(self) -> None:
        if self.used() + self.lent > self.held:
            self.budget._hold(self.scopes, self.used() + self.lent - self.held)
            self.held = self.used() + self.lent

    def _drop(self, tokens: int) -> int:
        """Stop holding ``tokens`` (recorded, or released): the in-process part first, then what it
        borrowed (back to its parent); returns how much of the stored hold the database must release."""
        tokens = min(max(tokens, 0), self.held)
        extra = min(tokens, self.held - self.stored - self.borrowed)
        self.budget._hold(self.scopes, -extra)
        back = min(tokens - extra, self.borrowed)
        if back and self.parent is not None:
            self.borrowed -= back
            self.parent.lent -= back
        self.held -= tokens
        self.stored -= tokens - extra - back
        return tokens - extra - back


class _SpendHook:
    def __init__(self, hold: Reservation) -> None:
        self.hold = hold

    async def remaining(self, caller: Caller) -> int | None:
        return self.hold.free()  # (None let a sub-run's last answer spend past its hold and the day: 5,348 of 4,000)

    async def charge(self, caller: Caller, usage: Usage) -> None:
        self.hold.spend(usage)

    async def charge_tools(self, caller: Caller, usage: Usage) -> None:
        self.hold.reported(usage.total_tokens)
        self.hold.spend(usage)


active: ContextVar[Reservation | None] = ContextVar("qunbot_reservation", default=None)
