"""A /command's typed values: which fields take a word by position, and the word as the field's type."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

__all__ = ["DATE", "TIME", "coerce", "fits", "is_list", "is_object", "is_text", "schema_branches"]


def schema_branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a field accepts (``anyOf``/``oneOf`` branches, nested ones flattened)."""
    subs = schema.get("anyOf") or schema.get("oneOf")
    return [b for sub in subs for b in schema_branches(sub)] if isinstance(subs, list) else [schema]


def _kinds(branch: dict[str, Any]) -> list[Any]:
    return kind if isinstance(kind := branch.get("type"), list) else [kind]


DATE = re.compile(r"^(\d{4})[-/](\d{1,2})[-/](\d{1,2})$")
TIME = re.compile(r"^(\d{1,2})[:：](\d{2})(?:[:：](\d{2}))?$")


def _when(fmt: str, raw: str) -> str | None:
    """A typed date, time or both in ISO form (``2026/12/1 9：30``), or None if it is not one."""
    day, _, clock = raw.partition(" ") if fmt == "date-time" else (raw, "", raw)
    d, t = DATE.match(day) if fmt != "time" else None, TIME.match(clock) if fmt != "date" else None
    if (fmt != "time" and not d) or (fmt != "date" and not t):
        return raw if fmt == "date-time" and re.match(r"^\d{4}-\d{2}-\d{2}T", raw) else None
    iso_day = f"{d[1]}-{int(d[2]):02d}-{int(d[3]):02d}" if d else ""
    iso_time = f"{int(t[1]):02d}:{t[2]}" + (f":{t[3]}" if t[3] else "") if t else ""
    return " ".join(p for p in (iso_day, iso_time) if p)


def coerce(schema: dict[str, Any], raw: str) -> Any:
    """A typed value as the field's type: the first alternative it reads as (number, choice, list...)."""
    branches = schema_branches(schema)
    kinds = {k for b in branches for k in _kinds(b)}
    if "null" in kinds and raw.lower() in ("none", "null", ""):
        return None
    with contextlib.suppress(ValueError):
        if "integer" in kinds or "number" in kinds:  # (5 for a Decimal: not 5.0)
            return int(raw) if "integer" in kinds or re.fullmatch(r"[-+]?\d+", raw) else float(raw)
    if "boolean" in kinds and raw.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return raw.lower() in ("true", "yes", "1", "on")
    if ("array" in kinds and raw[:1] == "[") or ("object" in kinds and raw[:1] == "{"):
        with contextlib.suppress(ValueError):
            return json.loads(raw)
    if (array := next((b for b in branches if "array" in _kinds(b)), None)) is not None:
        parts, fixed = [p.strip() for p in re.split(r"[,，]", raw) if raw.strip()], array.get("prefixItems", [])
        return [coerce(fixed[i] if i < len(fixed) else array.get("items", {}), p) for i, p in enumerate(parts)]
    when = [b["format"] for b in branches if b.get("format") in ("date", "time", "date-time")]
    return next((iso for fmt in when if (iso := _when(fmt, raw)) is not None), raw)  # (else validation says)


def is_text(schema: dict[str, Any]) -> bool:
    """Free text: strings only, without a format, pattern or choices (a date is not free text)."""
    return all(set(_kinds(b)) <= {"string", "null"} and "string" in _kinds(b)
               and not {"format", "pattern", "enum"} & b.keys() for b in schema_branches(schema) if b != {"type": "null"})


def is_object(schema: dict[str, Any]) -> bool:
    """Typed by name only, as JSON: every alternative is an object (a model, a dict)."""
    return {k for b in schema_branches(schema) for k in _kinds(b)} - {"null"} == {"object"}


def is_list(schema: dict[str, Any]) -> bool:
    return any("array" in _kinds(b) for b in schema_branches(schema))


def fits(schema: dict[str, Any], value: Any) -> bool:
    """Whether a coerced positional value plausibly belongs to this field (some alternative takes it)."""
    for branch in schema_branches(schema):
        kinds, fmt, pattern = _kinds(branch), branch.get("format"), branch.get("pattern")
        if "enum" in branch:
            ok = value in branch["enum"]
        elif isinstance(value, list):
            ok = "array" in kinds and all(fits(branch.get("items", {}), v) for v in value)
        elif not isinstance(value, str):  # (a number, a boolean or null, read as this field's own type)
            ok = True
        elif "string" not in kinds:
            ok = False
        elif fmt in ("date", "time", "date-time"):
            ok = _when(fmt, value) is not None
        elif isinstance(pattern, str):
            try:
                ok = re.search(pattern, value) is not None
            except re.error:  # (a Python-only pattern: validation decides)
                ok = True
        else:  # (a uuid, an email: validation decides) a number's string form (Decimal) takes no word
            ok = fmt is not None or is_text(schema)
        if ok:
            return True
    return False
