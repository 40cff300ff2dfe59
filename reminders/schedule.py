"""Pure time logic for reminders: parse, next fire instant, description, missed count.

Reminders are local wall times in an IANA zone; every instant this module returns is an
aware UTC ``datetime``. No I/O, no clock reads: callers pass ``now``/``after`` in.

Errors::

    ValueError
     └── ScheduleError   bad input; the message is written for an LLM to correct itself

A plain ``ValueError`` (not ``ScheduleError``) means a programming error: a naive datetime.

DST rules (see ``_resolve``): a wall time inside a spring-forward gap fires at the gap's end;
a wall time repeated by a fall-back fires once, at its first occurrence.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from typing import Literal

__all__ = [
    "MISSED_FIRES_CAP",
    "WORKDAYS",
    "Kind",
    "Schedule",
    "ScheduleError",
    "days_mask",
    "describe",
    "first_fire",
    "mask_days",
    "missed_fires",
    "next_fire",
    "parse_schedule",
]

Kind = Literal["once", "daily", "weekly", "weekdays"]
_KINDS: tuple[Kind, ...] = ("once", "daily", "weekly", "weekdays")
WORKDAYS = (0, 1, 2, 3, 4)
"""Monday to Friday (工作日); public holidays are not known to the bot."""

MISSED_FIRES_CAP = 1000
"""``missed_fires`` never counts beyond this (a bot down for years is still a short loop)."""

_WEEKDAYS_EN = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEEKDAYS_ZH = ("一", "二", "三", "四", "五", "六", "日")
_KINDS_ZH = {"once": "一次性", "daily": "每天", "weekly": "每周", "weekdays": "每周几天"}
_UNKNOWN_KIND_ZH = "提醒类型 {!r} 不认识，请用 once（一次性）、daily（每天）、weekly（每周）或 weekdays（每周几天）。"
_WEEKDAY_HINT_ZH = "周一、周二 … 周日（也可写数字 0=周一 … 6=周日）"

_TIME_RE = re.compile(r"([0-9]{1,2}):([0-9]{1,2})(?::([0-9]{1,2}))?")
_DATETIME_RE = re.compile(
    r"([0-9]{4})[-/]([0-9]{1,2})[-/]([0-9]{1,2})(?:\s+|[Tt])([0-9]{1,2}):([0-9]{1,2})(?::([0-9]{1,2}))?"
)
# Normalised forms stored in Schedule.wall (strict, so a stored row is checked on load too).
_WALL_TIME_RE = re.compile(r"[0-9]{2}:[0-9]{2}:[0-9]{2}")
_WALL_DATETIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")


class ScheduleError(ValueError):
    """Invalid reminder input; the message says what was wrong and what is expected.

    ``str(exc)`` is English, for the model; ``user_message`` the same in Chinese, for a person
    (None only for corrupted stored rows, which no person typed).
    """

    def __init__(self, message: str, *, user_message: str | None = None) -> None:
        super().__init__(message)
        self.user_message = user_message


@dataclass(frozen=True)
class Schedule:
    """A validated reminder schedule (build it with ``parse_schedule``).

    ``wall`` is ``"YYYY-MM-DD HH:MM:SS"`` for ``once`` and ``"HH:MM:SS"`` otherwise, local to ``zone``.
    ``weekday`` is the day (0=Monday ... 6=Sunday) of a ``weekly`` reminder, and for ``weekdays`` the
    set of days as a bit mask (bit 0 = Monday; see :func:`days_mask`), so a set fits the same column.
    Direct construction is validated too, so a schedule read back from storage cannot be malformed.
    """

    kind: Kind
    wall: str
    zone: str
    weekday: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ScheduleError(f"unknown reminder type {self.kind!r}; use one of: {', '.join(_KINDS)}",
                                user_message=_UNKNOWN_KIND_ZH.format(self.kind))
        _zone(self.zone)
        pattern = _WALL_DATETIME_RE if self.kind == "once" else _WALL_TIME_RE
        if not pattern.fullmatch(self.wall):
            raise ScheduleError(f"malformed stored wall time {self.wall!r} for a {self.kind} reminder")
        _check_weekday(self.kind, self.weekday)
        _wall_parts(self)  # range checks (hour 24, Feb 30, ...)


# --- parsing -----------------------------------------------------------------------------------


@functools.cache
def _zone_names_by_lower() -> dict[str, str]:
    return {name.lower(): name for name in zoneinfo.available_timezones()}


def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    hint = _zone_names_by_lower().get(name.strip().lower())
    suggestion = f"did you mean {hint!r}?" if hint else "use an IANA name such as 'Asia/Shanghai'"
    raise ScheduleError(f"unknown time zone {name!r}; {suggestion}", user_message=f"时区 {name!r} 不存在。")


def days_mask(days: Iterable[int]) -> int:
    """Days of the week (0=Monday ... 6=Sunday) -> the ``weekday`` bit mask of a ``weekdays`` schedule."""
    mask = 0
    for day in days:
        if isinstance(day, bool) or not isinstance(day, int) or not 0 <= day <= 6:
            raise ScheduleError(f"day {day!r} is out of range; use 0=Monday ... 6=Sunday",
                                user_message=f"星期几 {day!r} 超出范围，请用 {_WEEKDAY_HINT_ZH}。")
        mask |= 1 << day
    return mask


def mask_days(mask: int) -> tuple[int, ...]:
    """The days (0=Monday ... 6=Sunday) in a ``weekdays`` bit mask, in order."""
    return tuple(d for d in range(7) if mask >> d & 1)


def _check_weekday(kind: Kind, weekday: int | None) -> None:
    if kind == "weekdays":
        if isinstance(weekday, bool) or not isinstance(weekday, int) or not 1 <= weekday <= 127:
            raise ScheduleError("a weekdays reminder needs at least one day, e.g. [0, 1, 2, 3, 4] for Monday-Friday",
                                user_message=f"请指定每周哪几天，例如工作日（周一到周五）；星期几写 {_WEEKDAY_HINT_ZH}。")
    elif kind == "weekly":
        if weekday is None:
            raise ScheduleError("weekly reminders need a weekday: 0=Monday ... 6=Sunday",
                                user_message=f"每周提醒需要指定星期几：weekday={_WEEKDAY_HINT_ZH}。")
        if isinstance(weekday, bool) or not isinstance(weekday, int) or not 0 <= weekday <= 6:
            raise ScheduleError(f"weekday {weekday!r} is out of range; use 0=Monday ... 6=Sunday",
                                user_message=f"星期几 {weekday!r} 超出范围，请用 {_WEEKDAY_HINT_ZH}。")
    elif weekday is not None:
        raise ScheduleError(f"weekday is only for weekly reminders; leave it out for a {kind} reminder",
                            user_message=f"只有每周提醒需要星期几；{_KINDS_ZH[kind]}提醒请去掉 weekday。")


def _time_of_day(text: str, h: str, m: str, s: str | None) -> dt_time:
    hour, minute, second = int(h), int(m), int(s or 0)
    problem = (
        ("hour must be 00-23", "小时应为 00-23")
        if hour > 23
        else ("minute must be 00-59", "分钟应为 00-59")
        if minute > 59
        else ("second must be 00-59", "秒应为 00-59")
        if second > 59
        else None
    )
    if problem:
        raise ScheduleError(f"time {text!r} is not a valid HH:MM time ({problem[0]})",
                            user_message=f"时间 {text!r} 无效（{problem[1]}）。")
    return dt_time(hour, minute, second)


def parse_schedule(kind: str, time: str, zone: str, weekday: int | None) -> Schedule:
    """Validate loose user/LLM input and return a normalised ``Schedule``.

    Accepts ``HH:MM``, ``H:MM``, ``HH:MM:SS`` and full-width digits/colons; for ``once``,
    ``YYYY-MM-DD HH:MM[:SS]`` with ``-`` or ``/`` date separators and a space or ``T``.
    """
    norm_kind = kind.strip().lower()
    chosen = next((k for k in _KINDS if k == norm_kind), None)
    if chosen is None:
        raise ScheduleError(f"unknown reminder type {kind!r}; use one of: {', '.join(_KINDS)}",
                            user_message=_UNKNOWN_KIND_ZH.format(kind))
    zone = zone.strip()
    _zone(zone)
    _check_weekday(chosen, weekday)
    # NFKC folds full-width forms ("：", "０８", "／", ideographic space) to ASCII.
    text = unicodedata.normalize("NFKC", time).strip()

    if chosen == "once":
        m = _DATETIME_RE.fullmatch(text)
        if m is None:
            raise ScheduleError(
                f"time {time!r} is not a valid date and time; once reminders need 'YYYY-MM-DD HH:MM' "
                "in the chat's time zone, e.g. '2026-11-22 15:00'",
                user_message=f"时间 {time!r} 格式不对：一次性提醒请写“年-月-日 时:分”，例如 2026-11-22 15:00。",
            )
        tod = _time_of_day(text, m[4], m[5], m[6])
        try:
            day = date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            raise ScheduleError(f"date in {time!r} does not exist; use 'YYYY-MM-DD HH:MM'",
                                user_message=f"{time!r} 里的日期不存在。") from None
        wall = f"{day.isoformat()} {tod.isoformat()}"
    else:
        m = _TIME_RE.fullmatch(text)
        if m is None:
            if _DATETIME_RE.fullmatch(text):
                raise ScheduleError(
                    f"{chosen} reminders take only a time of day 'HH:MM', got {time!r}; "
                    "use type 'once' for a specific date",
                    user_message=f"{_KINDS_ZH[chosen]}提醒只需要时:分（收到 {time!r}）；指定日期请用一次性提醒（once）。",
                )
            raise ScheduleError(f"time {time!r} is not a valid HH:MM time, e.g. '08:30'",
                                user_message=f"时间 {time!r} 格式不对，请写“时:分”，例如 08:30。")
        wall = _time_of_day(text, m[1], m[2], m[3]).isoformat()
    return Schedule(kind=chosen, wall=wall, zone=zone, weekday=weekday)


# --- resolution --------------------------------------------------------------------------------


def _wall_parts(schedule: Schedule) -> tuple[date | None, dt_time]:
    try:
        if schedule.kind == "once":
            stamp = datetime.fromisoformat(schedule.wall)
            return stamp.date(), stamp.time()
        return None, dt_time.fromisoformat(schedule.wall)
    except ValueError:
        raise ScheduleError(f"stored wall time {schedule.wall!r} does not exist") from None


def _require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {value!r}")


def _local_wall(instant: datetime, tz: zoneinfo.ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None, fold=0)


def _resolve(day: date, tod: dt_time, tz: zoneinfo.ZoneInfo) -> datetime:
    """The UTC instant a local wall time on ``day`` fires at.

    Existence is checked by round-tripping through UTC, never by trusting ``fold`` semantics.
    Repeated (fall-back) time: the earlier of the two instants, so the reminder fires once.
    Nonexistent (spring-forward gap) time: the first valid instant after it, i.e. the gap's end
    (02:30 in a 02:00->03:00 gap fires at 03:00). We prefer this over zoneinfo's fold=0 reading
    (which would give 03:30) because it is the nearest real moment to what the user asked for
    and never moves a reminder later than the clocks themselves did.
    """
    wall = datetime.combine(day, tod)
    candidates = [datetime.combine(day, tod.replace(fold=f), tzinfo=tz).astimezone(UTC) for f in (0, 1)]
    real = [c for c in candidates if _local_wall(c, tz) == wall]
    if real:
        return min(real)
    # In a gap both readings lie around the transition; binary-search the first whole second
    # whose local wall time is at or past the requested one (tzdata transitions are whole seconds).
    lo, hi = min(candidates), max(candidates)
    lo_s, hi_s = int(lo.timestamp()), int(hi.timestamp()) + 1
    while lo_s < hi_s:
        mid = (lo_s + hi_s) // 2
        if _local_wall(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            hi_s = mid
        else:
            lo_s = mid + 1
    return datetime.fromtimestamp(lo_s, UTC)


def next_fire(schedule: Schedule, after: datetime) -> datetime | None:
    """The first fire instant strictly after ``after`` (aware UTC), or None for a passed ``once``."""
    _require_aware(after, "after")
    tz = _zone(schedule.zone)
    day, tod = _wall_parts(schedule)
    if day is not None:
        instant = _resolve(day, tod, tz)
        return instant if instant > after else None
    # Start a day early: a gap spanning midnight can push yesterday's wall time into today.
    start = after.astimezone(tz).date() - timedelta(days=1)
    for offset in range(16):
        candidate_day = start + timedelta(days=offset)
        if schedule.kind == "weekly" and candidate_day.weekday() != schedule.weekday:
            continue
        if schedule.kind == "weekdays" and not (schedule.weekday or 0) >> candidate_day.weekday() & 1:
            continue
        # Each calendar day is resolved once, so a repeated wall time cannot fire twice.
        instant = _resolve(candidate_day, tod, tz)
        if instant > after:
            return instant
    raise AssertionError(f"no occurrence of {schedule} within 16 days of {after}")  # pragma: no cover


def _format_wall(value: datetime, with_seconds: bool) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S" if with_seconds else "%Y-%m-%d %H:%M")


def first_fire(schedule: Schedule, now: datetime) -> datetime:
    """Like ``next_fire(schedule, now)``, but a ``once`` time not in the future is a ScheduleError."""
    _require_aware(now, "now")
    instant = next_fire(schedule, now)
    if instant is not None:
        return instant
    tz = _zone(schedule.zone)
    day, tod = _wall_parts(schedule)
    seconds = tod.second != 0
    asked = f"{day} {_short_time(tod)}"
    local_now = now.astimezone(tz)
    current = _format_wall(local_now, seconds)
    raise ScheduleError(
        f"that time ({asked} {schedule.zone}) is in the past; the current time is "
        f"{current} ({_WEEKDAYS_EN[local_now.weekday()]}) {schedule.zone}",
        user_message=f"这个时间（{asked}，{schedule.zone}）已经过去了；现在是 {current} "
        f"周{_WEEKDAYS_ZH[local_now.weekday()]}（{schedule.zone}）。",
    )


# --- reporting ---------------------------------------------------------------------------------


def _short_time(tod: dt_time) -> str:
    return tod.strftime("%H:%M:%S" if tod.second else "%H:%M")


def _days_zh(days: tuple[int, ...]) -> str:
    if days == WORKDAYS:
        return "工作日（周一至周五）"
    if days == (5, 6):
        return "周末"
    return "每周" + "、".join(_WEEKDAYS_ZH[d] for d in days)


def describe(schedule: Schedule, next_at: datetime | None) -> str:
    """Short Chinese description, e.g. ``"每周一 09:30 (Asia/Shanghai)，下次: 2026-11-23 09:30 周一"``.

    ``next_at`` is rendered in the schedule's zone; None omits the "下次" part.
    """
    day, tod = _wall_parts(schedule)
    if day is not None:
        base = f"{day.isoformat()} {_short_time(tod)}"
    elif schedule.kind == "weekdays":
        base = f"{_days_zh(mask_days(schedule.weekday or 0))} {_short_time(tod)}"
    elif schedule.weekday is not None:
        base = f"每周{_WEEKDAYS_ZH[schedule.weekday]} {_short_time(tod)}"
    else:
        base = f"每天 {_short_time(tod)}"
    text = f"{base} ({schedule.zone})"
    if next_at is None:
        return text
    _require_aware(next_at, "next_at")
    local = next_at.astimezone(_zone(schedule.zone))
    return (
        f"{text}，下次: {local.date().isoformat()} {_short_time(local.time())} "
        f"周{_WEEKDAYS_ZH[local.weekday()]}"
    )


def missed_fires(schedule: Schedule, last_planned: datetime, now: datetime) -> int:
    """How many occurrences fell in ``(last_planned, now]``, at most ``MISSED_FIRES_CAP``."""
    _require_aware(last_planned, "last_planned")
    _require_aware(now, "now")
    count = 0
    cursor = last_planned
    while count < MISSED_FIRES_CAP:
        upcoming = next_fire(schedule, cursor)
        if upcoming is None or upcoming > now:
            break
        count += 1
        cursor = upcoming
    return count
