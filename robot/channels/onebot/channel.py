"""The OneBot v11 channel: NapCat, Lagrange, LLOneBot and WeChat bridges over WebSocket.

Reverse mode (default): the channel is a WebSocket server and the implementation connects to
``ws://host:port/onebot/v11/ws`` (Universal), or to ``.../api`` and ``.../event`` (split sockets).
Forward mode: the channel connects to the implementation's server at ``url`` and reconnects with
exponential backoff. Either way actions go out as ``{"action", "params", "echo"}`` frames and
their answers are matched by ``echo``.

Errors (the tree of :mod:`robot.channels.base`)::

    ChannelError
    ├── ChannelUnavailable        not connected, socket dropped, or no answer in time
    └── SendRejected
        └── OneBotActionFailed    the implementation answered ``status: failed`` (has ``retcode``)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from robot.channels.base import Capabilities, Channel, ChannelUnavailable, SendReceipt, SendRejected
from robot.channels.onebot.connection import (
    ClientRole,
    Connection,
    PendingActions,
    auth_rejection,
    role_for,
)
from robot.channels.onebot.cq import compose_message, to_array
from robot.channels.onebot.events import message_from_event
from robot.channels.onebot.settings import OneBotSettings
from robot.message import OutgoingMessage
from robot.redact import redact_url

__all__ = ["OneBotChannel"]

log = logging.getLogger(__name__)

_MAX_FRAME = 64 * 1024 * 1024  # forwarded chat records can be large
_PING_S = 30.0
_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


def _wire_id(chat_id: str) -> int | str:
    # QQ implementations expect numeric ids; bridges with textual ids (WeChat wxid_...) get strings.
    if chat_id.isascii() and chat_id.isdigit() and (chat_id == "0" or not chat_id.startswith("0")):
        return int(chat_id)
    return chat_id


class OneBotChannel(Channel):
    """A :class:`Channel` speaking OneBot v11 over WebSocket (reverse or forward)."""

    platform = "onebot"
    capabilities = Capabilities(max_text_len=4500, mentions=True)

    def __init__(self, settings: OneBotSettings, *, bot_name: str | None = None) -> None:
        super().__init__()
        self.settings = settings
        # The OneBot-specific name (the QQ nickname) beats the bot-wide one.
        self.bot_name = settings.bot_name or bot_name
        self.self_id: str | None = None
        """The bot account id, from ``X-Self-ID`` or the events' ``self_id``."""
        self.online: bool | None = None
        """The account's online state from lifecycle/heartbeat events (``None``: not reported)."""
        self._conns: list[Connection] = []
        self._actions = PendingActions()
        self._connected = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._forward_task: asyncio.Task[None] | None = None
        self._running = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Reverse: listen (returns once bound). Forward: start the connect loop (returns at once)."""
        if self._running:
            return
        self._running = True
        if self.settings.mode == "reverse":
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self._handle_upgrade)
            # access_log=None: ?access_token= would otherwise be written to the log.
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
            await runner.setup()
            try:
                await web.TCPSite(runner, self.settings.host, self.settings.port).start()
            except BaseException:
                await runner.cleanup()
                self._running = False
                raise
            self._runner = runner
            self._port = runner.addresses[0][1]
            log.info("onebot: listening on %s", self.url)
        else:
            self._session = aiohttp.ClientSession()
            self._forward_task = asyncio.create_task(self._forward_loop(), name="onebot-forward")

    async def stop(self) -> None:
        """Close the sockets and the server, cancel deliveries; idempotent."""
        if not self._running:
            return
        self._running = False
        if self._forward_task is not None:
            self._forward_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forward_task
            self._forward_task = None
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"bot stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.finish_deliveries()
        self._connected.clear()

    def location(self) -> str | None:
        return redact_url(self.url)

    @property
    def url(self) -> str:
        """Reverse mode: the ws URL to give the implementation (the real port once started)."""
        if self.settings.mode == "forward":
            return self.settings.url or ""
        port = self._port if self._port is not None else self.settings.port
        return f"ws://{self.settings.host}:{port}{self.settings.path}"

    @property
    def connected(self) -> bool:
        """Whether a socket that can carry actions (Universal or API) is open."""
        return self._api_conn() is not None

    async def wait_connected(self) -> None:
        """Wait until :attr:`connected` (wrap in ``asyncio.timeout`` to bound the wait)."""
        await self._connected.wait()

    # -- actions -------------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        """``send_group_msg`` / ``send_private_msg`` with array-form segments."""
        chat = message.chat
        if chat.platform != self.platform:
            raise SendRejected(f"chat {chat.key!r} is not a onebot chat")
        mentions = message.mention if chat.kind == "group" else ()
        segments = compose_message(message.text, mentions=mentions, reply_to=message.reply_to)
        if not segments:
            raise SendRejected("refusing to send an empty message")
        if chat.kind == "group":
            action, params = "send_group_msg", {"group_id": _wire_id(chat.chat_id)}
        else:
            action, params = "send_private_msg", {"user_id": _wire_id(chat.chat_id)}
        response = await self.call_action(action, {**params, "message": to_array(segments)})
        data = response.get("data")
        message_id = data.get("message_id") if isinstance(data, Mapping) else None
        return SendReceipt(platform_message_id=None if message_id is None else str(message_id))

    async def call_action(self, action: str, params: Mapping[str, object] | None = None) -> dict[str, Any]:
        """Call any OneBot action (e.g. ``get_login_info``) and return the whole response.

        The payload is in ``response["data"]``. Raises :class:`ChannelUnavailable` when not
        connected, on a dropped socket or after ``action_timeout_s``, and
        :class:`OneBotActionFailed` when the implementation answers ``status: failed``.
        """
        conn = self._api_conn()
        if conn is None:
            raise ChannelUnavailable("onebot: no OneBot implementation is connected")
        return await self._actions.call(conn, action, params or {}, self.settings.action_timeout_s)

    # -- connections ---------------------------------------------------------------------------

    def _api_conn(self) -> Connection | None:
        return next((conn for conn in reversed(self._conns) if conn.carries_actions), None)

    async def _handle_upgrade(self, request: web.Request) -> web.StreamResponse:
        role = role_for(request, self.settings.path)
        if role is None:
            return web.Response(status=404, text="not a OneBot endpoint")
        rejection = auth_rejection(request, self.settings.token)
        if rejection is not None:
            log.warning("onebot: rejected a connection from %s: %s", request.remote, rejection.text)
            return rejection
        ws = web.WebSocketResponse(heartbeat=_PING_S, max_msg_size=_MAX_FRAME)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="expected a WebSocket upgrade")
        await ws.prepare(request)
        self_id = request.headers.get("X-Self-ID", "").strip() or None
        log.info("onebot: %s socket connected (self_id=%s) from %s", role, self_id, request.remote)
        await self._serve(ws, role, self_id)
        return ws

    async def _forward_loop(self) -> None:
        assert self._session is not None
        url = self.settings.url or ""
        shown = redact_url(url)  # a query may carry access_token
        headers = {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else {}
        delay = self.settings.reconnect_initial_s
        while self._running:
            try:
                async with self._session.ws_connect(
                    url, headers=headers, heartbeat=_PING_S, max_msg_size=_MAX_FRAME
                ) as ws:
                    log.info("onebot: connected to %s", shown)
                    delay = self.settings.reconnect_initial_s
                    await self._serve(ws, "Universal", None)
                log.warning("onebot: connection to %s closed; reconnecting in %.1fs", shown, delay)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                status = getattr(exc, "status", None)
                reason = f"HTTP {status}" if status else type(exc).__name__
                log.warning("onebot: cannot connect to %s (%s); retrying in %.1fs", shown, reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.reconnect_max_s)

    async def _serve(self, ws: _Socket, role: ClientRole, self_id: str | None) -> None:
        conn = Connection(ws, role, self_id)
        self._conns.append(conn)
        if self_id:
            self.self_id = self_id
        if role != "Event":
            self._connected.set()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_frame(conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    log.warning("onebot: ignoring a binary frame (%d bytes)", len(msg.data))
                elif msg.type == WSMsgType.ERROR:
                    log.warning("onebot: %s socket error: %s", role, ws.exception())
                    break
        finally:
            self._conns.remove(conn)
            self._actions.fail(conn)
            if self._api_conn() is None:
                self._connected.clear()
            log.info("onebot: %s socket closed (self_id=%s)", role, self_id)

    # -- incoming frames -----------------------------------------------------------------------

    def _on_frame(self, conn: Connection, text: str) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            log.warning("onebot: dropping a frame that is not JSON: %.200r", text)
            return
        if not isinstance(frame, dict):
            log.warning("onebot: dropping a frame that is not an object: %.200r", text)
            return
        try:
            if "post_type" in frame:
                self._on_event(conn, frame)
            elif "echo" in frame:
                if not self._actions.resolve(frame):
                    log.debug("onebot: answer with unknown echo %r", frame.get("echo"))
            else:
                log.warning("onebot: dropping an unrecognised frame: %.200r", text)
        except Exception:
            log.exception("onebot: failed to handle a frame: %.200r", text)

    def _on_event(self, conn: Connection, event: dict[str, Any]) -> None:
        post_type = event.get("post_type")
        event_self_id = event.get("self_id")
        if isinstance(event_self_id, int | str) and not isinstance(event_self_id, bool) and event_self_id:
            conn.self_id = self.self_id = str(event_self_id)
        if post_type == "meta_event":
            self._on_meta(event)
        elif post_type == "message":
            try:
                message = message_from_event(event, self_id=conn.self_id)
            except (ValueError, ValidationError) as exc:
                log.warning("onebot: dropping a malformed message event: %s", exc)
                return
            if message is not None:
                self.deliver_soon(message)
        else:
            # message_sent (our own sends echoed back), notice and request events are not chat input.
            log.debug("onebot: ignoring %s event", post_type)

    def _on_meta(self, event: dict[str, Any]) -> None:
        kind = event.get("meta_event_type")
        if kind == "lifecycle":
            sub_type = event.get("sub_type")
            log.info("onebot: lifecycle %s (self_id=%s)", sub_type, self.self_id)
            if sub_type in ("connect", "enable"):
                self.online = True
            elif sub_type == "disable":
                self.online = False
        elif kind == "heartbeat":
            status = event.get("status")
            online = status.get("online") if isinstance(status, dict) else None
            if isinstance(online, bool):
                if online != self.online:
                    log.log(logging.INFO if online else logging.WARNING, "onebot: account online=%s", online)
                self.online = online
            log.debug("onebot: heartbeat (self_id=%s)", self.self_id)

