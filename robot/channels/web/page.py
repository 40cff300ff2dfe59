"""One connected page of the web playground, and the headers every response carries."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from robot.channels.files import json_text
from robot.message import ChatRef

__all__ = ["HEADERS", "QUEUE", "Page"]

QUEUE = 2000  # frames waiting for one slow page before it is dropped
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Page:
    """One connected page: its socket and an ordered queue of frames a writer task drains."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue(QUEUE)
        self.writer: asyncio.Task[None] | None = None
        self.shown: ChatRef | None = None  # the chat whose panels it asked for last

    def push(self, frame: dict[str, Any]) -> bool:
        """Queue a frame; False when the page is too far behind (the caller drops it)."""
        try:
            # (a lone surrogate, half an emoji from a snippet cut mid-way, went out as no UTF-8 and
            self.queue.put_nowait(json_text(frame, default=str))  # broke the page's socket: escaped)
        except asyncio.QueueFull:
            return False
        return True

    async def write(self) -> None:
        while True:
            data = await self.queue.get()
            try:
                await self.ws.send_str(data)
            except Exception:  # the socket closed under us, or took no frame: closed (the page reconnects,
                await self.ws.close()  # not left connected and deaf to every frame after)
                return
