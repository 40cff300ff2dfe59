"""The ``snapshots`` table: runs paused for a person, authenticated, with single-use credentials.

One row per paused run: the run state, the tools it was offered, the caller, the chat (and account), the kind
(``approval`` or ``input``), who must answer (``requester`` or ``admin``), a five-character
code, created and expiry times, and the status (pending -> approved -> resumed, or denied,
expired, refused, interrupted, failed); an approved row also records what its calls did as they run
(``ran``, unsigned: it is only reported). Every field a resume trusts is covered by an HMAC under a
per-install secret (``secret.key`` in the data dir, mode 0600): an edited row fails
:meth:`SnapshotStore.verify`. Status changes are guarded UPDATEs (``WHERE status = ?``), so one
transition wins however many people (or processes) race for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from function_calls import Caller, RunState, ToolCall, stops
from robot.message import ChatRef
from robot.storage import Tx
from robot.storage.base import as_stored
from robot.store import Engine, iso

__all__ = ["ALPHABET", "ANSWERABLE", "Row", "SnapshotError", "SnapshotStore", "describe_call", "load_secret",
           "new_code", "notice_key", "notice_prefix", "summarize"]

#: Credentials use no 0/O/1/I: they are read off a phone screen and typed back.
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
_SIGNED = ("id", "code", "kind", "approver", "requester", "chat", "account", "caller", "state", "origin",
           "reply_to", "created_at", "expires_at", "tip", "tools")
#: Signed only when set, so rows written before the column existed still verify (and resume fail-closed).
_OPTIONAL = frozenset({"tools"})
Row = dict[str, Any]
#: Notification channel: the chat key of a new row its chat's next message may answer (any process takes it).
ANSWERABLE = "snapshots"


class SnapshotError(Exception):
    """A snapshot that cannot be stored or trusted (no secret, no free code, a damaged key file)."""


def new_code(length: int = 5) -> str:
    """A fresh credential from the unambiguous alphabet."""
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def load_secret(path: Path) -> bytes:
    """The per-install HMAC key, created once with mode 0600 (never logged)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < 32:
            raise SnapshotError(f"{path} is damaged (shorter than 32 bytes); delete it to create a new one") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    return key


