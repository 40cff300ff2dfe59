"""The web playground: a local page that simulates a group chat (and private chats) with the bot.

``GET /`` serves the page; ``/ws`` speaks the JSON protocol of :mod:`robot.channels.web.protocol`.
Several pages may be open: every page gets every frame (people's messages, streaming deltas, the
bot's replies, tool traces, side panels) and shows the chat it is on. Replies sent while no page
is connected wait in a bounded per-chat transcript that each page receives on connect.

The playground has no login: it binds 127.0.0.1 by default, and when bound to a loopback address
it refuses requests whose ``Host`` is not loopback (DNS rebinding; bound beyond, a ``Host`` that is
no IP address nor in ``[web] allowed_hosts``) and WebSockets opened from another origin (a web site
the user visits must not drive the bot). Nothing from the config but the bot's name, its message
size limit and the web approvers' ids (:mod:`robot.channels.web.panels`) reaches the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from aiohttp import WSCloseCode, WSMsgType, web
from yarl import URL

from robot.channels.base import (
    Capabilities,
    Channel,
    ChannelUnavailable,
    ChatHistory,
    PanelProvider,
    SendReceipt,
    SendRejected,
    cut_mention,
)
from robot.channels.web.page import HEADERS, QUEUE, Page
from robot.channels.web.panels import members, panel_frame
from robot.channels.web.protocol import (
    MAX_MESSAGE,
    MAX_TEXT,
    FrameError,
    PanelsFrame,
    PingFrame,
    SendFrame,
    address,
    answers_to,
    authority,
    is_loopback,
    parse_frame,
    stored_frames,
    trim,
)
from robot.config import WebSettings
from robot.message import ChatRef, Message, OutgoingMessage, Sender
from robot.privacy import ForgetRequest, Forgetter

__all__ = ["GROUP_ID", "MEMBERS", "WebChannel"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
GROUP_ID = "playground"
#: Preset identities of the simulated group; their ids are stable across restarts.
MEMBERS: tuple[tuple[str, str], ...] = (("u-xiaoming", "小明"), ("u-aqiang", "阿强"), ("u-alice", "Alice"))
_TRANSCRIPT = 200  # frames kept per chat
_CHATS = 100  # chats with a transcript
_NAMES = 1000  # remembered display names
_RESTORE = 50  # stored messages shown per chat after a restart
_HISTORY_CHARS = 1_000_000  # about the most a connecting page is sent at once (3 MB of CJK)
class WebChannel(Channel):
    """The web playground channel (platform ``web``)."""

    platform = "web"
    one_process = True  # its pages and their transcripts live in this process
    capabilities = Capabilities(max_text_len=MAX_TEXT, streaming=True, markdown=False)

    def __init__(self, settings: WebSettings, *, bot_name: str = "qunbot",
                 clock: Callable[[], datetime] | None = None, max_message_chars: int = MAX_MESSAGE) -> None:
        super().__init__()
        self.settings, self.bot_name = settings, bot_name
        self.max_text = max_message_chars  # what a page may send: the bot's [limits] max_message_chars
        self._clock = clock or (lambda: datetime.now(UTC))
        self._mention = re.compile(r"(?<![A-Za-z0-9_.@])@" + re.escape(bot_name) + r"(?![A-Za-z0-9_.])[ \t]*", re.I) \
            if bot_name else None  # ("你好@qunbot在吗" yes; bob@qunbot.io, @qunbotfan no)
        self._panels: dict[str, PanelProvider] = {}
        self._history: ChatHistory | None = None
        self._zone_for: Callable[[ChatRef], ZoneInfo] | None = None
        self._restored: OrderedDict[str, asyncio.Task[list[dict[str, Any]]]] = OrderedDict()
        self._pages: dict[web.WebSocketResponse, Page] = {}
        self._names: dict[str, str] = dict(MEMBERS)
        self._transcripts: OrderedDict[str, deque[tuple[int, dict[str, Any]]]] = OrderedDict()
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._mounts: list[tuple[str, Callable[[], web.Application]]] = []

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._index)
        app.router.add_get("/ws", self._socket)
        app.router.add_get("/favicon.ico", self._favicon)
        app.router.add_static("/static/", STATIC)
        for prefix, make in self._mounts:
            app.add_subapp(prefix, make())  # a fresh one: aiohttp freezes a mounted app for good
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ChannelUnavailable(f"web playground cannot listen on {self.settings.host}:"
                                     f"{self.settings.port}: {exc.strerror or exc}") from None
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        if not is_loopback(self.settings.host):
            log.warning("web playground listens on %s: it has no login, anyone who reaches it can talk "
                        "to the bot as any user", self.settings.host)
        log.info("web playground at %s", self.url)

    async def stop(self) -> None:
        pages, self._pages = list(self._pages.values()), {}
        for page in pages:
            if page.writer is not None:
                page.writer.cancel()
            with contextlib.suppress(Exception):
                await page.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.finish_deliveries()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def mount(self, prefix: str, factory: Callable[[], web.Application]) -> None:
        """Serve another channel's page under ``prefix`` (behind the same guard); before :meth:`start`.

        ``factory`` builds the sub-application anew on each start (the playground restarts when its
        lease is lost and retaken)."""
        self._mounts.append((prefix, factory))

    @property
    def port(self) -> int:
        """The bound port (the real one when configured as 0); only after :meth:`start`."""
        if self._port is None:
            raise RuntimeError("the web playground is not started")
        return self._port

    def location(self) -> str | None:
        return self.url

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:8765/``."""
        host = self.settings.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    @property
    def pages(self) -> int:
        """How many pages are connected now."""
        return len(self._pages)

    # --- the Channel interface ------------------------------------------------------------
    async def send(self, message: OutgoingMessage) -> SendReceipt:
        chat = message.chat
        if chat.platform != self.platform:
            raise SendRejected(f"the web playground cannot send to {chat.key}")
        mention = [{"id": uid, "name": self._names.get(uid, uid)} for uid in message.mention] \
            if chat.kind == "group" else []
        self._publish(chat, {"type": "reply", "chat": address(chat), "id": message.key, "text": message.text,
                             "mention": mention, "reply_to": message.reply_to,
                             "time": self._clock().astimezone(UTC).isoformat(), "zone": self._zone(chat)})
        self._refresh_panels(chat)  # what the bot says may change them (a request paused, approved, …)
        return SendReceipt(platform_message_id=message.key)

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:
        self._broadcast({"type": "delta", "chat": address(chat), "run_id": run_id, "delta": delta})

    async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:
        clean = json.loads(json.dumps(trim(event), ensure_ascii=False, default=str))
        self._publish(chat, {"type": "trace", "chat": address(chat), "event": clean})
        if event.get("type") == "run_end":
            self._refresh_panels(chat)

    def attach_panels(self, panels: dict[str, PanelProvider]) -> None:
        self._panels = panels  # the bot's own dict: panels added later show up too

    def attach_forgetters(self, forgetters: list[Forgetter]) -> None:
        forgetter = Forgetter("web-transcripts", "段网页记录", self._forget)
        if forgetter not in forgetters:
            forgetters.append(forgetter)

    async def _forget(self, request: ForgetRequest) -> int:
        """``/forget me``: the transcripts kept for pages that connect later go, every chat's (a notice or a
        summary elsewhere may quote the person); such a page reads what the store still has."""
        if request.platform == self.platform:
            self._transcripts.clear()
            self._restored.clear()
        return 0  # (nothing counted: they were copies of what the store held)

    def attach_chats(self, history: ChatHistory, zone_for: Callable[[ChatRef], ZoneInfo]) -> None:
        self._history = history
        self._zone_for = zone_for

    # --- HTTP -----------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            host = URL(f"http://{request.host}").host
        except ValueError:
            return web.Response(status=400, text="bad Host header\n")
        if not (is_loopback(host) if is_loopback(self.settings.host) else answers_to(host, self.settings.allowed_hosts)):
            log.warning("web playground refused a request for host %r", request.host[:100])
            return web.Response(status=403, text="the playground answers to its addresses and [web] allowed_hosts\n")
        origin = request.headers.get("Origin")
        if request.path == "/ws" and origin is not None and authority(origin) != request.host:
            log.warning("web playground refused a WebSocket from origin %r", origin[:100])
            return web.Response(status=403, text="cross-origin WebSocket refused\n")
        # CSRF: another site's form or no-cors fetch (start a WeChat login...); browsers name it in Origin.
        if request.method not in ("GET", "HEAD", "OPTIONS") and origin and authority(origin) != request.host:
            log.warning("web playground refused a cross-origin %s from %r", request.method, origin[:100])
            return web.Response(status=403, text="cross-origin request refused\n")
        response = await handler(request)
        if not response.prepared:
            response.headers.update(HEADERS)
        return response

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _favicon(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "favicon.svg", headers={"Content-Type": "image/svg+xml"})

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=max(64 * 1024, 6 * self.max_text + 4096))
        await ws.prepare(request)
        page = Page(ws)
        # After a restart: the group and the presets' private chats from the store (others when opened).
        for chat_id, kind in ((GROUP_ID, "group"), *((uid, "private") for uid, _ in MEMBERS)):
            await self._restore(ChatRef(platform=self.platform, chat_id=chat_id, kind=kind))
        page.push({"type": "welcome", "bot_name": self.bot_name, "group_id": GROUP_ID,
                   "max_text_len": self.max_text, "members": members(self._panels, self.platform, MEMBERS)})
        page.push({"type": "history", "frames": self._newest()})
        page.writer = asyncio.create_task(page.write(), name="web-page-writer")
        self._pages[ws] = page
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_frame(page, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    page.push({"type": "error", "error": "binary frames are not supported; send JSON text"})
                elif msg.type == WSMsgType.ERROR:
                    log.info("web page socket error: %s", ws.exception())
        finally:
            self._pages.pop(ws, None)
            if page.writer is not None:
                page.writer.cancel()
        return ws

    def _on_frame(self, page: Page, raw: str) -> None:
        try:
            frame = parse_frame(raw, self.max_text)
        except FrameError as exc:
            log.info("web playground refused a frame: %s", exc)
            page.push({"type": "error", "error": str(exc)})
            return
        if isinstance(frame, PingFrame):
            page.push({"type": "pong"})
        elif isinstance(frame, PanelsFrame):
            page.shown = ChatRef(platform=self.platform, chat_id=frame.chat.id, kind=frame.chat.kind)
            self._spawn(self._open_chat(page.shown, page))
        elif isinstance(frame, SendFrame):
            self._accept(frame)

    def _accept(self, frame: SendFrame) -> None:
        user = frame.user
        chat = ChatRef(platform=self.platform, chat_id=GROUP_ID if frame.kind == "group" else user.id,
                       kind=frame.kind)
        text, mentions_bot = frame.text, False
        if self._mention is not None and self._mention.search(text):
            mentions_bot = True
            text = cut_mention(self._mention, text)
        self._remember(user.id, user.name)
        message = Message(chat=chat, sender=Sender(user_id=user.id, name=user.name), message_id=uuid.uuid4().hex,
                          text=text, timestamp=self._clock(), mentions_bot=mentions_bot, raw={"text": frame.text})
        # Echo first: every page (the sender's too) sees the message before any reply to it.
        self._publish(chat, {"type": "message", "chat": address(chat), "id": message.message_id,
                             "sender": {"id": user.id, "name": user.name}, "text": frame.text,
                             "time": message.timestamp.astimezone(UTC).isoformat(), "mentions_bot": mentions_bot,
                             "zone": self._zone(chat)})
        self.deliver_soon(message)

    def _newest(self) -> list[dict[str, Any]]:
        """The transcripts' newest frames, up to about _HISTORY_CHARS (all of them, 84 MB once, froze the loop)."""
        frames, size = sorted((item for t in self._transcripts.values() for item in t), key=lambda item: -item[0]), 0
        for shown, (_, frame) in enumerate(frames):
            if (size := size + len(str(frame))) > _HISTORY_CHARS:
                return [f for _, f in reversed(frames[:shown])]
        return [f for _, f in reversed(frames)]

    async def _open_chat(self, chat: ChatRef, page: Page) -> None:
        """A page shows a chat: its stored messages (once per run) and its panels."""
        if restored := await self._restore(chat):
            self._broadcast({"type": "history", "frames": restored})
        await self._push_panels(chat, page)

    async def _restore(self, chat: ChatRef) -> list[dict[str, Any]]:
        """Put the chat's newest stored messages before its transcript (once per run); returns their frames,
        to each caller that came while they were read (two pages connecting together both need them)."""
        if self._history is None:
            return []
        reading = self._restored.get(chat.key)
        if reading is None or reading.cancelled():  # (cancelled: the channel stopped while reading)
            reading = self._restored[chat.key] = asyncio.create_task(self._read(chat, self._history))
            self._tasks.add(reading)
            reading.add_done_callback(self._tasks.discard)
            while len(self._restored) > 10 * _CHATS:  # bounded: a page may name any number of chats
                self._restored.popitem(last=False)
        elif reading.done():
            return []  # the pages have them already
        # Shielded: a page closing while it waits must not cancel the read the others wait for.
        return await asyncio.shield(reading)

    async def _read(self, chat: ChatRef, history: ChatHistory) -> list[dict[str, Any]]:
        try:
            entries = await history(chat, _RESTORE)
        except Exception:
            log.exception("web playground could not read the history of %s", chat.key)
            return []
        frames = stored_frames(chat, entries, [f for _, f in self._transcripts.get(chat.key, ())], self._zone(chat))
        if frames:
            kept = self._transcripts.setdefault(chat.key, deque(maxlen=_TRANSCRIPT))
            # Older than anything this run has seen: negative sequence numbers sort them first.
            for i, frame in enumerate(reversed(frames)):
                if len(kept) < _TRANSCRIPT:
                    kept.appendleft((-1 - i, frame))
        return frames

    async def _push_panels(self, chat: ChatRef, page: Page | None) -> None:
        frame = await panel_frame(self._panels, chat)
        if page is None:
            self._broadcast(frame)
        elif not page.push(frame):
            self._drop(page)

    def _refresh_panels(self, chat: ChatRef) -> None:  # and each page's chat: an approver's view spans chats
        shown = {c.key: c for c in (chat, *(p.shown for p in self._pages.values())) if c is not None}
        for each in shown.values() if self._panels and self._pages else ():
            self._spawn(self._push_panels(each, None))

    # --- fan-out --------------------------------------------------------------------------
    def _publish(self, chat: ChatRef, frame: dict[str, Any]) -> None:
        """Keep the frame in the chat's transcript (for pages that connect later) and broadcast it."""
        transcript = self._transcripts.get(chat.key)
        if transcript is None:
            transcript = self._transcripts[chat.key] = deque(maxlen=_TRANSCRIPT)
            while len(self._transcripts) > _CHATS:
                self._transcripts.popitem(last=False)
        self._transcripts.move_to_end(chat.key)
        transcript.append((next(self._seq), frame))
        self._broadcast(frame)

    def _broadcast(self, frame: dict[str, Any]) -> None:
        for page in list(self._pages.values()):
            if not page.push(frame):
                self._drop(page)

    def _drop(self, page: Page) -> None:
        log.warning("web page fell %d frames behind; closing it (it reloads the transcript on reconnect)", QUEUE)
        self._pages.pop(page.ws, None)
        self._spawn(page.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"too far behind"))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remember(self, user_id: str, name: str) -> None:
        self._names.pop(user_id, None)
        self._names[user_id] = name
        while len(self._names) > _NAMES:
            del self._names[next(iter(self._names))]

    def _zone(self, chat: ChatRef) -> str | None:  # the page shows times in the zone the bot speaks in
        return self._zone_for(chat).key if self._zone_for is not None else None
