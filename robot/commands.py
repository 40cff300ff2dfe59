"""``/commands``: the same tools, called without any LLM.

``/<tool or alias> field=value ...`` or positional values in field order (quote values with
spaces). Values are coerced by the tool's schema type, then go through the same two-stage
validation as a model's arguments. A plugin can give a tool its own command syntax
(:class:`CommandSyntax`, e.g. ``/remind 明天8点 开会``); the validation is the same.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from function_calls import ArgumentError, Caller, Tool, Toolset
from function_calls.errors import FieldProblem
from robot.command_values import DATE, TIME, coerce, fits, is_list, is_object, is_text, schema_branches

__all__ = [
    "CommandError",
    "CommandLine",
    "CommandSyntax",
    "ParsedCommand",
    "Word",
    "build_arguments",
    "clip",
    "describe_problem",
    "format_argument_error",
    "help_text",
    "parse_command",
    "refusal",
    "split_words",
    "usage_line",
]


class CommandError(Exception):
    """A command line that cannot be turned into arguments; the message is shown to the user."""


@dataclass(frozen=True)
class CommandLine:
    """What a tool's own command parser receives: the text after ``/name``, the chat's zone, the time."""

    tool: Tool
    rest: str
    zone: ZoneInfo
    now: datetime
    llm: bool
    """Whether the bot has a model (a parser may refuse what only a model can do)."""


@dataclass(frozen=True)
class CommandSyntax:
    """A tool's own command syntax, declared by its plugin (``Plugin.commands``).

    ``parse`` turns the line into the tool's arguments (raising :class:`CommandError` with a
    message for the person); ``usage`` replaces the generated field list in ``/help`` and errors.
    """

    parse: Callable[[CommandLine], dict[str, Any]]
    usage: str


@dataclass
class ParsedCommand:
    """``/name rest``."""

    name: str
    rest: str


_HEAD = re.compile(r"\s+")


def parse_command(text: str) -> ParsedCommand | None:
    stripped = text.strip()
    if not stripped.startswith(("/", "／")) or len(stripped) < 2:
        return None
    # Any whitespace ends the name: IMEs type the full-width space U+3000, phones a newline.
    head, rest = _HEAD.split(stripped[1:], maxsplit=1) if _HEAD.search(stripped[1:]) else (stripped[1:], "")
    # An IME's full-width mode types ／ｈｅｌｐ (and a zero-width space may ride along): the same command.
    return ParsedCommand(unicodedata.normalize("NFKC", head).strip("\u200b\u200c\u200d\u2060\ufeff").lower(),
                         rest.strip())


@dataclass(frozen=True)
class Word:
    """A word of a command line: its value (quotes taken off) and where it was typed (``line[start:end]``)."""

    text: str
    start: int
    end: int


def split_words(line: str) -> list[Word]:
    """The line's words, split at whitespace. A word that starts with a quote (or a ``key=`` whose value
    does) runs to the same quote where one ends a word, and loses the quotes. Anything else is as typed:
    an apostrophe (``what's``), a backslash (``C:\\Windows``, ``\\d+``), a quote never closed (shlex
    refused the first and ate the others)."""
    words: list[Word] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        end = i
        while end < n and not line[end].isspace():
            end += 1
        word = line[i:end]
        key, eq, value = word.partition("=")
        lead = i + len(key) + 1 if eq and value[:1] and value[0] in "\"'" else i if word[0] in "\"'" else -1
        if lead >= 0:
            close = line.find(line[lead], lead + 1)
            while close != -1 and close + 1 < n and not line[close + 1].isspace():
                close = line.find(line[lead], close + 1)
            if close != -1:
                words.append(Word(line[i:lead] + line[lead + 1:close], i, close + 1))
                i = close + 1
                continue
        words.append(Word(word, i, end))
        i = end
    return words


def build_arguments(tool: Tool, rest: str) -> dict[str, Any]:
    """Command text -> an arguments object for ``tool.parse_arguments``.

    Positional values fill the fields in order (an object field is typed by name only, as JSON; a
    list takes ``a,b``). A value that cannot belong to the next field (a word where a number or a
    choice is expected), and any surplus, continues the text (or list) field before it, as typed
    (spaces, quotes, backslashes), so ``/remind daily 08:00 起床 喝水`` needs no quotes; an unquoted
    ``2026-11-22 15:00`` stays one value unless a date field comes next (then its time follows).
    A word is in one place: when the text runs on over words later fields took by position, those
    fields give them back (``/todo 买 2 斤苹果`` sets no priority); values for them go after the text.
    """
    props: dict[str, Any] = tool.parameters.get("properties", {})
    args: dict[str, Any] = {}
    positional: list[Word] = []
    named: list[Word] = []
    for word in split_words(rest):
        key, eq, value = word.text.partition("=")
        if eq and key in props:
            args[key] = coerce(props[key], value)
            named.append(word)
        else:
            positional.append(word)
    free = [n for n in props if n not in args and not is_object(props[n])]
    last: str | None = None  # the text or list field that takes more words
    spans: dict[str, tuple[int, int]] = {}  # a text field that took more words: where they were typed
    taken: list[tuple[str, Word]] = []  # fields filled by position since ``last``: undone if its text runs on
    i = 0
    while i < len(positional):
        word, i = positional[i], i + 1
        field = props[free[0]] if free else None
        split = field is not None and any(b.get("format") in ("date", "time") for b in schema_branches(field))
        if i < len(positional) and not split and DATE.match(word.text) and TIME.match(positional[i].text):
            word, i = Word(f"{word.text} {positional[i].text}", word.start, positional[i].end), i + 1
        value = coerce(field, word.text) if field is not None else word.text
        # A second plain text field (deep_think's context) is filled by name only: it took all but the
        # question's first word. A list of words after text takes a word only with its commas.
        second = field is not None and last is not None and is_text(props[last]) and (
            is_text(field) or (is_list(field) and "," not in word.text and "，" not in word.text))
        if field is not None and not second and (fits(field, value) or last is None):
            name = free.pop(0)
            args[name] = value
            if is_text(props[name]) or (is_list(props[name]) and isinstance(value, list)):
                last, spans[name], taken = name, (word.start, word.end), []
            else:
                taken.append((name, word))
        elif last is not None and not is_text(props[last]):  # (a list: more items)
            more = coerce(props[last], word.text)
            args[last] = [*args[last], *(more if isinstance(more, list) else [word.text])]
        elif last is not None:
            # The text now runs over the words later fields took: they stay in the text only (a word
            # is in one place: "/remember my group locker code" is not a group memory), and those fields
            # are free again for words typed after the text. Values typed by name are never undone.
            for name, _ in taken:
                del args[name]
            free = sorted([*free, *(name for name, _ in taken)], key=list(props).index)
            start, between = spans[last][0], [w.text for _, w in taken]
            spans[last], taken = (start, word.end), []
            whole = not any(start < w.start < word.end for w in named)  # (else the words, a space between)
            args[last] = rest[start:word.end] if whole else " ".join([args[last], *between, word.text])
        else:
            raise CommandError(f"/{tool.name} 不需要这么多参数：{clip(word.text)}")
    return args


def usage_line(tool: Tool) -> str:
    """``/name <required> [optional] [list,…] [object={…}] [more=…]`` (an object field is typed by name,
    as JSON; so is a text field after another one, which ``build_arguments`` never fills by position)."""
    props: dict[str, Any] = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    texts = [n for n, s in props.items() if is_text(s)]
    shown = {n: f"{n}={{…}}" if is_object(s) else f"{n}=…" if n in texts[1:] else f"{n},…" if is_list(s) else n
             for n, s in props.items()}
    parts = [f"<{shown[n]}>" if n in required else f"[{shown[n]}]" for n in props]
    return " ".join([f"/{tool.aliases[0] if tool.aliases else tool.name}", *parts])


def refusal(tool: Tool, caller: Caller) -> str | None:
    """Why ``caller`` may not use ``tool`` here, or None."""
    if tool.scope == "group" and caller.chat_kind != "group":
        return f"/{tool.name} 只能在群聊里使用。"
    if tool.scope == "private" and caller.chat_kind != "private":
        return f"/{tool.name} 只能在私聊里使用。"
    if tool.admin_only and not caller.bot_admin:
        return f"/{tool.name} 只有机器人管理员可以使用。"
    if tool.group_admin and not caller.group_admin:
        return f"/{tool.name} 只有群主、群管理员或机器人管理员可以使用。"
    if not tool.allowed_for(caller):  # require_at: only when the bot was addressed directly
        return f"/{tool.name} 需要 @我 才能使用。"
    return None


_TYPES = {"zh": {"integer": "整数", "number": "数字", "string": "文字", "boolean": "true 或 false", "array": "列表",
                 "object": "对象", "null": "空"},
          "en": {"integer": "a whole number", "number": "a number", "string": "text", "boolean": "true or false",
                 "array": "a list", "object": "an object", "null": "empty"}}
#: (JSON-Schema keywords, Pydantic error types) -> wording per language; {0} is the rule's bound.
_RULES: list[tuple[frozenset[str], dict[str, str]]] = [
    (frozenset({"required", "missing"}), {"zh": "必须填写", "en": "is required"}),
    (frozenset({"maximum", "less_than_equal"}), {"zh": "不能大于 {0}", "en": "must be at most {0}"}),
    (frozenset({"minimum", "greater_than_equal"}), {"zh": "不能小于 {0}", "en": "must be at least {0}"}),
    (frozenset({"exclusiveMaximum", "less_than"}), {"zh": "必须小于 {0}", "en": "must be less than {0}"}),
    (frozenset({"exclusiveMinimum", "greater_than"}), {"zh": "必须大于 {0}", "en": "must be greater than {0}"}),
    (frozenset({"maxLength", "string_too_long"}), {"zh": "最多 {0} 个字", "en": "must be at most {0} characters"}),
    (frozenset({"minLength", "string_too_short"}), {"zh": "至少 {0} 个字", "en": "must be at least {0} characters"}),
    (frozenset({"maxItems", "too_long"}), {"zh": "最多 {0} 项", "en": "must have at most {0} items"}),
    (frozenset({"minItems", "too_short"}), {"zh": "至少 {0} 项", "en": "must have at least {0} items"}),
    (frozenset({"enum", "literal_error", "const"}), {"zh": "只能是 {0}", "en": "must be one of {0}"}),
    (frozenset({"additionalProperties", "extra_forbidden"}), {"zh": "没有这个参数（可用：{0}）",
                                                              "en": "is not a parameter (allowed: {0})"}),
    (frozenset({"pattern", "format", "string_pattern_mismatch"}), {"zh": "格式不对", "en": "has the wrong format"}),
    (frozenset({"int_parsing", "int_from_float", "int_type"}), {"zh": "应为整数", "en": "must be a whole number"}),
    (frozenset({"float_parsing", "float_type"}), {"zh": "应为数字", "en": "must be a number"}),
    (frozenset({"bool_parsing", "bool_type"}), {"zh": "应为 true 或 false", "en": "must be true or false"}),
]
_ECHO = 24  # longer values are described by their length, never echoed back


def clip(text: str, limit: int = _ECHO) -> str:
    """What a reply may quote of a person's input: at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit] + f"…（共 {len(text)} 字）"


