"""The daily budgets' tables and their refusal (see :mod:`robot.budgets`).

``budget_holds`` has a row per scope for each reservation in flight (``holder`` is the process's
lease holder id, then ``/`` and the reservation's own id): a settlement deletes its own rows, so
one written twice (retried after a commit whose outcome was unknown) releases nothing twice.
"""

from __future__ import annotations

__all__ = ["SCHEMA", "BudgetExceeded", "process_of"]

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS usage_daily (day TEXT NOT NULL, scope TEXT NOT NULL, "
    "tokens INTEGER NOT NULL, PRIMARY KEY (day, scope))",
    "ALTER TABLE usage_daily ADD COLUMN held BIGINT NOT NULL DEFAULT 0; "
    "CREATE TABLE budget_holds (day TEXT NOT NULL, scope TEXT NOT NULL, holder TEXT NOT NULL, "
    "tokens BIGINT NOT NULL, PRIMARY KEY (day, scope, holder))",
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
