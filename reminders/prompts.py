"""Running a prompt-mode reminder's stored prompt, and deciding whether its answer may be sent."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from function_calls import Caller, RunResult, StopReason
from reminders.store import Reminder

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["run_failure", "run_prompt"]

log = logging.getLogger(__name__)


def run_failure(result: RunResult | None) -> str | None:
    """Why a scheduled run's answer must not be delivered, or None when it may.

    Failed: no LLM, a run stopped by a guard or a model error, a run whose every tool call
    failed (its text is only an apology), or no text at all.
    """
    if result is None:
        return "no LLM configured"
    if result.stop not in (StopReason.COMPLETED, StopReason.ANSWERED_BY_TOOL):
        return f"run stopped: {result.stop.value} {result.detail}".strip()
    errors = [t for t in result.trace if t.is_error]
    if errors and len(errors) == len(result.trace):
        return f"every tool call failed ({errors[-1].name}: {errors[-1].result[:200]})"
    if not any(t.strip() for t in result.replies):
        return "no answer"
    return None


async def run_prompt(bot: Bot, r: Reminder, allow: Sequence[str], zone: ZoneInfo) -> str | None:
    """Run ``r``'s prompt as its owner, in ``zone`` with only ``allow``-ed tools; None when it failed.

    ``""`` means the run paused for an approval: the bot posted the request in the chat and the
    answer follows once approved, so the firing itself sends nothing.
    """
    chat = r.chat_ref
    caller = Caller(platform=chat.platform, user_id=r.owner_id, user_name=r.owner_name,
                    chat_id=chat.chat_id, chat_kind=chat.kind, addressed=True, account=chat.account)
    try:
        result = await bot.run_scheduled(r.content, caller, allow, zone=zone)
    except Exception:
        log.exception("reminders: prompt %s failed", r.id)
        return None
    if result is not None and result.stop is StopReason.AWAITING_APPROVAL:
        return ""
    why = run_failure(result)
    if why is not None:
        log.warning("reminders: prompt %s failed: %s", r.id, why)
        return None
    assert result is not None
    return "\n".join(t for t in result.replies if t.strip())
