"""What a Weixin account keeps on disk: credentials, the long-poll cursor and context tokens.

Everything lives under ``<data_dir>/weixin/accounts/`` as small JSON files written atomically
(temporary file + rename) with mode 0600, because they hold bearer tokens. File work runs in a
worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from robot.channels.files import write_private

__all__ = ["WeixinAccount", "WeixinState"]

_SAFE = re.compile(r"[^A-Za-z0-9._@-]")


class WeixinAccount(BaseModel):
    """One logged-in bot: its id, token, API base URL and the WeChat user who bound it."""

    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    bot_id: str
    bot_token: SecretStr
    base_url: str
    user_id: str = ""
    saved_at: datetime | None = None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class WeixinState:
    """The account files under ``root`` (``<data_dir>/weixin``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.accounts_dir = root / "accounts"

    def _file(self, bot_id: str, suffix: str) -> Path:
        name = _SAFE.sub("_", bot_id).lstrip(".")
        if not name:
            raise ValueError(f"unusable Weixin bot id {bot_id!r}")
        return self.accounts_dir / f"{name}{suffix}"

    # --- accounts ---------------------------------------------------------------------------
    def save_account_sync(self, account: WeixinAccount) -> Path:
        path = self._file(account.bot_id, ".json")
        write_private(path, {"bot_id": account.bot_id, "bot_token": account.bot_token.get_secret_value(),
                              "base_url": account.base_url, "user_id": account.user_id,
                              "saved_at": (account.saved_at or datetime.now(UTC)).isoformat()}, sync=True)
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
        data = await asyncio.to_thread(_read, self._file(bot_id, ".sync.json"))
        value = (data or {}).get("get_updates_buf")
        return value if isinstance(value, str) else ""

    async def save_cursor(self, bot_id: str, buf: str) -> None:
        await asyncio.to_thread(write_private, self._file(bot_id, ".sync.json"), {"get_updates_buf": buf})

    # --- context tokens ---------------------------------------------------------------------
    async def load_context_tokens(self, bot_id: str) -> dict[str, str]:
        data = await asyncio.to_thread(_read, self._file(bot_id, ".context.json")) or {}
        return {str(k): v for k, v in data.items() if isinstance(v, str) and v}

    async def save_context_tokens(self, bot_id: str, tokens: dict[str, str]) -> None:
        await asyncio.to_thread(write_private, self._file(bot_id, ".context.json"), dict(tokens))

    async def forget_context_tokens(self, chats: set[str], *, skip: set[str]) -> int:
        """Delete the tokens of ``chats`` from every stored account but ``skip``; how many went."""
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
