"""JSON Schema for OpenAI-compatible tool definitions, derived from a Pydantic model.

Pydantic's ``model_json_schema()`` is made compact and portable: ``$ref`` inlined, no
``title`` noise, ``additionalProperties: false`` everywhere, single-value Literals as
``enum``, ``Optional[X]`` as a nullable type. The strict variant also lists every property
as required (optional ones become nullable) and drops ``default``, as OpenAI's strict mode wants.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
from pydantic import BaseModel
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

from function_calls.errors import ToolDefinitionError

__all__ = ["EMPTY_PARAMETERS", "compact_schema", "drop_nulls", "not_strict", "strict_schema"]

JSON = dict[str, Any]

EMPTY_PARAMETERS: JSON = {"type": "object", "properties": {}, "additionalProperties": False}

_DROP = frozenset({"title", "$defs", "definitions"})


def compact_schema(model: type[BaseModel], tool: str) -> JSON:
    """The parameters schema sent to the model; raises :class:`ToolDefinitionError` naming ``tool``."""
    try:
        raw = model.model_json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError) as exc:
        raise ToolDefinitionError(f"tool {tool!r}: cannot derive a JSON Schema from {model.__name__}: {exc}") from exc
    defs: JSON = raw.get("$defs", {})
    out = _clean(raw, defs, tool, path="", seen=())
    if out.get("type") != "object":
        raise ToolDefinitionError(f"tool {tool!r}: the argument model must be an object")
    out.pop("description", None)  # the model's class docstring: the tool's description already says it
    return out


def strict_schema(schema: JSON) -> JSON:
    """OpenAI strict-mode variant of a :func:`compact_schema` result."""
    out = copy.deepcopy(schema)
    _strictify(out)
    return out


def _clean(node: JSON, defs: JSON, tool: str, path: str, seen: tuple[str, ...]) -> JSON:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            raise ToolDefinitionError(f"tool {tool!r}: recursive model {name!r} at {path or 'root'} is not supported")
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _clean(merged, defs, tool, path, (*seen, name))
    out: JSON = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _clean(sub, defs, tool, f"{path}.{name}".lstrip("."), seen) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _clean(value, defs, tool, f"{path}[]", seen)
        elif key in ("anyOf", "oneOf", "allOf"):
            out[key] = [_clean(sub, defs, tool, path, seen) for sub in value]
        elif key == "prefixItems":
            out[key] = [_clean(sub, defs, tool, f"{path}[]", seen) for sub in value]
        else:
            out[key] = value
    if "default" in out and out["default"] is None:
        del out["default"]  # "default: null" tells the model nothing that nullability does not
    if "const" in out and "enum" not in out:
        out["enum"] = [out.pop("const")]
    _collapse_nullable(out)
    is_map = isinstance(out.get("additionalProperties"), dict)  # dict[str, X]: keys are free, values typed
    if (out.get("type") == "object" or "properties" in out) and not is_map:
        out.setdefault("type", "object")
        out.setdefault("properties", {})
        out.setdefault("additionalProperties", False)
    if not _has_type(out):
        raise ToolDefinitionError(
            f"tool {tool!r}: field {path or '<root>'} has no JSON type (Any or an unsupported type); "
            "give it a concrete annotation"
        )
    return out


def _has_type(node: JSON) -> bool:
    return any(k in node for k in ("type", "enum", "anyOf", "oneOf", "allOf"))


def _collapse_nullable(node: JSON) -> None:
    """``anyOf: [{type: X, ...}, {type: null}]`` -> ``{type: [X, "null"], ...}``."""
    variants = node.get("anyOf")
    if not isinstance(variants, list) or len(variants) != 2:
        return
    nulls = [v for v in variants if v == {"type": "null"}]
    others = [v for v in variants if v != {"type": "null"}]
    if len(nulls) != 1 or len(others) != 1 or not isinstance(others[0].get("type"), str):
        return
    inner = dict(others[0])
    del node["anyOf"]
    inner["type"] = [inner["type"], "null"]
    if "enum" in inner:
        inner["enum"] = [*inner["enum"], None]
    for key, value in inner.items():
        node.setdefault(key, value)


def _strictify(node: JSON) -> None:
    node.pop("default", None)
    props = node.get("properties")
    if isinstance(props, dict):
        required = set(node.get("required", []))
        for name, sub in props.items():
            if name not in required:
                _make_nullable(sub)
            _strictify(sub)
        node["required"] = list(props)
        if not isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _strictify(node[key])
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key, []):
            _strictify(sub)


def _make_nullable(node: JSON) -> None:
    kind = node.get("type")
    if isinstance(kind, str) and kind != "null":
        node["type"] = [kind, "null"]
        if "enum" in node and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
    elif isinstance(kind, list) and "null" not in kind:
        node["type"] = [*kind, "null"]
    elif kind is None and "anyOf" in node and {"type": "null"} not in node["anyOf"]:
        node["anyOf"] = [*node["anyOf"], {"type": "null"}]


def not_strict(schema: JSON, path: str = "") -> str | None:
    """Where ``schema`` has a map (``dict[str, X]``: an object with free keys), which OpenAI's strict
    mode cannot describe (it wants ``additionalProperties: false`` on every object); None if nowhere."""
    if ("object" in _kinds(schema) or "properties" in schema) and schema.get("additionalProperties", False) is not False:
        return path or "<root>"
    subs = [(f"{path}.{n}".lstrip("."), sub) for n, sub in schema.get("properties", {}).items()]
    subs += [(f"{path}[]", sub) for sub in (schema.get("items"), *schema.get("prefixItems", [])) if isinstance(sub, dict)]
    subs += [(path, sub) for key in ("anyOf", "oneOf", "allOf") for sub in schema.get(key, [])]
    return next((found for where, sub in subs if (found := not_strict(sub, where)) is not None), None)


def drop_nulls(value: Any, schema: JSON) -> Any:
    """``value`` (as the strict variant of ``schema`` asks: a null for every optional field) without
    the nulls ``schema`` does not allow, at any depth, so the model's defaults apply. In a union the
    branch the value matches decides (a field one branch requires may be null)."""
    branch = _branch(value, schema)
    if isinstance(value, dict):
        props: JSON = branch.get("properties", {})
        free = branch.get("additionalProperties")
        subs = {key: props.get(key, free if isinstance(free, dict) else {}) for key in value}
        return {key: drop_nulls(v, subs[key]) for key, v in value.items()
                if v is not None or key not in props or "null" in _kinds(subs[key]) or _null_branch(subs[key])}
    if isinstance(value, list) and isinstance(items := branch.get("items"), dict):
        return [drop_nulls(v, items) for v in value]
    return value


def _kinds(schema: JSON) -> list[Any]:
    return kind if isinstance(kind := schema.get("type"), list) else [kind]


def _null_branch(schema: JSON) -> bool:
    return any(b.get("type") == "null" or "null" in _kinds(b) for b in schema.get("anyOf", []) + schema.get("oneOf", []))


def _branch(value: Any, schema: JSON) -> JSON:
    """The alternative of ``schema`` that ``value`` (an object or a list) belongs to: the only one of its
    kind, else the first whose strict variant it is valid under."""
    alternatives = [*schema.get("anyOf", []), *schema.get("oneOf", [])] or [schema]
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else None
    same = [b for b in alternatives if kind in _kinds(b) or (kind == "object" and "properties" in b)]
    if len(same) > 1:
        return next((b for b in same if jsonschema.Draft202012Validator(strict_schema(b)).is_valid(value)), same[0])
    return same[0] if same else schema
