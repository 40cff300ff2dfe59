"""``/commands``: the same tools, called without any LLM.

``/<tool or alias> field=value ...`` or positional values in field order (quote values with
spaces: ``/remind once "2026-11-22 15:00" 开会``). Values are coerced by the tool's schema
type, then go through the same two-stage validation as a model's arguments.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from function_calls import ArgumentError, Caller, Tool, Toolset
from function_calls.errors import FieldProblem

__all__ = [
    "CommandError",
    "ParsedCommand",
    "build_arguments",
    "format_argument_error",
    "help_text",
    "parse_command",
    "refusal",
    "usage_line",
]


class CommandError(Exception):
    """A command line that cannot be turned into arguments; the message is shown to the user."""


class ParsedCommand:
    """``/name rest``."""

    def __init__(self, name: str, rest: str) -> None:
        self.name = name
        self.rest = rest


_HEAD = re.compile(r"\s+")


def parse_command(text: str) -> ParsedCommand | None:
    stripped = text.strip()
    if not stripped.startswith(("/", "／")) or len(stripped) < 2:
        return None
    # Any whitespace ends the name: IMEs type the full-width space U+3000, phones a newline.
    head, rest = _HEAD.split(stripped[1:], maxsplit=1) if _HEAD.search(stripped[1:]) else (stripped[1:], "")
    return ParsedCommand(head.lower(), rest.strip())


def _coerce(schema: dict[str, Any], raw: str) -> Any:
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "null" in kinds and raw.lower() in ("none", "null", ""):
        return None
    try:
        if "integer" in kinds:
            return int(raw)
        if "number" in kinds:
            return float(raw)
    except ValueError:
        return raw  # let validation explain the problem with the value shown
    if "boolean" in kinds:
        low = raw.lower()
        return True if low in ("true", "yes", "1", "on") else False if low in ("false", "no", "0", "off") else raw
    return raw


_DATE = re.compile(r"^\d{4}[-/]\d{1,2}[-/]\d{1,2}$")
_TIME = re.compile(r"^\d{1,2}[:：]\d{2}([:：]\d{2})?$")


def _is_text(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "string" in kinds and "enum" not in schema


def _fits(schema: dict[str, Any], value: Any) -> bool:
    """Whether a coerced positional value plausibly belongs to this field."""
    if "enum" in schema:
        return value in schema["enum"]
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "string" in kinds or not isinstance(value, str)


def build_arguments(tool: Tool, rest: str) -> dict[str, Any]:
    """Command text -> an arguments object for ``tool.parse_arguments``.

    Positional values fill the fields in order. A value that cannot belong to the next field
    (a word where a number or a choice is expected), and any surplus, continues the text field
    before it, so ``/remind daily 08:00 起床 喝水`` needs no quotes; an unquoted
    ``2026-11-22 15:00`` stays one value.
    """
    try:
        tokens = shlex.split(rest)
    except ValueError as exc:
        raise CommandError(f"无法解析参数（{exc}）。带空格的值请用引号括起来。") from None
    props: dict[str, Any] = tool.parameters.get("properties", {})
    args: dict[str, Any] = {}
    positional: list[str] = []
    for token in tokens:
        key, eq, value = token.partition("=")
        if eq and key in props:
            args[key] = _coerce(props[key], value)
        elif positional and _DATE.match(positional[-1]) and _TIME.match(token):
            positional[-1] = f"{positional[-1]} {token}"
        else:
            positional.append(token)
    free = [n for n in props if n not in args]
    last_text: str | None = None
    for token in positional:
        value = _coerce(props[free[0]], token) if free else token
        if free and (_fits(props[free[0]], value) or last_text is None):
            name = free.pop(0)
            args[name] = value
            if _is_text(props[name]):
                last_text = name
        elif last_text is not None:
            args[last_text] = f"{args[last_text]} {token}"
        else:
            raise CommandError(f"/{tool.name} 不需要这么多参数：{token}")
    return args


def usage_line(tool: Tool) -> str:
    props: dict[str, Any] = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    parts = [f"<{n}>" if n in required else f"[{n}]" for n in props]
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


def format_argument_error(tool: Tool, exc: ArgumentError) -> str:
    lines = [FieldProblem.render(p) for p in exc.problems]
    return "参数有误：\n" + "\n".join(lines) + f"\n用法：{usage_line(tool)}"


def help_text(tools: Toolset, caller: Caller, unavailable: dict[str, str]) -> str:
    """``/help``, generated from tool metadata; only what this caller may use here."""
    lines = ["可用命令："]
    for tool in tools:
        if refusal(tool, caller):
            continue
        summary = " ".join(tool.description.strip().split("\n\n")[0].split())  # the first paragraph
        others = [n for n in (tool.name, *tool.aliases) if n != (tool.aliases[0] if tool.aliases else tool.name)]
        aliases = f"（也可用 {', '.join('/' + a for a in others)}）" if others else ""
        note = f" [未启用：{unavailable[tool.name]}]" if tool.name in unavailable else ""
        lines.append(f"{usage_line(tool)} — {summary}{aliases}{note}")
        if tool.examples:
            lines.append(f"    例：{tool.examples[0]}")
    lines.append("/help — 显示本帮助；也可以直接 @我 用自然语言提问。")
    return "\n".join(lines)
