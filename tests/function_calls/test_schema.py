"""Tool definitions: OpenAI shape, compact JSON Schema, strict variant, definition errors."""

import enum
import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field, RootModel

from function_calls import (
    Caller,
    Tool,
    ToolContext,
    ToolDefinitionError,
    Toolset,
    compact_schema,
    strict_schema,
    tool_function,
)
from function_calls.schema import EMPTY_PARAMETERS


class ReminderArgs(BaseModel):
    type: Literal["once", "daily", "weekly"] = Field(description="once = one time; daily; weekly")
    time: str = Field(description="once: 'YYYY-MM-DD HH:MM[:SS]' in the chat's zone; daily/weekly: 'HH:MM'")
    content: str = Field(description="text sent to the user when it fires", max_length=500)
    weekday: int | None = Field(default=None, ge=0, le=6, description="weekly only: 0=Monday ... 6=Sunday")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Note(BaseModel):
    """A note; its field named title must survive title-stripping."""

    title: str = Field(description="the note's title", min_length=1)
    tags: list[str] = []


class Outer(BaseModel):
    note: Note
    notes: list[Note] = []
    maybe_note: Note | None = None
    color: Color = Color.RED
    mode: Literal["fast"] = "fast"
    level: Literal["low", "high"] | None = None


def _tool(model: type[BaseModel], name: str = "t") -> Tool:
    async def handler(c: ToolContext[None], a: model) -> str:  # type: ignore[valid-type]
        """Doc."""
        return ""

    return tool_function(name=name)(handler)


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema node (dicts), skipping the names inside ``properties``."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    yield from _walk(sub)
            elif key != "default":
                yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_reminder_args_definition_is_exactly_the_compact_openai_shape() -> None:
    tool = _tool(ReminderArgs, "reminder_set")
    assert tool.definition() == {
        "type": "function",
        "function": {
            "name": "reminder_set",
            "description": "Doc.",
            "parameters": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["once", "daily", "weekly"],
                             "description": "once = one time; daily; weekly"},
                    "time": {"type": "string", "description": ReminderArgs.model_fields["time"].description},
                    "content": {"type": "string", "maxLength": 500,
                                "description": "text sent to the user when it fires"},
                    "weekday": {"type": ["integer", "null"], "minimum": 0, "maximum": 6,
                                "description": "weekly only: 0=Monday ... 6=Sunday"},
                },
                "required": ["type", "time", "content"],
                "additionalProperties": False,
            },
        },
    }


def test_nested_models_are_inlined_without_titles_and_closed() -> None:
    params = _tool(Outer).parameters
    text = json.dumps(params)
    assert "$ref" not in text and "$defs" not in text
    assert all("title" not in node for node in _walk(params))
    objects = [n for n in _walk(params) if n.get("type") == "object" or "object" in (n.get("type") or [])]
    assert len(objects) == 4  # root, note, notes[], maybe_note
    assert all(n["additionalProperties"] is False for n in objects)
    note = params["properties"]["note"]
    assert note["properties"]["title"] == {"type": "string", "minLength": 1, "description": "the note's title"}
    assert note["required"] == ["title"]
    assert params["properties"]["notes"]["items"]["properties"]["title"]["type"] == "string"
    assert params["properties"]["maybe_note"]["type"] == ["object", "null"]
    jsonschema.Draft202012Validator.check_schema(params)


def test_literal_enum_and_optional_render_as_enum_and_nullable() -> None:
    props = _tool(Outer).parameters["properties"]
    assert props["color"]["enum"] == ["red", "blue"]
    assert props["color"]["default"] == "red"
    assert props["mode"]["enum"] == ["fast"]  # a one-value Literal (const) becomes an enum
    assert "const" not in props["mode"]
    assert props["level"]["type"] == ["string", "null"]
    assert props["level"]["enum"] == ["low", "high", None]
    assert "anyOf" not in props["level"] and "default" not in props["level"]


