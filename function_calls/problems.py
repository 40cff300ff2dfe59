"""Field-level problems from jsonschema's and pydantic's errors, short enough to send to a model."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from function_calls.errors import FieldProblem

__all__ = ["field_path", "mend_text", "schema_problems", "short_value"]

_MAX_VALUE_CHARS = 80
_MAX_MESSAGE_CHARS = 160


def field_path(parts: Iterable[Any]) -> str:
    """``a.b[0].c`` from a location's parts."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def mend_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (half an emoji, which a peer, a model or a
    tool may send as a JSON ``\\ud83d`` escape) becomes U+FFFD; any other text is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def short_value(value: Any) -> str:
    """A JSON rendering of a value, cut to a readable length; lone surrogates made safe to send."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        text = repr(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"


def _cut(message: str) -> str:
    """jsonschema's messages embed the whole offending value: keep them short (the value is shown apart).

    The cut is in the middle: the reason ("is too long") comes after the value and must survive.
    """
    message = message.encode("utf-8", "replace").decode("utf-8")
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    half = (_MAX_MESSAGE_CHARS - 1) // 2
    return message[:half] + "…" + message[-half:]


_LENGTH_REASONS = {"maxLength": "is too long: at most {} characters", "minLength": "is too short: at least {} characters",
                   "maxItems": "has too many items: at most {}", "minItems": "has too few items: at least {}"}


def schema_problems(errors: Iterable[Any]) -> list[FieldProblem]:
    """jsonschema's errors as field problems: one per field, short, with the reason kept."""
    problems: list[FieldProblem] = []
    for err in errors:
        if err.validator == "required" and isinstance(err.instance, dict):
            # Point at the missing field itself, not at its parent object (one entry per field).
            missing = err.message.split(" is a required property")[0].strip("'\"")
            if missing in err.validator_value and missing not in err.instance:
                problems.append(FieldProblem(field_path([*err.absolute_path, missing]), "required field is missing",
                                             kind="required"))
                continue
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = err.schema.get("properties", {})
            allowed = ", ".join(known) or "none"
            problems.extend(
                FieldProblem(field_path([*err.absolute_path, k]), f"unknown field (allowed: {allowed})", short_value(v),
                             kind="additionalProperties", limit=list(known), length=len(v) if isinstance(v, str) else None)
                for k, v in err.instance.items() if k not in known
            )
            continue
        if err.validator in _LENGTH_REASONS:
            message = _LENGTH_REASONS[err.validator].format(err.validator_value)
        else:
            message = _cut(err.message) if err.validator != "enum" else _enum_msg(err)
        problems.append(FieldProblem(field_path(err.absolute_path), message, short_value(err.instance), kind=str(err.validator),
                                     limit=err.validator_value, length=len(err.instance) if isinstance(err.instance, str) else None))
    return sorted(problems, key=lambda p: p.path)


def _enum_msg(err: Any) -> str:
    return "must be one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in err.validator_value)
