"""The daily budgets' tables and their refusal (see :mod:`robot.budgets`).

``budget_holds`` has a row per scope for each reservation in flight (``holder`` is the process's
lease holder id, then ``/`` and the reservation's own id): a settlement deletes its own rows, so
one written twice (retried after a commit whose outcome was unknown) releases nothing twice. A
dead process's rows are kept at 0 tokens with what they were ``charged`` as spent, till the day
after: should the process only have stalled, its settlement gives back the difference.
"""

from __future__ import annotations

import logging
from datetime import date, timedelta
from typing import TYPE_CHECKING

from robot.storage import Tx
from robot.storage.leases import Leases

if TYPE_CHECKING:
    from robot.reservation import Reservation

__all__ = ["SCHEMA", "BudgetExceeded", "day_before", "process_of", "reap_sync", "rows_sync", "settle_sync"]

log = logging.getLogger("robot.budgets")

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS usage_daily (day TEXT NOT NULL, scope TEXT NOT NULL, "
    "tokens INTEGER NOT NULL, PRIMARY KEY (day, scope))",
    "ALTER TABLE usage_daily ADD COLUMN held BIGINT NOT NULL DEFAULT 0; "
    "CREATE TABLE budget_holds (day TEXT NOT NULL, scope TEXT NOT NULL, holder TEXT NOT NULL, "
    "tokens BIGINT NOT NULL, PRIMARY KEY (day, scope, holder))",
    # What a dead process's hold was charged as spent (see reap_sync).
    "ALTER TABLE budget_holds ADD COLUMN charged BIGINT NOT NULL DEFAULT 0",
]


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


def process_of(holder: str) -> str:
    """The process (lease holder id) of a ``budget_holds.holder``: before the reservation's id."""
    return holder.split("/", 1)[0]


def day_before(day: str) -> str:
    """The date (``YYYY-MM-DD``) before ``day``."""
    return (date.fromisoformat(day) - timedelta(days=1)).isoformat()


def reap_sync(db: Tx, leases: Leases, day: str, scopes: list[str]) -> bool:
    """Charge as spent the holds of dead processes holding in ``scopes`` (and drop those of the days
    before yesterday); whether there were any. A unit of :class:`~robot.budgets.DailyBudget`'s."""
    db.execute("DELETE FROM budget_holds WHERE day < ?", [day_before(day)])
    mine = leases.holder + "/"  # (alive: its own rows, thousands in a burst, are not read)
    holders = db.execute(f"SELECT DISTINCT holder FROM budget_holds WHERE day = ? AND scope IN ({','.join('?' * len(scopes))}) "
                         "AND tokens > 0 AND substr(holder, 1, ?) != ?", [day, *scopes, len(mine), mine]).fetchall()
    gone = sorted({p for p in {process_of(str(h[0])) for h in holders} if not leases.alive_sync(db, p)})
    if not gone:
        return False
    # Every hold of theirs, in every scope (a row or the rows of its reservations, "<process>/<id>").
    match = "day = ? AND tokens > 0 AND (" + " OR ".join(["holder = ? OR substr(holder, 1, ?) = ?"] * len(gone)) + ")"
    params = [day, *(v for p in gone for v in (p, len(p) + 1, p + "/"))]
    for scope, tokens in db.execute(f"SELECT scope, sum(tokens) FROM budget_holds WHERE {match} GROUP BY scope "
                                    "ORDER BY scope", params).fetchall():  # charged: spent, as far as anyone knows
        db.execute("UPDATE usage_daily SET held = held - ?, tokens = tokens + ? WHERE day = ? AND scope = ?",
                   [tokens, tokens, day, scope])
    # Kept at 0, not deleted: the settlement of a process that only stalled finds them charged.
    db.execute(f"UPDATE budget_holds SET charged = tokens, tokens = 0 WHERE {match}", params)
    log.warning("budgets: charged the holds of %s (no longer running) as spent", ", ".join(gone))
    return True