def test_strict_variant_requires_everything_and_makes_optionals_nullable() -> None:
    tool = _tool(ReminderArgs)
    strict = tool.definition(strict=True)["function"]
    assert strict["strict"] is True
    params = strict["parameters"]
    assert params["required"] == ["type", "time", "content", "weekday"]
    assert params["properties"]["weekday"]["type"] == ["integer", "null"]
    assert params["properties"]["type"]["type"] == "string"  # required fields stay non-nullable
    outer = _tool(Outer).strict_parameters
    assert outer["properties"]["color"]["type"] == ["string", "null"]
    assert None in outer["properties"]["color"]["enum"]
    assert outer["properties"]["note"]["properties"]["tags"]["type"] == ["array", "null"]
    assert all("default" not in node for node in _walk(outer))
    for node in _walk(outer):
        if "properties" in node:
            assert node["required"] == list(node["properties"])
            assert node["additionalProperties"] is False
    assert "strict" not in tool.definition()["function"]


class Counts(BaseModel):
    counts: dict[str, int] = {}
    extra: dict[str, Any] = {}
    name: str = ""


def test_a_tool_with_a_dict_field_is_sent_non_strict(caplog: pytest.LogCaptureFixture) -> None:
    # OpenAI strict mode wants additionalProperties: false on every object: the request was refused
    # (counts), or the model could pass no key at all (extra).
    with caplog.at_level("INFO", logger="function_calls.tool"):
        tool = _tool(Counts)
    assert "counts" in caplog.text and "strict" in caplog.text
    fn = tool.definition(strict=True)["function"]
    assert fn["strict"] is False and fn["parameters"] == tool.parameters
    parsed = tool.parse_arguments(json.dumps({"counts": {"a": 1}, "extra": {"k": [1]}}), strict=True)
    assert parsed == Counts(counts={"a": 1}, extra={"k": [1]})
    assert _tool(ReminderArgs).definition(strict=True)["function"]["strict"] is True


def test_strict_schema_does_not_mutate_its_input() -> None:
    compact = compact_schema(ReminderArgs, "t")
    before = json.dumps(compact, sort_keys=True)
    strict_schema(compact)
    assert json.dumps(compact, sort_keys=True) == before


def test_identity_never_appears_in_any_schema() -> None:
    tool = _tool(ReminderArgs)
    for variant in (tool.definition(), tool.definition(strict=True)):
        text = json.dumps(variant)
        for identity in [*Caller.model_fields, "ctx", "ToolContext"]:
            assert f'"{identity}"' not in text


class Opaque:
    pass


class OpaqueArgs(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


class AnyArgs(BaseModel):
    value: Any


class ObjectArgs(BaseModel):
    value: object


class Node(BaseModel):
    children: list["Node"] = []


class HoldsNode(BaseModel):
    root: Node


class ListRoot(RootModel[list[int]]):
    pass


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        (OpaqueArgs, "cannot derive"),
        (AnyArgs, "field value has no JSON type"),
        (ObjectArgs, "field value has no JSON type"),
        (Node, "recursive model 'Node'"),
        (HoldsNode, "recursive model 'Node' at root.children[]"),
        (ListRoot, "must be an object"),
    ],
)
def test_unsupported_models_raise_definition_errors_naming_the_tool(model: type[BaseModel], hint: str) -> None:
    with pytest.raises(ToolDefinitionError) as info:
        _tool(model, "my_tool")
    assert "'my_tool'" in str(info.value)
    assert hint in str(info.value)


def test_a_model_used_twice_side_by_side_is_not_mistaken_for_recursion() -> None:
    class Pair(BaseModel):
        left: Note
        right: Note

    params = _tool(Pair).parameters
    assert params["properties"]["left"] == params["properties"]["right"]


def test_empty_parameters_and_toolset_definitions() -> None:
    async def ping() -> str:
        """Ping."""
        return "pong"

    tool = tool_function(ping)
    assert tool.parameters == EMPTY_PARAMETERS
    assert tool.parameters is not EMPTY_PARAMETERS  # a copy: callers cannot corrupt the constant
    names = [t.definition()["function"]["name"] for t in Toolset("s", [tool, _tool(ReminderArgs, "r")])]
    assert names == ["ping", "r"]
