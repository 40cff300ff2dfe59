"""Channel state in the bot's database: poll cursors, login credentials, per-chat tokens.

One table, ``channel_state (platform, account, key, value, secret, updated_at)``, keyed by its first
three columns, so every process sharing the database (PostgreSQL, possibly on several machines) sees
the same Telegram offset and the same Weixin logins. The bot hands its store to each channel with
:meth:`robot.channels.base.Channel.attach_state`.

Credentials are stored with ``secret`` set: the value is sealed with Fernet (AES-128-CBC and an
HMAC-SHA256) under a key derived by HKDF-SHA256 from the install's ``secret.key`` (the key that
signs approval snapshots), so a database dump alone does not reveal a bot token. Every process that
shares the database therefore needs the same ``secret.key`` (copy the file); a process with another
key cannot open the value, says so without the value, and treats it as absent. Values are never
logged.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TypeVar

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from robot import secret_key
from robot.storage import Engine, StorageError, Tx, iso, utcnow

__all__ = ["SCHEMA", "ChannelState", "ChannelStateError"]

T = TypeVar("T")
log = logging.getLogger(__name__)

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS channel_state (platform TEXT NOT NULL, account TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, secret INTEGER NOT NULL DEFAULT 0, updated_at TEXT NOT NULL, "
    "PRIMARY KEY (platform, account, key))",
]
"""The ``channel_state`` component's migrations (append a step to change it, never edit one)."""

_INFO = b"qunbot channel_state v1"  # HKDF context: this key seals nothing else


class ChannelStateError(Exception):
    """A sealed value this process cannot open (another ``secret.key``, or an edited row)."""


