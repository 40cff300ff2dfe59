"""The outbox's claims: which process sends a row (SQL that runs on SQLite and PostgreSQL).

A row is sent by one process: the one that claims it (``claimed_by`` = its lease holder id,
``claimed_until``). A claim by a dead process (its ``process:`` lease expired) or an expired claim is
free again, so a killed process's rows are taken over. A chat's rows are claimed in order
(:func:`claim_sync`); on PostgreSQL the rows are locked while they are claimed (``FOR UPDATE``: a
concurrent claimer waits, then sees the claim; ``SKIP LOCKED`` would let it send a chat's later rows
before its earlier ones).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from robot.storage import Tx
from robot.storage.base import in_chunks

__all__ = ["CLAIM_LIMIT", "Claimed", "Scope", "claim_many_sync", "claim_sync", "order_by", "release_sync"]


def order_by(tx: Tx, desc: bool = False) -> str:
    """A chat's rows in the order they were queued (ties on ``created_at``: insertion order)."""
    way = " DESC" if desc else ""
    return f"created_at{way}, {'rowid' if tx.dialect == 'sqlite' else 'seq'}{way}"


@dataclass(frozen=True)
class Scope:
    """The rows of a platform this process may send: all (``accounts`` None), or those of the
    accounts it holds, plus the rows naming no account when ``empty``."""

    accounts: tuple[str, ...] | None = None
    empty: bool = False

    @property
    def nothing(self) -> bool:
        return self.accounts is not None and not self.accounts and not self.empty

    def sql(self) -> tuple[str, list[Any]]:
        """A condition on ``account`` and its parameters."""
        if self.accounts is None:
            return "1 = 1", []
        terms = [f"account IN ({', '.join('?' for _ in self.accounts)})"] if self.accounts else []
        if self.empty:
            terms.append("account = ''")
        return "(" + " OR ".join(terms or ["1 = 0"]) + ")", list(self.accounts)

    def covers(self, account: str) -> bool:
        return self.accounts is None or (account in self.accounts if account else self.empty)


Claimed = tuple[list[dict[str, Any]], bool]
"""What :func:`claim_sync` returns: the rows claimed, and whether another process blocks the rest."""
CLAIM_LIMIT = 32
"""Rows of a chat one claim takes at most."""


def claim_sync(tx: Tx, platform: str, chat: str, scope: Scope, holder: str, now: str, until: str,
               alive: Callable[[Tx, str], bool], limit: int = CLAIM_LIMIT) -> Claimed:
    """Claim the chat's first pending rows in ``scope`` for ``holder``, in order: (rows, blocked).

    Claiming stops at the first row another living process holds an unexpired claim on
    (``blocked``): the rest of the chat waits for it, so the chat's order holds across processes.
    """
    return claim_many_sync(tx, [(platform, chat, scope, now, until)], holder, alive, limit)[0]


def claim_many_sync(tx: Tx, items: Sequence[tuple[str, str, Scope, str, str]], holder: str,
                    alive: Callable[[Tx, str], bool], limit: int = CLAIM_LIMIT) -> list[Claimed]:
    """:func:`claim_sync` for several ``(platform, chat, scope, now, until)``: one read and one write
    for them all (a statement is a round trip on PostgreSQL), not two per chat."""
    groups: dict[tuple[str, Scope], list[int]] = {}
    for i, (platform, _, scope, _, _) in enumerate(items):
        groups.setdefault((platform, scope), []).append(i)
    claimed: dict[tuple[str, Scope, str], Claimed] = {}
    lock = " FOR UPDATE" if tx.dialect == "postgresql" else ""
    living = functools.lru_cache(maxsize=None)(functools.partial(alive, tx))  # locks wait: ask once per holder
    for (platform, scope), members in sorted(groups.items(), key=lambda g: (g[0][0], repr(g[0][1]))):
        chats = sorted({items[i][1] for i in members})
        now, until = max(items[i][3] for i in members), max(items[i][4] for i in members)
        where, params = scope.sql()
        # Each chat's first ``limit`` pending rows, locked chat by chat in one order in every
        # process: two transactions never wait for each other in a cycle. (The outer status test
        # is checked again on a row another transaction changed while this one waited for it.)
        if len(chats) == 1:  # (the index's order and a LIMIT: a chat's long backlog is not numbered)
            rows = tx.query(f"SELECT * FROM outbox WHERE platform = ? AND chat = ? AND status = 'pending' AND {where} "
                            f"ORDER BY {order_by(tx)} LIMIT ?{lock}", [platform, chats[0], *params, limit])
        else:
            rows = tx.query(
                "SELECT * FROM outbox WHERE status = 'pending' AND key IN (SELECT key FROM (SELECT key, row_number() "
                f"OVER (PARTITION BY chat ORDER BY {order_by(tx)}) AS n FROM outbox WHERE platform = ? AND chat IN "
                f"({', '.join('?' for _ in chats)}) AND status = 'pending' AND {where}) AS firsts WHERE n <= ?) "
                f"ORDER BY chat, {order_by(tx)}{lock}", [platform, *chats, *params, limit])
        per_chat: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            per_chat.setdefault(str(row["chat"]), []).append(row)
        keys: list[str] = []
        for chat in chats:
            mine: list[dict[str, Any]] = []
            blocked = False
            for row in per_chat.get(chat, []):
                by = row.get("claimed_by")
                if by and by != holder and str(row.get("claimed_until") or "") >= now and living(str(by)):
                    blocked = True
                    break
                mine.append(row)
            claimed[platform, scope, chat] = mine, blocked
            keys += [str(r["key"]) for r in mine]
        for part, marks in in_chunks(keys):
            tx.execute(f"UPDATE outbox SET claimed_by = ?, claimed_until = ? WHERE key IN ({marks})", [holder, until, *part])
    return [claimed[platform, scope, chat] for platform, chat, scope, _, _ in items]


def release_sync(tx: Tx, holder: str, platform: str | None = None, keep: Scope | None = None,
                 busy: Collection[str] = ()) -> int:
    """Give up ``holder``'s claims on pending rows (of ``platform``, outside ``keep``, but for the
    ``busy`` keys it is sending now): others may send them now."""
    sql, params = "UPDATE outbox SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by = ? " \
                  "AND status = 'pending'" + "".join(" AND key <> ?" for _ in busy), [holder, *busy]
    if platform is not None:
        sql, params = sql + " AND platform = ?", [*params, platform]
    if keep is not None:
        where, more = keep.sql()
        sql, params = sql + f" AND NOT {where}", [*params, *more]
    return int(tx.execute(sql, params).rowcount)
