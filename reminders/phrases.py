"""Common Chinese and English time phrases -> a reminder schedule, without a model.

``parse_phrase("明天8点 开会", zone, now)`` reads the time phrase at the start of the text and
returns a :class:`Phrase`: the schedule fields ``reminder_set`` takes (the same arguments a model
would send) and the content after the phrase. What it understands::

    10分钟后 / 半小时后 / 一个半小时后 / 1小时30分钟后 / 3天后 / in 10 minutes / in 2 hours 30 minutes
    明天8点 / 明早8:30 / 后天下午3点 / 今晚9点 / 明天8点1刻 / 11月24日 15:00 / 2026-11-24 15:00
    下周一 9:30 / 周五 18:00 (the coming Friday) / tomorrow 8am / tonight at 9pm / monday 9:30
    5pm tomorrow / 3pm friday / at 10 tonight / 下午3点 明天 (the day after the clock, standing alone)
    at 3.30pm / 9.15am (a dot only with at or am/pm)
    8点 / 下午3点 / 8:30 / 8am / 明天中午 (the next such time: today, or tomorrow if it has passed; 今天3点
    said at noon is 15:00, as 3点 is; 12点 said at 22:30 is the midnight 1.5 hours on, 中午12点 noon)
    每天 8:00 / 每周五 18:00 / 工作日 9:00 / 周末 10:00 / 每周一三五 7:00 / 每周1,3,5 7:00 (周1 = Monday)
    每周五晚上12点 (the midnight that ends Friday: Saturday 00:00, as for one day)
    every day 8am / daily 8:00 / every friday 6pm / weekdays 9:00

Every phrase it accepts resolves to an instant in the future (:attr:`Phrase.first`, in the chat's
zone); anything else raises :class:`PhraseError` with a Chinese explanation, and so does content
that starts with what looks like more of the time (after a clock, a day: "tomorrow 5pm friday review",
"3点 明天开会", or a piece of it: ".30", "4刻"; a smaller unit after an English relative time: "in 1 minute
30 seconds"): a guess there confirmed a time the person did not mean. A larger unit is content ("in 5
minutes 2 days left"). Pure: no I/O, no clock reads.

Errors::

    ValueError
     └── PhraseError    the text holds no time phrase this module understands, or a past one
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as dt_time
from zoneinfo import ZoneInfo

from reminders.clocks import NUM as _NUM
from reminders.clocks import Cursor, PhraseError, clock, relative
from reminders.schedule import WORKDAYS, Kind, Schedule, ScheduleError, days_mask, first_fire, parse_schedule
from reminders.weekdays import EN_DAY, ZH_DAY, weekday_number, weekday_set

__all__ = ["EXAMPLES", "Phrase", "PhraseError", "parse_phrase"]

EXAMPLES = ("/remind 10分钟后 喝水", "/remind 明天8点 开会", "/remind 每周五 18:00 交周报")
"""Three command lines that work (``/help`` and the parse-error reply show them)."""


@dataclass(frozen=True)
class Phrase:
    """A parsed phrase: ``reminder_set``'s schedule arguments, the rest of the text, the first fire."""

    kind: Kind
    time: str
    weekday: int | None
    days: tuple[int, ...] | None
    content: str
    first: datetime
    """The first fire instant, aware, in the chat's zone, after ``now``."""

    def arguments(self) -> dict[str, object]:
        """The ``reminder_set`` arguments (without ``mode``)."""
        args: dict[str, object] = {"type": self.kind, "time": self.time, "content": self.content}
        if self.weekday is not None:
            args["weekday"] = self.weekday
        if self.days is not None:
            args["days"] = list(self.days)
        return args


_p = re.compile


_LEAD = _p(r"(?:提醒我|提醒大家|提醒|叫我|remind me(?: to)?\b|remind us(?: to)?\b)\s*")
_EVERY_ZH = _p(rf"(?:每天|每日|天天)(?P<period>早上|早晨|上午|中午|下午|傍晚|晚上|夜里)?|每(?P<p2>早|晚)"
               rf"|(?P<work>(?:每个|每)?工作日|(?:每)?周一(?:到|至|-|~)周五)"
               rf"|(?P<weekend>(?:每个|每)?周末)"
               rf"|每(?:个)?(?:周|星期|礼拜)(?P<days>{ZH_DAY}(?:[、,，和及与]?{ZH_DAY})*)")
_EVERY_EN = _p(rf"(?:every\s*day|everyday|daily)\b|(?P<work>(?:on\s+|every\s+)?weekdays?)\b"
               rf"|(?P<weekend>(?:on\s+|every\s+)?weekends?)\b|every\s+(?P<day>{EN_DAY})\b")
