"""Running a prompt-mode reminder's stored prompt (or a command-mode one's stored command), and
deciding whether its answer may be sent."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from function_calls import Caller, RunResult, StopReason, ToolError
from reminders.settings import ReminderSettings
from reminders.store import Reminder
from robot import ConfigError

if TYPE_CHECKING:
    from robot import Bot

__all__ = ["Allowed", "allowed_tools", "command_name", "run_command", "run_failure", "run_prompt"]

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


@dataclass(frozen=True)
class Allowed:
    """``[reminders] command_tools`` and ``prompt_tools`` resolved to the bot's tools."""

    #: The allowed commands as configured (how people type them, e.g. ``search``), for messages.
    commands: tuple[str, ...]
    #: Their tools' real names (``perplexity_search``): what a stored command is checked against.
    command_tools: frozenset[str]
    #: The tools' real names a scheduled prompt may be offered.
    prompt_tools: tuple[str, ...]


def allowed_tools(bot: Bot, settings: ReminderSettings) -> Allowed:
    """Resolve both lists through ``bot.tools`` (a name or a /command alias).

    An entry naming no tool of this bot raises :class:`ConfigError` (at start-up, not at the first
    reminder). A default entry is dropped instead, set or not (``qunbot init`` writes the defaults
    out): the defaults name other plugins' tools, which may not be loaded.
    """
    defaults = ReminderSettings()

    def resolve(field: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for entry in getattr(settings, field):
            shown = entry.strip().lstrip("/／")
            tool = bot.tools.resolve(shown) if shown else None
            if tool is not None:
                found[shown] = tool.name
            elif entry not in getattr(defaults, field):  # (a field left unset holds only defaults)
                raise ConfigError(f"[reminders] {field}: {entry!r} is no tool or command of this bot (is its plugin "
                                  f"in [bot] plugins?); known: {', '.join(sorted(bot.tools.names()))}")
        return found

    commands = resolve("command_tools")
    return Allowed(tuple(commands), frozenset(commands.values()),
                   tuple(dict.fromkeys(resolve("prompt_tools").values())))


def _owner(r: Reminder) -> Caller:
    chat = r.chat_ref
    return Caller(platform=chat.platform, user_id=r.owner_id, user_name=r.owner_name, chat_id=chat.chat_id,
                  chat_kind=chat.kind, addressed=True, account=chat.account)


async def run_command(bot: Bot, r: Reminder, allow: Collection[str], zone: ZoneInfo) -> str | None:
    """Run ``r``'s stored ``/command`` as its owner through the bot's command path; its reply, or None.

    Only the tools named in ``allow`` (real names, see :func:`allowed_tools`) run (checked now, not
    only when stored: settings may have changed).
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
