"""The outbox's table and its migrations, queueing, marks and lookups (SQL that runs on SQLite and PostgreSQL).

Which process sends a row is :mod:`robot.outbox_claims`. A row may be queued claimed already (a
reminders burst is sent by the process that fired it: :func:`queue_sync`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta

from robot.channels.base import Channel, ChannelUnavailable, SendFailed, SendRejected
from robot.history import HistoryStore, Said
from robot.message import ChatRef, OutgoingMessage
from robot.outbox_claims import Scope, order_by
from robot.storage import Engine, Step, Tx, iso, parse_iso
from robot.storage.base import columns, in_chunks, padded, unnest
from robot.storage.batch import Batched
from robot.text_parts import split_text

__all__ = ["LATE", "LEASED_PLATFORMS", "ONE_PROCESS_PLATFORMS", "SCHEMA", "OutboxRows", "queue_sync", "said_of"]
#: The sending outbox's logger: its marks (retries, failures) are logged under it.
log = logging.getLogger("robot.outbox")
#: The platforms whose channels serve an account from one process at a time (``Channel.account_leases``).
LEASED_PLATFORMS = ("onebot", "telegram", "weixin")
#: The platforms whose channel runs in one process at a time (``Channel.one_process``).
ONE_PROCESS_PLATFORMS = ("console", "web", "wecom")
#: A row going out this long after it was queued is late: its ``late_note`` is added (a channel was down).
LATE = timedelta(seconds=60)
_REMEMBERED = 10_000  # sends whose key a process keeps (a database loses well under a second of commits)


def _v1(tx: Tx) -> None:
    """The v0.1 table (idempotent: SQLite files from v0.1 have it, without a version row)."""
    seq = "" if tx.dialect == "sqlite" else "seq BIGINT GENERATED ALWAYS AS IDENTITY, "  # SQLite orders by rowid
    tx.execute(
        f"CREATE TABLE IF NOT EXISTS outbox (key TEXT PRIMARY KEY, {seq}platform TEXT NOT NULL, chat TEXT NOT NULL, "
        "text TEXT NOT NULL, mention TEXT NOT NULL DEFAULT '[]', reply_to TEXT, status TEXT NOT NULL, "
        "attempts INTEGER NOT NULL DEFAULT 0, parts_sent INTEGER NOT NULL DEFAULT 0, next_at TEXT NOT NULL, "
        "created_at TEXT NOT NULL, sent_at TEXT, error TEXT, receipt TEXT, account TEXT NOT NULL DEFAULT '')")
    tx.execute("CREATE INDEX IF NOT EXISTS outbox_due ON outbox (platform, status, next_at)")
    tx.execute("CREATE INDEX IF NOT EXISTS outbox_receipt ON outbox (chat, receipt)")
    tx.execute("CREATE INDEX IF NOT EXISTS outbox_chat ON outbox (chat, status, next_at)")
    # The account a row leaves through (ChatRef.account); files from before it get "".
    if tx.dialect == "sqlite" and "account" not in {r[1] for r in tx.execute("PRAGMA table_info(outbox)").fetchall()}:
        tx.execute("ALTER TABLE outbox ADD COLUMN account TEXT NOT NULL DEFAULT ''")


SCHEMA: list[Step] = [
    _v1,
    # Which process is sending a row, until when (many processes, one database).
    "ALTER TABLE outbox ADD COLUMN claimed_by TEXT; ALTER TABLE outbox ADD COLUMN claimed_until TEXT; "
    "CREATE INDEX IF NOT EXISTS outbox_account ON outbox (platform, account, status)",
    # The receipts of a long message's parts before its last (whose receipt is the row's): a reply to
    # any of them is a reply to the bot (is_own_message).
    "CREATE TABLE IF NOT EXISTS outbox_parts (key TEXT NOT NULL, chat TEXT NOT NULL, receipt TEXT NOT NULL); "
    "CREATE INDEX IF NOT EXISTS outbox_parts_receipt ON outbox_parts (chat, receipt); "
    "CREATE INDEX IF NOT EXISTS outbox_parts_key ON outbox_parts (key)",
    # What a row adds when it goes out late (OutgoingMessage.late_note).
    "ALTER TABLE outbox ADD COLUMN late_note TEXT NOT NULL DEFAULT ''",
]


_QUEUE_INTO = ("INSERT INTO outbox (key, platform, chat, account, text, mention, reply_to, status, next_at, created_at, "
               "claimed_by, claimed_until, late_note) ")
_QUEUE = _QUEUE_INTO + "VALUES "
_QUEUED_ROW = "(?,?,?,?,?,?,?, 'pending', ?, ?, ?, ?, ?)"
_ROWS_PER_QUEUE = 64  # rows per INSERT (768 parameters: below either engine's limit)


def queue_sync(tx: Tx, messages: Sequence[OutgoingMessage], now: datetime, bot_id: str, bot_name: str,
               claims: Sequence[tuple[str, str] | None] | None = None) -> list[bool]:
    """Queue ``messages`` in the caller's transaction; per message, False when its key was queued already.

    Each new row wakes the senders of every process (``notify``, at the commit) and is recorded in
    the chat's history, as the bot's message, in the same transaction. Many messages (a firing
    pass) go in one INSERT per chunk (:func:`~robot.storage.base.padded`), not one statement each:
    on PostgreSQL a statement is a round trip. ``claims``: per message, ``(holder, until)`` to queue
    it claimed by that process (its notification names the holder: no other process wakes for it).
    """
    claims = claims or [None] * len(messages)
    rows = [[m.key, m.chat.platform, m.chat.key, m.chat.account, m.text, json.dumps(list(m.mention)), m.reply_to,
             *[iso(m.created_at or now)] * 2, *(claim or (None, None)), m.late_note]  # next_at, created_at, claim
            for m, claim in zip(messages, claims, strict=True)]
    new: set[str] = set()
    if len(rows) == 1:  # a reply: the common case, no RETURNING to read
        if tx.execute(_QUEUE + _QUEUED_ROW + " ON CONFLICT (key) DO NOTHING", rows[0]).rowcount == 1:
            new.add(messages[0].key)
    elif tx.dialect == "postgresql" and rows:  # rows keep their order: the chat's order (seq) is theirs
        sql = (_QUEUE_INTO + "SELECT k, p, c, a, t, m, r, 'pending', n, cr, cb, cu, ln FROM "
               + unnest(*["text"] * 12) + " WITH ORDINALITY AS v(k, p, c, a, t, m, r, n, cr, cb, cu, ln, i) ORDER BY i "
               "ON CONFLICT (key) DO NOTHING RETURNING key")
        new.update(str(r[0]) for r in tx.execute(sql, columns(rows)).fetchall())
    else:
        for start in range(0, len(rows), _ROWS_PER_QUEUE):
            part = padded(rows[start:start + _ROWS_PER_QUEUE], _ROWS_PER_QUEUE)
            sql = _QUEUE + ",".join([_QUEUED_ROW] * len(part)) + " ON CONFLICT (key) DO NOTHING RETURNING key"
            new.update(str(r[0]) for r in tx.execute(sql, [v for row in part for v in row]).fetchall())
    added: list[bool] = []
    said: list[Said] = []
    for message, claim in zip(messages, claims, strict=True):
        if message.key not in new:  # queued before (or twice in ``messages``: the first one counts)
            added.append(False)
            continue
        new.discard(message.key)
        chat = message.chat
        tx.notify("outbox", json.dumps([chat.platform, chat.key, chat.account, *([claim[0]] if claim else [])]))
        # (message_id: its key, so that a failed mark can take back what was never said: _mark_many)
        said.append(Said(message.chat, bot_id, bot_name, message.text, message.created_at or now, from_bot=True,
                         message_id=message.key, reply_to=message.reply_to,
                         to_user=message.about or (message.mention[0] if message.mention else None),
                         to_users=(message.about,) if message.about else message.mention))
        added.append(True)
    HistoryStore.insert_many_sync(tx, said)
    return added


def said_of(parts: Sequence[str], sent: int) -> str:
    """What a chat saw of a message split in ``parts`` when only the first ``sent`` went out, for its
    history ("" when none did: the history row goes)."""
    if sent <= 0:
        return ""
    return "\n".join(parts[:sent]) + f"…〔后 {len(parts) - sent} 段未送达〕"


class OutboxRows:
    """The outbox's queries: queueing, inspection (and waiting on it: :meth:`flush`), pruning, moves,
    and one row's send with its marks (a base of :class:`robot.outbox.Outbox`, whose lanes send)."""

    db: Engine
    _marks: Batched[list[object], None]
    clock: Callable[[], datetime]
    bot_id: str
    bot_name: str
    max_attempts: int
    retry_base_s: float
    retry_max_s: float
    scope: Callable[[str], Scope]
    _channels: dict[str, Channel]
    claims_for: Callable[[Sequence[OutgoingMessage]], list[tuple[str, str] | None]]
    _delivered: dict[str, tuple[int, str | None]]  # key: parts sent, receipt (see _send_row)

    def enqueue_sync(self, db: Tx, message: OutgoingMessage) -> bool:
        """Insert within the caller's transaction; False when the key was already queued (idempotent).

        The bot's own reply is recorded in the chat history in the same transaction.
        """
        return queue_sync(db, [message], self.clock(), self.bot_id, self.bot_name)[0]

    def enqueue_many_sync(self, db: Tx, messages: Sequence[OutgoingMessage], *, send_here: bool = False) -> list[bool]:
        """:meth:`enqueue_sync` for many messages at once (fewer statements), in their order.

        ``send_here`` (a reminders burst): on PostgreSQL, those this process may send are queued
        claimed by it, and no other process is woken for them. Three processes that each fired a
        third of a burst otherwise all claimed every chat of it at once, waiting on each other's locks."""
        if not messages:
            return []
        claims = self.claims_for(messages) if send_here and db.dialect == "postgresql" else None
        return queue_sync(db, messages, self.clock(), self.bot_id, self.bot_name, claims)

    async def flush(self) -> None:
        """Wait until no message that is due now remains pending that this process may send."""
        while True:
            now = iso(self.clock())
            terms, params = [], [now]
            for platform in self._channels:
                scope = self.scope(platform)
                if not scope.nothing:
                    where, more = scope.sql()
                    terms.append(f"(platform = ? AND {where})")
                    params += [platform, *more]
            if not terms:
                return
            sql = f"SELECT count(*) FROM outbox WHERE status='pending' AND next_at <= ? AND ({' OR '.join(terms)})"
            due = await self.db.run(lambda db, q=sql, p=params: db.execute(q, p).fetchone()[0])  # type: ignore[misc]
            if not due:
                return
            await asyncio.sleep(0.02)

    async def pending(self, platform: str | None = None) -> int:
        sql = "SELECT count(*) FROM outbox WHERE status = 'pending'" + (" AND platform = ?" if platform else "")
        return int(await self.db.run(lambda db: db.execute(sql, [platform] if platform else []).fetchone()[0]))

    async def prune(self, now: datetime, keep: timedelta = timedelta(days=7), max_rows: int | None = None) -> int:
        """Forget delivered and failed messages older than ``keep`` (and beyond ``max_rows`` per chat).

        Their text is gone already (see :meth:`_mark`); what remains (key, receipt, status) only
        lets a reply to the bot be recognised.
        """
        cutoff = iso(now - keep)

        def work(db: Tx) -> int:
            removed = int(db.execute(
                "DELETE FROM outbox WHERE status IN ('sent', 'failed') AND created_at < ?", [cutoff]).rowcount)
            if max_rows is not None:
                removed += int(db.execute(
                    "DELETE FROM outbox WHERE key IN (SELECT key FROM (SELECT key, ROW_NUMBER() OVER "
                    f"(PARTITION BY chat ORDER BY {order_by(db, desc=True)}) AS n FROM outbox "
                    "WHERE status IN ('sent', 'failed')) AS ranked WHERE n > ?)", [max_rows]).rowcount)
            if removed:
                db.execute("DELETE FROM outbox_parts WHERE NOT EXISTS (SELECT 1 FROM outbox WHERE outbox.key = outbox_parts.key)")
            return removed

        return await self.db.run(work)

    async def move_chat(self, old: ChatRef, new: ChatRef) -> int:
        """Queued and sent rows of ``old`` now belong to ``new`` (replies and reply lookups follow)."""
        def work(db: Tx) -> int:
            db.execute("UPDATE outbox_parts SET chat = ? WHERE chat = ?", [new.key, old.key])
            return int(db.execute("UPDATE outbox SET chat = ? WHERE chat = ?", [new.key, old.key]).rowcount)
        return await self.db.run(work)

    async def is_own_message(self, chat: ChatRef, platform_message_id: str) -> bool:
        """Whether the platform's message id is one the bot sent in this chat (any part of a long
        message: replies to the bot)."""
        params = [chat.key, platform_message_id]
        return bool(await self.db.run(lambda db: db.execute(
            "SELECT 1 FROM outbox WHERE chat = ? AND receipt = ? UNION ALL "
            "SELECT 1 FROM outbox_parts WHERE chat = ? AND receipt = ? LIMIT 1", params * 2).fetchone()))

    async def rows(self, status: str | None = None) -> list[dict[str, object]]:
        """Outbox rows for inspection (tests, ``qunbot doctor``)."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        return await self.db.run(
            lambda db: db.query(f"SELECT * FROM outbox {where} ORDER BY {order_by(db)}", params))

    async def failures(self, since: datetime) -> list[dict[str, object]]:
        """Messages that could not be delivered since ``since`` (newest first), for ``qunbot doctor``."""
        return await self.db.run(lambda db: db.query(
            "SELECT key, chat, error, sent_at FROM outbox WHERE status = 'failed' AND sent_at >= ? "
            "ORDER BY sent_at DESC LIMIT 50", [iso(since)]))

    async def _due_chats(self, platform: str, busy: set[str]) -> tuple[list[str], float | None]:
        """Chats with a row due now (not ``busy``) in this process's scope, and seconds until the next row is due."""
        now = iso(self.clock())
        scope = self.scope(platform)
        if scope.nothing:
            return [], None
        where, params = scope.sql()

        def work(db: Tx) -> tuple[list[str], float | None]:
            chats = [str(r[0]) for r in db.execute(
                f"SELECT DISTINCT chat FROM outbox WHERE platform = ? AND status = 'pending' AND next_at <= ? "
                f"AND {where} LIMIT 2000", [platform, now, *params]).fetchall() if str(r[0]) not in busy]
            nxt = db.execute(f"SELECT min(next_at) FROM outbox WHERE platform = ? AND status = 'pending' "
                             f"AND next_at > ? AND {where}", [platform, now, *params]).fetchone()[0]
            wait = None if nxt is None else max(0.0, (parse_iso(nxt) - self.clock()).total_seconds())
            return chats, wait

        return await self.db.run(work, urgent=True)

    async def _send_row(self, channel: Channel, row: dict[str, object]) -> str:
        """Send one row (its unsent parts); "sent", "failed", "retry" or "parked"."""
        key = str(row["key"])
        chat = ChatRef.from_key(str(row["chat"]), str(row.get("account") or ""))
        mention = tuple(json.loads(str(row["mention"])))
        # What this process delivered lately stays known after its mark: a database cut off, or one
        # that crashed and lost its last commits (a mark, a firing: PostgreSQL commits without
        # waiting for its log's flush), has the row claimed again; it is then marked, not resent.
        done, receipt = self._delivered.get(key, (0, None))
        text, late = str(row["text"]), str(row.get("late_note") or "")
        # Only while none of it went out: the parts still to send continue the ones sent (the note is at the end)
        if late and not done and not int(str(row["parts_sent"])) \
                and self.clock() - parse_iso(str(row["created_at"])) > LATE:
            text += late
        parts = split_text(text, channel.capabilities.max_text_len)
        for index in range(max(done, int(str(row["parts_sent"]))), len(parts)):
            out = OutgoingMessage(
                key=f"{key}#{index}" if len(parts) > 1 else key, chat=chat, text=parts[index],
                mention=mention if index == 0 else (), reply_to=str(row["reply_to"]) if row["reply_to"] else None,
            )
            said = said_of(parts, index)  # what the chat has seen of it, should this part be its last
            try:
                sent = await channel.send(out)
            except SendRejected as exc:
                return await self._fail(chat, key, f"refused: {exc}", said=said)
            except SendFailed as exc:
                attempts = int(str(row["attempts"])) + 1
                return await self._retry(chat, key, attempts, str(exc), exc.retry_after_s, said=said)
            except ChannelUnavailable as exc:
                if exc.retry_after_s:  # the platform's flood wait: not a failure of this message, and uncapped
                    wait = [iso(self.clock() + timedelta(seconds=exc.retry_after_s)), str(exc)[:500], key]
                    await self._update("UPDATE outbox SET next_at = ?, error = ? WHERE key = ?", wait)
                    return "retry"
                note = [str(exc)[:500], key]  # not connected: park, the backoff does not grow
                await self._update("UPDATE outbox SET error = ? WHERE key = ?", note)
                return "parked"
            except Exception as exc:  # a channel bug: retried like a transient failure, and logged
                log.exception("outbox %s: unexpected send failure", chat.key)
                attempts = int(str(row["attempts"])) + 1
                return await self._retry(chat, key, attempts, f"{type(exc).__name__}: {exc}", said=said)
            receipt = sent.platform_message_id if sent else None
            self._delivered[key] = (index + 1, receipt)
            if len(self._delivered) > _REMEMBERED:
                del self._delivered[next(iter(self._delivered))]
            if index + 1 < len(parts):  # the last part's count is committed with the 'sent' mark
                await self._set_parts(key, index + 1, chat, receipt)
        await self._mark(key, "sent", receipt=receipt, parts=len(parts))
        return "sent"

    async def _retry(self, chat: ChatRef, key: str, attempts: int, error: str, at_least_s: float | None = None,
                     *, said: str = "") -> str:
        if attempts >= self.max_attempts:
            return await self._fail(chat, key, f"gave up after {attempts} attempts: {error}", said=said)
        delay = max(min(self.retry_max_s, self.retry_base_s * 2 ** min(attempts - 1, 16)), at_least_s or 0.0)
        log.warning("outbox %s: message %s failed (%s); retry %d in %.1fs", chat.key, key, error[:200], attempts, delay)
        params = [attempts, iso(self.clock() + timedelta(seconds=delay)), error[:500], key]
        await self._update("UPDATE outbox SET attempts = ?, next_at = ?, error = ? WHERE key = ?", params)
        return "retry"

    async def _fail(self, chat: ChatRef, key: str, error: str, *, said: str = "") -> str:
        """Mark the row failed; its history row keeps ``said`` (the parts delivered), or goes."""
        log.error("outbox %s: message %s not delivered: %s (qunbot doctor lists such failures)",
                  chat.key, key, error[:300])
        await self._mark(key, "failed", error=error[:500], said=said)
        return "failed"

    async def _set_parts(self, key: str, parts: int, chat: ChatRef | None = None, receipt: str | None = None) -> None:
        """Note that ``parts`` parts of the row went out, the last of them as ``receipt``."""
        def work(db: Tx) -> None:
            db.execute("UPDATE outbox SET parts_sent = ? WHERE key = ?", [parts, key])
            if chat is not None and receipt:
                db.execute("INSERT INTO outbox_parts (key, chat, receipt) VALUES (?, ?, ?)", [key, chat.key, receipt])
        await self.db.run(work, urgent=True)

    async def _unwait(self, elsewhere: Collection[str]) -> None:
        """Waiting rows due at once (a start drops its last run's backoff), but those another process sends:
        the accounts' and channels' whose leases (``elsewhere``) it holds (a platform's flood wait too)."""
        def work(tx: Tx) -> None:
            now = iso(self.clock())
            if not elsewhere:
                tx.execute("UPDATE outbox SET next_at = ? WHERE status = 'pending' AND next_at > ?", [now, now])
                return
            rows = tx.execute("SELECT key, platform, account FROM outbox WHERE status = 'pending' AND next_at > ?", [now])
            keys = [str(k) for k, p, a in rows.fetchall() if f"channel:{p}" not in elsewhere and f"account:{p}:{a}" not in elsewhere
                    and (a or not any(n.startswith(f"account:{p}:") for n in elsewhere))]  # ("": perhaps theirs)
            for part, marks in in_chunks(keys):
                tx.execute(f"UPDATE outbox SET next_at = ? WHERE key IN ({marks})", [now, *part])
        await self.db.run(work, urgent=True)

    async def _update(self, sql: str, params: Sequence[object]) -> None:
        """One statement in a unit of its own (a row's state as its send goes)."""
        await self.db.run(lambda db: db.execute(sql, params), urgent=True)

    async def _mark(self, key: str, status: str, *, error: str | None = None, receipt: str | None = None,
                    parts: int | None = None, said: str = "") -> None:
        """Mark a row finished; marks made together (a burst's lanes) share a transaction. A failed row's
        history row is taken back (:meth:`HistoryStore.unsay_sync`) in it: ``said`` stays of it."""
        await self._marks([status, iso(self.clock()), error, receipt, parts, key, said])

    @staticmethod
    def _mark_many(db: Tx, marks: list[list[object]]) -> list[None]:
        # A finished row keeps key, receipt and status, never the text: the history holds the
        # conversation (under its retention and /forget me), the outbox is no second copy.
        rows = [m[:6] for m in marks]
        if db.dialect == "postgresql" and len(rows) > 1:  # two statements, not a round trip per row
            # Locked in the order claims lock rows (claim_many_sync): two transactions never wait in a cycle.
            db.execute(f"SELECT 1 FROM outbox WHERE key = ANY(?::text[]) ORDER BY chat, {order_by(db)} FOR UPDATE",
                       [[row[-1] for row in rows]])
            db.execute("UPDATE outbox AS o SET status = v.status, sent_at = v.sent_at, error = v.error, "
                       "receipt = v.receipt, text = '', mention = '[]', parts_sent = coalesce(v.parts, o.parts_sent) "
                       f"FROM {unnest('text', 'text', 'text', 'text', 'int', 'text')} "
                       "AS v(status, sent_at, error, receipt, parts, key) WHERE o.key = v.key", columns(rows))
        else:
            db.executemany("UPDATE outbox SET status = ?, sent_at = ?, error = ?, receipt = ?, text = '', "
                           "mention = '[]', parts_sent = coalesce(?, parts_sent) WHERE key = ?", rows)
        # (after the outbox's rows: the order /forget me locks them in, so neither waits on the other in a cycle)
        for key, said in [(str(m[5]), str(m[6])) for m in marks if m[0] == "failed"]:
            chat = db.execute("SELECT chat FROM outbox WHERE key = ?", [key]).fetchone()
            if chat is not None:
                HistoryStore.unsay_sync(db, str(chat[0]), key, said)
        return [None] * len(marks)
