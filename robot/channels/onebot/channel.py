"""The OneBot v11 channel: NapCat, Lagrange, LLOneBot and WeChat bridges over WebSocket.

Reverse mode (default): the channel is a WebSocket server and the implementation connects to
``ws://host:port/onebot/v11/ws`` (Universal), or to ``.../api`` and ``.../event`` (split sockets).
Forward mode: the channel connects to the implementation's server at ``url`` and reconnects with
exponential backoff. Either way actions go out as ``{"action", "params", "echo"}`` frames and
their answers are matched by ``echo``.

Several accounts may connect to one reverse URL: each socket speaks for its ``X-Self-ID`` (or its first
events' ``self_id``), messages carry it in ``ChatRef.account``, and a send leaves through that account's.

Errors (the tree of :mod:`robot.channels.base`)::

    ChannelError
    ├── ChannelUnavailable        not connected (the socket gone before the send), or logged out of QQ
    │   └── SendFailed            no answer in time, or the socket dropped after the send went out
    └── SendRejected
        └── OneBotActionFailed    the implementation answered ``status: failed`` (has ``retcode``)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from robot.channels.base import Capabilities, Channel, SendFailed, SendReceipt, SendRejected
from robot.channels.onebot.accounts import GroupLines, OwnAccounts
from robot.channels.onebot.connection import (
    ActionTimeout,
    ClientRole,
    Connection,
    LateAnswer,
    OneBotActionFailed,
    PendingActions,
    Sockets,
    auth_rejection,
    check_response,
    final,
    peer_rejection,
    receipt_of,
    role_for,
    wire_id,
)
from robot.channels.onebot.cq import compose_message, to_array
from robot.channels.onebot.events import chat_scope, message_from_event, recall_from_event
from robot.channels.onebot.presence import Presence
from robot.channels.onebot.settings import OneBotSettings
from robot.message import OutgoingMessage
from robot.redact import redact_url

__all__ = ["OneBotChannel"]

log = logging.getLogger(__name__)

_MAX_FRAME = 64 * 1024 * 1024  # forwarded chat records can be large
_PING_S = 30.0
_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse
_LATE_KEEP = 1024  # outbox keys whose send timed out, remembered for their retry
_STATUS_S = 10.0  # the longest a get_status (is the account logged in?) may hold up a send


class OneBotChannel(Channel):
    """A :class:`Channel` speaking OneBot v11 over WebSocket (reverse or forward)."""

    platform = "onebot"
    account_leases = True  # the process an account's socket is open to serves it: see Sockets.accounts
    capabilities = Capabilities(max_text_len=4500, mentions=True)

    def __init__(self, settings: OneBotSettings, *, bot_name: str | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.bot_name = settings.bot_name or bot_name  # the OneBot-specific one (the QQ nickname) first
        self.self_id: str | None = None
        """The bot account id, from ``X-Self-ID`` or the events' ``self_id``."""
        self._own = OwnAccounts(lambda: self.leases)  # a sibling account's sends are the bot's, never a member's
        self._lines = GroupLines()  # (NapCat: one group line, another message id on each account)
        #: Each account's logged-in state, from heartbeats, lifecycle events and ``get_status``.
        self.presence = Presence(self.announce_connected)
        self._conns = Sockets(self.serve_accounts_soon)
        self._actions = PendingActions()
        self._connected = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._forward_task: asyncio.Task[None] | None = None
        self._running = False
        # Outbox keys whose send got no answer in time -> that answer, should it still come.
        self._unanswered: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()

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
            if self.settings.token is None:
                log.warning(
                    "onebot: NO access_token is set: only OneBot implementations on this machine (loopback) "
                    "may connect. Set [onebot] access_token (and the same token in NapCat/Lagrange) to be safe "
                    "and to accept other hosts."
                )
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
        for conn in self._conns.all():
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
        return self._conns.carries_actions()

    @property
    def online(self) -> bool | None:
        """Whether :attr:`self_id`'s account is logged in, as last reported (``None``: not reported)."""
        return self.presence.online(self.self_id or "")

    async def wait_connected(self) -> None:
        """Wait until :attr:`connected` (wrap in ``asyncio.timeout`` to bound the wait)."""
        await self._connected.wait()

    # -- actions -------------------------------------------------------------------------------

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        """``send_group_msg`` / ``send_private_msg`` with array-form segments, through the chat's account.

        A retry of a key whose attempt timed out first waits (``action_timeout_s`` more) for that attempt's
        late answer: if it comes the message was delivered after all; else it is resent (and logged).
        While the account is reported logged out of QQ (heartbeat, ``get_status`` after a refused send)
        this raises :class:`ChannelUnavailable`: the chat waits, and goes when the account is back."""
        chat = message.chat
        if chat.platform != self.platform:
            raise SendRejected(f"chat {chat.key!r} is not a onebot chat")
        # An anonymous member's id is no account: an @ of it would reach nobody (or a stranger).
        mentions = tuple(m for m in message.mention if not m.startswith("anonymous:")) if chat.kind == "group" else ()
        key, timeout, scope = message.key, self.settings.action_timeout_s, chat_scope(chat)
        quoted = message.reply_to or ""
        reply = quoted[len(scope):] if quoted.startswith(scope) else None  # a message of this chat's only
        segments = compose_message(message.text, mentions=mentions, reply_to=reply)
        if not segments:
            raise SendRejected("refusing to send an empty message")
        if chat.kind == "group":
            action, params = "send_group_msg", {"group_id": wire_id(chat.chat_id)}
        else:
            action, params = "send_private_msg", {"user_id": wire_id(chat.chat_id)}
        conn = self._conns.for_account(chat.account)
        status = functools.partial(self._actions.call, conn, "get_status", {}, min(timeout, _STATUS_S))
        await self.presence.check(conn.self_id or "", status)
        late = self._unanswered.pop(key, None)
        if late is not None:
            try:
                response = check_response(action, await asyncio.wait_for(late, timeout))
                log.info("onebot: %s was delivered after its timeout; not sending it again", key)
                return receipt_of(response, scope)
            except TimeoutError:
                log.warning("onebot: resending %s: the first attempt got no answer within %gs "
                            "(the chat may see it twice)", key, 2 * timeout)
            except OneBotActionFailed as exc:  # answered late, and failed: nothing went out, so send it now
                if final(exc):
                    raise
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def on_late(frame: dict[str, Any]) -> None:
            if not answer.done():
                answer.set_result(frame)

        try:
            response = await self._actions.call(
                conn, action, {**params, "message": to_array(segments)}, timeout, on_late=on_late
            )
        except ActionTimeout:
            self._unanswered[key] = answer
            while len(self._unanswered) > _LATE_KEEP:
                self._unanswered.popitem(last=False)
            raise
        except OneBotActionFailed as exc:
            if final(exc):
                raise
            await self.presence.check(conn.self_id or "", status, recheck=True)  # (NapCat's 1200 when logged out)
            raise SendFailed(str(exc)) from exc
        return receipt_of(response, scope)  # its id scoped as received messages' are

    async def call_action(self, action: str, params: Mapping[str, object] | None = None, *, account: str = "",
                          on_late: LateAnswer | None = None) -> dict[str, Any]:
        """Call any OneBot action (e.g. ``get_login_info``) and return the whole response.

        ``account`` picks the socket of that bot account (``ChatRef.account``); ``""`` is fine
        while one account is connected. The payload is in ``response["data"]``. Raises
        :class:`ChannelUnavailable` when not connected, on a dropped socket or after
        ``action_timeout_s``, and :class:`OneBotActionFailed` when the implementation refuses.
        """
        conn = self._conns.for_account(account)
        return await self._actions.call(
            conn, action, params or {}, self.settings.action_timeout_s, on_late=on_late
        )

    # -- connections ---------------------------------------------------------------------------

    async def _handle_upgrade(self, request: web.Request) -> web.StreamResponse:
        role = role_for(request, self.settings.path)
        if role is None:
            return web.Response(status=404, text="not a OneBot endpoint")
        rejection = peer_rejection(request, self.settings.token) or auth_rejection(request, self.settings.token)
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
        refusal_logged = False
        while self._running:
            try:
                async with self._session.ws_connect(
                    url, headers=headers, heartbeat=_PING_S, max_msg_size=_MAX_FRAME
                ) as ws:
                    log.info("onebot: connected to %s", shown)
                    since = time.monotonic()
                    conn = await self._serve(ws, "Universal", None)
                # Only a connection that stayed up resets the backoff: a server that accepts and
                # closes at once (a refused token) must not be redialled every second.
                if time.monotonic() - since >= self.settings.reconnect_stable_s:
                    delay = self.settings.reconnect_initial_s
                if conn.refused is not None:
                    level = logging.DEBUG if refusal_logged else logging.ERROR
                    log.log(level, "onebot: %s refused the connection (%s): check [onebot] access_token; "
                            "retrying in %.1fs", shown, conn.refused, delay)
                    refusal_logged = True
                else:
                    refusal_logged = False
                    log.warning("onebot: connection to %s closed; reconnecting in %.1fs", shown, delay)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                status = getattr(exc, "status", None)
                reason = f"HTTP {status}" if status else type(exc).__name__
                log.warning("onebot: cannot connect to %s (%s); retrying in %.1fs", shown, reason, delay)
            except Exception:
                # Whatever went wrong, the bot must not go deaf: log it and reconnect.
                log.exception("onebot: the connection to %s failed; reconnecting in %.1fs", shown, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.reconnect_max_s)

    async def _serve(self, ws: _Socket, role: ClientRole, self_id: str | None) -> Connection:
        conn = Connection(ws, role, self_id)
        self._conns.add(conn)
        if self_id:
            self.self_id = self_id
            self._own.add(self_id)
        if role != "Event":
            self._connected.set()
            self.announce_connected()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_frame_safely(conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    log.warning("onebot: ignoring a binary frame (%d bytes)", len(msg.data))
                elif msg.type == WSMsgType.ERROR:
                    log.warning("onebot: %s socket error: %s", role, ws.exception())
                    break
        finally:
            self._conns.remove(conn)
            self._actions.fail(conn)
            if not self._conns.carries_actions():
                self._connected.clear()
            log.info("onebot: %s socket closed (self_id=%s)", role, conn.self_id)
        return conn

    # -- incoming frames -----------------------------------------------------------------------

    def _on_frame_safely(self, conn: Connection, text: str) -> None:
        # A peer's frame must never take the socket (or the forward loop) down.
        try:
            self._on_frame(conn, text)
        except Exception:
            log.exception("onebot: failed to handle a frame: %.200r", text)

    def _on_frame(self, conn: Connection, text: str) -> None:
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            log.warning("onebot: dropping a frame that is not JSON (or nested too deeply): %.200r", text)
            return
        if not isinstance(frame, dict):
            log.warning("onebot: dropping a frame that is not an object: %.200r", text)
            return
        try:
            if "post_type" in frame:
                self._on_event(conn, frame)
            elif "echo" in frame or "retcode" in frame:
                if self._actions.resolve(frame, conn):
                    return
                if frame.get("retcode") == 1403:
                    # NapCat's forward server refuses a token with this frame, then closes.
                    detail = frame.get("wording") or frame.get("message") or frame.get("msg") or ""
                    conn.refused = f"retcode 1403 {str(detail)[:100]}".strip()
                    log.debug("onebot: refused: %s", conn.refused)
                else:
                    log.debug("onebot: answer with unknown echo %r", frame.get("echo"))
            else:
                log.warning("onebot: dropping an unrecognised frame: %.200r", text)
        except Exception:
            log.exception("onebot: failed to handle a frame: %.200r", text)

    def _on_event(self, conn: Connection, event: dict[str, Any]) -> None:
        post_type = event.get("post_type")
        event_self_id = event.get("self_id")
        if isinstance(event_self_id, int | str) and not isinstance(event_self_id, bool) and str(event_self_id):
            claimed = str(event_self_id)
            if conn.self_id is not None and claimed != conn.self_id:
                # A socket speaks for one account: it may not take over another's chats.
                log.warning("onebot: dropping an event for account %s on the socket of account %s",
                            claimed, conn.self_id)
                return
            self.self_id = self._conns.learn(conn, claimed)
            self._own.add(claimed)
        if post_type == "meta_event":
            self.presence.on_meta(conn.self_id or "", event)
        elif post_type == "message":
            try:
                message = message_from_event(event, self_id=conn.self_id, own=self._own.all())
            except (ValueError, ValidationError) as exc:
                log.warning("onebot: dropping a malformed message event: %s", exc)
                return
            if message is not None and message.sender.user_id in self._own:  # another account's reply, seen by
                log.debug("onebot: ignoring account %s's own message", message.sender.user_id)  # a sibling: not a
            elif message is not None and self._lines.first(conn.self_id, event, message.chat.account):  # member's
                self.deliver_soon(message)  # words (/forget me left them, the model read them as a member's); once
        elif post_type == "notice" and (recall := recall_from_event(event, self_id=conn.self_id)) is not None:
            self.recall_soon(*recall)  # (撤回: the chat's own message id, on this account's socket)
        else:  # message_sent (our own sends echoed back), other notices and request events: not chat input
            log.debug("onebot: ignoring %s event", post_type)
