"""A chat's "typing…" indicator, kept while any run in the chat is going (shared by the channels).

The bot calls ``Channel.typing(chat, True)`` when a run starts and ``typing(chat, False)`` when it ends,
and runs in one chat overlap (two members ask at once). So the runs are counted: the indicator starts
with a chat's first run and stops with its last. A platform that clears the indicator when a message
arrives (Telegram) gets it back after a send while runs go on (:meth:`TypingIndicators.paused`). A
safety net: it stops ``max_s`` after the chat's latest run started, so a run whose end never came
cannot leave "typing…" on for good (and the count starts afresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

__all__ = ["TypingIndicators"]

log = logging.getLogger(__name__)

#: Shows the indicator once (it fades after a few seconds); False: it cannot be shown in this chat.
Show = Callable[[], Awaitable[bool]]
#: Takes the indicator down at once (a platform that has no such call leaves it to fade).
Clear = Callable[[], Awaitable[None]]


@dataclass
class _Chat:
    runs: int
    until: float  # loop time
    every: float
    max_s: float
    show: Show
    clear: Clear | None
    task: asyncio.Task[None] | None = None


class TypingIndicators:
    """One indicator per chat key, refreshed every ``every`` seconds while the chat has runs going."""

    def __init__(self, name: str) -> None:
        self.name = name  # the channel's, for the log
        self._chats: dict[str, _Chat] = {}

    def begin(self, key: str, show: Show, clear: Clear | None = None, *, every: float, max_s: float) -> None:
        """A run started in the chat: show the indicator (the chat's first run's ``show``/``clear`` serve all).

        Not a coroutine: a caller cancelled around it cannot count a run it will not end."""
        until = asyncio.get_running_loop().time() + max_s
        chat = self._chats.get(key)
        if chat is None:
            chat = self._chats[key] = _Chat(0, until, every, max_s, show, clear)
        chat.runs, chat.until = chat.runs + 1, until
        self._spawn(key, chat)

    async def end(self, key: str) -> None:
        """A run ended: the indicator stops with the chat's last one."""
        chat = self._chats.get(key)
        if chat is None:  # (stopped by the safety net, or by close())
            return
        chat.runs -= 1  # before any await: counted even if the caller is cancelled meanwhile
        if chat.runs <= 0:
            del self._chats[key]
            await self._stop(chat)

    @contextlib.asynccontextmanager
    async def paused(self, key: str) -> AsyncIterator[None]:
        """Around a send: the indicator off during it and, if runs go on in the chat, back after it."""
        chat = self._chats.get(key)
        if chat is not None:
            await self._stop(chat)
        try:
            yield
        finally:
            chat = self._chats.get(key)
            if chat is not None:
                await self._stop(chat)  # one a run started during the send showed before the message
                if self._chats.get(key) is chat:  # (its last run may have ended meanwhile)
                    self._spawn(key, chat)

    async def close(self) -> None:
        """Stop every indicator and forget the counts (the channel stops)."""
        chats, self._chats = list(self._chats.values()), {}
        await asyncio.gather(*(self._stop(chat) for chat in chats), return_exceptions=True)

    def _spawn(self, key: str, chat: _Chat) -> None:
        if chat.task is None:
            chat.task = asyncio.create_task(self._keep(key, chat), name=f"{self.name}-typing-{key}")

    @staticmethod
    async def _stop(chat: _Chat) -> None:
        task, chat.task = chat.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _keep(self, key: str, chat: _Chat) -> None:
        loop = asyncio.get_running_loop()
        shown = False
        try:
            while (left := chat.until - loop.time()) > 0:
                if not await chat.show():
                    return
                shown = True
                await asyncio.sleep(min(chat.every, left))
            log.warning("%s: 'typing' in %s stopped after %.0f s without a new run (a run that never ended?)",
                        self.name, key, chat.max_s)
            if self._chats.get(key) is chat:  # fail closed: not shown again for runs counted before
                del self._chats[key]
        except Exception as exc:  # the platform refused it: no indicator, the answer goes on
            log.debug("%s: typing indicator failed: %s", self.name, exc)
        finally:
            if chat.task is asyncio.current_task():
                chat.task = None
            if shown and chat.clear is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(chat.clear())
