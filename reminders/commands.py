"""``/remind`` without a model: a time phrase and the content (``/remind 明天8点 开会``, see
:mod:`reminders.phrases`), or the structured form (``/remind once "2026-11-24 08:00" 开会``,
``/remind weekly 周一 09:30 周报``). Either way the result is ``reminder_set``'s arguments, validated
like a model's. What cannot be read gets a Chinese reply with three examples that work. A one-time
time is checked against when the message was sent (``line.now``): ``reminder_set`` relies on that to keep
one that passed only while the message waited.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from reminders.phrases import EXAMPLES, PhraseError, parse_phrase
from reminders.schedule import ScheduleError, first_fire, parse_schedule
from reminders.weekdays import weekday_number, weekday_set
from robot import CommandError, CommandLine, CommandSyntax, split_words

__all__ = ["REMIND_SYNTAX", "remind_command"]

_STRUCTURED = frozenset({"once", "daily", "weekly", "weekdays"})
_FIELDS = ("type", "time", "content", "weekday", "days", "mode")
_KEYED = re.compile(r"(?:^|\s)(?:type|time)=")
_MODE = re.compile(r"(?:\s+mode=(?P<named>\S+)|\s+(?P<bare>prompt))\s*$", re.IGNORECASE)
_DATE_TOKEN = re.compile(r"\d{4}[-/]\d{1,2}[-/]\d{1,2}")
_TIME_TOKEN = re.compile(r"\d{1,2}[:：]\d{2}(?:[:：]\d{2})?")


def _unparsed(reason: str, line: CommandLine) -> CommandError:
    tomorrow = (line.now.astimezone(line.zone) + timedelta(days=1)).strftime("%Y-%m-%d")
    examples = "\n".join(EXAMPLES)
    return CommandError(f"{reason}\n可以这样写：\n{examples}\n（重复提醒：每天 8:00、每周五 18:00、工作日 9:00；"
                        f"也可以写明类型：/remind once \"{tomorrow} 08:00\" 开会，类型有 once、daily、weekly、weekdays）")


def _days_value(raw: str) -> list[int]:
    days = weekday_set(raw)
    if days is None:
        raise CommandError(f"days={raw[:20]} 不对：请写 工作日、周末，或 周一三五 这样的星期几"
                           "（只写数字时 0=周一 … 6=周日）。")
    return days


def _weekday_value(raw: str) -> int:
    number = weekday_number(raw)
    if number is None:
        raise CommandError(f"weekday={raw[:20]} 不对：星期几请写 周一、周二 … 周日（或数字 0=周一 … 6=周日）。")
    return number


def _structured(rest: str) -> dict[str, Any]:
    """``once "2026-11-24 08:00" 开会``, ``weekly 周一 09:30 周报``, ``daily 08:00 查天气 prompt``, ``key=value``."""
    tokens = [word.text for word in split_words(rest)]  # ("don't forget": shlex refused it)
    args: dict[str, Any] = {}
    words: list[str] = []
    for token in tokens:
        key, eq, value = token.partition("=")
        if eq and key in _FIELDS:
            args[key] = value
        else:
            words.append(token)
    if words and "type" not in args:
        args["type"] = words.pop(0).lower()
    kind = str(args.get("type", "")).lower()
    if kind == "weekly" and "weekday" not in args and words and weekday_number(words[0]) is not None:
        args["weekday"] = words.pop(0)
    if kind == "weekdays" and "days" not in args and words:
        args["days"] = words.pop(0)
    if "time" not in args and words:
        args["time"] = words.pop(0)
        if _DATE_TOKEN.fullmatch(args["time"]) and words and _TIME_TOKEN.fullmatch(words[0]):
            args["time"] += " " + words.pop(0)
    if kind == "weekly" and "weekday" not in args and words and weekday_number(words[-1]) is not None:
        args["weekday"] = words.pop()  # /remind weekly 09:30 周报 周一
    if "mode" not in args and words and words[-1].lower() == "prompt":
        args["mode"] = words.pop().lower()
    if "content" not in args and words:
        args["content"] = " ".join(words)
    if "weekday" in args:
        args["weekday"] = _weekday_value(args["weekday"])
    if "days" in args:
        args["days"] = _days_value(args["days"])
    return args


def _ahead_when_sent(args: dict[str, Any], line: CommandLine) -> dict[str, Any]:
    """A one-time ``time`` already past when the message was sent is refused here, as a phrase's is:
    ``reminder_set`` keeps a typed one whose time passed only while the message waited (it fires late)."""
    if str(args.get("type", "")).lower() != "once" or not isinstance(args.get("time"), str):
        return args
    try:
        schedule = parse_schedule("once", args["time"], line.zone.key, None)
    except ScheduleError:
        return args  # malformed: the tool explains it
    try:
        first_fire(schedule, line.now)
    except ScheduleError as exc:
        raise CommandError(f"设置提醒失败：{exc.user_message or '时间无效。'}") from None
    return args


def remind_command(line: CommandLine) -> dict[str, Any]:
    """``/remind`` -> ``reminder_set`` arguments: a time phrase and the content (``/remind 明天8点 开会``),
    or the structured form (``/remind once "2026-11-24 08:00" 开会``). A trailing ``prompt`` (or
    ``mode=prompt``) makes it a scheduled prompt."""
    rest = line.rest.strip()
    if not rest:
        raise _unparsed("请写上提醒时间和内容。", line)
    first = rest.split(maxsplit=1)[0].lower()
    if first in _STRUCTURED or _KEYED.search(rest):
        return _ahead_when_sent(_structured(rest), line)
    mode: str | None = None
    if m := _MODE.search(rest):
        mode = (m["named"] or m["bare"]).lower()
        rest = rest[:m.start()]
    try:
        phrase = parse_phrase(rest, line.zone, line.now)
    except PhraseError as exc:
        reason = f"没有看懂提醒时间：{exc}" if str(exc) != "没有看懂提醒时间。" else str(exc)
        raise _unparsed(reason, line) from None
    if not phrase.content:
        raise CommandError(f"请写上提醒内容，例如：{EXAMPLES[1]}")
    args = phrase.arguments()
    if mode is not None:
        args["mode"] = mode
    return args


REMIND_SYNTAX = CommandSyntax(parse=remind_command, usage="/remind <时间> <内容>")
"""``Plugin.commands`` entry for ``reminder_set``."""
