"""The durable outbox: every outgoing message is committed to SQLite before it is sent.

A worker per channel sends due rows, different chats concurrently and each chat in order,
retries with backoff while the channel is unavailable, and marks a row sent on the platform's
acknowledgement. Long texts go out in parts within the channel's limit; ``parts_sent`` is
committed after each part, so a restart resumes at the first unsent part and never repeats
one. The only window for a duplicate is a crash between the platform's acknowledgement and
that commit (milliseconds); platforms offer no idempotency key to close it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlite_utils

from robot.channels.base import Channel, ChannelUnavailable, SendRejected
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.store import Database, iso, parse_iso

__all__ = ["Outbox", "split_text"]

log = logging.getLogger(__name__)
_BREAKS = ("\n\n", "\n", "。", "！", "？", ". ", "! ", "? ", "；", "，", ", ", " ")


def split_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters, at the most natural break."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = 0
        for mark in _BREAKS:
            pos = window.rfind(mark)
            if pos >= limit // 2:
                cut = pos + len(mark)
                break
        cut = cut or limit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest or not parts:
        parts.append(rest)
    return parts


class Outbox:
    """Durable, idempotent, per-channel delivery."""

    def __init__(
        self,
        db: Database,
        *,
        bot_id: str = "bot",
        bot_name: str = "qunbot",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        chats_in_parallel: int = 16,
    ) -> None:
        self.db = db
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.clock = clock
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.chats_in_parallel = chats_in_parallel
        self._channels: dict[str, Channel] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False
        db.migrate(self._schema)

    @staticmethod
    def _schema(db: sqlite_utils.Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (key TEXT PRIMARY KEY, platform TEXT NOT NULL, chat TEXT NOT NULL, "
            "text TEXT NOT NULL, mention TEXT NOT NULL DEFAULT '[]', reply_to TEXT, status TEXT NOT NULL, "
            "attempts INTEGER NOT NULL DEFAULT 0, parts_sent INTEGER NOT NULL DEFAULT 0, next_at TEXT NOT NULL, "
            "created_at TEXT NOT NULL, sent_at TEXT, error TEXT, receipt TEXT)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS outbox_due ON outbox (platform, status, next_at)")
        db.execute("CREATE INDEX IF NOT EXISTS outbox_receipt ON outbox (chat, receipt)")
        db.execute("CREATE INDEX IF NOT EXISTS outbox_chat ON outbox (chat, status, next_at)")
        # The account a row leaves through (ChatRef.account); databases from before it get "".
        if "account" not in {row[1] for row in db.execute("PRAGMA table_info(outbox)").fetchall()}:
            db.execute("ALTER TABLE outbox ADD COLUMN account TEXT NOT NULL DEFAULT ''")

    def enqueue_sync(self, db: sqlite_utils.Database, message: OutgoingMessage) -> bool:
        """Insert within the caller's transaction; False when the key was already queued (idempotent).

        The bot's own reply is recorded in the chat history in the same transaction.
        """
        now = message.created_at or self.clock()
        cur = db.execute(
            "INSERT OR IGNORE INTO outbox (key, platform, chat, account, text, mention, reply_to, status, next_at, "
            "created_at) VALUES (?,?,?,?,?,?,?, 'pending', ?, ?)",
            [message.key, message.chat.platform, message.chat.key, message.chat.account, message.text,
             json.dumps(list(message.mention)), message.reply_to, iso(now), iso(now)],
        )
        if cur.rowcount != 1:
            return False
        HistoryStore.insert_sync(db, message.chat, self.bot_id, self.bot_name, message.text, now, from_bot=True,
                                 reply_to=message.reply_to, to_user=message.mention[0] if message.mention else None)
        return True

    def notify(self, platform: str) -> None:
        """Wake the platform's worker after a commit made outside :meth:`enqueue`."""
        event = self._wake.get(platform)
        if event is not None:
            event.set()

    async def enqueue(self, *messages: OutgoingMessage) -> int:
        """Commit messages (one transaction) and wake their workers; returns how many were new."""
        added = await self.db.transaction(lambda db: sum(self.enqueue_sync(db, m) for m in messages))
        for platform in {m.chat.platform for m in messages}:
            self.notify(platform)
        return added

    def register(self, channel: Channel) -> None:
        self._channels[channel.platform] = channel
        self._wake.setdefault(channel.platform, asyncio.Event())

    async def start(self) -> None:
        self._stopping = False
        for platform, channel in self._channels.items():
            self._workers.append(asyncio.create_task(self._worker(platform, channel), name=f"outbox-{platform}"))

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Give due messages up to ``flush_timeout_s`` to go out, then stop the workers."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), flush_timeout_s)
        self._stopping = True
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()

    async def pending(self, platform: str | None = None) -> int:
        sql = "SELECT count(*) FROM outbox WHERE status = 'pending'" + (" AND platform = ?" if platform else "")
        return int(await self.db.run(lambda db: db.execute(sql, [platform] if platform else []).fetchone()[0]))

    async def flush(self) -> None:
        """Wait until no message that is due now remains pending on a registered channel."""
        platforms = list(self._channels)
        marks = ",".join("?" * len(platforms))
        while platforms:
            now = iso(self.clock())
            params = [now, *platforms]
            due = await self.db.run(lambda db, p=params: db.execute(  # type: ignore[misc]
                f"SELECT count(*) FROM outbox WHERE status='pending' AND next_at <= ? AND platform IN ({marks})",
                p).fetchone()[0])
            if not due:
                return
            await asyncio.sleep(0.02)

    async def prune(self, now: datetime, keep: timedelta = timedelta(days=7), max_rows: int | None = None) -> int:
        """Forget delivered and failed messages older than ``keep`` (and beyond ``max_rows`` per chat).

        Their text is gone already (see :meth:`_mark`); what remains (key, receipt, status) only
        lets a reply to the bot be recognised.
        """
        cutoff = iso(now - keep)

        def work(db: sqlite_utils.Database) -> int:
            removed = int(db.execute(
                "DELETE FROM outbox WHERE status IN ('sent', 'failed') AND created_at < ?", [cutoff]).rowcount)
            if max_rows is not None:
                removed += int(db.execute(
                    "DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM (SELECT rowid, ROW_NUMBER() OVER "
                    "(PARTITION BY chat ORDER BY created_at DESC, rowid DESC) AS n FROM outbox "
                    "WHERE status IN ('sent', 'failed')) WHERE n > ?)", [max_rows]).rowcount)
            return removed

        return await self.db.run(work)

    async def move_chat(self, old: ChatRef, new: ChatRef) -> int:
        """Queued and sent rows of ``old`` now belong to ``new`` (replies and reply lookups follow)."""
        return await self.db.run(lambda db: db.execute(
            "UPDATE outbox SET chat = ? WHERE chat = ?", [new.key, old.key]).rowcount)

    async def is_own_message(self, chat: ChatRef, platform_message_id: str) -> bool:
        """Whether the platform's message id is one the bot sent in this chat (replies to the bot)."""
        return bool(await self.db.run(lambda db: db.execute(
            "SELECT 1 FROM outbox WHERE chat = ? AND receipt = ? LIMIT 1", [chat.key, platform_message_id]
        ).fetchone()))

    async def rows(self, status: str | None = None) -> list[dict[str, object]]:
        """Outbox rows for inspection (tests, ``qunbot doctor``)."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        return await self.db.run(
            lambda db: db.execute_returning_dicts(f"SELECT * FROM outbox {where} ORDER BY created_at, rowid", params))

    async def _due(self, platform: str) -> tuple[list[dict[str, object]], float | None]:
        now = iso(self.clock())

        def work(db: sqlite_utils.Database) -> tuple[list[dict[str, object]], float | None]:
            # A row waiting out a retry holds back the later rows of its chat: each chat in order.
            rows = db.execute_returning_dicts(
                "SELECT * FROM outbox AS o WHERE platform = ? AND status = 'pending' AND next_at <= ? "
                "AND NOT EXISTS (SELECT 1 FROM outbox AS p WHERE p.chat = o.chat AND p.status = 'pending' "
                "AND p.next_at > ? AND (p.created_at < o.created_at OR (p.created_at = o.created_at "
                "AND p.rowid < o.rowid))) ORDER BY created_at, rowid LIMIT 256", [platform, now, now])
            nxt = db.execute("SELECT min(next_at) FROM outbox WHERE platform = ? AND status = 'pending'",
                             [platform]).fetchone()[0]
            wait = None if nxt is None else max(0.0, (parse_iso(nxt) - self.clock()).total_seconds())
            return rows, wait

        return await self.db.run(work)

    async def _worker(self, platform: str, channel: Channel) -> None:
        wake = self._wake[platform]
        while not self._stopping:
            wake.clear()
            try:
                rows, wait = await self._due(platform)
            except Exception:
                log.exception("outbox %s: reading due rows failed", platform)
                rows, wait = [], 1.0
            if rows:
                by_chat: dict[str, list[dict[str, object]]] = {}
                for row in rows:
                    by_chat.setdefault(str(row["chat"]), []).append(row)
                sem = asyncio.Semaphore(self.chats_in_parallel)
                await asyncio.gather(*(self._send_chat(channel, chat_rows, sem) for chat_rows in by_chat.values()))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(wait, 5.0) if wait is not None else 5.0)

    async def _send_chat(self, channel: Channel, rows: list[dict[str, object]], sem: asyncio.Semaphore) -> None:
        async with sem:
            for row in rows:
                if not await self._send_row(channel, row):
                    return  # keep this chat's order: later rows wait for the failed one

    async def _send_row(self, channel: Channel, row: dict[str, object]) -> bool:
        key = str(row["key"])
        chat = ChatRef.from_key(str(row["chat"]), str(row.get("account") or ""))
        parts = split_text(str(row["text"]), channel.capabilities.max_text_len)
        done = int(str(row["parts_sent"]))
        mention = tuple(json.loads(str(row["mention"])))
        receipt = None
        try:
            for index in range(done, len(parts)):
                out = OutgoingMessage(
                    key=f"{key}#{index}" if len(parts) > 1 else key, chat=chat, text=parts[index],
                    mention=mention if index == 0 else (), reply_to=str(row["reply_to"]) if row["reply_to"] else None,
                )
                receipt = await channel.send(out)
                if index + 1 < len(parts):  # the last part's count is committed with the 'sent' mark
                    await self._set_parts(key, index + 1)
        except SendRejected as exc:
            log.warning("outbox %s: %s refused message %s: %s", chat.key, channel.platform, key, exc)
            await self._mark(key, "failed", error=str(exc)[:500])
            return False
        except Exception as exc:  # unavailable, or a channel bug: keep the message and retry later
            attempts = int(str(row["attempts"])) + 1
            delay = min(self.retry_max_s, self.retry_base_s * 2 ** min(attempts - 1, 16))
            if isinstance(exc, ChannelUnavailable) and exc.retry_after_s:
                delay = max(delay, exc.retry_after_s)  # the platform's flood wait, uncapped
            if not isinstance(exc, ChannelUnavailable):
                log.exception("outbox %s: unexpected send failure", chat.key)
            params = [attempts, iso(self.clock() + timedelta(seconds=delay)), str(exc)[:500], key]
            await self.db.run(lambda db: db.execute(
                "UPDATE outbox SET attempts = ?, next_at = ?, error = ? WHERE key = ?", params))
            return False
        await self._mark(key, "sent", receipt=receipt.platform_message_id if receipt else None, parts=len(parts))
        return True

    async def _set_parts(self, key: str, parts: int) -> None:
        await self.db.run(lambda db: db.execute("UPDATE outbox SET parts_sent = ? WHERE key = ?", [parts, key]))

    async def _mark(self, key: str, status: str, *, error: str | None = None, receipt: str | None = None,
                    parts: int | None = None) -> None:
        now = iso(self.clock())
        # A finished row keeps key, receipt and status, never the text: the history holds the
        # conversation (under its retention and /forget me), the outbox is no second copy.
        await self.db.run(lambda db: db.execute(
            "UPDATE outbox SET status = ?, sent_at = ?, error = ?, receipt = ?, text = '', mention = '[]', "
            "parts_sent = coalesce(?, parts_sent) WHERE key = ?", [status, now, error, receipt, parts, key]))
