"""A thin aiohttp client for the few Telegram Bot API methods the channel uses.

Why not aiogram 3: we call eight methods; the project already speaks HTTP through aiohttp; a
``429 retry_after`` and a ``migrate_to_chat_id`` must reach our outbox as our own exceptions
rather than be retried or swallowed inside another framework's session; and a base URL is all a
fake Bot API server needs. aiogram would add its own dispatcher, models and pinned versions.

Errors::

    ChannelError (robot.channels.base)
    └── TelegramError
        ├── TelegramHTTPError      network failure or an unreadable answer (retry later)
        └── TelegramApiError       ``ok: false``: error_code and description
            ├── TooManyRequests    429 with ``parameters.retry_after`` seconds
            ├── ChatMigrated       400 with ``parameters.migrate_to_chat_id``
            └── TokenRefused       401 or 404: the bot token is wrong or revoked (no call can work)
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from robot.channels.base import ChannelError

__all__ = ["ChatMigrated", "TelegramApi", "TelegramApiError", "TelegramError", "TelegramHTTPError",
           "TokenRefused", "TooManyRequests", "utf16_len"]


def utf16_len(text: str) -> int:
    """Length as Telegram counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class TelegramError(ChannelError):
    """Base of Bot API client failures."""


class TelegramHTTPError(TelegramError):
    """No usable answer (network, timeout, non-JSON body)."""


class TelegramApiError(TelegramError):
    """The Bot API answered ``ok: false``."""

    def __init__(self, method: str, code: int, description: str, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(f"{method}: {code} {description}")
        self.code, self.description, self.parameters = code, description, parameters or {}


class TooManyRequests(TelegramApiError):
    """Flood control: wait ``retry_after`` seconds."""

    @property
    def retry_after(self) -> float:
        value = self.parameters.get("retry_after")
        return float(value) if isinstance(value, int | float) and value > 0 else 1.0


class ChatMigrated(TelegramApiError):
    """The group became a supergroup with a new id."""

    @property
    def new_chat_id(self) -> int:
        return int(self.parameters["migrate_to_chat_id"])


class TokenRefused(TelegramApiError):
    """401 (or 404 on the bot's URL): the token is wrong or was revoked in @BotFather; nothing can be sent."""


class TelegramApi:
    """``await api.call("sendMessage", {...})`` returns the ``result`` or raises."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str, *, timeout_s: float = 15.0) -> None:
        self.session = session
        self._url = f"{base_url.rstrip('/')}/bot{token}/"
        self.timeout_s = timeout_s

    async def call(self, method: str, payload: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> Any:
        try:
            async with self.session.post(self._url + method, json=payload or {},
                                         timeout=aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)) as resp:
                raw = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The URL holds the token: never let it into a message.
            raise TelegramHTTPError(f"{method}: {type(exc).__name__}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise TelegramHTTPError(f"{method}: HTTP {resp.status}, not JSON") from None
        if not isinstance(answer, dict):
            raise TelegramHTTPError(f"{method}: HTTP {resp.status}, not a JSON object")
        if answer.get("ok") is True:
            return answer.get("result")
        raw_code = answer.get("error_code")
        code = raw_code if isinstance(raw_code, int) else resp.status
        description = str(answer.get("description") or "")
        params = answer.get("parameters") if isinstance(answer.get("parameters"), dict) else {}
        if code == 429:
            raise TooManyRequests(method, code, description, params)
        if code in (401, 404):  # Telegram answers 404 to a malformed token's URL (and to no method we call)
            raise TokenRefused(method, code, description, params)
        if isinstance(params, dict) and "migrate_to_chat_id" in params:
            raise ChatMigrated(method, code, description, params)
        if code >= 500:
            raise TelegramHTTPError(f"{method}: {code} {description}")
        raise TelegramApiError(method, code, description, params)
