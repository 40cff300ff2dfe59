"""The base of qunbot's fake servers: an aiohttp app on 127.0.0.1 at a free port."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from aiohttp import web

__all__ = ["LoopbackServer"]


class LoopbackServer:
    """Subclasses add their routes in :meth:`routes`; ``async with`` starts and stops the server.

    Handlers are cancelled quietly when a client hangs up (a client timing out mid-delay), and
    stopping waits at most half a second for requests still running.
    """

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def routes(self, app: web.Application) -> None:
        """Register the server's handlers on ``app``."""
        raise NotImplementedError

    async def start(self) -> None:
        """Bind a free loopback port and start serving."""
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} is already started")
        app = web.Application()
        self.routes(app)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()  # bursts of clients in benches
        self._runner, self._port = runner, int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving; requests still in flight are cancelled. Safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
