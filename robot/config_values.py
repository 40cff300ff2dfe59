"""Checks of the values an owner writes in the config: time zones, URLs, keys, chats, qualified ids."""

from __future__ import annotations

import re
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import SecretStr

__all__ = ["chat_key", "check_url", "check_zone", "clean_key", "qualified"]


def check_zone(value: str, where: str = "") -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # ("Asia": a folder of zones, IsADirectoryError)
        raise ValueError(f"{where}unknown IANA time zone {value!r} (e.g. 'Asia/Shanghai')") from None
    return value


def check_url(value: str | None) -> str | None:
    """An endpoint URL that an HTTP client can use (a mistyped port failed only at the first request)."""
    if value is not None:
        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError:  # (its text quotes what it took for the port: a password's start, in proxy URLs)
            raise ValueError("has a port that is not a number (credentials in a URL are percent-encoded)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
    return value


def clean_key(value: SecretStr | None) -> SecretStr | None:
    """An API key as an HTTP header can carry it: surrounding whitespace dropped (a Windows .env's \\r was
    reported as a connection failure), any left inside refused (the key itself is never shown)."""
    if value is None:
        return None
    key = value.get_secret_value().strip()
    if any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError("contains whitespace or a control character")
    return SecretStr(key)


def chat_key(text: str) -> str:
    """A chat as the owner writes it in a per-chat table: the chat key ``platform:group:id`` /
    ``platform:private:id``, or ``platform:id`` for a group; ValueError for anything else."""
    found = re.fullmatch(r"([a-z][a-z0-9_-]*):(?:(group|private):)?([^:\s][^\s]*)", text.strip())
    if found is None:
        raise ValueError(f"chats are written \"platform:group_id\" (or the chat key \"platform:group:id\", "
                         f"\"platform:private:user_id\"), e.g. \"onebot:123456\", not {text!r}")
    return f"{found[1]}:{found[2] or 'group'}:{found[3]}"


_PLATFORM = re.compile(r"[a-z][a-z0-9_-]*")


def qualified(value: list[str], what: str) -> list[str]:
    """Ids as ``platform:user_id``, written as messages name them: an entry that could never match a sender
    (a space around the colon or the id, an upper-case platform) is refused, naming it. Any lower-case
    platform name passes: a plugin's own channel may bring one."""
    for entry in value:
        platform, colon, user_id = entry.partition(":")
        if not colon or not user_id:
            raise ValueError(f"{what} must be platform-qualified like 'onebot:10001', not {entry!r}")
        if any(c.isspace() or not c.isprintable() for c in entry):
            raise ValueError(f"{what}: {entry!r} holds a space (or a control character); write it as "
                             f"'onebot:10001', with nothing around the colon or the id")
        if not _PLATFORM.fullmatch(platform):
            hint = f"{platform.lower()}:{user_id}" if _PLATFORM.fullmatch(platform.lower()) else "onebot:10001"
            raise ValueError(f"{what}: {entry!r} names no platform: platforms are lower-case names, e.g. {hint!r}")
    return value
