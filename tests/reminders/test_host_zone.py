"""The host's own time zone plays no part: the bot's is ``[bot] timezone``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tzlocal

import reminders
from robot.bot import Bot
from robot.config import Settings
from robot.testing import MemoryChannel


@pytest.fixture
def posix_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TZ=CST-8, as many Chinese container images set it: the OS takes it, tzlocal cannot name it."""
    monkeypatch.setenv("TZ", "CST-8")
    time.tzset()
    with pytest.raises(Exception):  # noqa: B017 - the premise: asking the host's zone fails
        tzlocal.reload_localzone()
    yield
    monkeypatch.undo()
    time.tzset()
    tzlocal.reload_localzone()


@pytest.mark.usefixtures("posix_tz")
async def test_the_reminders_plugin_starts_under_a_posix_tz(tmp_path: Path) -> None:
    """Its scheduler's triggers asked tzlocal for the host's zone: the plugin's setup failed and the bot
    did not start with its default plugins."""
    bot = Bot(Settings(bot={"data_dir": tmp_path}), model=None, channels=[MemoryChannel()], plugins=[reminders.plugin])
    await bot.start()
    try:
        assert "reminder_set" in bot.tools
    finally:
        await bot.stop()
