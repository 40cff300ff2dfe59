"""The pieces of a time phrase (:mod:`reminders.phrases`): a time of day ("8点一刻", "3.30pm", "at 10")
and a relative time ("1小时30分钟后", "in 2 hours 30 minutes"), read at a cursor over the normalised text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import time as dt_time
from datetime import timedelta

__all__ = ["NUM", "Cursor", "PhraseError", "clock", "relative"]

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
              "九": 9}
NUM = r"(?:\d{1,4}|[零〇一二两三四五六七八九十]{1,3})"
"""A number as typed: digits, or Chinese numerals up to 99 (a regex)."""


class PhraseError(ValueError):
    """No usable time phrase; ``str(exc)`` is the Chinese reason, for the person."""


def cn_int(text: str) -> int:
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
class Cursor:
    """A position in the normalised text; ``take`` moves past a match at it."""

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

_REL_ZH = _p(rf"(?P<n>{NUM}(?:\.\d+)?|半)\s*(?:个)?\s*(?P<half>半)?\s*(?P<unit>分钟|分|小时|钟头|个钟|天|日)")
_REL_ZH_END = _p(r"\s*(?:后|以后|之后)")
_IN = _p(r"in\s+")
# A word number takes a unit word after a space ("an hour"; "ad", "and" are words); a letter unit takes digits
_REL_EN = _p(r"(?:(?P<n>\d+(?:\.\d+)?)\s*|(?P<w>an?|one|half an?|a half)\s+)"
             r"(?P<unit>seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b")
_JOINT = _p(r"\s*(?P<joint>,?\s*and\s+|,\s*)?")
_HALF = _p(r"a\s+half\b")
_RANK = {"s": 0, "m": 1, "分": 1, "h": 2, "小": 2, "钟": 2, "个": 2, "d": 3, "天": 3, "日": 3}
_PERIOD_ZH = _p(r"凌晨|早上|早晨|上午|早|中午|下午|午后|傍晚|晚上|夜里|夜间|晚")
_AMPM = r"(?P<ampm>am|pm|a\.m\.|p\.m\.)(?![a-z])"  # not the start of a word ("9:00 PMP考试")
_CLOCK = _p(rf"(?:at\s+)?(?P<h>\d{{1,2}})[:：](?P<m>\d{{2}})(?::(?P<s>\d{{2}}))?(?:\s*{_AMPM})?")
# "3.30pm", "at 3.30": a dot between hour and minutes only with "at" or am/pm (else it may be a decimal)
_CLOCK_DOT = _p(rf"(?P<at>at\s+)?(?P<h>\d{{1,2}})\.(?P<m>\d{{2}})(?![\d.])(?:\s*{_AMPM})?")
# Minutes follow 点 directly, without 分 only as said (10, 十五, 零五): "8点 一起吃饭" was 8:01 "起吃饭"
_CLOCK_ZH = _p(rf"(?P<h>{NUM})\s*(?:点钟|点|时)(?:(?P<half>半)|(?P<q>[一二三123])刻(?!钟)|(?P<m>{NUM})分"
               r"|(?P<m2>\d{2}|[零〇][一二三四五六七八九]|[一二三四五]?十[一二三四五六七八九]?)(?![\d分刻])"
               r"|整(?![理齐个天体修改合顿套份洁]))?")
_CLOCK_EN = _p(rf"(?:at\s+)?(?P<h>\d{{1,2}})\s*{_AMPM}|at\s+(?P<bare>\d{{1,2}})\b|(?P<word>noon|midnight)\b")
_QUARTERS = {"一": 15, "1": 15, "二": 30, "2": 30, "三": 45, "3": 45}

_AFTERNOON = frozenset({"下午", "午后", "傍晚"})
_NIGHT = frozenset({"晚上", "夜里", "夜间", "晚", "今晚", "今夜", "明晚", "tonight"})


def clock(cur: Cursor, period: str | None) -> tuple[dt_time, int, bool] | None:
    """A time of day at the cursor, a day carry (1 for "今晚12点" = midnight, "晚上1点" = 01:00 next day),
    and whether it could be either half of the day ("3点", "12点", "at 3": no 下午, no pm, no HH:MM, no noon)."""
    start = cur.pos
    p = cur.take(_PERIOD_ZH)
    period = p[0] if p else period
    cur.skip_space()
    hour = minute = second = 0
    ampm: str | None = None
    if m := cur.take(_CLOCK):
        hour, minute, second, ampm = int(m["h"]), int(m["m"]), int(m["s"] or 0), m["ampm"]
    elif m := _dotted(cur):
        hour, minute, ampm = int(m["h"]), int(m["m"]), m["ampm"]
    elif m := cur.take(_CLOCK_ZH):
        hour = cn_int(m["h"])
        said = m["m"] or m["m2"]
        minute = 30 if m["half"] else _QUARTERS[m["q"]] if m["q"] else cn_int(said) if said else 0
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
    either_half = (period is None and ampm is None and m is not None and m.re is not _CLOCK
                   and not m.groupdict().get("word") and 1 <= hour <= 12)
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


def _dotted(cur: Cursor) -> re.Match[str] | None:
    m = _CLOCK_DOT.match(cur.text, cur.pos)
    if m is None or not (m["at"] or m["ampm"]):
        return None
    cur.pos = m.end()
    return m


def relative(cur: Cursor) -> tuple[timedelta, bool, bool] | None:
    """A relative time at the cursor ("10分钟后", "1小时30分钟后", "in 2 hours 30 minutes"): how far,
    whether it counts whole days only ("3天后": a clock may follow), and whether an English one is followed
    by a smaller unit it did not read ("in 1 minute 30 seconds"; the cursor stays before it)."""
    start = cur.pos
    english = cur.take(_IN) is not None
    parts: list[re.Match[str]] = []
    unread = False
    while True:
        joint = cur.pos
        joined = ""  # what came between this part and the last: "and", a comma, or nothing
        if parts and english:
            j = cur.take(_JOINT)
            joined = (j["joint"] or "") if j else ""
        elif parts:
            cur.skip_space()
        m = _part(cur, english, more=bool(parts))
        if m is None or (not parts and m["unit"][0] == "s"):  # seconds are too fine for a reminder
            unread = "and" in joined and _HALF.match(cur.text, cur.pos) is not None  # "in 1 hour and a half"
            cur.pos = joint
            break
        if parts and not _follows(parts[-1], m, joined):
            # A larger unit starts the content ("in 5 minutes 2 days left"); a smaller one is more of the time
            unread = _RANK[m["unit"][0]] < _RANK[parts[-1]["unit"][0]] and (m["n"] is not None or "and" in joined)
            cur.pos = joint
            break
        parts.append(m)
    if not parts or (not english and cur.take(_REL_ZH_END) is None):
        cur.pos = start
        return None
    delta = sum((_amount(m) for m in parts), timedelta())
    if not timedelta(minutes=1) <= delta <= timedelta(days=3660):
        raise PhraseError("相对时间要在 1 分钟到 10 年之间。")
    return delta, all(_RANK[m["unit"][0]] == 3 for m in parts), unread


def _part(cur: Cursor, english: bool, *, more: bool) -> re.Match[str] | None:
    m = (_REL_EN if english else _REL_ZH).match(cur.text, cur.pos)
    if m is None or (english and m["w"] and len(m["unit"]) == 1):  # "a d": no unit
        return None
    if more and cur.text.startswith("-", m.end()):  # "in 1 day and an hour-long call": content
        return None
    cur.pos = m.end()
    return m


def _follows(last: re.Match[str], m: re.Match[str], joined: str) -> bool:
    """Whether ``m`` goes on the relative time ``last`` ended: a smaller unit, and in English after "and",
    or as digits after a comma, with a unit word ("2 hours 30 minutes") or a letter after a letter ("1h 30m").
    "in 2 hours, a minute of silence": the rest is content."""
    if _RANK[m["unit"][0]] >= _RANK[last["unit"][0]] or m["unit"][0] == "s":
        return False
    if "w" not in m.groupdict() or "and" in joined:
        return True
    return m["n"] is not None and (bool(joined) or len(m["unit"]) > 1 or len(last["unit"]) == 1)


def _amount(m: re.Match[str]) -> timedelta:
    raw, unit = m.groupdict().get("w") or m["n"], m["unit"]
    if raw in ("半", "half a", "half an", "a half"):
        amount = 0.5
    elif raw in ("a", "an", "one"):
        amount = 1.0
    elif re.fullmatch(r"\d+(?:\.\d+)?", raw):
        amount = float(raw)
    else:
        amount = float(cn_int(raw))
    if m.groupdict().get("half"):
        amount += 0.5
    if unit in ("分钟", "分") or unit.startswith("m"):
        return timedelta(minutes=amount)
    if unit in ("天", "日") or unit.startswith("d"):
        return timedelta(days=amount)
    return timedelta(hours=amount)
