"""Running a prompt-mode reminder's stored prompt (or a command-mode one's stored command), and
deciding whether its answer may be sent."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from function_calls import Caller, RunResult, StopReason, ToolError
from reminders.store import Reminder

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["command_name", "run_command", "run_failure", "run_prompt"]

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


def command_name(line: str) -> tuple[str, str]:
    """``"/summary #g1 hours=24"`` -> ``("summary", "#g1 hours=24")``; ``("", "")`` when it is no command."""
    text = line.strip()
    if not text.startswith(("/", "／")) or len(text) < 2:
        return "", ""
    name, _, rest = text[1:].partition(" ")
    return name.strip().lower(), rest.strip()


def _owner(r: Reminder) -> Caller:
    chat = r.chat_ref
    return Caller(platform=chat.platform, user_id=r.owner_id, user_name=r.owner_name, chat_id=chat.chat_id,
                  chat_kind=chat.kind, addressed=True, account=chat.account)


async def run_command(bot: Bot, r: Reminder, allow: Sequence[str], zone: ZoneInfo) -> str | None:
    """Run ``r``'s stored ``/command`` as its owner through the bot's command path; its reply, or None.

    Only commands in ``allow`` run (checked now, not only when stored: settings may have changed).
    The owner counts as a bot admin if configured so; a group role cannot be seen without a live
    message, so it is not assumed (the tool may look for evidence itself).
    """
    name, rest = command_name(r.content)
    tool = bot.tools.resolve(name) if name else None
    if tool is None or tool.name not in allow:
        log.warning("reminders: command %s of %s is not allowed (reminders.command_tools)", name, r.id)
        return None
    caller = _owner(r)
    admin = bot.is_admin(caller.platform, caller.user_id)
    caller = caller.model_copy(update={"bot_admin": admin, "is_admin": admin})
    try:
        result = await bot.call_tool(tool.name, caller, rest, via="scheduled", zone=zone)
    except ToolError as exc:
        log.warning("reminders: command %s failed: %s", r.id, exc.message)
        return None
    except Exception:
        log.exception("reminders: command %s failed", r.id)
        return None
    text = "\n".join(t for t in result.user_messages if t.strip()) or result.content
    if result.is_error or not text.strip():
        log.warning("reminders: command %s failed: %s", r.id, result.content[:200])
        return None
    return text


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
