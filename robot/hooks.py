"""Hooks plugins register on the bot: context before a model run, and ``/forget``.

* ``bot.context_hooks``: ``hook(caller, text)`` runs before each chat run and may return
  :class:`RunExtras`: messages placed after the history and before the user's message, and a
  ``settle(result)`` called once the run ended (say, to count which memories the answer used).
* ``bot.forget_hooks``: ``hook(caller, item_id)`` for ``/forget <id>``: the hook deletes that one
  item if it is its own and the caller may (a memory), and returns a short Chinese phrase saying
  what it did, or None when the id is not its own. ``/forget me`` uses ``bot.forgetters``
  (:mod:`robot.privacy`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from function_calls import Caller, RunResult

__all__ = ["ContextHook", "ForgetHook", "RunExtras", "observe"]

log = logging.getLogger(__name__)


async def observe(call: Awaitable[object], what: str) -> None:
    """Await a channel's observer call ("typing…", a trace event): its failure is logged, and the reply
    goes on (a channel whose typing() raised lost the whole answer, the model already paid for)."""
    try:
        await call
    except Exception:
        log.exception("a channel's %s failed; the reply goes on", what)


@dataclass
class RunExtras:
    """What a context hook adds to one run."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    settle: Callable[[RunResult], Awaitable[None]] | None = None


ContextHook = Callable[[Caller, str], Awaitable[RunExtras | None]]
ForgetHook = Callable[[Caller, str], Awaitable[str | None]]