_DAY_ZH = _p(rf"(?P<word>大后天|后天|明天|明日|今天|今日)|(?P<short>今早|今晨|明早|明晨|今晚|今夜|明晚)"
             rf"|(?P<next>下个?|这个?|本)?(?:周|星期|礼拜)(?P<day>{ZH_DAY})"
             rf"|(?:(?P<y>\d{{4}})[-/年])?(?P<mo>\d{{1,2}})(?:[-/]|月)(?P<d>\d{{1,2}})[日号]?")
_DAY_EN = _p(rf"(?P<word>the day after tomorrow|tomorrow|today|tonight)\b|(?:(?P<next>next|this)\s+|on\s+)?(?P<day>{EN_DAY})\b")
_COLON = _p(r"[:：]\s*")
_OF = _p(r"的\s*")


def _wall_after(target: datetime, zone: ZoneInfo, now: datetime) -> str:
    """The wall time (to the minute) of ``target``; in a repeated (fall-back) hour's second pass,
    which a wall time cannot name, the first wall time that resolves (from ``now``, as the reminder
    will) at or after it: late by up to the rest of that hour, never early."""
    local = target.astimezone(zone)
    wall = local.replace(second=0, microsecond=0, tzinfo=None) + timedelta(minutes=1 if local.second >= 30 else 0)
    for _ in range(24 * 60):
        text = wall.strftime("%Y-%m-%d %H:%M")
        at = _first_or_none(parse_schedule("once", text, zone.key, None), now)
        if at is not None and at >= target - timedelta(seconds=30):
            return text
        wall += timedelta(minutes=1)
    raise PhraseError("这个时间无法表示。")  # pragma: no cover - zones shift by at most a few hours


def _first_or_none(schedule: Schedule, now: datetime) -> datetime | None:
    try:
        return first_fire(schedule, now)
    except ScheduleError:
        return None


def _normalise(text: str) -> tuple[str, list[int]]:
    """NFKC + lower case, character by character, with each output character's source index."""
    out: list[str] = []
    index: list[int] = []
    for i, ch in enumerate(text):
        folded = unicodedata.normalize("NFKC", ch).lower()
        out.append(folded)
        index.extend([i] * len(folded))
    index.append(len(text))
    return "".join(out), index


_TIME_LEFT = _p(rf"[.:]\d|{_NUM}\s*刻(?!钟)")
"""What is left of a clock the phrase did not read (".30pm", "4刻"); "一刻钟" is a duration, content."""
_ALONE = _p(r"\s|[,，:：]|$")
_WORDS = frozenset({"sun", "sat", "wed"})  # words as well as days: "9am sun cream" names no day


def _day_at(cur: Cursor) -> tuple[re.Match[str], bool] | None:
    """A day phrase at the cursor (which stays) and whether it stands alone, a space, a comma or the
    end after it: "明天 开会" names a day, "明天开会" may be the content. A bare "3-4" or "sun" is none here."""
    m = _DAY_ZH.match(cur.text, cur.pos) or _DAY_EN.match(cur.text, cur.pos)
    if m is None or (m.groupdict().get("mo") and not (m["y"] or "月" in m[0])) or m[0] in _WORDS:
        return None
    return m, _ALONE.match(cur.text, m.end()) is not None


def _leftover(original: str, index: list[int], cur: Cursor) -> PhraseError:
    word = original[index[cur.pos]:].split(maxsplit=1)[0][:20]
    return PhraseError(f"“{word}”是时间的一部分吗？请把时间写在内容前面、写在一起，例如：明天下午5点 开会、"
                       "tomorrow 5pm call mom。")


def _content(original: str, index: list[int], cur: Cursor, *, after_clock: bool = True) -> str:
    """The text after the phrase; refused when it starts with what looks like more of the time. No day or
    piece of a clock goes on a relative time ("10分钟后 明天 交材料"): there it is content."""
    cur.skip_space()
    day = _day_at(cur) if after_clock else None
    if (day is not None and day[1]) or (after_clock and _TIME_LEFT.match(cur.text, cur.pos)):
        raise _leftover(original, index, cur)
    cur.take(_COLON)
    cur.take(_LEAD)
    return original[index[cur.pos]:].strip()


def _next_weekday(today: date, day: int) -> date:
    return today + timedelta(days=(day - today.weekday()) % 7)


