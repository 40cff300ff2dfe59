"""The reminders plugin: once, daily and weekly reminders (or scheduled prompts) per chat.

``plugin`` sets up the ``reminders`` table, a :class:`ReminderService` around an APScheduler
``AsyncIOScheduler`` (the timer; the table is the truth), fires what fell due while the bot was
down, and registers the ``reminders`` side panel. Configure it in the ``[reminders]`` table
(:class:`ReminderSettings`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from reminders.commands import REMIND_SYNTAX
from reminders.service import FireReport, ReminderService
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, LimitError, Reminder, ReminderError, ReminderStore
from reminders.tools import (
    DeleteArgs,
    ReminderArgs,
    ReminderDeps,
    reminder_delete,
    reminder_list,
    reminder_set,
    toolset,
)
from robot import ChatRef, Forgetter, Plugin

if TYPE_CHECKING:
    from robot import Bot

__all__ = [
    "DeleteArgs",
    "FireReport",
    "LimitError",
    "Reminder",
    "ReminderArgs",
    "ReminderDeps",
    "ReminderError",
    "ReminderService",
    "ReminderSettings",
    "ReminderStore",
    "chat_moved",
    "plugin",
    "reminder_delete",
    "reminder_list",
    "reminder_set",
    "setup",
    "teardown",
    "toolset",
]


async def setup(bot: Bot) -> ReminderDeps:
    """Create the table, start the timer, catch up on missed reminders, register the panel."""
    settings = bot.settings.section("reminders", ReminderSettings)
    quiet = logging.getLogger("apscheduler")
    if quiet.level == logging.NOTSET:  # APScheduler logs every job at INFO; keep an explicit setting
        quiet.setLevel(logging.WARNING)
    await bot.db.ensure("reminders", SCHEMA)
    scheduler = AsyncIOScheduler(timezone=ZoneInfo("UTC"),
                                 job_defaults={"misfire_grace_time": None, "coalesce": True})
    service = ReminderService(ReminderStore(bot.db, durable=settings.durable_writes), bot, settings,
                              scheduler=scheduler)
    await service.start()
    deps = ReminderDeps(service)
    bot.panels["reminders"] = deps.panel
    bot.forgetters.append(Forgetter("reminders", "个提醒（已取消）", service.forget))
    return deps


async def teardown(deps: ReminderDeps) -> None:
    """Stop the timer (without waiting for jobs) and any running prompt."""
    await deps.service.stop()


async def chat_moved(deps: ReminderDeps, old: ChatRef, new: ChatRef) -> None:
    """A group became a supergroup (Telegram): its reminders follow it."""
    await deps.store.move_chat(old.key, new.key)


plugin: Plugin[ReminderDeps] = Plugin(name="reminders", tools=toolset, setup=setup, teardown=teardown,
                                      settings_model=ReminderSettings, commands={"reminder_set": REMIND_SYNTAX},
                                      chat_moved=chat_moved)
