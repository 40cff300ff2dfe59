"""What a Weixin account keeps: credentials, the long-poll cursor and context tokens.

In a bot (:meth:`WeixinState.attach`, done by the channel's ``attach_state``) they live in the
database's ``channel_state`` table (:mod:`robot.channels.state_store`), so every process sharing
it sees the same logins: ``account`` (sealed JSON: id, token, base URL, user), ``cursor``
(``get_updates_buf``) and one ``context:<chat id>`` row per chat. On first use the JSON files an
older qunbot left under ``<data_dir>/weixin/accounts/`` are imported (what the database already
holds wins) and renamed ``*.imported``; they still hold the token in plain text, so delete them
once the upgrade has settled.

Without a database (a channel or ``qunbot login`` run alone) the same data is kept in those files,
written atomically (temporary file + rename) with mode 0600 in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from robot.channels.files import write_private
from robot.channels.state_store import ChannelState, ChannelStateError

__all__ = ["WeixinAccount", "WeixinState"]

log = logging.getLogger(__name__)
_PLATFORM = "weixin"
_CONTEXT = "context:"
_SAFE = re.compile(r"[^A-Za-z0-9._@-]")


class WeixinAccount(BaseModel):
    """One logged-in bot: its id, token, API base URL and the WeChat user who bound it."""

    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    bot_id: str
    bot_token: SecretStr
    base_url: str
    user_id: str = ""
    saved_at: datetime | None = None


def _parse(value: str) -> WeixinAccount | None:
    try:
        return WeixinAccount.model_validate_json(value)
    except ValidationError:
        return None  # hide_input_in_errors: nothing of the token reaches a message


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _account_json(account: WeixinAccount) -> dict[str, Any]:
    return {"bot_id": account.bot_id, "bot_token": account.bot_token.get_secret_value(),
            "base_url": account.base_url, "user_id": account.user_id,
            "saved_at": (account.saved_at or datetime.now(UTC)).isoformat()}


class WeixinState:
    """The accounts: in the attached database, else in the files under ``root`` (``<data_dir>/weixin``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.accounts_dir = root / "accounts"
        self.store: ChannelState | None = None
        self._imported = False
        self._import_lock = asyncio.Lock()
        self._save_lock = asyncio.Lock()
        #: Each account's context tokens as this process last read or wrote them: saves write the difference.
        self._saved: dict[str, dict[str, str]] = {}

    def attach(self, store: ChannelState) -> None:
        """Keep state in ``store`` from now on (the old files are imported on first use)."""
        self.store = store

    @property
    def where(self) -> str:
        """Where accounts are kept, for messages."""
        return "the database" if self.store is not None else str(self.accounts_dir)

    async def _db(self) -> ChannelState | None:
        """The store, once the old files are in it; None without one."""
        if self.store is None:
            return None
        async with self._import_lock:
            if not self._imported:
                await self._import(self.store)
                self._imported = True
        return self.store

    async def _import(self, store: ChannelState) -> None:
        for account in await asyncio.to_thread(self.load_accounts_sync):
            files = [self._file(account.bot_id, s) for s in (".json", ".sync.json", ".context.json")]
            cursor = await asyncio.to_thread(_read, files[1])
            tokens = await asyncio.to_thread(_read, files[2]) or {}
            put = {"account": json.dumps(_account_json(account))}
            if isinstance((cursor or {}).get("get_updates_buf"), str):
                put["cursor"] = str((cursor or {})["get_updates_buf"])
            put.update({_CONTEXT + str(k): v for k, v in tokens.items() if isinstance(v, str) and v})
            await store.update(_PLATFORM, account.bot_id, put, secret=["account"], only_new=True, durable=True)
            for path in files:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(path.rename, path.with_name(path.name + ".imported"))
            log.warning("weixin: account %s imported from %s into the database; the files are renamed *.imported "
                        "(they hold its token in plain text: delete them once this version runs well)",
                        account.bot_id, self.accounts_dir)

    def _file(self, bot_id: str, suffix: str) -> Path:
        name = _SAFE.sub("_", bot_id).lstrip(".")
        if not name:
            raise ValueError(f"unusable Weixin bot id {bot_id!r}")
        return self.accounts_dir / f"{name}{suffix}"

    # --- accounts ---------------------------------------------------------------------------
    async def save_account(self, account: WeixinAccount) -> str:
        """Store a login (durably); where it went, for the user (who reads Chinese)."""
        store = await self._db()
        if store is None:
            return str(await asyncio.to_thread(self.save_account_sync, account))
        await store.put(_PLATFORM, account.bot_id, "account", json.dumps(_account_json(account)), secret=True,
                        durable=True)
        return "数据库"

    async def load_accounts(self) -> list[WeixinAccount]:
        """Every readable account, oldest login first."""
        store = await self._db()
        if store is None:
            return await asyncio.to_thread(self.load_accounts_sync)
        found = [_parse(value) for value in (await store.items(_PLATFORM, key="account")).values()]
        return sorted((a for a in found if a is not None),
                      key=lambda a: a.saved_at or datetime.min.replace(tzinfo=UTC))

    async def load_account(self, bot_id: str) -> WeixinAccount | None:
        store = await self._db()
        if store is None:
            return await asyncio.to_thread(self.load_account_sync, bot_id)
        try:
            value = await store.get(_PLATFORM, bot_id, "account")
        except ChannelStateError as exc:
            log.error("%s", exc)
            return None
        return None if value is None else _parse(value)

    def save_account_sync(self, account: WeixinAccount) -> Path:
        """The file backend of :meth:`save_account`."""
        path = self._file(account.bot_id, ".json")
        write_private(path, _account_json(account), sync=True)
        return path

    def load_accounts_sync(self) -> list[WeixinAccount]:
        """Every readable account file, oldest login first."""
        if not self.accounts_dir.is_dir():
            return []
        found: list[WeixinAccount] = []
        for path in sorted(self.accounts_dir.glob("*.json")):
            if path.name.endswith((".sync.json", ".context.json")):
                continue
            data = _read(path)
            if data is None:
                continue
            try:
                found.append(WeixinAccount.model_validate(data))
            except ValidationError:
                continue
        return sorted(found, key=lambda a: a.saved_at or datetime.min.replace(tzinfo=UTC))

    def load_account_sync(self, bot_id: str) -> WeixinAccount | None:
        data = _read(self._file(bot_id, ".json"))
        try:
            return None if data is None else WeixinAccount.model_validate(data)
        except ValidationError:
            return None

    # --- the long-poll cursor ---------------------------------------------------------------
    async def load_cursor(self, bot_id: str) -> str:
        store = await self._db()
        if store is not None:
            return await store.get(_PLATFORM, bot_id, "cursor") or ""
        data = await asyncio.to_thread(_read, self._file(bot_id, ".sync.json"))
        value = (data or {}).get("get_updates_buf")
        return value if isinstance(value, str) else ""

    async def save_cursor(self, bot_id: str, buf: str) -> None:
        store = await self._db()
        if store is not None:
            return await store.put(_PLATFORM, bot_id, "cursor", buf)
        await asyncio.to_thread(write_private, self._file(bot_id, ".sync.json"), {"get_updates_buf": buf})

    # --- context tokens ---------------------------------------------------------------------
    async def load_context_tokens(self, bot_id: str) -> dict[str, str]:
        store = await self._db()
        if store is not None:
            rows = await store.items(_PLATFORM, account=bot_id, prefix=_CONTEXT)
            tokens = {key[len(_CONTEXT):]: value for (_, key), value in rows.items() if value}
            self._saved[bot_id] = dict(tokens)
            return tokens
        data = await asyncio.to_thread(_read, self._file(bot_id, ".context.json")) or {}
        return {str(k): v for k, v in data.items() if isinstance(v, str) and v}

    async def context_token(self, bot_id: str, chat_id: str) -> str | None:
        """One chat's stored token: another process that served the account may have learned it.

        Only read: what this process last saved stays its base, so its next save deletes nothing it kept."""
        store = await self._db()
        if store is None:
            return (await self.load_context_tokens(bot_id)).get(chat_id)
        return await store.get(_PLATFORM, bot_id, _CONTEXT + chat_id) or None

    async def save_context_tokens(self, bot_id: str, tokens: dict[str, str]) -> None:
        """Store an account's tokens. In the database only what changed since this process last read
        or wrote them is written: a token another process deleted (``/forget me``) stays deleted, and
        one it learned stays stored (only what this process itself dropped is deleted)."""
        store = await self._db()
        if store is None:
            return await asyncio.to_thread(write_private, self._file(bot_id, ".context.json"), dict(tokens))
        async with self._save_lock:
            saved = self._saved.get(bot_id, {})  # never read here: nothing was dropped here either
            put = {_CONTEXT + chat: token for chat, token in tokens.items() if saved.get(chat) != token}
            gone = [_CONTEXT + chat for chat in saved if chat not in tokens]
            if put or gone:
                await store.update(_PLATFORM, bot_id, put, gone)
            self._saved[bot_id] = dict(tokens)

    def forgotten_elsewhere(self, chats: set[str] | None, bot_id: str | None = None) -> None:
        """Another process deleted the tokens of ``chats`` (None: any of ``bot_id``'s): the next save here
        neither deletes them again (one learned since may be stored) nor counts them as kept."""
        for account, saved in self._saved.items():
            if chats is None and account == bot_id:
                saved.clear()
            for chat in chats or ():
                saved.pop(chat, None)

    async def forget_context_tokens(self, chats: set[str], *, skip: set[str]) -> int:
        """Delete the tokens of ``chats`` from every stored account but ``skip``; how many went."""
        store = await self._db()
        if store is not None:
            for bot_id, saved in self._saved.items():
                if bot_id not in skip:
                    for chat in chats:
                        saved.pop(chat, None)
            return await store.delete_keys(_PLATFORM, [_CONTEXT + chat for chat in chats], keep_accounts=skip)
        accounts = await asyncio.to_thread(self.load_accounts_sync)
        removed = 0
        for bot_id in (a.bot_id for a in accounts if a.bot_id not in skip):
            tokens = await self.load_context_tokens(bot_id)
            hit = [chat for chat in chats if chat in tokens]
            for chat in hit:
                del tokens[chat]
            if hit:
                removed += len(hit)
                await self.save_context_tokens(bot_id, tokens)
        return removed
