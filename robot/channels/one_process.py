"""Channels that run in one process only (:attr:`Channel.one_process`): the web playground, the
console and WeCom's callback keep what they serve in their process's memory (pages, the terminal,
reply streams), so a reply must leave through the process that runs them.

The first process to take the lease ``channel:<platform>`` runs the channel. Every other process
stands by: it keeps asking for the lease, and takes the channel over (starts it, and sends the rows
that waited for it) once the holder stops or dies and its lease expires. A process that loses the
lease (it could not renew it in time, and another took it) stops the channel at once, so two
processes never serve it side by side, and stands by in turn. A process whose takeover fails (the
channel cannot start: its port is taken) gives the lease up for the others and asks again after
:attr:`OneProcessChannels.retry_s`. SQLite grants every lease: its one process runs every channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from robot.channels.base import CHANNEL_LEASE, Channel
from robot.redact import redact_url

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["OneProcessChannels"]

log = logging.getLogger(__name__)


class OneProcessChannels:
    """Runs the bot's one-process channels while this process holds their leases (see the module)."""

    #: Seconds before a process whose takeover failed (its start raised) asks for the lease again.
    retry_s = 60.0

    def __init__(self, bot: Bot) -> None:
        self.bot = bot
        #: The one-process channels another process runs now: taken over when their lease falls free.
        self.standby: dict[str, Channel] = {}
        self._held: dict[str, bool] = {}
        self._settling: dict[str, asyncio.Task[None]] = {}
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._asking: set[asyncio.Task[None]] = set()
        self._over = False
        self._started = asyncio.Event()  # a takeover waits for the bot's start to finish

    async def start(self) -> None:
        """Before the channels start: take each one-process channel's lease, or stand the channel by
        (removed from ``bot.channels``, not started, its rows left to the holder)."""
        self._over = False
        self._started.clear()
        leases = self.bot.leases
        for platform, channel in list(self.bot.channels.items()):
            if not channel.one_process:
                continue
            name = CHANNEL_LEASE.format(platform=platform)
            if await leases.want(name, functools.partial(self._changed, platform)):
                continue
            del self.bot.channels[platform]
            self.standby[platform] = channel
            holder = (await leases.leases.holders(name)).get(name, "another process")
            log.warning("%s: %s runs it (it keeps what it serves in its own memory); this process stands by "
                        "and takes it over if that one stops. To run it there only, turn it off here "
                        "(QUNBOT_CHANNELS__%s__ENABLED=false)", platform, holder, platform.upper())

    def started(self) -> None:
        """The bot has started: channels may come and go from now on (not while it starts its channels)."""
        self._started.set()

    async def stop(self) -> None:
        """Take over nothing more, and let a takeover under way finish (the bot then stops the channel)."""
        self._over = True
        self._started.set()  # a change waiting for the start ends at once
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        asking = list(self._asking)
        for task in asking:
            task.cancel()
        await asyncio.gather(*asking, return_exceptions=True)
        tasks = list(self._settling.values())
        self._settling.clear()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task

    def _changed(self, platform: str, held: bool) -> None:
        """The lease keeper's news; the channel follows it in a task, one change after another."""
        self._held[platform] = held
        task = self._settling.get(platform)
        if not self._over and (task is None or task.done()):
            self._settling[platform] = asyncio.create_task(self._settle(platform), name=f"qunbot-{platform}-lease")

    async def _settle(self, platform: str) -> None:
        await self._started.wait()
        while not self._over:
            held, running = self._held.get(platform, False), platform in self.bot.channels
            if held == running:
                return
            try:
                await (self._take if held else self._leave)(platform)
            except Exception:  # the lease keeper's next news tries again
                log.exception("%s: following the channel's lease failed", platform)
                return

    async def _take(self, platform: str) -> None:
        channel = self.standby.pop(platform)
        bot = self.bot
        bot.wire(channel)
        try:
            await channel.start()
        except Exception as exc:
            # Holding a lease for a channel that does not run would keep every other process off it.
            self.standby[platform] = channel
            self._held[platform] = False
            with contextlib.suppress(Exception):  # unreleased, it expires after lease_s: not renewed any more
                await bot.leases.drop(CHANNEL_LEASE.format(platform=platform))
            with contextlib.suppress(Exception):
                await channel.stop()
            self._retries[platform] = asyncio.get_running_loop().call_later(self.retry_s, self._ask_again, platform)
            log.error("%s: taking the channel over failed (%s); this process leaves it to the others and asks "
                      "again in %.0f s", platform, exc, self.retry_s)
            return
        bot.channels[platform] = channel
        bot.outbox.register(channel)  # after start: what waited for the channel goes out now
        with contextlib.suppress(Exception):
            await channel.publish_commands(bot.command_menu())
        where = channel.location()
        log.warning("%s: this process holds the channel's lease now and runs it%s", platform,
                    f" at {redact_url(where)}" if where else "")

    def _ask_again(self, platform: str) -> None:
        self._retries.pop(platform, None)
        if not self._over:
            task = asyncio.create_task(self._want(platform), name=f"qunbot-{platform}-ask")
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _want(self, platform: str) -> None:
        try:  # wanted from now on, even if this first round fails: the lease keeper asks on
            await self.bot.leases.want(CHANNEL_LEASE.format(platform=platform), functools.partial(self._changed, platform))
        except Exception as exc:
            log.warning("%s: asking for the channel's lease again failed (%s); the lease keeper asks on", platform, exc)

    async def _leave(self, platform: str) -> None:
        channel = self.bot.channels.pop(platform)
        self.standby[platform] = channel
        await self.bot.outbox.leave(platform)
        try:
            await channel.stop()
        except Exception:
            log.exception("%s: stopping the channel failed", platform)
        log.error("%s: this process lost the channel's lease (it could not renew it in time) and stopped the "
                  "channel, so that two processes never serve it; it takes the channel back when it is free",
                  platform)
