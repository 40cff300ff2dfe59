"""Test seams for the WeCom channel: a local fake of the WeCom server API and callback helpers.

``FakeWeComAPI`` serves ``gettoken``, ``message/send``, ``webhook/send`` and an AI-bot
``response_url`` on 127.0.0.1 (port 0), records every call, and can be told to answer the
next sends with chosen error codes (``fail_sends``), e.g. 42001 (token expired), and the next
``response_url`` posts with chosen HTTP statuses (``fail_responses``), e.g. 503.
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from function_calls.testing.loopback import LoopbackServer
from robot.channels.wecom.crypto import WeComCrypto

__all__ = ["FakeWeComAPI", "RecordedCall", "signed_query"]


@dataclass(frozen=True)
class RecordedCall:
    """One request the fake received: path, query and JSON body (None for GET)."""

    path: str
    query: dict[str, str]
    body: dict[str, Any] | None = field(default=None)


def signed_query(
    crypto: WeComCrypto, encrypt: str, *, timestamp: str | None = None, nonce: str = "42"
) -> dict[str, str]:
    """The query parameters WeCom would send with ``encrypt`` (``timestamp``: now by default)."""
    timestamp = str(int(time.time())) if timestamp is None else timestamp
    return {
        "msg_signature": crypto.signature(timestamp, nonce, encrypt),
        "timestamp": timestamp,
        "nonce": nonce,
    }


class FakeWeComAPI(LoopbackServer):
    """A local stand-in for ``qyapi.weixin.qq.com``; use as ``async with FakeWeComAPI() as api``."""

    def __init__(
        self, *, corp_id: str = "corp", corp_secret: str = "secret", webhook_key: str = "hook"
    ) -> None:
        super().__init__()
        self.corp_id = corp_id
        self.corp_secret = corp_secret
        self.webhook_key = webhook_key
        self.calls: list[RecordedCall] = []
        self.fail_sends: collections.deque[int] = collections.deque()
        self.fail_webhooks: collections.deque[int] = collections.deque()
        self.fail_responses: collections.deque[int] = collections.deque()
        self.token: str | None = None
        self._counter = itertools.count(1)
        self.base_url = ""

    def calls_to(self, path: str) -> list[RecordedCall]:
        """The recorded calls to one path, e.g. ``/cgi-bin/gettoken``."""
        return [c for c in self.calls if c.path == path]

    @property
    def response_url(self) -> str:
        """A response_url pointing at this fake (what an AI-bot callback would carry)."""
        return f"{self.base_url}/cgi-bin/aibot/response?response_code=code{next(self._counter)}"

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/cgi-bin/gettoken", self._gettoken)
        app.router.add_post("/cgi-bin/message/send", self._message_send)
        app.router.add_post("/cgi-bin/webhook/send", self._webhook_send)
        app.router.add_post("/cgi-bin/aibot/response", self._aibot_response)

    async def start(self) -> None:
        await super().start()
        self.base_url = self.root_url

    async def _record(self, request: web.Request) -> RecordedCall:
        body = None
        if request.method == "POST":
            try:
                parsed = json.loads(await request.text())
            except ValueError:
                parsed = {"_invalid": True}
            body = parsed if isinstance(parsed, dict) else {"_value": parsed}
        call = RecordedCall(request.path, dict(request.query), body)
        self.calls.append(call)
        return call

    async def _gettoken(self, request: web.Request) -> web.Response:
        call = await self._record(request)
        if call.query.get("corpid") != self.corp_id or call.query.get("corpsecret") != self.corp_secret:
            return web.json_response({"errcode": 40001, "errmsg": "invalid credential"})
        self.token = f"token-{next(self._counter)}"
        return web.json_response(
            {"errcode": 0, "errmsg": "ok", "access_token": self.token, "expires_in": 7200}
        )

    async def _message_send(self, request: web.Request) -> web.Response:
        call = await self._record(request)
        if self.fail_sends:
            code = self.fail_sends.popleft()
            return web.json_response({"errcode": code, "errmsg": "injected failure"})
        if self.token is None or call.query.get("access_token") != self.token:
            return web.json_response({"errcode": 40014, "errmsg": "invalid access_token"})
        return web.json_response({"errcode": 0, "errmsg": "ok", "msgid": f"msg-{next(self._counter)}"})

    async def _webhook_send(self, request: web.Request) -> web.Response:
        call = await self._record(request)
        if call.query.get("key") != self.webhook_key:
            return web.json_response({"errcode": 93000, "errmsg": "invalid webhook url"})
        if self.fail_webhooks:
            return web.json_response({"errcode": self.fail_webhooks.popleft(), "errmsg": "injected failure"})
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    async def _aibot_response(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.fail_responses:
            return web.Response(status=self.fail_responses.popleft(), text="injected failure")
        return web.json_response({"errcode": 0, "errmsg": "ok"})
