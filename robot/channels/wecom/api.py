"""Outgoing HTTP calls to the WeCom server API: access token and ``message/send``.

Error mapping: network failures, HTTP 5xx/429 and ``errcode`` -1 (system busy) become
:class:`ChannelUnavailable` / :class:`SendFailed` (retried a bounded number of times); the
rate-limit codes 45009/45033 a :class:`ChannelUnavailable` with ``retry_after_s=60`` (a flood
wait, not counted against the message); any other non-zero ``errcode`` becomes
:class:`SendRejected`. Tokens, secrets and webhook keys travel only as query parameters and
never appear in messages or logs (aiohttp errors that carry the URL are not chained).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from robot.channels.base import ChannelUnavailable, SendFailed, SendRejected, transport_failure
from robot.text_parts import whole

__all__ = [
    "RATE_LIMIT_ERRCODES",
    "RETRYABLE_ERRCODES",
    "TOKEN_ERRCODES",
    "WeComAPI",
    "call_json",
    "raise_for_errcode",
    "split_utf8",
]

log = logging.getLogger("robot.channels.wecom")

# 40014 invalid access_token, 42001 access_token expired: refresh once and retry.
TOKEN_ERRCODES = frozenset({40014, 42001})
# -1 system busy, 45009 API frequency limit, 45033 concurrency limit: retry later.
RETRYABLE_ERRCODES = frozenset({-1, 45009, 45033})
# The rate limits count per minute (the webhook: 20 a minute), so the outbox's bounded backoff
# (31 s in all) would give up inside the window: they are a flood wait of a whole minute instead.
RATE_LIMIT_ERRCODES = frozenset({45009, 45033})
_RATE_LIMIT_WAIT_S = 60.0
_TOKEN_MARGIN = 300.0  # refresh this many seconds before WeCom says the token expires


async def call_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    what: str,
    params: Mapping[str, str] | None = None,
    payload: Mapping[str, Any] | None = None,
    request_timeout: float = 10.0,
) -> dict[str, Any]:
    """One JSON call; returns the parsed object or raises ChannelUnavailable / SendRejected.

    ``what`` names the call in errors; ``url`` must not carry secrets (pass them in ``params``).
    The caller inspects ``errcode``.
    """
    try:
        async with session.request(
            method, url, params=params, json=payload, timeout=aiohttp.ClientTimeout(total=request_timeout)
        ) as resp:
            status = resp.status
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise transport_failure(f"WeCom {what}: request failed ({type(exc).__name__})", exc) from None
    if status >= 500 or status == 429:
        raise SendFailed(f"WeCom {what}: HTTP {status}")
    if status >= 400:
        raise SendRejected(f"WeCom {what}: HTTP {status}")
    try:
        data = json.loads(text)
    except ValueError:
        raise SendFailed(f"WeCom {what}: response is not JSON") from None
    if not isinstance(data, dict):
        raise SendFailed(f"WeCom {what}: response is not a JSON object")
    return data


def split_utf8(text: str, limit: int) -> list[str]:
    """Split ``text`` into pieces of at most ``limit`` UTF-8 bytes (WeCom limits are in bytes)."""
    pieces: list[str] = []
    while len(text.encode("utf-8")) > limit:
        cut = size = 0
        for cut, char in enumerate(text):  # noqa: B007 - the first character past the limit
            size += len(char.encode("utf-8"))
            if size > limit:
                break
        cut = whole(text, max(cut, 1))  # never inside an emoji sequence, a flag or a letter and its accent
        pieces.append(text[:cut])
        text = text[cut:]
    pieces.append(text)
    return pieces


def raise_for_errcode(data: Mapping[str, Any], what: str) -> None:
    """Map a non-zero ``errcode`` to SendFailed, ChannelUnavailable (a rate limit: wait a minute) or SendRejected."""
    code = data.get("errcode", 0)
    if code == 0:
        return
    msg = str(data.get("errmsg", ""))[:200]
    text = f"WeCom {what}: errcode {code} ({msg})"
    if code in RATE_LIMIT_ERRCODES:
        raise ChannelUnavailable(text, retry_after_s=_RATE_LIMIT_WAIT_S)
    if code in RETRYABLE_ERRCODES:
        raise SendFailed(text)
    raise SendRejected(text)


class WeComAPI:
    """The server API of one self-built app: a cached access token and ``message/send``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        api_base: str,
        corp_id: str,
        corp_secret: str,
        agent_id: int,
        timeout: float = 10.0,
    ) -> None:
        self._session = session
        self._base = api_base.rstrip("/")
        self._corp_id = corp_id
        self._secret = corp_secret
        self._agent_id = agent_id
        self._timeout = timeout
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"WeComAPI(base={self._base!r}, corp_id={self._corp_id!r}, agent_id={self._agent_id})"

    async def access_token(self, *, stale: str | None = None) -> str:
        """The cached token, fetched from ``gettoken`` when missing or expiring.

        ``stale`` is a token WeCom just rejected: it is replaced unless another caller already did.
        """
        loop = asyncio.get_running_loop()
        async with self._lock:
            cached = self._token
            if cached is not None and cached != stale and loop.time() < self._expires_at:
                return cached
            data = await call_json(
                self._session,
                "GET",
                f"{self._base}/cgi-bin/gettoken",
                what="gettoken",
                params={"corpid": self._corp_id, "corpsecret": self._secret},
                request_timeout=self._timeout,
            )
            raise_for_errcode(data, "gettoken")
            token = data.get("access_token")
            if not isinstance(token, str) or not token:
                raise ChannelUnavailable("WeCom gettoken: response has no access_token")
            expires_in = float(data.get("expires_in", 7200))
            self._token = token
            self._expires_at = loop.time() + max(expires_in - _TOKEN_MARGIN, expires_in / 2)
            log.info("wecom: fetched an access token (valid %.0f s)", expires_in)
            return token

    async def send_text(self, touser: str, content: str) -> str | None:
        """Send one text message to a user; returns WeCom's msgid."""
        payload = {
            "touser": touser,
            "msgtype": "text",
            "agentid": self._agent_id,
            "text": {"content": content},
        }
        token = await self.access_token()
        data = await self._post_send(token, payload)
        if data.get("errcode") in TOKEN_ERRCODES:
            log.info("wecom: access token rejected (errcode %s), refreshing once", data.get("errcode"))
            token = await self.access_token(stale=token)
            data = await self._post_send(token, payload)
        raise_for_errcode(data, "message/send")
        msgid = data.get("msgid")
        return str(msgid) if msgid else None

    async def _post_send(self, token: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        return await call_json(
            self._session,
            "POST",
            f"{self._base}/cgi-bin/message/send",
            what="message/send",
            params={"access_token": token},
            payload=payload,
            request_timeout=self._timeout,
        )
