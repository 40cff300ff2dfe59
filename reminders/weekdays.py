"""Names of the days of the week, as people type them: 周一, 星期日, 礼拜天, 周1, monday, fri, 0-6."""

from __future__ import annotations

import re
import unicodedata

from reminders.schedule import WORKDAYS

__all__ = ["EN_DAY", "ZH_DAY", "weekday_number", "weekday_set"]

ZH_DAY = r"[一二三四五六日天七1-7]"
"""One day character after 周/星期/礼拜 (a regex class)."""
EN_DAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|mon|tues?|wed|thu(?:rs?)?|fri|sat|sun)"
"""An English day name or abbreviation, lower case (a regex)."""
_EN_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_EN_SHORT = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_PREFIX = re.compile(r"周|星期|礼拜")
_JOIN = re.compile(r"[、,，和及与\s]")
_ZH_SET = re.compile(rf"(?:(?:周|星期|礼拜)?{ZH_DAY}[、,，和及与\s]*)+")


def weekday_number(text: str) -> int | None:
    """``"周一"``, ``"星期日"``, ``"礼拜天"``, ``"周1"``, ``"monday"``, ``"fri"``, ``"0"`` -> 0..6 (None if not a day).

    Bare digits are the ``weekday`` field's 0=Monday ... 6=Sunday; after 周 they count from 1 (周1 = Monday).
    """
    text = unicodedata.normalize("NFKC", text).strip().lower()
    word = re.sub(r"^(?:周|星期|礼拜)", "", text)
    prefixed = word != text
    if word in ("日", "天", "七"):
        return 6
    if len(word) == 1 and word in "一二三四五六":
        return "一二三四五六".index(word)
    if len(word) == 1 and word.isdigit():
        number = int(word) - prefixed
        return number if 0 <= number <= 6 else None
    for i, (full, short) in enumerate(zip(_EN_DAYS, _EN_SHORT, strict=True)):
        if word == full or (word.startswith(short) and full.startswith(word)):
            return i
    return None


def weekday_set(text: str) -> list[int] | None:
    """``"工作日"``, ``"周末"``, ``"周一三五"``, ``"一、三和五"``, ``"0,2,4"``, ``"weekdays"`` -> sorted days, or None.

    Digits after 周 count from 1 (周1 = Monday), as in :func:`weekday_number`; a bare list is 0-6 if it holds
    a 0, 1-7 if it holds a 7, else None (ambiguous).
    """
    word = unicodedata.normalize("NFKC", text).strip().lower()
    if word in ("工作日", "workdays", "weekdays"):
        return list(WORKDAYS)
    if word in ("周末", "weekend", "weekends"):
        return [5, 6]
    if re.fullmatch(r"[0-7](?:\s*[、,，和及与\s]\s*[0-7])*", word):
        # Bare digits: 0=Monday as in weekday= (a 0 says so), or 1-7 (a 7 says so); "1,3,5" could be either,
        # and read one way by "," and the other by "、", it named other days than meant: refused, not guessed.
        digits = {int(d) for d in re.findall(r"\d", word)}
        return None if (0 in digits) == (7 in digits) else sorted(d - (7 in digits) for d in digits)
    if not _ZH_SET.fullmatch(word):
        return None
    days: set[int] = set()
    for ch in _JOIN.sub("", _PREFIX.sub("", word)):
        days.add(6 if ch in "日天7七" else "一二三四五六".index(ch) if ch in "一二三四五六" else int(ch) - 1)
    return sorted(days)
