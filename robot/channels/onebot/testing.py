"""A fake OneBot v11 implementation (like NapCat) for tests, speaking real WebSocket traffic.

Reverse mode: ``await peer.connect(channel.url)`` dials the channel as a client, with
``X-Self-ID``, ``X-Client-Role`` and ``Authorization`` headers (``split=True`` opens separate
API and Event sockets). Forward mode: ``url = await peer.serve()`` starts a WebSocket server the
channel connects to. Either way the peer sends a lifecycle ``connect`` event, can
:meth:`~OneBotTestPeer.send_event`, answers actions and records them in ``actions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from robot.channels.onebot.connection import auth_rejection

__all__ = ["OneBotTestPeer"]

_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse
ActionPredicate = Callable[[dict[str, Any]], bool]


class OneBotTestPeer:
    """A scripted OneBot implementation. Use as ``async with OneBotTestPeer(...) as peer``."""

    def __init__(
        self,
        *,
        self_id: int | str = 10001,
        access_token: str | None = None,
        nickname: str = "qunbot",
        first_message_id: int = 3001,
        heartbeat_interval_s: float | None = None,
        napcat_refusal: bool = False,
    ) -> None:
        """``napcat_refusal``: forward mode refuses a wrong token the way NapCat does (accept the
        upgrade, send a ``retcode 1403`` frame, close) instead of with HTTP 401/403."""
        self.self_id = str(self_id)
        self.access_token = access_token
        self.nickname = nickname
        self.heartbeat_interval_s = heartbeat_interval_s
        self.napcat_refusal = napcat_refusal
        self.refusal_times: list[float] = []
        """Forward mode: when (``time.monotonic()``) each refused attempt came."""
        self.online = True
        """Whether the account is logged in to QQ: while False (NapCat after QQ logged it out) every send
        fails with ``retcode 1200``, and heartbeats and ``get_status`` say ``online: false``."""
        self.actions: list[dict[str, Any]] = []
        """Every action frame received, in order (``action``, ``params``, ``echo``)."""
        self.connections = 0
        """How many times a connection was established (reconnects count)."""
        self.rejected = 0
        """Forward mode: how many connection attempts failed the token check."""
        self._next_message_id = first_message_id
        self._extra_headers: dict[str, str] = {}
        self._plan: deque[tuple[str, Any]] = deque()
        self._claimed: set[int] = set()
        self._action_seen = asyncio.Event()
        self._connected = asyncio.Event()
        self._api: _Socket | None = None
        self._event: _Socket | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- setup ---------------------------------------------------------------------------------

    async def __aenter__(self) -> OneBotTestPeer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self, url: str, *, split: bool = False, headers: Mapping[str, str] | None = None) -> None:
        """Reverse mode: dial the channel (``headers`` are added to the handshake). Raises
        ``aiohttp.WSServerHandshakeError`` (``.status`` 401/403) when the channel refuses."""
        self._extra_headers = dict(headers or {})
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if split:
            base = url.rstrip("/")
            api = await self._dial(f"{base}/api", "API")
            try:
                event = await self._dial(f"{base}/event", "Event")
            except BaseException:
                await api.close()
                raise
        else:
            api = event = await self._dial(url, "Universal")
        self._on_connected(api, event)
        for ws in {id(api): api, id(event): event}.values():
            self._spawn(self._read(ws))
        await self.send_event(self.lifecycle_event())

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Forward mode: start the WebSocket server; returns its ``ws://`` URL."""
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return f"ws://{host}:{self._runner.addresses[0][1]}"

    async def disconnect(self) -> None:
        """Close the current socket(s); the channel sees the implementation drop."""
        sockets = [ws for ws in (self._api, self._event) if ws is not None]
        self._api = self._event = None
        self._connected.clear()
        for ws in {id(ws): ws for ws in sockets}.values():
            await ws.close()

    async def close(self) -> None:
        """Disconnect, stop the server and all background tasks."""
        await self.disconnect()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def connected(self) -> bool:
        return self._api is not None

    async def wait_connected(self, timeout: float = 5.0) -> None:
        """Wait until a connection is up (forward mode: until the channel has dialled in)."""
        async with asyncio.timeout(timeout):
            await self._connected.wait()

    # -- events --------------------------------------------------------------------------------

    def lifecycle_event(self) -> dict[str, Any]:
        return self._meta("lifecycle", sub_type="connect")

    def heartbeat_event(self, *, online: bool | None = None, interval_ms: int = 5000) -> dict[str, Any]:
        """NapCat's heartbeat; ``online`` defaults to :attr:`online`."""
        online = self.online if online is None else online
        return self._meta("heartbeat", status={"online": online, "good": True}, interval=interval_ms)

    async def send_heartbeat(self, *, online: bool | None = None) -> None:
        await self.send_event(self.heartbeat_event(online=online))

    async def set_online(self, online: bool) -> None:
        """The account logs out of QQ (sends fail from now on) or back in, and a heartbeat says so."""
        self.online = online
        await self.send_heartbeat()

    async def send_event(self, event: Mapping[str, Any], **overrides: Any) -> None:
        """Push an event (e.g. a vector from onebot_v11.json) with ``overrides`` merged in.

        A recorded event's ``time`` is replaced by now unless ``time`` is overridden: replayed
        traffic is live traffic, and a years-old stamp would fall to history retention the
        moment the bot's housekeeping runs.
        """
        stamped = {"time": int(time.time())} if "time" in event else {}
        await self.send_raw(json.dumps({**event, **stamped, **overrides}, ensure_ascii=False))

    async def send_raw(self, text: str) -> None:
        """Push any text frame, e.g. garbage to test the channel's tolerance."""
        if self._event is None:
            raise RuntimeError("the OneBot test peer is not connected")
        await self._event.send_str(text)

    # -- actions -------------------------------------------------------------------------------

    def fail_next_action(self, retcode: int = 1404) -> None:
        """Answer the next action with ``status: failed`` and ``retcode``."""
        self._plan.append(("fail", retcode))

    def ignore_next_action(self) -> None:
        """Do not answer the next action at all (the channel should time out)."""
        self._plan.append(("ignore", 0))

    def answer_next_action(self, **fields: Any) -> None:
        """Answer the next action with these fields (``status``, ``retcode``, ``data``...) and its echo."""
        self._plan.append(("answer", fields))

    def delay_next_action(self, seconds: float) -> None:
        """Answer the next action normally, but only after ``seconds`` (a slow send)."""
        self._plan.append(("delay", seconds))

    async def wait_for_action(
        self,
        predicate: ActionPredicate | None = None,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        """The first recorded action matching ``predicate`` not yet returned by this method."""
        async with asyncio.timeout(timeout):
            while True:
                for index, frame in enumerate(self.actions):
                    if index not in self._claimed and (predicate is None or predicate(frame)):
                        self._claimed.add(index)
                        return frame
                self._action_seen.clear()
                await self._action_seen.wait()

    def _answer(self, frame: Mapping[str, Any]) -> dict[str, Any] | None:
        echo = frame.get("echo")
        plan = self._plan.popleft() if self._plan else None
        if plan is not None and plan[0] in ("ignore", "delay"):
            return None
        if plan is not None and plan[0] == "answer":
            return {**plan[1], "echo": echo}
        if plan is not None:
            return {"status": "failed", "retcode": plan[1], "data": None, "echo": echo}
        action = frame.get("action")
        data: dict[str, Any]
        if action in ("send_group_msg", "send_private_msg", "send_msg") and not self.online:
            return {"status": "failed", "retcode": 1200, "data": None, "message": "发送消息失败",
                    "wording": "发送消息失败", "echo": echo}
        if action in ("send_group_msg", "send_private_msg", "send_msg"):
            data = {"message_id": self._next_message_id}
            self._next_message_id += 1
        elif action == "get_login_info":
            user_id: int | str = int(self.self_id) if self.self_id.isdigit() else self.self_id
            data = {"user_id": user_id, "nickname": self.nickname}
        elif action == "get_status":
            data = {"online": self.online, "good": True, "stat": {}}  # NapCat's shape
        else:
            return {"status": "failed", "retcode": 1404, "data": None, "echo": echo}
        return {"status": "ok", "retcode": 0, "data": data, "echo": echo}

    # -- plumbing ------------------------------------------------------------------------------

    def _meta(self, kind: str, **fields: Any) -> dict[str, Any]:
        self_id: int | str = int(self.self_id) if self.self_id.isdigit() else self.self_id
        return {
            "time": int(time.time()),
            "self_id": self_id,
            "post_type": "meta_event",
            "meta_event_type": kind,
            **fields,
        }

    async def _dial(self, url: str, role: str) -> aiohttp.ClientWebSocketResponse:
        assert self._session is not None
        headers = {"X-Self-ID": self.self_id, "X-Client-Role": role, "User-Agent": "OneBotTestPeer",
                   **self._extra_headers}
        if self.access_token is not None:
            headers["Authorization"] = f"Bearer {self.access_token}"
        return await self._session.ws_connect(url, headers=headers)

    def _on_connected(self, api: _Socket, event: _Socket) -> None:
        self._api, self._event = api, event
        self.connections += 1
        self._connected.set()
        if self.heartbeat_interval_s:
            self._spawn(self._heartbeats(event, self.heartbeat_interval_s))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rejection = auth_rejection(request, self.access_token)
        if rejection is not None:
            self.rejected += 1
            self.refusal_times.append(time.monotonic())
            if not self.napcat_refusal:
                return rejection
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            # NapCat's websocket-server.ts authorize(): OB11Response.res(null, 'failed', 1403, ...), close.
            await ws.send_str(json.dumps({"status": "failed", "retcode": 1403, "data": None,
                                          "message": "token验证失败", "wording": "token验证失败",
                                          "echo": None, "stream": "normal-action"}, ensure_ascii=False))
            await ws.close()
            return ws
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._on_connected(ws, ws)
        await self.send_event(self.lifecycle_event())
        await self._read(ws)
        return ws

    async def _read(self, ws: _Socket) -> None:
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    frame = json.loads(msg.data)
                    if isinstance(frame, dict) and "action" in frame:
                        self.actions.append(frame)
                        self._action_seen.set()
                        if self._plan and self._plan[0][0] == "delay":
                            self._spawn(self._answer_later(ws, frame, float(self._plan[0][1])))
                        answer = self._answer(frame)
                        if answer is not None:
                            with contextlib.suppress(ConnectionError, RuntimeError):
                                await ws.send_str(json.dumps(answer, ensure_ascii=False))
        finally:
            if ws is self._api or ws is self._event:
                self._api = self._event = None
                self._connected.clear()

    async def _answer_later(self, ws: _Socket, frame: Mapping[str, Any], seconds: float) -> None:
        await asyncio.sleep(seconds)
        answer = self._answer(frame)
        if answer is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(json.dumps(answer, ensure_ascii=False))

    async def _heartbeats(self, ws: _Socket, interval: float) -> None:
        while not ws.closed:
            await asyncio.sleep(interval)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(json.dumps(self.heartbeat_event(), ensure_ascii=False))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
