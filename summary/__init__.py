"""The group-chat summary plugin: ``/summary``.

Load it with ``plugins = ["summary"]`` (a default). ``summary`` summarises this chat since its
last summary, or a named period (``/summary 昨天``, ``/summary 2026-11-20``, ``/summary 09:00-12:00``),
the last N hours / N messages, or one member's messages ("总结 @小明"), map-reducing through the
bot's model within ``[summary] max_request_tokens`` per call, or extractively when there is no
model (sections 结论/决定, 待办, 话题, 链接). ``/summary optout`` keeps a member's messages out of
summaries in that chat (``optin`` undoes it); a member waits ``user_cooldown_s`` between AI
summaries; ``[summary] prompt`` / ``prompts`` add the owner's instructions. On ``/forget me``
(core) the bot's earlier summaries in the chat go too: they may quote the person. How long chat
history is kept is the core's ``[history]`` table.
"""

from robot import ChatRef, Plugin
from summary.extractive import extractive_summary
from summary.mapreduce import MapReduceResult, SummaryFailed, map_reduce
from summary.settings import SummarySettings
from summary.tools import SummaryArgs, SummaryDeps, setup, summary, toolset
from summary.window import move_chat_sync

__all__ = [
    "MapReduceResult",
    "SummaryArgs",
    "SummaryDeps",
    "SummaryFailed",
    "SummarySettings",
    "chat_moved",
    "extractive_summary",
    "map_reduce",
    "plugin",
    "setup",
    "summary",
    "toolset",
]



async def chat_moved(deps: SummaryDeps, old: ChatRef, new: ChatRef) -> None:
    """A chat got a new id (a Telegram group became a supergroup): its mark and opt-outs follow it."""
    await deps.db.transaction(lambda db: move_chat_sync(db, old.key, new.key))


plugin: Plugin[SummaryDeps] = Plugin("summary", tools=toolset, setup=setup, settings_model=SummarySettings,
                                     chat_moved=chat_moved)
