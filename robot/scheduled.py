"""A stored prompt run by the model as its owner (reminders' prompt mode): :meth:`robot.Bot.run_scheduled`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from function_calls import Caller, RunResult, RunState, StopReason
from robot.limits import BudgetExceeded
from robot.message import ChatRef, OutgoingMessage

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["run_scheduled"]


async def run_scheduled(bot: Bot, prompt: str, caller: Caller, allow: Sequence[str],
                        zone: ZoneInfo | None = None) -> RunResult | None:
    """Run ``prompt`` with only the ``allow`` tools, within the owner's budget; a call that needs
    approval is posted in the chat and resumes there. None without an LLM."""
    if bot.router is None:
        return None
    # A prompt caught up at start (due while the bot was down) may call a later plugin's tool: not before
    # that plugin is set up (its tool got the Bot as its deps, failed, and a one-time task was lost).
    await bot._plugins_ready.wait()
    chat = ChatRef.of(caller)
    try:
        with bot.tool_scope(allow):
            async with bot.budget.for_run(caller, bot.settings.llm.max_run_tokens):
                result = await bot.router.scheduled(prompt, caller=caller, tools=bot.offered_tools(), allow=allow,
                                                     zone=zone or bot.zone_for(chat), deps_for=bot.deps_for,
                                                     clock=bot.clock)
    except BudgetExceeded as exc:
        return RunResult(stop=StopReason.DAILY_BUDGET, detail=str(exc), state=RunState(messages=[]))
    if result.stop is StopReason.AWAITING_APPROVAL:
        # The request is posted in the chat; the run resumes there once approved.
        ask = await bot.approvals.pause(result, caller, chat, tools=allow, origin="scheduled")
        mention = (caller.user_id,) if chat.kind == "group" else ()
        await bot.outbox.enqueue(*(OutgoingMessage(key=f"scheduled:{result.state.run_id}:{i}", chat=chat, text=t,
                                                    mention=mention)
                                    for i, t in enumerate([*result.state.user_messages, ask]) if t.strip()))
        await bot.approvals.announce()
    return result
