"""Once reminders at the edges: a fall-back's repeated hour, absurd years, an overlong time argument."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from reminders.schedule import ScheduleError, first_fire, parse_schedule

BERLIN = "Europe/Berlin"
Start = Callable[..., Awaitable[Any]]


def berlin(text: str, fold: int = 0) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(BERLIN), fold=fold).astimezone(UTC)


def test_a_once_reminder_set_during_the_repeated_hour_picks_the_occurrence_still_ahead() -> None:
    # 2030-10-27: 03:00 CEST falls back to 02:00 CET, so 02:00-02:59 happens twice.
    now = berlin("2030-10-27 02:10", fold=1)  # the second 02:10: the first 02:30 is past
    once = parse_schedule("once", "2030-10-27 02:30", BERLIN, None)
    assert first_fire(once, now) == berlin("2030-10-27 02:30", fold=1) == datetime(2030, 10, 27, 1, 30, tzinfo=UTC)
    # Before the first pass the first occurrence is still chosen; a time past in both passes is refused.
    assert first_fire(once, berlin("2030-10-27 02:10")) == datetime(2030, 10, 27, 0, 30, tzinfo=UTC)
    with pytest.raises(ScheduleError, match="in the past"):
        first_fire(parse_schedule("once", "2030-10-27 02:05", BERLIN, None), now)


@pytest.mark.parametrize(("time", "expected"), [
    ("9999-12-31 23:59", "10 年以内"),
    ("2041-01-01 00:00", "10 年以内"),
    ("0001-01-01 00:00", "已经过去了"),
])
def test_years_far_out_of_range_get_a_clear_message(time: str, expected: str) -> None:
    now = datetime(2030, 1, 7, 4, 0, tzinfo=UTC)
    for zone in ("Asia/Shanghai", "America/Los_Angeles", "Pacific/Kiritimati"):
        with pytest.raises(ScheduleError) as caught:
            first_fire(parse_schedule("once", time, zone, None), now)
        assert expected in (caught.value.user_message or "")
    assert first_fire(parse_schedule("once", "2039-12-31 23:00", "Asia/Shanghai", None), now).year == 2039


async def test_remind_in_year_9999_or_1_answers_in_chinese_without_a_traceback(start: Start) -> None:
    chat = await start()
    assert "10 年以内" in await chat.say('/remind once "9999-12-31 23:00" 世界末日')
    assert "已经过去了" in await chat.say('/remind once "0001-01-01 08:00" 公元元年')
    assert await chat.active() == []


async def test_an_overlong_time_is_refused_without_echoing_it(start: Start) -> None:
    chat = await start()
    junk = "明" * 3000
    reply = await chat.say(f"/remind once {junk} 开会")
    assert "太长" in reply and len(reply) < 200
    with pytest.raises(ScheduleError, match="characters long"):
        parse_schedule("daily", "8" * 65, "Asia/Shanghai", None)
