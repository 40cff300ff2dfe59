"""The host's own time zone plays no part: the bot's is ``[bot] timezone``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tzlocal

from robot.bot import Bot
from robot.config import Settings
from robot.config_file import load_plugins
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
async def test_the_bot_starts_with_its_default_plugins_under_a_posix_tz(tmp_path: Path) -> None:
    """The reminders' and memory's schedulers asked tzlocal for the host's zone: their setup failed and the
    bot did not start with its default plugins."""
    settings = Settings(bot={"data_dir": tmp_path})
    bot = Bot(settings, model=None, channels=[MemoryChannel()], plugins=load_plugins(settings))
    await bot.start()
    try:
        assert {"reminder_set", "remember"} <= set(bot.tools.names())
    finally:
        await bot.stop()
