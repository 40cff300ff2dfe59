"""Reminder time logic: parsing, next fire across DST, descriptions, missed counts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reminders.schedule as schedule_module
from reminders.schedule import (
    MISSED_FIRES_CAP,
    Schedule,
    ScheduleError,
    describe,
    first_fire,
    missed_fires,
    next_fire,
    parse_schedule,
)

SH = "Asia/Shanghai"
BERLIN = "Europe/Berlin"


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=UTC)


def local(zone: str, y: int, mo: int, d: int, h: int, mi: int = 0, s: int = 0, *, fold: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=ZoneInfo(zone), fold=fold)


def daily(time: str, zone: str = SH) -> Schedule:
    return parse_schedule("daily", time, zone, None)


def test_all_lists_every_public_name() -> None:
    defined_here = {
        name
        for name, value in vars(schedule_module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == schedule_module.__name__
    }
    assert defined_here | {"Kind", "MISSED_FIRES_CAP", "WORKDAYS"} == set(schedule_module.__all__)


# --- parsing -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "time", "zone", "weekday", "expected"),
    [
        ("daily", "08:00", SH, None, Schedule("daily", "08:00:00", SH, None)),
        ("daily", "8:05", SH, None, Schedule("daily", "08:05:00", SH, None)),
        ("daily", "08：30", SH, None, Schedule("daily", "08:30:00", SH, None)),
        ("daily", "０８：３０", SH, None, Schedule("daily", "08:30:00", SH, None)),
        ("daily", "  23:59:59 ", SH, None, Schedule("daily", "23:59:59", SH, None)),
        ("Daily", "00:00", " UTC ", None, Schedule("daily", "00:00:00", "UTC", None)),
        ("weekly", "09:30", SH, 0, Schedule("weekly", "09:30:00", SH, 0)),
        ("weekly", "21:15:05", BERLIN, 6, Schedule("weekly", "21:15:05", BERLIN, 6)),
        ("once", "2026-11-22 15:00", SH, None, Schedule("once", "2026-11-22 15:00:00", SH, None)),
        ("once", "2026-11-22T15:00:30", SH, None, Schedule("once", "2026-11-22 15:00:30", SH, None)),
        ("once", "2026/11/22 15:00", SH, None, Schedule("once", "2026-11-22 15:00:00", SH, None)),
        ("once", " 2026/1/5  7:05 ", SH, None, Schedule("once", "2026-01-05 07:05:00", SH, None)),
        ("once", "2026-11-22 15：00", SH, None, Schedule("once", "2026-11-22 15:00:00", SH, None)),
    ],
)
def test_parse_schedule_normalises(
    kind: str, time: str, zone: str, weekday: int | None, expected: Schedule
) -> None:
    assert parse_schedule(kind, time, zone, weekday) == expected


@pytest.mark.parametrize(
    ("kind", "time", "zone", "weekday", "message"),
    [
        ("hourly", "08:00", SH, None, "unknown reminder type 'hourly'; use one of: once, daily, weekly"),
        ("daily", "08:00", "Mars/Base", None, "unknown time zone 'Mars/Base'"),
        ("daily", "08:00", "asia/shanghai", None, "did you mean 'Asia/Shanghai'?"),
        ("daily", "08:00", "Asia", None, "unknown time zone 'Asia'"),
        ("daily", "08:00", "", None, "use an IANA name such as 'Asia/Shanghai'"),
        ("daily", "08:00", "../etc/passwd", None, "unknown time zone"),
        ("daily", "25:00", SH, None, "time '25:00' is not a valid HH:MM time (hour must be 00-23)"),
        ("daily", "24:00", SH, None, "hour must be 00-23"),
        ("daily", "12:60", SH, None, "time '12:60' is not a valid HH:MM time (minute must be 00-59)"),
        ("daily", "12:00:61", SH, None, "second must be 00-59"),
        ("daily", "noon", SH, None, "time 'noon' is not a valid HH:MM time"),
        ("daily", "", SH, None, "is not a valid HH:MM time"),
        ("daily", "2026-11-22 08:00", SH, None, "daily reminders take only a time of day 'HH:MM'"),
        ("weekly", "2026-11-22 08:00", SH, 1, "use type 'once' for a specific date"),
        ("once", "15:00", SH, None, "once reminders need 'YYYY-MM-DD HH:MM'"),
        ("once", "tomorrow 3pm", SH, None, "is not a valid date and time"),
        ("once", "2026-02-30 10:00", SH, None, "date in '2026-02-30 10:00' does not exist"),
        ("once", "2026-11-22 25:00", SH, None, "hour must be 00-23"),
        ("weekly", "09:30", SH, None, "weekly reminders need a weekday: 0=Monday ... 6=Sunday"),
        ("weekly", "09:30", SH, 7, "weekday 7 is out of range; use 0=Monday ... 6=Sunday"),
        ("weekly", "09:30", SH, -1, "weekday -1 is out of range"),
        ("daily", "09:30", SH, 2, "weekday is only for weekly reminders; leave it out for a daily reminder"),
        ("once", "2026-11-22 15:00", SH, 2, "leave it out for a once reminder"),
    ],
)
def test_parse_schedule_errors_explain_the_fix(
    kind: str, time: str, zone: str, weekday: int | None, message: str
) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(kind, time, zone, weekday)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kind", "wall", "zone", "weekday"),
    [
        ("daily", "8:00", SH, None),
        ("daily", "24:00:00", SH, None),
        ("once", "2026-02-30 10:00:00", SH, None),
        ("once", "10:00:00", SH, None),
        ("weekly", "10:00:00", SH, None),
        ("daily", "10:00:00", "Nowhere/City", None),
        ("monthly", "10:00:00", SH, None),
    ],
)
def test_schedule_constructed_directly_is_validated(
    kind: str, wall: str, zone: str, weekday: int | None
) -> None:
    with pytest.raises(ScheduleError):
        Schedule(kind, wall, zone, weekday)  # type: ignore[arg-type]


# --- Asia/Shanghai (no DST) ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (local(SH, 2026, 11, 21, 11, 30), utc(2026, 11, 22, 0, 0)),  # later today -> tomorrow
        (local(SH, 2026, 11, 21, 7, 59), utc(2026, 11, 21, 0, 0)),  # earlier today -> today
        (local(SH, 2026, 11, 21, 8, 0), utc(2026, 11, 22, 0, 0)),  # exactly at it -> strictly after
        (local(SH, 2026, 12, 31, 9, 0), utc(2027, 1, 1, 0, 0)),  # over the year end
        (utc(2026, 11, 20, 23, 59), utc(2026, 11, 21, 0, 0)),  # `after` in another zone
    ],
)
def test_daily_shanghai(after: datetime, expected: datetime) -> None:
    fired = next_fire(daily("08:00"), after)
    assert fired == first_fire(daily("08:00"), after) == expected
    assert fired is not None and fired.tzinfo is UTC


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (local(SH, 2026, 11, 21, 11, 30), local(SH, 2026, 11, 23, 9, 30)),  # Saturday -> Monday
        (local(SH, 2026, 11, 23, 9, 29), local(SH, 2026, 11, 23, 9, 30)),  # Monday before -> same day
        (local(SH, 2026, 11, 23, 9, 30), local(SH, 2026, 11, 30, 9, 30)),  # at it -> a week later
    ],
)
def test_weekly_shanghai(after: datetime, expected: datetime) -> None:
    sched = parse_schedule("weekly", "09:30", SH, 0)
    assert next_fire(sched, after) == first_fire(sched, after) == expected


def test_once_shanghai() -> None:
    once = parse_schedule("once", "2026-11-22 15:00", SH, None)
    assert next_fire(once, local(SH, 2026, 11, 22, 14, 59)) == utc(2026, 11, 22, 7, 0)
    assert next_fire(once, local(SH, 2026, 11, 22, 15, 0)) is None
    assert next_fire(once, local(SH, 2026, 11, 23, 0, 0)) is None
    assert first_fire(once, local(SH, 2026, 11, 21, 11, 30)) == utc(2026, 11, 22, 7, 0)


# --- DST ---------------------------------------------------------------------------------------
def test_spring_forward_gap_fires_at_gap_end_then_back_to_wall_time() -> None:
    sched = daily("02:30", BERLIN)
    fired = next_fire(sched, utc(2026, 3, 28, 12, 0))
    assert fired == utc(2026, 3, 29, 1, 0)
    assert fired is not None
    assert fired.astimezone(ZoneInfo(BERLIN)).strftime("%H:%M %Z") == "03:00 CEST"
    following = next_fire(sched, fired)
    assert following == local(BERLIN, 2026, 3, 30, 2, 30) == utc(2026, 3, 30, 0, 30)


@pytest.mark.parametrize(
    ("zone", "time", "after", "expected"),
    [
        (BERLIN, "02:00", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),  # gap start
        (BERLIN, "02:59:59", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        (BERLIN, "03:00", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),  # first real time, same instant
        ("America/New_York", "02:15", utc(2026, 3, 7, 12), utc(2026, 3, 8, 7, 0)),  # 03:00 EDT
        ("Australia/Lord_Howe", "02:15", utc(2026, 10, 3), utc(2026, 10, 3, 15, 30)),  # 02:30 +11:00
    ],
)
def test_gap_times_fire_at_first_valid_instant(
    zone: str, time: str, after: datetime, expected: datetime
) -> None:
    assert next_fire(daily(time, zone), after) == expected


def test_once_inside_gap_fires_at_gap_end() -> None:
    once = parse_schedule("once", "2026-03-29 02:30", BERLIN, None)
    assert first_fire(once, utc(2026, 3, 1)) == utc(2026, 3, 29, 1, 0)


def test_fall_back_repeated_time_fires_once_at_first_occurrence() -> None:
    sched = daily("02:30", BERLIN)
    fired = next_fire(sched, utc(2026, 10, 24, 12, 0))
    # Aware comparisons of a repeated wall time across zones are always unequal (PEP 495), hence UTC.
    assert fired == local(BERLIN, 2026, 10, 25, 2, 30, fold=0).astimezone(UTC) == utc(2026, 10, 25, 0, 30)
    second_occurrence = local(BERLIN, 2026, 10, 25, 2, 30, fold=1).astimezone(UTC)
    assert second_occurrence == utc(2026, 10, 25, 1, 30)
    assert fired is not None
    following = next_fire(sched, fired)
    assert following != second_occurrence
    assert following == local(BERLIN, 2026, 10, 26, 2, 30) == utc(2026, 10, 26, 1, 30)
    # Between the two 02:30s, the repeated one is skipped too.
    assert next_fire(sched, utc(2026, 10, 25, 0, 45)) == utc(2026, 10, 26, 1, 30)
    assert missed_fires(sched, utc(2026, 10, 24, 12), utc(2026, 10, 26, 12)) == 2


@pytest.mark.parametrize(
    ("zone", "time", "after", "expected"),
    [
        ("America/New_York", "01:30", utc(2026, 10, 31, 12), utc(2026, 11, 1, 5, 30)),  # EDT reading
        ("Australia/Lord_Howe", "01:45", utc(2026, 4, 4, 0), utc(2026, 4, 4, 14, 45)),  # +11:00 reading
    ],
)
def test_fall_back_other_zones_first_occurrence(
    zone: str, time: str, after: datetime, expected: datetime
) -> None:
    sched = daily(time, zone)
    fired = next_fire(sched, after)
    assert fired == expected
    assert fired is not None
    assert fired.astimezone(ZoneInfo(zone)).fold == 0
    following = next_fire(sched, fired)
    assert following is not None and following - fired > timedelta(hours=23)


@pytest.mark.parametrize(
    ("zone", "weekday", "time", "after", "expected"),
    [
        # Sunday 09:00 in Berlin: 08:00 UTC before spring forward, 07:00 UTC after, wall time kept.
        (BERLIN, 6, "09:00", utc(2026, 3, 22, 8, 0), utc(2026, 3, 29, 7, 0)),
        (BERLIN, 6, "09:00", utc(2026, 10, 18, 7, 0), utc(2026, 10, 25, 8, 0)),
        ("America/New_York", 0, "08:00", utc(2026, 10, 26, 12, 0), utc(2026, 11, 2, 13, 0)),
    ],
)
def test_weekly_across_dst_keeps_local_wall_time(
    zone: str, weekday: int, time: str, after: datetime, expected: datetime
) -> None:
    sched = parse_schedule("weekly", time, zone, weekday)
    fired = next_fire(sched, after)
    assert fired == expected
    assert fired is not None
    before = after.astimezone(ZoneInfo(zone))
    after_change = fired.astimezone(ZoneInfo(zone))
    assert before.utcoffset() != after_change.utcoffset()  # the week really crossed a DST change
    assert after_change.time() == before.time() == dt_time.fromisoformat(time)


# --- first_fire / naive input --------------------------------------------------------------------
def test_first_fire_once_in_past_reports_current_time() -> None:
    once = parse_schedule("once", "2026-11-20 08:00", SH, None)
    with pytest.raises(ScheduleError) as info:
        first_fire(once, utc(2026, 11, 21, 3, 30))
    assert str(info.value) == (
        "that time (2026-11-20 08:00 Asia/Shanghai) is in the past; "
        "the current time is 2026-11-21 11:30 (Saturday) Asia/Shanghai"
    )


def test_first_fire_once_exactly_now_is_not_future() -> None:
    once = parse_schedule("once", "2026-11-21 11:30:15", SH, None)
    past = r"11:30:15 Asia/Shanghai\) is in the past.*11:30:15 \(Saturday\)"
    with pytest.raises(ScheduleError, match=past):
        first_fire(once, local(SH, 2026, 11, 21, 11, 30, 15))


NAIVE = datetime(2026, 11, 21, 11, 30)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: next_fire(s, NAIVE),
        lambda s: first_fire(s, NAIVE),
        lambda s: describe(s, NAIVE),
        lambda s: missed_fires(s, NAIVE, utc(2026, 11, 22)),
        lambda s: missed_fires(s, utc(2026, 11, 20), NAIVE),
    ],
    ids=["next_fire", "first_fire", "describe", "missed_fires-last", "missed_fires-now"],
)
def test_naive_datetimes_rejected(call: Callable[[Schedule], object]) -> None:
    with pytest.raises(ValueError, match="timezone-aware") as info:
        call(daily("08:00"))
    assert not isinstance(info.value, ScheduleError)


# --- describe ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("weekday", "char"), list(enumerate("一二三四五六日")))
def test_describe_weekday_names(weekday: int, char: str) -> None:
    sched = parse_schedule("weekly", "09:30", SH, weekday)
    fired = next_fire(sched, utc(2026, 11, 21))
    assert fired is not None
    text = describe(sched, fired)
    assert text.startswith(f"每周{char} 09:30 (Asia/Shanghai)，下次: ")
    assert text.endswith(f" 09:30 周{char}")


@pytest.mark.parametrize(
    ("sched", "next_at", "expected"),
    [
        (daily("08:00"), utc(2026, 11, 22, 0, 0), "每天 08:00 (Asia/Shanghai)，下次: 2026-11-22 08:00 周日"),
        (daily("08:00:30"), None, "每天 08:00:30 (Asia/Shanghai)"),
        (
            parse_schedule("once", "2026-11-22 15:00", SH, None),
            utc(2026, 11, 22, 7, 0),
            "2026-11-22 15:00 (Asia/Shanghai)，下次: 2026-11-22 15:00 周日",
        ),
        # next_at given in UTC is shown in the schedule's zone, DST-shifted time included.
        (
            daily("02:30", BERLIN),
            utc(2026, 3, 29, 1),
            "每天 02:30 (Europe/Berlin)，下次: 2026-03-29 03:00 周日",
        ),
    ],
)
def test_describe(sched: Schedule, next_at: datetime | None, expected: str) -> None:
    assert describe(sched, next_at) == expected


# --- missed_fires ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sched", "last", "now", "expected"),
    [
        (daily("08:00"), local(SH, 2026, 11, 18, 8), local(SH, 2026, 11, 21, 11, 30), 3),
        (daily("08:00"), local(SH, 2026, 11, 18, 8), local(SH, 2026, 11, 21, 8), 3),  # now inclusive
        (daily("08:00"), local(SH, 2026, 11, 18, 8), local(SH, 2026, 11, 21, 7, 59), 2),
        (daily("08:00"), local(SH, 2026, 11, 21, 8), local(SH, 2026, 11, 21, 8), 0),
        (daily("08:00"), local(SH, 2026, 11, 21, 9), local(SH, 2026, 11, 20, 9), 0),  # clock went back
        (parse_schedule("weekly", "09:30", SH, 0), utc(2026, 11, 1), utc(2026, 11, 30, 2), 5),
        (parse_schedule("once", "2026-11-22 15:00", SH, None), utc(2026, 11, 22), utc(2026, 11, 23), 1),
        (parse_schedule("once", "2026-11-22 15:00", SH, None), utc(2026, 11, 22, 7), utc(2026, 11, 23), 0),
        (daily("08:00"), utc(2026, 1, 1), utc(2036, 1, 1), MISSED_FIRES_CAP),
    ],
)
def test_missed_fires(sched: Schedule, last: datetime, now: datetime, expected: int) -> None:
    assert missed_fires(sched, last, now) == expected


# --- property ----------------------------------------------------------------------------------

ZONES = [BERLIN, "America/New_York", SH, "Australia/Lord_Howe", "UTC"]
START = int(utc(2026, 1, 1).timestamp())
END = int(utc(2028, 1, 1).timestamp())


def wall_exists(day: date, tod: dt_time, tz: ZoneInfo) -> bool:
    wall = datetime.combine(day, tod, tzinfo=tz)
    return wall.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall.replace(tzinfo=None)


@settings(max_examples=200, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    stamp=st.integers(min_value=START, max_value=END),
    hour=st.integers(0, 23),
    minute=st.sampled_from([0, 1, 15, 29, 30, 31, 45, 59]),
)
def test_daily_next_fire_property(zone: str, stamp: int, hour: int, minute: int) -> None:
    tz = ZoneInfo(zone)
    tod = dt_time(hour, minute)
    after = datetime.fromtimestamp(stamp, UTC)
    fired = next_fire(daily(f"{hour:02d}:{minute:02d}", zone), after)
    assert fired is not None and fired.tzinfo is UTC
    assert after < fired <= after + timedelta(hours=25)
    seen = fired.astimezone(tz)
    if seen.time() == tod:
        assert seen.fold == 0  # a repeated wall time fires at its first occurrence
    else:
        # Only a nonexistent wall time may move, and only to the first real instant after it.
        assert not wall_exists(seen.date(), tod, tz)
        assert seen.time() > tod
        assert (fired - timedelta(seconds=1)).astimezone(tz).time() < tod