class ChannelState:
    """Reads and writes ``channel_state``; every method is one unit of work on the bot's database.

    ``secret_path`` is the install's ``secret.key`` (created 0600 on first use); None (an in-memory
    bot) seals with a key that lives as long as this object, like the database it goes with.
    """

    def __init__(self, db: Engine, secret_path: Path | None = None) -> None:
        self.db = db
        self.secret_path = secret_path
        self._fernet: Fernet | None = None
        self._loading = asyncio.Lock()
        db.migrate("channel_state", SCHEMA)
        db.migrate("install_secret", secret_key.SCHEMA)

    async def check_key(self) -> None:
        """Refuse (:class:`robot.secret_key.SecretKeyMismatch`) unless the install's ``secret.key`` is
        the one the open database was first used with (see :mod:`robot.secret_key`): before anything
        is sealed or signed with it. Nothing to check for an in-memory bot."""
        if self.secret_path is not None:
            await secret_key.check_secret(self.db, self.secret_path)

    async def _cipher(self) -> Fernet:
        async with self._loading:
            if self._fernet is None:
                from robot.snapshots import load_secret  # the one reader of secret.key

                secret = (await asyncio.to_thread(load_secret, self.secret_path) if self.secret_path is not None
                          else secrets.token_bytes(32))
                key = HKDF(algorithm=SHA256(), length=32, salt=None, info=_INFO).derive(secret)
                self._fernet = Fernet(base64.urlsafe_b64encode(key))
            return self._fernet

    async def _open(self, platform: str, account: str, key: str, value: str) -> str:
        try:
            return (await self._cipher()).decrypt(value.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise ChannelStateError(
                f"{platform} {account}: the stored {key!r} cannot be opened with this install's secret.key; every "
                "process sharing the database needs the same secret.key (copy it), or log in again") from exc

    async def _run(self, fn: Callable[[Tx], T], *, durable: bool = False) -> T:
        """``fn`` as one transaction; any failure is a :class:`StorageError` (an ``OSError``, like the
        files this table replaces), so a channel's cursor write fails as it always could."""
        try:
            return await self.db.transaction(fn, durable=durable)
        except StorageError:
            raise
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise StorageError(f"channel state in {self.db.where}: {type(exc).__name__} {reason}") from exc

    # -- reading -------------------------------------------------------------------------------

    async def get(self, platform: str, account: str, key: str) -> str | None:
        """The value, opened if sealed; None if absent. Raises :class:`ChannelStateError` if unopenable."""
        rows = await self._run(lambda tx: tx.query(
            "SELECT value, secret FROM channel_state WHERE platform = ? AND account = ? AND key = ?",
            [platform, account, key]))
        if not rows:
            return None
        value = str(rows[0]["value"])
        return await self._open(platform, account, key, value) if rows[0]["secret"] else value

    async def items(self, platform: str, *, account: str | None = None, key: str | None = None,
                    prefix: str | None = None) -> dict[tuple[str, str], str]:
        """``(account, key) -> value`` of ``platform``, narrowed to one account, one key or a key prefix.

        A sealed value this process cannot open is left out, with one error logged (never the value).
        """
        sql = "SELECT account, key, value, secret FROM channel_state WHERE platform = ?"
        params: list[str] = [platform]
        if account is not None:
            sql, params = sql + " AND account = ?", [*params, account]
        if key is not None:
            sql, params = sql + " AND key = ?", [*params, key]
        if prefix is not None:  # not LIKE (the prefix may hold % or _), not a range (collations differ)
            sql, params = sql + f" AND substr(key, 1, {len(prefix)}) = ?", [*params, prefix]
        rows = await self._run(lambda tx: tx.query(sql + " ORDER BY account, key", params))
        found: dict[tuple[str, str], str] = {}
        for row in rows:
            where = (str(row["account"]), str(row["key"]))
            try:
                found[where] = (await self._open(platform, *where, str(row["value"])) if row["secret"]
                                else str(row["value"]))
            except ChannelStateError as exc:
                log.error("%s", exc)
        return found

    # -- writing -------------------------------------------------------------------------------

    async def put(self, platform: str, account: str, key: str, value: str, *, secret: bool = False,
                  durable: bool = False) -> None:
        """Set one value (sealed if ``secret``); ``durable``: on disk before this returns (credentials)."""
        await self.update(platform, account, {key: value}, secret=[key] if secret else (), durable=durable)

    async def delete(self, platform: str, account: str, key: str) -> bool:
        """Remove one value; whether it was there."""
        return await self.update(platform, account, delete=[key]) > 0

    async def update(self, platform: str, account: str, put: Mapping[str, str] | None = None,
                     delete: Collection[str] = (), *, secret: Collection[str] = (), only_new: bool = False,
                     durable: bool = False) -> int:
        """Set ``put`` and remove ``delete`` for one account, in one transaction; rows written or removed.

        Keys in ``secret`` are sealed. ``only_new``: keep values already stored (an import of old files).
        """
        cipher = await self._cipher() if secret else None
        now = iso(utcnow())
        rows = [(platform, account, key, cipher.encrypt(value.encode("utf-8")).decode("ascii")
                 if cipher is not None and key in secret else value, int(key in secret), now)
                for key, value in (put or {}).items()]
        conflict = ("DO NOTHING" if only_new else
                    "DO UPDATE SET value = excluded.value, secret = excluded.secret, updated_at = excluded.updated_at")

        def work(tx: Tx) -> int:
            changed = 0
            for row in rows:
                changed += tx.execute("INSERT INTO channel_state (platform, account, key, value, secret, updated_at) "
                                      f"VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (platform, account, key) {conflict}",
                                      row).rowcount
            for key in delete:
                changed += tx.execute("DELETE FROM channel_state WHERE platform = ? AND account = ? AND key = ?",
                                      [platform, account, key]).rowcount
            return changed

        return await self._run(work, durable=durable)

    async def delete_keys(self, platform: str, keys: Collection[str], *, keep_accounts: Collection[str] = ()) -> int:
        """Remove ``keys`` from every account of ``platform`` but ``keep_accounts``; how many went."""
        keys, kept = list(keys), list(keep_accounts)
        if not keys:
            return 0

        def work(tx: Tx) -> int:
            removed = 0
            for key in keys:
                sql = "DELETE FROM channel_state WHERE platform = ? AND key = ?"
                if kept:
                    sql += f" AND account NOT IN ({', '.join(['?'] * len(kept))})"
                removed += tx.execute(sql, [platform, key, *kept]).rowcount
            return removed

        return await self._run(work)
