"""The Telegram channel's webhook and its spool (a mixin of :class:`~.channel.TelegramChannel`).

An update gets 200 (Telegram never resends it then) only once fsync'ed to ``<bot>-webhook/``
(:mod:`.state`); a polled batch is spooled there too before the next poll (which confirms it). The
file goes once the bot has taken the update (``Bot.handle`` returned: recorded), and a start delivers
what a crash left, or what came as the bot stopped.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hmac
import json
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from robot.channels.base import Channel
from robot.channels.telegram.api import TelegramApi
from robot.channels.telegram.settings import TelegramSettings
from robot.channels.telegram.state import read_spool, write_private

__all__ = ["WebhookIntake"]

log = logging.getLogger("robot.channels.telegram.channel")


def _usable_id(update_id: object) -> bool:
    """Whether ``update_id`` can name a spool file (and be one Telegram sent)."""
    return isinstance(update_id, int) and not isinstance(update_id, bool) and 0 <= update_id < 2 ** 63


def _write_all(spooled: list[tuple[dict[str, Any], Path]]) -> None:
    for update, path in spooled:
        write_private(path, update, sync=True)


class WebhookIntake(Channel):
    """The webhook server and the spool of updates the bot has not taken yet."""

    settings: TelegramSettings
    state_dir: Path
    bot_id: str
    api: TelegramApi | None
    _runner: web.AppRunner | None
    _url: str | None
    _spooled: dict[str, asyncio.Task[bool]]  # file name -> its delivery in flight

    @property
    def _spool(self) -> Path:
        """The folder of updates answered 200 (or polled) that the bot has not taken yet."""
        return self.state_dir / f"{self.bot_id}-webhook"

    @abc.abstractmethod
    def _accept(self, update: dict[str, Any]) -> asyncio.Task[bool] | None:
        """Hand one update to the bot in the background; returns the delivery task (False: not taken)."""

    async def _start_webhook(self) -> None:
        app = web.Application()
        app.router.add_post(self.settings.path, self._on_webhook)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._url = f"http://{self.settings.host}:{port}{self.settings.path}"
        if self.settings.webhook_url and self.api is not None:
            await self.api.call("setWebhook", {
                "url": self.settings.webhook_url, "secret_token": self.settings.webhook_secret.get_secret_value(),
                "allowed_updates": ["message"]})

    async def _take_batch(self, updates: list[dict[str, Any]]) -> list[asyncio.Task[bool]] | None:
        """Spool a polled batch (fsync'ed) and deliver it; the delivery tasks (True: taken). If it cannot
        be spooled, it is delivered and waited for instead: None if the bot did not take it all."""
        spooled = [(u, self._spool / f"{u['update_id']}.json") for u in updates if _usable_id(u.get("update_id"))]
        try:
            await asyncio.to_thread(_write_all, spooled)
        except (OSError, TypeError, ValueError):
            log.exception("telegram: could not spool %d polled update(s); delivering them before the next poll",
                          len(spooled))
            batch = [t for t in map(self._accept, updates) if t is not None]
            if batch:
                await asyncio.wait(batch)  # (not gather: a poller cancelled meanwhile must not cancel them)
            return batch if all(not t.cancelled() and t.result() for t in batch) else None
        return [self._deliver_spooled(update, path) for update, path in spooled]

    async def _on_webhook(self, request: web.Request) -> web.Response:
        expected = self.settings.webhook_secret.get_secret_value().encode()
        given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "").encode(errors="surrogateescape")  # (bytes)
        if not expected or not hmac.compare_digest(given, expected):
            log.warning("telegram: webhook request without the right secret token refused")
            return web.Response(status=401)
        try:
            update = json.loads(await request.text())
        except ValueError:
            log.warning("telegram: webhook body is not JSON")
            return web.Response(status=400)
        update_id = update.get("update_id") if isinstance(update, dict) else None
        if not _usable_id(update_id):
            log.warning("telegram: webhook update without a usable update_id skipped")
            return web.Response(status=200)
        path = self._spool / f"{update_id}.json"
        try:  # durably ours before the 200: after it Telegram never sends this update again
            await asyncio.to_thread(write_private, path, update, sync=True)
        except (OSError, TypeError, ValueError):
            log.exception("telegram: could not spool webhook update %s; Telegram will retry", update_id)
            return web.Response(status=500)
        self._deliver_spooled(update, path)
        return web.Response(status=200)

    def _deliver_spooled(self, update: dict[str, Any], path: Path) -> asyncio.Task[bool]:
        """Deliver in the background; the spool file goes once the bot has it (not if cut short). The
        task says whether it was taken; a copy of an update being delivered (Telegram's resend, the
        spool's replay meeting a poll) shares its task, so one whose delivery was ignored never removes
        the file the other still needs."""
        running = self._spooled.get(path.name)
        if running is not None and not running.done():
            return running

        async def run() -> bool:
            task = self._accept(update)
            if task is not None:
                (result,) = await asyncio.gather(task, return_exceptions=True)
                if result is not True:
                    return False  # stop() cut it short, or it came as the bot stopped: the next start delivers it
            with contextlib.suppress(OSError):
                await asyncio.to_thread(path.unlink, True)
            return True

        done = asyncio.create_task(run(), name=f"telegram-spool-{path.stem}")
        self._spooled[path.name] = done
        self._deliveries.add(done)
        done.add_done_callback(self._deliveries.discard)
        done.add_done_callback(lambda t: self._spooled.pop(path.name) if self._spooled.get(path.name) is t else None)
        return done

    async def _replay_spool(self) -> None:
        spooled = await asyncio.to_thread(read_spool, self._spool)
        if spooled:
            log.warning("telegram: delivering %d webhook update(s) left from the last run", len(spooled))
        for update, path in spooled:
            self._deliver_spooled(update, path)