def _day(m: re.Match[str], today: date) -> tuple[date, bool, str | None]:
    """The day a ``_DAY_ZH`` / ``_DAY_EN`` match names; whether it is strict (passed: an error, not the
    next one); the half of the day it implies (今晚, tonight)."""
    groups = m.groupdict()
    word = groups.get("word") or groups.get("short")
    if word:
        offsets = {"今天": 0, "今日": 0, "today": 0, "tonight": 0, "明天": 1, "明日": 1, "tomorrow": 1,
                   "后天": 2, "the day after tomorrow": 2, "大后天": 3}
        offsets.update({w: 0 for w in ("今早", "今晨", "今晚", "今夜")})
        offsets.update({w: 1 for w in ("明早", "明晨", "明晚")})
        implied = word if groups.get("short") or word == "tonight" else None  # 今晚 says evening, 今天 no half
        return today + timedelta(days=offsets[word]), True, implied
    if groups.get("day"):
        number = weekday_number(("周" if groups["day"].isdigit() else "") + groups["day"])
        assert number is not None
        nxt = groups.get("next")
        if nxt in ("下", "下个", "next"):
            return today - timedelta(days=today.weekday()) + timedelta(days=7 + number), True, None
        if nxt in ("这", "这个", "本", "this"):
            return today - timedelta(days=today.weekday()) + timedelta(days=number), True, None
        return _next_weekday(today, number), False, None
    year = int(groups["y"]) if groups.get("y") else today.year
    try:
        day = date(year, int(groups["mo"]), int(groups["d"]))
    except ValueError:
        raise PhraseError(f"日期“{m[0]}”不存在。") from None
    if not groups.get("y") and day < today:
        try:
            day = day.replace(year=year + 1)
        except ValueError:
            raise PhraseError(f"明年没有{m[0]}。") from None
    return day, True, None