class SnapshotStore:
    """Reads and writes ``snapshots`` on the bot's database thread."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.secret: bytes | None = None
        # ``runner``: the process (lease holder id) that runs an approved row: a start reports only the
        # approved rows of a dead one as interrupted, not what another living process is running.
        # ``ran``: what an approved row's calls did, recorded as they start and end (see :meth:`ran`).
        db.migrate("snapshots", [self._schema, "ALTER TABLE snapshots ADD COLUMN runner TEXT",
                                 "ALTER TABLE snapshots ADD COLUMN ran TEXT"])

    @staticmethod
    def _schema(db: Tx) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS snapshots (id TEXT PRIMARY KEY, code TEXT NOT NULL, kind TEXT NOT NULL, "
            "approver TEXT NOT NULL, status TEXT NOT NULL, requester TEXT NOT NULL, chat TEXT NOT NULL, "
            "account TEXT NOT NULL DEFAULT '', caller TEXT NOT NULL, state TEXT NOT NULL, origin TEXT NOT NULL, "
            "reply_to TEXT, tip TEXT, created_at TEXT NOT NULL, expires_at TEXT NOT NULL, resolved_at TEXT, "
            "resolved_by TEXT, mac TEXT NOT NULL, tools TEXT)"
        )
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS snapshots_live_code ON snapshots (code) WHERE status = 'pending'")
        db.execute("CREATE INDEX IF NOT EXISTS snapshots_code ON snapshots (code, created_at)")
        db.execute("CREATE INDEX IF NOT EXISTS snapshots_chat ON snapshots (chat, requester, status, created_at)")
        db.execute("CREATE INDEX IF NOT EXISTS snapshots_answerable ON snapshots (chat) "
                   "WHERE status = 'pending' AND (kind = 'input' OR approver = 'requester')")
        db.execute("CREATE INDEX IF NOT EXISTS snapshots_due ON snapshots (status, expires_at)")
        # The names of the tools the paused run was offered (JSON list): its resume gets no more.
        if db.dialect == "sqlite" and "tools" not in {
                row[1] for row in db.execute("PRAGMA table_info(snapshots)").fetchall()}:
            db.execute("ALTER TABLE snapshots ADD COLUMN tools TEXT")

    def mac(self, row: Row) -> str:
        if self.secret is None:
            raise SnapshotError("the snapshot secret is not loaded")
        data = {k: row.get(k) for k in _SIGNED if k not in _OPTIONAL or row.get(k) is not None}
        text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return hmac.new(self.secret, text, hashlib.sha256).hexdigest()

    def verify(self, row: Row) -> bool:
        """True when no signed field was changed since the row was written."""
        return hmac.compare_digest(self.mac(row), str(row.get("mac", "")))

    async def insert(self, row: Row) -> str:
        """Store a new pending row under a fresh code (unique among pending rows); returns the code."""
        # Signed as stored: a NUL in a tip, kept by PostgreSQL as U+FFFD, failed its check when read back.
        row = {**{k: as_stored(v) if isinstance(v, str) else v for k, v in row.items()},
               "id": row.get("id") or uuid.uuid4().hex, "status": "pending"}

        def work(db: Tx) -> str:
            for _ in range(20):
                row["code"] = new_code()
                row["mac"] = self.mac(row)
                # No error on a taken code (it would abort a PostgreSQL transaction): no row, draw again.
                if db.execute(f"INSERT INTO snapshots ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)}) "
                              "ON CONFLICT DO NOTHING", list(row.values())).rowcount == 1:
                    if row["kind"] == "input" or row["approver"] == "requester":
                        db.notify(ANSWERABLE, str(row["chat"]))
                    return str(row["code"])
            raise SnapshotError("no free credential after 20 draws")

        return await self.db.run(work)

    async def _rows(self, sql: str, params: list[Any]) -> list[Row]:
        return await self.db.run(lambda db: list(db.query(sql, params)))

    async def by_code(self, code: str) -> Row | None:
        rows = await self._rows("SELECT * FROM snapshots WHERE code = ? ORDER BY created_at DESC LIMIT 1", [code])
        return rows[0] if rows else None

    async def latest_answerable(self, chat: str, requester: str) -> Row | None:
        """The newest pending row this person can answer with a plain message in this chat."""
        rows = await self._rows(
            "SELECT * FROM snapshots WHERE chat = ? AND requester = ? AND status = 'pending' "
            "AND (kind = 'input' OR approver = 'requester') ORDER BY created_at DESC LIMIT 1", [chat, requester])
        return rows[0] if rows else None

    async def pending(self, now: datetime, *, requester: str | None = None, admin_only: bool = False,
                      chat: str | None = None, platform: str | None = None) -> list[Row]:
        sql = "SELECT * FROM snapshots WHERE status = 'pending' AND expires_at > ?"
        params: list[Any] = [iso(now)]
        if requester is not None:
            sql, params = sql + " AND requester = ?", [*params, requester]
        if chat is not None:
            sql, params = sql + " AND chat = ?", [*params, chat]
        if platform is not None:  # chat keys start with "platform:"
            sql, params = sql + " AND substr(chat, 1, ?) = ?", [*params, len(platform) + 1, platform + ":"]
        if admin_only:
            sql += " AND approver = 'admin' AND kind = 'approval'"
        return await self._rows(sql + " ORDER BY created_at", params)

    async def with_status(self, status: str | None) -> list[Row]:
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        return await self._rows(f"SELECT * FROM snapshots {where} ORDER BY created_at DESC", params)

    async def due(self, now: datetime) -> list[Row]:
        return await self._rows("SELECT * FROM snapshots WHERE status = 'pending' AND expires_at <= ?", [iso(now)])

    async def next_expiry(self) -> str | None:
        rows = await self._rows("SELECT MIN(expires_at) AS at FROM snapshots WHERE status = 'pending'", [])
        return str(rows[0]["at"]) if rows and rows[0]["at"] is not None else None

    async def orphans(self, alive: Callable[[Tx, str], bool]) -> tuple[list[Row], set[str]]:
        """Approved rows whose runner is not ``alive`` (or unknown), and the living runners of the others."""
        def work(db: Tx) -> tuple[list[Row], set[str]]:
            dead: list[Row] = []
            living: set[str] = set()
            for row in db.query("SELECT * FROM snapshots WHERE status = 'approved' ORDER BY created_at DESC"):
                runner = str(row.get("runner") or "")
                if runner and alive(db, runner):
                    living.add(runner)
                else:
                    dead.append(row)
            return dead, living

        return await self.db.run(work)

    async def answerable_chats(self) -> set[str]:
        rows = await self._rows("SELECT DISTINCT chat FROM snapshots WHERE status = 'pending' "
                                "AND (kind = 'input' OR approver = 'requester')", [])
        return {str(r["chat"]) for r in rows}

    async def transition(self, snapshot_id: str, to: str, *, frm: str, now: datetime, by: str | None = None,
                         runner: str | None = None) -> bool:
        """Move one row from ``frm`` to ``to``; False when someone else moved it first."""

        def work(db: Tx) -> bool:
            cur = db.execute("UPDATE snapshots SET status = ?, resolved_at = ?, resolved_by = COALESCE(?, resolved_by), "
                             "runner = COALESCE(?, runner) WHERE id = ? AND status = ?",
                             [to, iso(now), by, runner, snapshot_id, frm])
            return cur.rowcount == 1

        return await self.db.run(work)

    async def ran(self, snapshot_id: str, call: str, result: str | None = None) -> None:
        """Record on an approved row that ``call`` (as :func:`describe_call` shows it) starts, or ended with
        ``result``: a run broken off after it is reported as run (or maybe run), never as not run."""
        def work(db: Tx) -> None:
            found = db.execute("SELECT ran FROM snapshots WHERE id = ? AND status = 'approved'",
                               [snapshot_id]).fetchone()
            if found is None:
                return
            calls: list[dict[str, str]] = json.loads(found[0]) if found[0] else []
            started = next((c for c in reversed(calls) if c["call"] == call and "result" not in c), None)
            if result is None or started is None:
                calls.append({"call": call})
                started = calls[-1]
            if result is not None:
                started["result"] = result
            db.execute("UPDATE snapshots SET ran = ? WHERE id = ?", [json.dumps(calls, ensure_ascii=False), snapshot_id])

        await self.db.transaction(work)

    async def move_chat(self, old: ChatRef, new: ChatRef) -> int:
        """A chat's new id: its paused runs (their codes, answers and callers) follow it, signed anew;
        a row that fails its check stays where it is, refused (a move never launders an edit)."""
        def work(db: Tx) -> int:
            moved = 0
            for row in db.execute_returning_dicts("SELECT * FROM snapshots WHERE chat = ?", [old.key]):
                if not self.verify(row):
                    continue
                caller = json.loads(str(row["caller"]))
                if isinstance(caller, dict) and caller.get("chat_id") == old.chat_id:
                    caller["chat_id"] = new.chat_id
                row.update(chat=new.key, caller=json.dumps(caller, ensure_ascii=False))
                db.execute("UPDATE snapshots SET chat = ?, caller = ?, mac = ? WHERE id = ?",
                           [row["chat"], row["caller"], self.mac(row), row["id"]])
                moved += 1
                if row["status"] == "pending" and (row["kind"] == "input" or row["approver"] == "requester"):
                    db.notify(ANSWERABLE, new.key)
            return moved

        return await self.db.run(work)

    async def prune(self, before: datetime) -> int:
        """Delete finished rows created before ``before`` (history retention: each holds a conversation)."""
        return await self.db.run(lambda db: db.execute(
            "DELETE FROM snapshots WHERE status NOT IN ('pending', 'approved') AND created_at < ?",
            [iso(before)]).rowcount)

    @staticmethod
    def finish_sync(db: Tx, snapshot_id: str) -> None:
        """Mark an approved row resumed, inside the transaction that queues its replies."""
        db.execute("UPDATE snapshots SET status = 'resumed' WHERE id = ? AND status = 'approved'", [snapshot_id])


def notice_key(chat: ChatRef, requester_id: str) -> str:
    """The outbox key prefix of the approvers' notices of a request made in ``chat`` (found by ``/forget me``)."""
    return f"notice:{chat.key}>{requester_id}:"


