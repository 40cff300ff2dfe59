"""The memory plugin: memories that strengthen with use and fade without it.

Tools ``remember`` and ``recall`` (offered to the model), commands ``/remember``, ``/recall``,
``/memories``, ``/sleep`` (bot admins), and ``/forget <id>`` / ``/forget me`` through the bot's
forget hooks. Before each model run the relevant memories are shown to the model (see
:mod:`memory.service` for the rules). Configure it in ``[memory]`` (:class:`MemorySettings`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from function_calls import Caller
from memory.service import MemoryService, SleepReport, used_in
from memory.settings import MemorySettings
from memory.store import MemoryRow, MemoryStore
from memory.strength import Rules, Strength
from memory.tools import MemoryDeps, RecallArgs, RememberArgs, memories, recall, remember, sleep, toolset
from memory.vectors import EmbeddingClient, EmbeddingError
from robot import ChatRef, ForgetRequest, Forgetter, Plugin, Tx

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "EmbeddingClient",
    "EmbeddingError",
    "MemoryDeps",
    "MemoryRow",
    "MemoryService",
    "MemorySettings",
    "MemoryStore",
    "RecallArgs",
    "RememberArgs",
    "Rules",
    "SleepReport",
    "Strength",
    "chat_moved",
    "memories",
    "plugin",
    "recall",
    "remember",
    "setup",
    "sleep",
    "teardown",
    "toolset",
    "used_in",
]


async def setup(bot: Bot) -> MemoryDeps:
    """Create the tables, register the context and forget hooks, start the nightly check."""
    settings = bot.settings.section("memory", MemorySettings)
    embedder = None
    if settings.embedding_model:
        key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None
        embedder = EmbeddingClient(settings.embedding_model, settings.embedding_base_url, key,
                                   settings.embedding_timeout_s)
    service = MemoryService(bot.db, settings, clock=bot.clock, model=bot.model, embedder=embedder, bot=bot)
    await service.prepare()

    async def forget_one(caller: Caller, target: str) -> str | None:  # /forget <id>
        return await service.delete(caller, int(target)) if target.isdigit() else None

    async def forget_me(request: ForgetRequest) -> int:  # /forget me [all]
        chats = None if request.everywhere else [c.key for c in request.chats]
        return await service.forget_person(request.platform, request.user_id, chats,
                                           dreams_in=[c.key for c in request.chats])

    bot.context_hooks.append(service.before_run)
    bot.forget_hooks.append(forget_one)
    bot.forgetters.append(Forgetter("memory", "条记忆", forget_me))
    service.start()
    return MemoryDeps(service)


async def teardown(deps: MemoryDeps) -> None:
    """Stop the nightly check and close the embedding client."""
    await deps.service.stop()


async def chat_moved(deps: MemoryDeps, old: ChatRef, new: ChatRef) -> None:
    """A chat got a new id (a Telegram group became a supergroup): its memories and dreams follow it,
    so they are recalled there, and ``/forget me`` there reaches them."""
    service = deps.service

    def work(db: Tx) -> None:
        service.store.move_chat(db, old.key, new.key)
        service.index.announce(db, [old.key, new.key])

    await service.db.transaction(work)
    for chat in (old.key, new.key):
        service.index.drop(chat)


plugin: Plugin[MemoryDeps] = Plugin(name="memory", tools=toolset, setup=setup, teardown=teardown,
                                    settings_model=MemorySettings, chat_moved=chat_moved)
