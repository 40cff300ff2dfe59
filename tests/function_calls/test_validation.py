"""Two-stage argument validation, and what the model hears when it gets arguments wrong."""

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field, field_validator, model_validator

from function_calls import (
    ArgumentError,
    Runner,
    StopReason,
    Tool,
    ToolContext,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text


class Item(BaseModel):
    name: str
    qty: int = Field(ge=1)


class Order(BaseModel):
    kind: Literal["pickup", "delivery"]
    items: list[Item] = Field(min_length=1)
    note: str | None = Field(default=None, max_length=10)
    tip: int = 0

    @field_validator("note")
    @classmethod
    def no_shouting(cls, value: str | None) -> str | None:
        if value is not None and value.isupper():
            raise ValueError("do not shout")
        return value

    @model_validator(mode="after")
    def delivery_needs_tip(self) -> "Order":
        if self.kind == "delivery" and self.tip < 1:
            raise ValueError("delivery needs a tip")
        return self


GOOD = {"kind": "pickup", "items": [{"name": "tea", "qty": 2}]}


def make_tool(seen: list[Order] | None = None, **options: object) -> Tool:
    async def order(c: ToolContext[None], o: Order) -> ToolResult:
        """Place an order."""
        if seen is not None:
            seen.append(o)
        return ToolResult(content=f"ordered {len(o.items)} items")

    return tool_function(**options)(order)  # type: ignore[call-overload, no-any-return]


def problems(raw: str, *, strict: bool = False) -> tuple[str, list[tuple[str, str, str | None]]]:
    with pytest.raises(ArgumentError) as info:
        make_tool().parse_arguments(raw, strict=strict)
    err = info.value
    assert err.tool == "order"
    return err.stage, [(p.path, p.problem, p.value) for p in err.problems]


@pytest.mark.parametrize("raw", ["{", "not json", '{"kind": "pickup",}', "{'kind': 'pickup'}"])
def test_invalid_json_is_an_error_never_an_empty_object(raw: str) -> None:
    stage, found = problems(raw)
    assert stage == "JSON"
    assert len(found) == 1 and found[0][0] == "" and found[0][1].startswith("not valid JSON")


@pytest.mark.parametrize("raw", ["[]", "3", '"text"', "null"])
def test_json_that_is_not_an_object_is_refused(raw: str) -> None:
    stage, found = problems(raw)
    assert (stage, found[0][1]) == ("JSON", "arguments must be a JSON object")


def test_schema_errors_name_each_path_problem_and_value() -> None:
    raw = json.dumps({"kind": "drone", "items": [{"name": "a", "qty": 1}, {"name": 5, "qty": 0}], "extra": True})
    stage, found = problems(raw)
    assert stage == "schema"
    assert found == [
        ("extra", "unknown field (allowed: kind, items, note, tip)", "true"),
        ("items[1].name", "5 is not of type 'string'", "5"),
        ("items[1].qty", "0 is less than the minimum of 1", "0"),
        ("kind", 'must be one of "pickup", "delivery"', '"drone"'),
    ]


def test_missing_fields_are_named_by_their_own_path() -> None:
    stage, found = problems(json.dumps({"items": [{"qty": 1}]}))
    assert stage == "schema"
    assert found == [("items[0].name", "required field is missing", None), ("kind", "required field is missing", None)]


def test_an_empty_argument_string_means_no_arguments() -> None:
    stage, found = problems("")
    assert stage == "schema"
    assert {p for p, _, _ in found} == {"kind", "items"}


def test_pydantic_semantic_errors_come_back_the_same_way() -> None:
    stage, found = problems(json.dumps({**GOOD, "note": "HEY"}))
    assert (stage, found) == ("validation", [("note", "Value error, do not shout", '"HEY"')])
    stage, found = problems(json.dumps({**GOOD, "kind": "delivery"}))
    assert stage == "validation"
    assert found[0][0] == "" and "delivery needs a tip" in found[0][1]


def test_message_for_the_model_lists_every_problem_and_long_values_are_cut() -> None:
    with pytest.raises(ArgumentError) as info:
        make_tool().parse_arguments(json.dumps({**GOOD, "note": "x" * 300}))
    message = info.value.message
    assert message.startswith("Invalid arguments for tool `order` (schema):")
    assert "- note: " in message and "Fix these fields" in message
    value = info.value.problems[0].value
    assert value is not None and len(value) <= 80 and value.endswith("…")


def test_valid_arguments_parse_to_the_model_and_strict_nulls_take_defaults() -> None:
    tool = make_tool()
    parsed = tool.parse_arguments(json.dumps(GOOD))
    assert isinstance(parsed, Order) and parsed.items[0].qty == 2
    strict = tool.parse_arguments(json.dumps({**GOOD, "note": None, "tip": None}), strict=True)
    assert isinstance(strict, Order) and (strict.note, strict.tip) == (None, 0)
    with pytest.raises(ArgumentError):
        tool.parse_arguments(json.dumps({"kind": "pickup", "items": [{"name": "x", "qty": 1}]}), strict=True)


def test_strict_nulls_take_defaults_at_any_depth() -> None:
    """The strict schema makes every field required and nullable, nested ones too: a model that sends
    ``null`` as told gets the default, in an object, a list of objects and an optional object."""

    class When(BaseModel):
        hour: int
        minute: int = 0

    class Stop(BaseModel):
        at: str
        wait: int = 5

    class Trip(BaseModel):
        when: When
        stops: list[Stop]
        back: When | None = None

    async def trip(args: Trip) -> str:
        """Plan a trip."""
        return "ok"

    tool = tool_function(trip)
    sent = {"when": {"hour": 8, "minute": None}, "stops": [{"at": "A", "wait": None}],
            "back": {"hour": 18, "minute": None}}
    assert not list(tool._strict_validator.iter_errors(sent))  # what the strict schema asks for
    parsed = tool.parse_arguments(json.dumps(sent), strict=True)
    assert isinstance(parsed, Trip)
    assert (parsed.when.minute, parsed.stops[0].wait, parsed.back) == (0, 5, When(hour=18, minute=0))
    assert tool.parse_arguments(json.dumps({**sent, "back": None}), strict=True).back is None  # type: ignore[union-attr]


class Cat(BaseModel):
    meows: bool


class Dog(BaseModel):
    barks: bool
    owner: str | None  # required, and may be null


class Cell(BaseModel):
    v: int
    note: str = "-"


class Yard(BaseModel):
    pet: Cat | Dog
    rows: list[list[Cell]] = []


def test_strict_nulls_are_dropped_against_the_branch_the_value_matches_at_any_list_depth() -> None:
    # The first object branch was used (Dog's owner dropped: "Field required"), and one list level only.
    async def yard(args: Yard) -> str:
        """Fill the yard."""
        return "ok"

    tool = tool_function(yard)
    sent = {"pet": {"barks": True, "owner": None}, "rows": [[{"v": 1, "note": None}]]}
    assert not list(tool._strict_validator.iter_errors(sent))  # valid under the strict schema sent
    parsed = tool.parse_arguments(json.dumps(sent), strict=True)
    assert parsed == Yard(pet=Dog(barks=True, owner=None), rows=[[Cell(v=1)]])
    cat = tool.parse_arguments(json.dumps({"pet": {"meows": False}, "rows": None}), strict=True)
    assert cat == Yard(pet=Cat(meows=False))


async def test_in_a_run_the_error_reaches_the_model_and_it_corrects_itself() -> None:
    seen: list[Order] = []
    model = ScriptedModel([call("order", {"kind": "pickup", "items": []}), call("order", GOOD), text("done")])
    result = await Runner(model).run([{"role": "user", "content": "tea"}], Toolset("s", [make_tool(seen)]))
    assert result.stop is StopReason.COMPLETED
    assert result.replies == ["done"]
    assert [o.items[0].name for o in seen] == ["tea"]  # the bad call never reached the handler
    feedback = model.requests[1].messages[-1]
    assert feedback["role"] == "tool"
    assert feedback["tool_call_id"] == result.trace[0].call_id
    assert "items" in feedback["content"] and "Fix these fields" in feedback["content"]
    assert model.requests[2].messages[-1]["content"] == "ordered 1 items"


async def test_after_retries_failures_the_run_ends_with_a_readable_reply() -> None:
    bad = call("order", "{oops")
    model = ScriptedModel([bad, bad, bad, text("never reached")])
    seen: list[Order] = []
    result = await Runner(model).run([{"role": "user", "content": "tea"}], Toolset("s", [make_tool(seen)]))
    assert result.stop is StopReason.TOOL_RETRIES_EXHAUSTED
    assert len(model.requests) == 3  # default retries=2: two corrections allowed, the third failure ends it
    assert seen == []
    assert len(result.replies) == 1 and "order" in result.replies[0]
    assert "Traceback" not in result.replies[0] and "{oops" not in result.replies[0]


async def test_retries_option_is_honoured() -> None:
    model = ScriptedModel([call("order", "{}"), text("never")])
    result = await Runner(model).run([{"role": "user", "content": "x"}], Toolset("s", [make_tool(retries=0)]))
    assert result.stop is StopReason.TOOL_RETRIES_EXHAUSTED
    assert len(model.requests) == 1


async def test_unknown_tool_is_answered_with_the_tools_that_exist() -> None:
    async def menu() -> str:
        """Show the menu."""
        return "tea, coffee"

    model = ScriptedModel([call("ordr", GOOD), text("sorry")])
    tools = Toolset("s", [make_tool(), tool_function(menu)])
    result = await Runner(model).run([{"role": "user", "content": "x"}], tools)
    assert result.stop is StopReason.COMPLETED
    answer = model.requests[1].messages[-1]["content"]
    assert "Unknown tool `ordr`" in answer and "order, menu" in answer
    assert result.trace[0].is_error


async def test_argument_retry_budget_counts_consecutive_failures_only() -> None:
    from pydantic import BaseModel as _Base

    from function_calls import Runner, StopReason, Toolset, tool_function
    from function_calls.testing import ScriptedModel, call, text

    class CountArgs(_Base):
        n: int

    @tool_function(retries=2)
    async def count(args: CountArgs) -> str:
        """Count."""
        return f"counted {args.n}"

    bad = {"n": "many"}
    model = ScriptedModel([call("count", bad), call("count", bad), call("count", {"n": 1}),
                           call("count", bad), call("count", bad), text("done")])
    from function_calls import Limits

    result = await Runner(model, limits=Limits(max_iterations=10, max_tool_calls=10)).run(
        [{"role": "user", "content": "count"}], Toolset("t", [count]))
    assert result.stop is StopReason.COMPLETED  # two failures, a success, two failures: never 3 in a row
    assert result.text == "done"

    model = ScriptedModel([call("count", bad), call("count", bad), call("count", bad), text("never")])
    result = await Runner(model, limits=Limits(max_iterations=10, max_tool_calls=10)).run(
        [{"role": "user", "content": "count"}], Toolset("t", [count]))
    assert result.stop is StopReason.TOOL_RETRIES_EXHAUSTED
