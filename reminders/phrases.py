"""Common Chinese and English time phrases -> a reminder schedule, without a model.

``parse_phrase("明天8点 开会", zone, now)`` reads the time phrase at the start of the text and
returns a :class:`Phrase`: the schedule fields ``reminder_set`` takes (the same arguments a model
would send) and the content after the phrase. What it understands::

    10分钟后 / 半小时后 / 一个半小时后 / 3天后 / in 10 minutes / in half an hour
    明天8点 / 明早8:30 / 后天下午3点 / 今晚9点 / 11月24日 15:00 / 2026-11-24 15:00
    下周一 9:30 / 周五 18:00 (the coming Friday) / tomorrow 8am / tonight at 9pm / monday 9:30
    8点 / 下午3点 / 8:30 / 8am / 明天中午 (the next such time: today, or tomorrow if it has passed; 今天3点
    said at noon is 15:00, as 3点 is)
    每天 8:00 / 每周五 18:00 / 工作日 9:00 / 周末 10:00 / 每周一三五 7:00 / 每周1,3,5 7:00 (周1 = Monday)
    每周五晚上12点 (the midnight that ends Friday: Saturday 00:00, as for one day)
    every day 8am / daily 8:00 / every friday 6pm / weekdays 9:00

Every phrase it accepts resolves to an instant in the future (:attr:`Phrase.first`, in the chat's
zone); anything else raises :class:`PhraseError` with a Chinese explanation. Pure: no I/O, no
clock reads.

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

from reminders.schedule import WORKDAYS, Kind, Schedule, ScheduleError, days_mask, first_fire, parse_schedule
from reminders.weekdays import EN_DAY, ZH_DAY, weekday_number, weekday_set

__all__ = ["EXAMPLES", "Phrase", "PhraseError", "parse_phrase"]

EXAMPLES = ("/remind 10分钟后 喝水", "/remind 明天8点 开会", "/remind 每周五 18:00 交周报")
"""Three command lines that work (``/help`` and the parse-error reply show them)."""

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
              "九": 9}
_NUM = r"(?:\d{1,4}|[零〇一二两三四五六七八九十]{1,3})"


class PhraseError(ValueError):
    """No usable time phrase; ``str(exc)`` is the Chinese reason, for the person."""


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


def _cn_int(text: str) -> int:
    """``"8"``, ``"八"``, ``"十五"``, ``"二十三"`` -> int (up to 99 for Chinese numerals)."""
    if text.isdigit():
        return int(text)
    if "十" in text:
        tens, _, ones = text.partition("十")
        if "十" in ones or len(tens) > 1 or len(ones) > 1:
            raise PhraseError(f"看不懂数字“{text}”。")
        return (_CN_DIGITS.get(tens, -100) if tens else 1) * 10 + (_CN_DIGITS.get(ones, -100) if ones else 0)
    if len(text) == 1 and text in _CN_DIGITS:
        return _CN_DIGITS[text]
    if len(text) == 2 and text[0] in "零〇" and text[1] in _CN_DIGITS:  # 三点零五
        return _CN_DIGITS[text[1]]
    raise PhraseError(f"看不懂数字“{text}”。")


@dataclass
class _Cursor:
    text: str
    pos: int = 0

    def take(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        m = pattern.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return m

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\n,，":
            self.pos += 1


_p = re.compile


_LEAD = _p(r"(?:提醒我|提醒大家|提醒|叫我|remind me(?: to)?\b|remind us(?: to)?\b)\s*")
_REL_ZH = _p(rf"(?P<n>{_NUM}(?:\.\d+)?|半)\s*(?:个)?\s*(?P<half>半)?\s*(?P<unit>分钟|分|小时|钟头|个钟|天|日)\s*(?:后|以后|之后)")
_REL_EN = _p(r"in\s+(?P<n>\d+(?:\.\d+)?|an?|one|half an?|a half)\s*(?P<unit>minutes?|mins?|m|hours?|hrs?|h|days?|d)\b")
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
_PERIOD_ZH = _p(r"凌晨|早上|早晨|上午|早|中午|下午|午后|傍晚|晚上|夜里|夜间|晚")
_AMPM = r"(?P<ampm>am|pm|a\.m\.|p\.m\.)(?![a-z])"  # not the start of a word ("9:00 PMP考试")
_CLOCK = _p(rf"(?:at\s+)?(?P<h>\d{{1,2}})[:：](?P<m>\d{{2}})(?::(?P<s>\d{{2}}))?(?:\s*{_AMPM})?")
# Minutes follow 点 directly, without 分 only as said (10, 十五, 零五): "8点 一起吃饭" was 8:01 "起吃饭"
_CLOCK_ZH = _p(rf"(?P<h>{_NUM})\s*(?:点钟|点|时)(?:(?P<half>半)|(?P<q>一刻|三刻)|(?P<m>{_NUM})分"
               r"|(?P<m2>\d{2}|[零〇][一二三四五六七八九]|[一二三四五]?十[一二三四五六七八九]?)(?![\d分])"
               r"|整(?![理齐个天体修改合顿套份洁]))?")
_CLOCK_EN = _p(rf"(?:at\s+)?(?P<h>\d{{1,2}})\s*{_AMPM}|at\s+(?P<bare>\d{{1,2}})\b|(?P<word>noon|midnight)\b")

_AFTERNOON = frozenset({"下午", "午后", "傍晚"})
_NIGHT = frozenset({"晚上", "夜里", "夜间", "晚", "今晚", "今夜", "明晚", "tonight"})
_COLON = _p(r"[:：]\s*")
_OF = _p(r"的\s*")


def _clock(cur: _Cursor, period: str | None) -> tuple[dt_time, int, bool] | None:
    """A time of day at the cursor, a day carry (1 for "今晚12点" = midnight, "晚上1点" = 01:00 next day),
    and whether it could be either half of the day ("3点", "at 3": no 下午, no pm, no HH:MM)."""
    start = cur.pos
    p = cur.take(_PERIOD_ZH)
    period = p[0] if p else period
    cur.skip_space()
    hour = minute = second = 0
    ampm: str | None = None
    if m := cur.take(_CLOCK):
        hour, minute, second, ampm = int(m["h"]), int(m["m"]), int(m["s"] or 0), m["ampm"]
    elif m := cur.take(_CLOCK_ZH):
        hour = _cn_int(m["h"])
        said = m["m"] or m["m2"]
        minute = 30 if m["half"] else 15 if m["q"] == "一刻" else 45 if m["q"] else _cn_int(said) if said else 0
    elif m := cur.take(_CLOCK_EN):
        if m["word"]:
            hour = 12 if m["word"] == "noon" else 24
        else:
            hour, ampm = int(m["h"] or m["bare"]), m["ampm"]
    elif period == "中午":  # "明天中午", "每天中午" name their hour: noon
        hour = 12
    else:
        cur.pos = start
        return None
    carry = 0
    either_half = period is None and ampm is None and m is not None and m.re is not _CLOCK and 1 <= hour <= 11
    if ampm:
        if not 1 <= hour <= 12:
            raise PhraseError(f"时间 {hour}{ampm} 不存在。")
        hour = hour % 12 + (12 if ampm.startswith("p") else 0)
    elif period in _NIGHT:
        if hour == 12 or hour <= 3:  # the small hours after that evening
            hour, carry = hour % 12, 1
        elif hour < 12:
            hour += 12
    elif period == "中午" and 3 < hour < 11:  # 中午10点 is no noon: 22:00 was a silent guess
        raise PhraseError(f"“中午{hour}点”是几点？请写 上午{hour}点 或 晚上{hour}点。")
    elif (period in _AFTERNOON and hour < 12) or (period == "中午" and hour <= 3):
        hour += 12
    elif period == "凌晨" and hour == 12:
        hour = 0
    if hour == 24 and minute == 0 and second == 0:
        hour, carry = 0, carry + 1
    if hour > 23 or minute > 59 or second > 59:
        raise PhraseError(f"时间 {hour}:{minute:02d} 不存在（小时 0-23，分钟 0-59）。")
    return dt_time(hour, minute, second), carry, either_half


def _relative(m: re.Match[str]) -> timedelta:
    raw, unit = m["n"], m["unit"]
    if raw in ("半", "half a", "half an", "a half"):
        amount = 0.5
    elif raw in ("a", "an", "one"):
        amount = 1.0
    elif re.fullmatch(r"\d+(?:\.\d+)?", raw):
        amount = float(raw)
    else:
        amount = float(_cn_int(raw))
    if m.groupdict().get("half"):
        amount += 0.5
    if unit in ("分钟", "分") or unit.startswith("m"):
        delta = timedelta(minutes=amount)
    elif unit in ("天", "日") or unit.startswith("d"):
        delta = timedelta(days=amount)
    else:
        delta = timedelta(hours=amount)
    if not timedelta(minutes=1) <= delta <= timedelta(days=3660):
        raise PhraseError("相对时间要在 1 分钟到 10 年之间。")
    return delta


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


def _content(original: str, index: list[int], cur: _Cursor) -> str:
    cur.skip_space()
    cur.take(_COLON)
    cur.take(_LEAD)
    return original[index[cur.pos]:].strip()


def _next_weekday(today: date, day: int) -> date:
    return today + timedelta(days=(day - today.weekday()) % 7)


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
    cur = _Cursor(norm)
    cur.skip_space()
    cur.take(_LEAD)
    cur.skip_space()
    local_now = now.astimezone(zone)
    today = local_now.date()

    if m := cur.take(_REL_ZH) or cur.take(_REL_EN):
        delta, in_days = _relative(m), m["unit"] in ("天", "日") or m["unit"].startswith("d")
        cur.skip_space()
        if (clock := _clock(cur, None) if in_days else None) and delta < timedelta(days=1):
            raise PhraseError("“半天后”和几点只能写一个：例如 12小时后，或 明天8点。")  # (its clock was dropped)
        if clock:
            day = (local_now + delta).date() + timedelta(days=clock[1])
            return _once(day, clock[0], zone, now, _content(text, index, cur))
        if in_days and delta % timedelta(days=1) == timedelta(0):  # N days later: the wall time too, over DST
            at = local_now.replace(tzinfo=None) + delta + timedelta(seconds=30)
            return _once(at.date(), at.time().replace(second=0, microsecond=0), zone, now, _content(text, index, cur))
        return _once_at(_wall_after(now + delta, zone, now), zone, now, _content(text, index, cur))

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
        clock = _clock(cur, period)
        if clock is None:
            raise PhraseError("重复提醒要写上几点，例如：每天 8:00、每周五 18:00。")
        tod = clock[0]
        if days is not None and clock[1]:  # 每周五晚上12点: the midnight that ends Friday, as for one day
            days = [(d + clock[1]) % 7 for d in days]
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
        groups = m.groupdict()
        word = groups.get("word") or groups.get("short")
        if word:
            offsets = {"今天": 0, "今日": 0, "today": 0, "tonight": 0, "明天": 1, "明日": 1, "tomorrow": 1,
                       "后天": 2, "the day after tomorrow": 2, "大后天": 3}
            offsets.update({w: 0 for w in ("今早", "今晨", "今晚", "今夜")})
            offsets.update({w: 1 for w in ("明早", "明晨", "明晚")})
            day_, strict = today + timedelta(days=offsets[word]), True
            implied = word if groups.get("short") or word == "tonight" else None  # 今晚 says evening, 今天 no half
        elif groups.get("day"):
            number = weekday_number(("周" if groups["day"].isdigit() else "") + groups["day"])
            assert number is not None
            nxt = groups.get("next")
            if nxt in ("下", "下个", "next"):
                day_ = today - timedelta(days=today.weekday()) + timedelta(days=7 + number)
                strict = True
            elif nxt in ("这", "这个", "本", "this"):
                day_, strict = today - timedelta(days=today.weekday()) + timedelta(days=number), True
            else:
                day_ = _next_weekday(today, number)
        else:
            year = int(groups["y"]) if groups.get("y") else today.year
            try:
                day_ = date(year, int(groups["mo"]), int(groups["d"]))
            except ValueError:
                raise PhraseError(f"日期“{m[0]}”不存在。") from None
            if not groups.get("y") and day_ < today:
                try:
                    day_ = day_.replace(year=year + 1)
                except ValueError:
                    raise PhraseError(f"明年没有{m[0]}。") from None
            strict = True
        cur.skip_space()
        cur.take(_OF)

    clock = _clock(cur, implied)
    if clock is None:
        if day_ is not None:
            raise PhraseError("请写上几点，例如：明天8点、下周一 9:30。")
        raise PhraseError("没有看懂提醒时间。")
    tod, carry, either_half = clock
    content = _content(text, index, cur)
    if day_ is None:  # a bare time: the next one; "3点" at noon is 15:00 today, not 03:00 tomorrow
        day_, carry = today + timedelta(days=carry), 0
        if _resolve_first(day_, tod, zone, now) is None:
            later = tod.replace(hour=tod.hour + 12) if either_half else tod  # either_half: 1..11 o'clock
            if either_half and _resolve_first(day_, later, zone, now) is not None:
                tod = later
            else:
                day_ += timedelta(days=1)
    elif day_ == today and either_half and not carry and _resolve_first(day_, tod, zone, now) is None \
            and _resolve_first(day_, tod.replace(hour=tod.hour + 12), zone, now) is not None:
        tod = tod.replace(hour=tod.hour + 12)  # "今天3点" at noon: 15:00, as a bare "3点" reads
    elif not strict and carry == 0 and _resolve_first(day_, tod, zone, now) is None:
        day_ += timedelta(days=7)  # "周一 9:30" on a Monday afternoon: next Monday
    return _once(day_ + timedelta(days=carry), tod, zone, now, content)


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
