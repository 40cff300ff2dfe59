"""Secrets out of what we print and log: URLs carry tokens (``?access_token=``, ``user:pass@``)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_text", "redact_url"]

#: Query keys whose values are credentials (compared in lower case).
_SECRET_KEYS = frozenset({"access_token", "token", "key", "api_key", "apikey", "secret", "password", "sig",
                          "signature", "auth", "authorization", "corpsecret", "encodingaeskey"})
#: ...and the endings of such keys' other spellings (``x-api-key``, ``client_secret``, ``refresh-token``).
_SECRET_ENDINGS = ("token", "secret", "key", "password", "signature")
MASK = "***"


def _secret_key(key: str) -> bool:
    folded = key.lower().replace("-", "_")
    return folded in _SECRET_KEYS or folded.endswith(_SECRET_ENDINGS)
#: A Telegram Bot API path carries the token: ``/bot<id>:<secret>/method`` (the id is public).
_BOT_PATH = re.compile(r"(/bot\d+:)[^/]+")


def redact_url(url: str) -> str:
    """``url`` with every credential masked: secret query values, a password in the authority and a
    Telegram bot token in the path.

    Unparseable input is masked whole rather than risked.
    """
    # A password with an unencoded "/" ends the authority early for urlsplit: masked up to the last @ first.
    url = re.sub(r"(://[^:/@\s]*:)\S*@", rf"\1{MASK}@", url)
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, MASK if _secret_key(k) else v) for k, v in pairs], safe="*")
        path = _BOT_PATH.sub(lambda m: m.group(1) + MASK, parts.path)
        return urlunsplit((parts.scheme, netloc, path, query, parts.fragment))
    except ValueError:
        return MASK


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` (an exception's message) with every URL in it passed through :func:`redact_url`."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
