"""The aiohttp callback server shared by the WeCom app and AI-bot channels.

GET ``path`` answers WeCom's URL verification with the decrypted echostr; POST ``path``
hands the raw body to the subclass. A bad signature, or a timestamp further than
``timestamp_window_s`` from now (a replay), gets 403; a body not received within
:data:`_BODY_DEADLINE` 408; any other unreadable request 400 and a log line; a handler bug gets 500
and a logged traceback. Messages are delivered to
the bot in background tasks so WeCom (which retries after 5 s) gets its answer at once; one
that arrives once the bot is stopping (:attr:`Channel.taking` is off) gets 503, not "success",
and is left to WeCom's retry.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from robot.channels.base import Channel
from robot.channels.wecom.crypto import MalformedBody, SignatureError, WeComCrypto, WeComCryptoError
from robot.channels.wecom.settings import WeComSettings
from robot.message import Message

__all__ = ["CallbackQuery", "StaleTimestamp", "WeComCallbackChannel"]

log = logging.getLogger("robot.channels.wecom")

_MAX_BODY = 256 * 1024  # callbacks are small; refuse anything bigger early
_DEDUPE_SIZE = 2048
_STOP_GRACE = 5.0
# WeCom sends a few hundred bytes at once and gives up after 5 s; a body slower than this is no callback.
_BODY_DEADLINE = 5.0
# Requests in flight when the server closes get this long: a body never finished must not hold the stop
# past systemd's TimeoutStopSec=30 (aiohttp's default is 60 s).
_SHUTDOWN_S = 1.0
_SIGNATURE = re.compile(r"[0-9a-fA-F]{40}")  # a SHA-1 hex digest


class StaleTimestamp(WeComCryptoError):
    """The callback's timestamp is outside the accepted window: a replay, or a skewed clock."""


@dataclass(frozen=True)
class CallbackQuery:
    """The signature parameters WeCom puts in every callback URL."""

    msg_signature: str
    timestamp: str
    nonce: str

    @classmethod
    def from_request(cls, request: web.Request) -> CallbackQuery:
        q = request.query
        values = (q.get("msg_signature"), q.get("timestamp"), q.get("nonce"))
        if not all(values):
            raise MalformedBody("missing msg_signature, timestamp or nonce")
        sig, ts, nonce = (str(v) for v in values)
        if not _SIGNATURE.fullmatch(sig):  # refused before its body is waited for
            raise SignatureError("msg_signature is not a SHA-1 hex digest")
        return cls(sig, ts, nonce)