def parse_phrase(text: str, zone: ZoneInfo, now: datetime) -> Phrase:
    """The time phrase at the start of ``text`` and the content after it; see the module docstring."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    try:
        return _parse(text, zone, now)
    except (OverflowError, ScheduleError) as exc:  # dates past year 9999, a day the zone cannot place
        reason = exc.user_message if isinstance(exc, ScheduleError) and exc.user_message else "这个时间无法设置。"
        raise PhraseError(reason) from None


def _parse(text: str, zone: ZoneInfo, now: datetime) -> Phrase:
    norm, index = _normalise(text)
    cur = Cursor(norm)
    cur.skip_space()
    cur.take(_LEAD)
    cur.skip_space()
    local_now = now.astimezone(zone)
    today = local_now.date()

    if rel := relative(cur):
        delta, in_days, unread = rel
        cur.skip_space()
        if unread:  # "in 1 minute 30 seconds": the seconds were no content
            raise _leftover(text, index, cur)
        if (got := clock(cur, None) if in_days else None) and delta < timedelta(days=1):
            raise PhraseError("“半天后”和几点只能写一个：例如 12小时后，或 明天8点。")  # (its clock was dropped)
        content = _content(text, index, cur, after_clock=got is not None)
        if got:
            return _once((local_now + delta).date() + timedelta(days=got[1]), got[0], zone, now, content)
        if in_days and delta % timedelta(days=1) == timedelta(0):  # N days later: the wall time too, over DST
            at = local_now.replace(tzinfo=None) + delta + timedelta(seconds=30)
            return _once(at.date(), at.time().replace(second=0, microsecond=0), zone, now, content)
        return _once_at(_wall_after(now + delta, zone, now), zone, now, content)

    if m := cur.take(_EVERY_ZH) or cur.take(_EVERY_EN):
        groups = m.groupdict()
        days: list[int] | None = None
        if groups.get("work"):
            days = list(WORKDAYS)
        elif groups.get("weekend"):
            days = [5, 6]
        elif groups.get("days"):
            days = weekday_set("周" + groups["days"]) or []  # its digits count from 1, as after 周
        elif groups.get("day"):
            days = [weekday_number(groups["day"]) or 0]
        cur.skip_space()
        period = groups.get("period") or {"早": "早上", "晚": "晚上"}.get(groups.get("p2") or "")
        got = clock(cur, period)
        if got is None:
            raise PhraseError("重复提醒要写上几点，例如：每天 8:00、每周五 18:00。")
        tod = got[0]
        if days is not None and got[1]:  # 每周五晚上12点: the midnight that ends Friday, as for one day
            days = [(d + got[1]) % 7 for d in days]
        wall = tod.strftime("%H:%M:%S" if tod.second else "%H:%M")
        content = _content(text, index, cur)
        if days is None:
            return _repeat("daily", wall, None, None, zone, now, content)
        if len(days) == 1:
            return _repeat("weekly", wall, days[0], None, zone, now, content)
        return _repeat("weekdays", wall, None, tuple(sorted(days)), zone, now, content)

    day_: date | None = None
    implied: str | None = None
    strict = False  # a named day that has passed is an error, not "the next one"
    if m := cur.take(_DAY_ZH) or cur.take(_DAY_EN):
        day_, strict, implied = _day(m, today)
        cur.skip_space()
        cur.take(_OF)
    start = cur.pos
    got = clock(cur, implied)
    if got is None:
        if day_ is not None:
            raise PhraseError("请写上几点，例如：明天8点、下周一 9:30。")
        raise PhraseError("没有看懂提醒时间。")
    if day_ is None:  # "5pm tomorrow", "下午3点 明天 开会": the day after the clock
        end = cur.pos
        cur.skip_space()
        if (after := _day_at(cur)) is None:
            cur.pos = end
        elif not after[1]:  # "3点 明天开会": tomorrow at 3, or "明天开会" at 3? Not guessed
            raise _leftover(text, index, cur)
        else:
            day_, strict, implied = _day(after[0], today)
            end = after[0].end()
            if implied:  # "at 10 tonight": the evening's 10 o'clock
                cur.pos = start
                got = clock(cur, implied)
                assert got is not None
            cur.pos = end
    tod, carry, either_half = got
    content = _content(text, index, cur)
    if day_ is None:  # a bare time: the next one; "3点" at noon is 15:00 today, not 03:00 tomorrow
        day_, carry = today + timedelta(days=carry), 0
        if either_half and tod.hour == 12 and _resolve_first(day_, tod.replace(hour=0), zone, now) is not None:
            tod = tod.replace(hour=0)  # "12点半" said at 00:10: 00:30, before noon's
        elif _resolve_first(day_, tod, zone, now) is None:
            later = _other_half(day_, tod)
            if either_half and _resolve_first(*later, zone, now) is not None:
                day_, tod = later
            else:
                day_ += timedelta(days=1)
    elif day_ == today and either_half and tod.hour < 12 and not carry \
            and _resolve_first(day_, tod, zone, now) is None \
            and _resolve_first(day_, tod.replace(hour=tod.hour + 12), zone, now) is not None:
        tod = tod.replace(hour=tod.hour + 12)  # "今天3点" at noon: 15:00; "今天12点" is not tomorrow's 00:00
    elif not strict and carry == 0 and _resolve_first(day_, tod, zone, now) is None:
        day_ += timedelta(days=7)  # "周一 9:30" on a Monday afternoon: next Monday
    return _once(day_ + timedelta(days=carry), tod, zone, now, content)


def _other_half(day: date, tod: dt_time) -> tuple[date, dt_time]:
    """The same clock in the other half of the day, after it: 3点 -> 15:00, 12点 -> the midnight that ends it."""
    if tod.hour == 12:
        return day + timedelta(days=1), tod.replace(hour=0)
    return day, tod.replace(hour=tod.hour + 12)


def _resolve_first(day: date, tod: dt_time, zone: ZoneInfo, now: datetime) -> datetime | None:
    schedule = parse_schedule("once", f"{day.isoformat()} {tod.isoformat()}", zone.key, None)
    return _first_or_none(schedule, now)


def _once(day: date, tod: dt_time, zone: ZoneInfo, now: datetime, content: str) -> Phrase:
    if day.year > 9998:
        raise PhraseError("这个日期太远了。")
    return _once_at(f"{day.isoformat()} {tod.strftime('%H:%M:%S' if tod.second else '%H:%M')}", zone, now, content)


def _once_at(wall: str, zone: ZoneInfo, now: datetime, content: str) -> Phrase:
    schedule = parse_schedule("once", wall, zone.key, None)
    try:
        first = first_fire(schedule, now)
    except ScheduleError as exc:
        raise PhraseError(exc.user_message or "这个时间已经过去了。") from None
    return Phrase("once", wall, None, None, content, first.astimezone(zone))


def _repeat(kind: Kind, wall: str, weekday: int | None, days: tuple[int, ...] | None, zone: ZoneInfo,
            now: datetime, content: str) -> Phrase:
    mask = days_mask(days) if days is not None else weekday
    schedule = parse_schedule(kind, wall, zone.key, mask)
    return Phrase(kind, wall, weekday, days, content, first_fire(schedule, now).astimezone(zone))
