"""Shared seams for the reminder tests: a hand-set clock and bots on a memory channel.

- ``start``: a bot with the reminders plugin at ``NOW``; ``chat.say(line)`` returns the bot's reply.
- ``rig_factory``: a bot without the plugin plus a ``ReminderService`` over its DB, fired by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pytest

import reminders
from function_calls import Caller, ChatModel
from reminders.schedule import parse_schedule
from reminders.service import ReminderService
from reminders.settings import ReminderSettings
from reminders.store import SCHEMA, Reminder, ReminderStore
from reminders.tools import ReminderDeps
from robot import OutgoingMessage
from robot.bot import Bot
from robot.config import Settings
from robot.message import Role
from robot.plugin import Plugin
from robot.testing import MemoryChannel

SH = "Asia/Shanghai"
NOW = datetime(2030, 1, 7, 4, 0, tzinfo=UTC)  # ``start``: Monday 12:00 in Shanghai, 05:00 in Berlin
ALICE = Caller(platform="memory", user_id="u1", user_name="Alice", chat_id="g1", chat_kind="group")
G1 = "memory:group:g1"


class Clock:
    """A controllable aware-UTC clock: tests move ``now`` by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Chat:
    """A bot with the reminders plugin and a memory channel; ``say`` returns the bot's reply."""

    def __init__(self, bot: Bot, ch: MemoryChannel, clock: Clock) -> None:
        self.bot, self.ch, self.clock = bot, ch, clock

    async def say(self, line: str, *, user: str = "u1", chat: str = "g1", kind: str = "group",
                  role: Role = "member") -> str:
        before = len(self.ch.sent)
        await self.ch.inject(line, user=user, name=user, chat=self.ch.chat(chat, kind), at_bot=True, role=role)
        return (await self.ch.wait_sent(before + 1))[before].text

    @property
    def deps(self) -> ReminderDeps:
        deps = self.bot.deps_for(reminders.reminder_set)
        assert isinstance(deps, ReminderDeps)
        return deps

    async def active(self, chat: str = G1) -> list[str]:
        """The contents of a chat's live reminders, sorted."""
        return sorted(r.content for r in await self.deps.store.for_chat(chat))


@dataclass
class Rig:
    """A started bot and a ``ReminderService`` over its DB; nothing fires unless a test says so."""

    bot: Bot
    ch: MemoryChannel
    service: ReminderService
    clock: Clock

    async def add(self, kind: str, time: str, content: str = "交周报", *, zone: str = SH,
                  weekday: int | None = None, caller: Caller = ALICE, mode: str = "text") -> Reminder:
        """Create a reminder (Alice's, in group g1, unless ``caller`` says otherwise)."""
        schedule = parse_schedule(kind, time, zone, weekday)
        return await self.service.create(caller, schedule, content, mode)  # type: ignore[arg-type]

    async def fire(self, now: datetime) -> int:
        """Move the clock to ``now``, fire what is due and deliver it; how many were handled."""
        self.clock.now = now
        report = await self.service.fire_due(now)
        await self.bot.outbox.flush()
        return report.delivered + report.missed + report.failed

    async def texts(self) -> list[str]:
        await self.bot.outbox.flush()
        return [m.text for m in self.ch.sent]

    async def texts_sent(self) -> list[OutgoingMessage]:
        """Every message sent so far, once the outbox is flushed."""
        await self.bot.outbox.flush()
        return list(self.ch.sent)

    async def row(self, reminder: Reminder) -> Reminder:
        found = await self.service.store.get(reminder.id)
        assert found is not None
        return found


class Launch(Protocol):
    async def __call__(self, now: datetime, *, model: ChatModel | None = None,
                       plugins: Sequence[Plugin[Any]] = (), cfg: dict[str, Any] | None = None,
                       limits: dict[str, Any] | None = None, gate: dict[str, Any] | None = None,
                       **bot_section: Any) -> tuple[Bot, MemoryChannel, Clock]: ...


class Start(Protocol):
    async def __call__(self, *, model: ChatModel | None = None, cfg: dict[str, Any] | None = None,
                       admins: tuple[str, ...] = (), zones: dict[str, str] | None = None,
                       plugins: Sequence[Plugin[Any]] = ()) -> Chat: ...


class RigFactory(Protocol):
    async def __call__(self, now: datetime, *, model: ChatModel | None = None,
                       cfg: dict[str, Any] | None = None, plugins: Sequence[Plugin[Any]] = (),
                       **bot_section: Any) -> Rig: ...


@pytest.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Launch]:
    """Start a bot on a MemoryChannel whose clock starts at ``now``; every bot is stopped at teardown.

    ``cfg`` is the [reminders] table, ``limits`` the [limits] one and ``gate`` the [gate] one (defaults if
    None), the rest is [bot].
    """
    bots: list[Bot] = []

    async def make(now: datetime, *, model: ChatModel | None = None, plugins: Sequence[Plugin[Any]] = (),
                   cfg: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
                   gate: dict[str, Any] | None = None, **bot_section: Any) -> tuple[Bot, MemoryChannel, Clock]:
        clock = Clock(now)
        ch = MemoryChannel(clock=clock)
        sections: dict[str, Any] = {"bot": {"data_dir": tmp_path, **bot_section},
                                    "reminders": cfg or {}}
        if limits is not None:
            sections["limits"] = limits
        if gate is not None:
            sections["gate"] = gate
        bot = Bot(Settings(**sections), model=model, channels=[ch], plugins=list(plugins), clock=clock)
        await bot.start()
        bots.append(bot)
        return bot, ch, clock

    yield make
    for bot in bots:
        await bot.stop()


@pytest.fixture
def start(launch: Launch) -> Start:
    """``await start(model=, cfg=, admins=, zones=, plugins=)``: a ``Chat`` with the reminders plugin (and
    ``plugins``) at ``NOW``.

    The bot's zone is Asia/Shanghai; rate limits are raised so tests can talk freely.
    """

    async def make(*, model: ChatModel | None = None, cfg: dict[str, Any] | None = None,
                   admins: tuple[str, ...] = (), zones: dict[str, str] | None = None,
                   plugins: Sequence[Plugin[Any]] = ()) -> Chat:
        bot, ch, clock = await launch(NOW, model=model, plugins=[reminders.plugin, *plugins], cfg=cfg,
                                      limits={"user_burst": 100, "chat_burst": 100},
                                      timezone=SH, zones=zones or {}, admins=list(admins))
        return Chat(bot, ch, clock)

    return make


@pytest.fixture
def rig_factory(launch: Launch) -> RigFactory:
    """``await rig_factory(now, model=, cfg=, plugins=)``: a ``Rig`` whose clock starts at ``now``."""

    async def make(now: datetime, *, model: ChatModel | None = None,
                   cfg: dict[str, Any] | None = None, plugins: Sequence[Plugin[Any]] = (),
                   **bot_section: Any) -> Rig:
        bot, ch, clock = await launch(now, model=model, plugins=plugins, cfg=cfg, **bot_section)
        await bot.db.ensure("reminders", SCHEMA)
        settings = bot.settings.section("reminders", ReminderSettings)
        service = ReminderService(ReminderStore(bot.db), bot, settings)
        return Rig(bot, ch, service, clock)

    return make