def rows_sync(db: Tx, day: str, scopes: list[str], *, lock: bool = False) -> dict[str, int]:
    """Recorded plus held tokens per scope (0 for a scope with no row); ``lock``: the rows locked
    (PostgreSQL) in the scopes' order, as every unit locks them (:func:`settle_sync`)."""
    marks = ",".join("?" * len(scopes))
    order = " ORDER BY scope FOR UPDATE" if lock else ""
    rows = db.execute(f"SELECT scope, tokens + held FROM usage_daily WHERE day = ? AND scope IN ({marks}){order}",
                      [day, *scopes]).fetchall()
    found = {str(scope): int(total) for scope, total in rows}
    return {scope: found.get(scope, 0) for scope in scopes}


def settle_sync(db: Tx, records: dict[tuple[str, ...], int], res: Reservation | None,
                release: int, day: str, *, retry: bool = False, shrink: bool = False) -> None:
    """Record tokens (per scopes) on ``day`` and release ``res``'s stored hold (``release``), together.

    ``retry``: the same settlement tried before, with an unknown outcome: if its hold's rows are
    gone, that try was written and this one writes nothing. ``shrink``: ``release`` is part of the hold
    (the rest, lent to a reservation nested in it, stays with its rows)."""
    freed = set(res.scopes) if res is not None and release else set()
    if db.dialect == "postgresql":  # the day's rows first, as a reservation locks them (see _reserve_sync)
        rows: dict[str, set[str]] = {day: {scope for scopes in records for scope in scopes}}
        if freed and res is not None:
            rows.setdefault(res.day, set()).update(freed)
        for when in sorted(rows):
            if rows[when]:
                rows_sync(db, when, sorted(rows[when]), lock=True)
    if freed and shrink:
        assert res is not None
        if db.execute(f"UPDATE budget_holds SET tokens = tokens - ? WHERE day = ? AND scope IN "
                      f"({','.join('?' * len(freed))}) AND holder = ? AND tokens >= ?",
                      [release, res.day, *sorted(freed), res.holder, release]).rowcount:
            for scope in sorted(freed):
                db.execute("UPDATE usage_daily SET held = held - ? WHERE day = ? AND scope = ?", [release, res.day, scope])
        freed = set()  # (rows charged by another process as a dead one's are left as they are)
    if freed:
        assert res is not None
        # Its own rows, deleted. Had this process stalled past its lease, another one charged
        # them already (tokens 0, see reap_sync): releasing twice would raise the cap, and what was
        # charged for them is given back, as this records what was really spent.
        mine = db.execute(f"DELETE FROM budget_holds WHERE day = ? AND scope IN ({','.join('?' * len(freed))}) "
                          "AND holder = ? RETURNING scope, tokens, charged",
                          [res.day, *sorted(freed), res.holder]).fetchall()
        if retry and not mine:
            return
        freed = {str(scope) for scope, tokens, _ in mine if tokens}
        release = max((int(tokens) for _, tokens, _ in mine), default=0)  # what it holds (each scope alike)
        for scope, _, charged in mine:
            if charged:
                db.execute("UPDATE usage_daily SET tokens = tokens - ? WHERE day = ? AND scope = ?",
                           [charged, res.day, scope])
        if res.day != day:  # held yesterday, settled today
            for scope in sorted(freed):
                db.execute("UPDATE usage_daily SET held = held - ? WHERE day = ? AND scope = ?",
                           [release, res.day, scope])
            freed = set()
    spent_in: dict[str, int] = {}  # per scope, in the order given (a caller's shared rows last)
    for scopes, spent in records.items():
        for scope in scopes:
            spent_in[scope] = spent_in.get(scope, 0) + spent
    if spent_in:  # one statement for every scope (a row once: PostgreSQL refuses it twice)
        gone = sorted(freed & set(spent_in)) or [""]
        db.execute("INSERT INTO usage_daily (day, scope, tokens) VALUES "
                   + ", ".join("(?, ?, ?)" for _ in spent_in)
                   + " ON CONFLICT (day, scope) DO UPDATE SET tokens = usage_daily.tokens + excluded.tokens, "
                   f"held = usage_daily.held - CASE WHEN usage_daily.scope IN ({','.join('?' * len(gone))}) "
                   "THEN ? ELSE 0 END",
                   [*(v for scope, spent in spent_in.items() for v in (day, scope, spent)), *gone, release])
        freed -= set(spent_in)
    for scope in sorted(freed):
        db.execute("UPDATE usage_daily SET held = held - ? WHERE day = ? AND scope = ?", [release, day, scope])