class WeComCallbackChannel(Channel, abc.ABC):
    """Base of the callback-driven WeCom channels; subclasses implement :meth:`handle_callback`."""

    platform = "wecom"
    one_process = True  # its reply streams and response_urls live in this process

    def __init__(self, settings: WeComSettings, *, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.crypto = WeComCrypto(
            settings.token.get_secret_value(),
            settings.encoding_aes_key.get_secret_value(),
            settings.receive_id,
        )
        self._own_session = session is None
        self._session = session
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._seen: OrderedDict[str, str] = OrderedDict()
        #: Wall clock (Unix seconds) for the timestamp window; tests replaying old vectors set it.
        self.clock: Callable[[], float] = time.time

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.settings.mode!r}, path={self.settings.path!r})"

    @property
    def port(self) -> int:
        """The bound TCP port (useful when the settings asked for port 0)."""
        if self._port is None:
            raise RuntimeError("the WeCom channel is not started")
        return self._port

    def location(self) -> str | None:
        return self.url

    @property
    def url(self) -> str:
        """The callback URL this server answers on."""
        return f"http://{self.settings.host}:{self.port}{self.settings.path}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_get(self.settings.path, self._on_get)
        app.router.add_post(self.settings.path, self._on_post)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_S)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        address = runner.addresses[0]
        self._port = int(address[1])
        log.info("wecom (%s): callback server listening on %s", self.settings.mode, self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await self.before_close()
            await runner.cleanup()
        # Let deliveries in flight finish; the pipeline dedupes, so a cut-off one is not lost twice.
        await self.finish_deliveries(_STOP_GRACE)
        if runner is not None:
            await self.after_close()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def http(self) -> aiohttp.ClientSession:
        """The client session for outgoing calls (created on first use when none was given)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    # -- subclass API -----------------------------------------------------------------------

    @abc.abstractmethod
    async def handle_callback(self, query: CallbackQuery, body: bytes) -> web.StreamResponse:
        """Answer one signed POST callback; raise WeComCryptoError for bad input."""

    async def before_close(self) -> None:
        """For subclasses: :meth:`stop` is about to close the server, which still answers WeCom now."""

    async def after_close(self) -> None:
        """For subclasses: :meth:`stop` closed the server; the client session is still open."""

    def remember(self, msgid: str, value: str = "") -> str | None:
        """Record ``msgid``; return the value stored for it if it was seen before (a WeCom retry)."""
        if msgid in self._seen:
            self._seen.move_to_end(msgid)
            return self._seen[msgid]
        self._seen[msgid] = value
        if len(self._seen) > _DEDUPE_SIZE:
            self._seen.popitem(last=False)
        return None

    def not_taking(self, message: Message) -> web.Response:
        """The answer to a message arriving while the bot stops: not "success", so WeCom sends it again."""
        log.info("wecom: message %s arrived while the bot stops; left to WeCom's retry", message.message_id)
        return web.Response(status=503, text="stopping")

    def check_timestamp(self, query: CallbackQuery) -> None:
        """Raise :class:`StaleTimestamp` unless the callback's timestamp is within the window."""
        try:
            sent = int(query.timestamp)
            float(sent)  # 400 digits parse, but overflow the clock's arithmetic below
        except (ValueError, OverflowError):
            raise MalformedBody("timestamp is not an integer") from None
        if abs(self.clock() - sent) > self.settings.timestamp_window_s:
            raise StaleTimestamp(f"timestamp {sent} is more than {self.settings.timestamp_window_s:g}s from now")

    # -- HTTP handlers ----------------------------------------------------------------------

    async def _on_get(self, request: web.Request) -> web.StreamResponse:
        try:
            query = CallbackQuery.from_request(request)
            self.check_timestamp(query)
            # A raw "+" in the query decodes to a space; base64 never contains spaces.
            echostr = request.query.get("echostr", "").replace(" ", "+")
            if not echostr:
                raise MalformedBody("missing echostr")
            plain = self.crypto.verify_url(query.msg_signature, query.timestamp, query.nonce, echostr)
        except SignatureError:
            log.warning("wecom: URL verification with a bad signature from %s", request.remote)
            return web.Response(status=403, text="bad signature")
        except StaleTimestamp as exc:
            log.warning("wecom: URL verification refused from %s: %s", request.remote, exc)
            return web.Response(status=403, text="stale timestamp")
        except WeComCryptoError as exc:
            log.warning("wecom: bad URL verification request from %s: %s", request.remote, exc)
            return web.Response(status=400, text="bad request")
        log.info("wecom: URL verification succeeded")
        return web.Response(text=plain)

    async def _on_post(self, request: web.Request) -> web.StreamResponse:
        try:
            query = CallbackQuery.from_request(request)
            self.check_timestamp(query)
            # The signature covers the body's ciphertext: only the query could be checked before it is read.
            try:
                async with asyncio.timeout(_BODY_DEADLINE):
                    body = await request.read()
            except TimeoutError:
                log.warning("wecom: callback body from %s not received within %gs", request.remote, _BODY_DEADLINE)
                return web.Response(status=408, text="request timeout")
            except (ConnectionError, aiohttp.ClientPayloadError):
                log.info("wecom: callback from %s ended before its body did", request.remote)
                return web.Response(status=400, text="bad request")
            return await self.handle_callback(query, body)
        except SignatureError:
            log.warning("wecom: callback with a bad signature from %s", request.remote)
            return web.Response(status=403, text="bad signature")
        except StaleTimestamp as exc:
            log.warning("wecom: callback refused from %s: %s (a replay?)", request.remote, exc)
            return web.Response(status=403, text="stale timestamp")
        except RecursionError:
            log.warning("wecom: callback from %s is nested too deeply", request.remote)
            return web.Response(status=400, text="bad request")
        except WeComCryptoError as exc:
            log.warning("wecom: unreadable callback from %s: %s", request.remote, exc)
            return web.Response(status=400, text="bad request")
        except web.HTTPException:
            raise
        except Exception:
            log.exception("wecom: callback handler failed")
            return web.Response(status=500, text="internal error")