def _bound(problem: FieldProblem, language: str) -> str:
    limit = problem.limit
    if problem.kind in ("enum", "literal_error") and isinstance(limit, list | tuple | str):
        options = limit if isinstance(limit, list | tuple) else re.findall(r"'([^']*)'", limit)
        return ("、" if language == "zh" else ", ").join(str(o) for o in options if o is not None)  # (None: unset)
    if problem.kind in ("additionalProperties", "extra_forbidden") and isinstance(limit, list):
        return ", ".join(str(o) for o in limit) or "-"
    return str(limit)


def describe_problem(problem: FieldProblem, language: str = "zh") -> str:
    """One validation problem as a person reads it, in ``language`` ("zh" or "en"): never raw
    validator text, and a long value is described by its length instead of echoed."""
    lang = "en" if language == "en" else "zh"
    where = problem.path or ("参数" if lang == "zh" else "arguments")
    if problem.kind in ("value_error", "assertion_error"):  # the tool author's own words
        what = problem.problem.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    elif problem.kind == "type":
        kinds = problem.limit if isinstance(problem.limit, list) else [problem.limit]
        names = [_TYPES[lang].get(str(k), str(k)) for k in kinds if k != "null"]
        what = ("应为" + "或".join(names)) if lang == "zh" else "must be " + " or ".join(names)
    else:
        rule = next((words[lang] for kinds, words in _RULES if problem.kind in kinds), None)
        what = rule.format(_bound(problem, lang)) if rule else ("取值无效" if lang == "zh" else "is not valid")
    got = ""
    # A problem of the whole input (no field) would echo every argument as JSON: say only what is wrong.
    if problem.value is not None and problem.path and problem.kind not in ("required", "missing"):
        if problem.length is not None and problem.length > _ECHO:
            got = f"（收到 {problem.length} 个字）" if lang == "zh" else f" (got {problem.length} characters)"
        elif len(problem.value) <= _ECHO + 2:
            got = f"（收到 {problem.value}）" if lang == "zh" else f" (got {problem.value})"
    return f"- {where}{'：' if lang == 'zh' else ': '}{what}{got}"


