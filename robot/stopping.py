"""How a bot stops: :meth:`robot.Bot.stop`.

Messages in flight get the stop's grace; then the channels take no more (what comes is kept for the next
start: :mod:`robot.parked`), plugins are torn down, the outbox is flushed and the channels close, each
cancelling the deliveries it still has after its own grace (none for OneBot and the web page, 2 s for the
console). A message whose handling is cut short there, or that is still being handled after all that
(:func:`cut_short`), is kept too (:meth:`robot.Bot.handle`): OneBot, the web page and WeCom's AI bot never
send it again. One whose reply was already queued is not: it has its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["CUT_WAIT_S", "TEARDOWN_S", "cut_short", "stop"]

log = logging.getLogger(__name__)
#: How long handling cancelled by the stop may take to keep its message (one unit of work) before the store closes.
CUT_WAIT_S = 5.0
#: How long each plugin's teardown may take (a client close whose server never answers) before it is left.
TEARDOWN_S = 5.0


async def cut_short(bot: Bot, wait_s: float = CUT_WAIT_S) -> None:
    """Cancel the handling still in flight (not the caller's own) and wait for it to end: each keeps its
    message. Those still waiting for their turn are left to be turned away as places free up (they keep
    theirs as well); whatever is left after that is cancelled too."""
    me = asyncio.current_task()
    running = {t: m for t, m in bot._inflight.items() if t is not me and not t.done()}
    if not running:
        return
    log.warning("%d message(s) still being handled as the bot stops: kept, answered at the next start", len(running))
    _cancel(bot, [t for t, m in running.items() if bot.pipeline.in_hand(m)])
    await asyncio.wait(running, timeout=wait_s)
    if rest := [t for t in running if not t.done()]:
        _cancel(bot, rest)
        await asyncio.wait(rest, timeout=wait_s)


async def _tear_down(name: str, teardown: Callable[[Any], Awaitable[None]], deps: Any) -> None:
    """Await a plugin's teardown for :data:`TEARDOWN_S` at most: one that hangs (or swallows its cancellation)
    must not keep the outbox from being flushed and the process from exiting."""
    try:
        task = asyncio.ensure_future(teardown(deps))
    except Exception:
        log.exception("plugin %s teardown failed", name)
        return
    try:
        await asyncio.wait([task], timeout=TEARDOWN_S)
    finally:
        if not task.done():  # (the stop itself cancelled too: the teardown goes with it)
            task.cancel()
    if not task.done():
        log.error("plugin %s teardown did not finish within %g s: left behind", name, TEARDOWN_S)
    elif not task.cancelled() and (exc := task.exception()) is not None:
        log.error("plugin %s teardown failed", name, exc_info=exc)


def _cancel(bot: Bot, tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        if not task.cancelling():  # (one its channel cancelled is keeping its message already)
            bot._cut.add(task)
            task.cancel()


async def stop(bot: Bot, flush_timeout_s: float) -> None:
    """:meth:`robot.Bot.stop`'s sequence; ``flush_timeout_s``: the grace of in-flight work and of the outbox."""
    await bot.one_process.stop()
    if bot._inflight:
        await asyncio.wait(bot._inflight, timeout=flush_timeout_s)
    for channel in bot.channels.values():  # from now on, messages are left to the platforms' redelivery
        channel.stop_taking()  # (and kept for the next start: robot.parked)
    bot.pipeline.admission.close()  # what has not started by now would meet a closed store
    for plugin in bot.plugins:
        if plugin.teardown is not None and plugin.name in bot._deps:
            await _tear_down(plugin.name, plugin.teardown, bot._deps[plugin.name])
    await bot.approvals.stop(flush_timeout_s)
    for task in (bot._housekeeping, bot._replay):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await bot.outbox.stop(flush_timeout_s)
    for channel in bot.channels.values():
        try:
            await channel.stop()
        except Exception:
            log.exception("stopping channel %s failed", channel.platform)
    if bot._inflight:  # messages that arrived while the outbox was flushing
        await asyncio.wait(bot._inflight, timeout=flush_timeout_s)
    await cut_short(bot)  # (a channel that left its deliveries running): before the store closes
    close = getattr(bot.model, "aclose", None)
    if close is not None:
        await close()
    await bot.pending.stop()  # what the database refused meanwhile: one last try
    await bot.leases.stop()
    await bot.db.close()
