"""Telegram through the Bot API: :class:`TelegramChannel` (long polling or webhook) on a thin
aiohttp client (:class:`TelegramApi`); :mod:`robot.channels.telegram.testing` has a fake server."""

from __future__ import annotations

from robot.channels.telegram.api import (
    ChatMigrated,
    TelegramApi,
    TelegramApiError,
    TelegramError,
    TelegramHTTPError,
    TooManyRequests,
)
from robot.channels.telegram.channel import TelegramChannel
from robot.channels.telegram.convert import split_utf16
from robot.channels.telegram.settings import TelegramSettings

__all__ = [
    "ChatMigrated",
    "TelegramApi",
    "TelegramApiError",
    "TelegramChannel",
    "TelegramError",
    "TelegramHTTPError",
    "TelegramSettings",
    "TooManyRequests",
    "split_utf16",
]