def format_argument_error(tool: Tool, exc: ArgumentError, *, usage: str | None = None, language: str = "zh") -> str:
    """A command's invalid arguments, for the person who typed it (``[bot] language``)."""
    lines = [describe_problem(p, language) for p in exc.problems]
    if language == "en":
        return "Invalid arguments:\n" + "\n".join(lines) + f"\nUsage: {usage or usage_line(tool)}"
    return "参数有误：\n" + "\n".join(lines) + f"\n用法：{usage or usage_line(tool)}"


def help_text(tools: Toolset, caller: Caller, unavailable: dict[str, str], *, llm: bool = True,
              syntax: Mapping[str, CommandSyntax] | None = None) -> str:
    """``/help``, generated from tool metadata; only what this caller may use here.

    Examples are the ones that work now: command examples (``/...``) always, plain-language ones
    (said to the bot) only when it has a model.
    """
    syntax = syntax or {}
    lines = ["可用命令："]
    for tool in tools:
        if refusal(tool, caller):
            continue
        summary = " ".join(tool.description.strip().split("\n\n")[0].split())  # the first paragraph
        others = [n for n in (tool.name, *tool.aliases) if n != (tool.aliases[0] if tool.aliases else tool.name)]
        aliases = f"（也可用 {', '.join('/' + a for a in others)}）" if others else ""
        note = f" [未启用：{unavailable[tool.name]}]" if tool.name in unavailable else ""
        usage = syntax[tool.name].usage if tool.name in syntax else usage_line(tool)
        lines.append(f"{usage} — {summary}{aliases}{note}")
        command = next((e for e in tool.examples if e.startswith("/")), None)
        spoken = next((e for e in tool.examples if not e.startswith("/")), None)
        if command:
            lines.append(f"    例：{command}")
        if spoken and llm:
            lines.append(f"    例：{'@我 ' if caller.chat_kind == 'group' else ''}{spoken}")
    lines.append("/help — 显示本帮助")
    if llm:
        lines.append("也可以直接 @我 用自然语言提问。" if caller.chat_kind == "group" else "也可以直接用自然语言提问。")
    else:
        lines.append("（还没有接入大模型：现在只能用上面的命令。）")
    if caller.chat_kind == "group":
        lines.append("在群里，不认识的 /命令 会被忽略，除非同时 @我。")
    return "\n".join(lines)