def notice_prefix(chat: ChatRef) -> str:
    """How an approver's private notice of a request made in ``chat`` starts (found by ``/forget me``)."""
    return f"（来自 {chat.key}）"


def describe_call(call: ToolCall, limit: int = 160) -> str:
    """``name(key=value, …)`` for an approver: every key shown, each value quoted as JSON and cut to its share
    of ``limit`` (see :func:`function_calls.stops.describe_call`)."""
    return stops.describe_call(call.name, call.arguments, limit, floor=24, brackets="()", bounded=False)


def stored_caller(row: Row, is_admin: Callable[[str, str], bool]) -> Caller:
    """The paused run's requester as stored, with their bot-admin right as the config says now (an admin
    removed since must not run an admin-only call by approving it); a group role seen only through that
    right is dropped (unknown now: refused rather than guessed)."""
    caller = Caller.model_validate_json(str(row["caller"]))
    admin = is_admin(caller.platform, caller.user_id)
    group = caller.is_admin and not caller.bot_admin  # the platform named them a group admin then
    return caller.model_copy(update={"bot_admin": admin, "is_admin": admin or group})


def summarize(row: Row) -> str:
    """What a stored snapshot waits on, for ``/pending``."""
    if row["kind"] == "input":
        return str(row["tip"] or "")
    try:
        state = RunState.model_validate_json(str(row["state"]))
    except ValueError:
        return "（记录无法读取）"
    return "；".join(describe_call(c, 80) for c in state.pending)
