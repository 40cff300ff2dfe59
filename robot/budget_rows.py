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

from robot.storage import Tx
from robot.storage.leases import Leases

__all__ = ["SCHEMA", "BudgetExceeded", "day_before", "process_of", "reap_sync"]

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
