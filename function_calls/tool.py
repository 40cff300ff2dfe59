"""``@tool_function``, :class:`Tool` and :class:`Toolset`.

Everything a tool needs at run time (the OpenAI definition, its strict variant, the compiled
JSON-Schema validators, the Pydantic validator) is built once, when the function is decorated.
Decorating mutates no global state: tools are collected from the modules a bot loads.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, overload

import jsonschema
from pydantic import BaseModel, ValidationError

from function_calls.context import Caller, ToolContext, ToolResult
from function_calls.errors import ArgumentError, FieldProblem, ToolDefinitionError
from function_calls.problems import field_path, schema_problems, short_value
from function_calls.schema import EMPTY_PARAMETERS, compact_schema, drop_nulls, not_strict, strict_schema
from function_calls.threads import SyncCalls

__all__ = ["Confirm", "Scope", "Tool", "Toolset", "collect_tools", "tool_function"]

log = logging.getLogger(__name__)

Scope = Literal["group", "private", "both"]
#: Who must agree before a ``confirm`` tool runs (see :attr:`Tool.confirm`).
Confirm = Literal["requester", "admin", "input"]
Result = ToolResult | str | dict[str, Any] | None
Handler = Callable[..., Awaitable[Result] | Result]
#: Larger argument strings are refused before parsing: no tool needs them, and parsing costs.
MAX_ARGUMENT_CHARS = 64_000
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # what OpenAI accepts for a function name


@dataclass(frozen=True, eq=False)
class Tool:
    """A validated, callable tool. Build one with :func:`tool_function`."""

    name: str
    description: str
    handler: Handler
    args_model: type[BaseModel] | None
    parameters: dict[str, Any]
    strict_parameters: dict[str, Any]
    examples: tuple[str, ...] = ()
    scope: Scope = "both"
    require_at: bool = False
    admin_only: bool = False
    group_admin: bool = False
    #: Who must agree before the call runs: the ``"requester"``, an ``"admin"`` (approver), or the
    #: asker's ``"input"`` (``ask_user``); None runs at once. The bot pauses the run until then.
    confirm: Confirm | None = None
    retries: int = 2
    timeout_s: float = 30.0
    sequential: bool = False
    aliases: tuple[str, ...] = ()
    hash_exclude: tuple[str, ...] = ()
    #: Declared free of side effects: a run stopped short neither names its calls nor warns not to ask again.
    read_only: bool = False
    #: False when OpenAI's strict mode cannot describe its arguments (a dict field): with ``strict_tools``
    #: it is still sent, and checked, non-strict (``strict: false``).
    strict_ok: bool = True
    _takes_ctx: bool = field(default=False, repr=False)
    _validator: Any = field(default=None, repr=False)
    _strict_validator: Any = field(default=None, repr=False)
    _sync: SyncCalls = field(default_factory=SyncCalls, repr=False)

    def definition(self, *, strict: bool = False) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        fn: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.strict_parameters if strict else self.parameters,
        }
        if strict:
            fn["strict"] = self.strict_ok
        return {"type": "function", "function": fn}

    def allowed_for(self, caller: Caller) -> bool:
        """Scope, @-requirement and admin rules: a tool that fails this is neither offered nor run.

        ``admin_only``: the bot's admins (``[bot] admins``) only; owning a group is not enough,
        since anyone can create one and add the bot. ``group_admin``: a group's owner or admins
        acting in that group (and the bot's admins anywhere).
        """
        if self.scope != "both" and self.scope != caller.chat_kind:
            return False
        if self.require_at and caller.chat_kind == "group" and not caller.addressed:
            return False
        if self.admin_only and not caller.bot_admin:
            return False
        return not (self.group_admin and not caller.group_admin)

    def parse_arguments(self, raw: str | dict[str, Any] | None, *, strict: bool = False) -> BaseModel | None:
        """Raw JSON -> JSON Schema (as sent) -> Pydantic. Raises :class:`ArgumentError`."""
        strict = strict and self.strict_ok
        if isinstance(raw, dict):
            data: Any = raw
        else:
            text = (raw or "").strip()
            if not text:
                text = "{}"  # an empty string is how some providers send "no arguments"
            if len(text) > MAX_ARGUMENT_CHARS:
                problem = FieldProblem("", f"arguments are {len(text)} characters; the limit is {MAX_ARGUMENT_CHARS}")
                raise ArgumentError(self.name, "JSON", [problem])
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                problem = FieldProblem("", f"not valid JSON: {exc.msg} at char {exc.pos}", short_value(text))
                raise ArgumentError(self.name, "JSON", [problem]) from None
            except RecursionError:
                raise ArgumentError(self.name, "JSON", [FieldProblem("", "JSON nested too deeply")]) from None
        if not isinstance(data, dict):
            raise ArgumentError(self.name, "JSON", [FieldProblem("", "arguments must be a JSON object", short_value(data))])
        validator = self._strict_validator if strict else self._validator
        problems = schema_problems(validator.iter_errors(data))
        if problems:
            raise ArgumentError(self.name, "schema", problems)
        if self.args_model is None:
            return None
        if strict:  # strict mode sends null for optional fields, nested ones too; the model's defaults apply
            data = drop_nulls(data, self.parameters)
        try:
            return self.args_model.model_validate(data)
        except ValidationError as exc:
            raise ArgumentError(
                self.name,
                "validation",
                [FieldProblem(field_path(e["loc"]), e["msg"], short_value(given := e.get("input")), kind=e["type"],
                              limit=next(iter(e.get("ctx", {}).values()), None),
                              length=len(given) if isinstance(given, str) else None) for e in exc.errors()],
            ) from None

    async def invoke(self, ctx: ToolContext[Any], args: BaseModel | None) -> ToolResult:
        """Run the handler and normalise its result. A sync handler runs on a thread of the tools' own
        pool; past its timeout it keeps running (a thread cannot be stopped), see :mod:`function_calls.threads`."""
        call_args: list[Any] = []
        if self._takes_ctx:
            call_args.append(ctx)
        if self.args_model is not None:
            call_args.append(args)
        if inspect.iscoroutinefunction(self.handler):
            result = await self.handler(*call_args)
        else:
            result = await self._sync.run(self.name, self.timeout_s, _run_sync, self.handler, *call_args)
            if inspect.isawaitable(result):
                result = await result
        return _as_result(self.name, result)


def _as_result(name: str, result: object) -> ToolResult:
    """A handler's return value as a result. Whatever it returned, it ran: the model must never hear
    of a failure (it would call again, and the action happen twice)."""
    if isinstance(result, ToolResult):
        return result
    if isinstance(result, str):
        return ToolResult(content=result)
    if result is None:
        return ToolResult(content="done")
    if isinstance(result, dict):
        with contextlib.suppress(TypeError, ValueError, RecursionError):  # (a key that is not text, a cycle)
            return ToolResult(content=json.dumps(result, ensure_ascii=False, default=str), data=result)
    log.error("tool %s returned %s, not ToolResult, str, dict or None", name, type(result).__name__)
    return ToolResult(content=f"`{name}` ran, but its result could not be read (it returned "
                              f"{type(result).__name__}); do not call it again for this.")


def _run_sync(handler: Callable[..., Any], *args: Any) -> Any:
    """A sync handler's call on its worker thread. A StopIteration (a ``next()`` on an empty
    result) cannot cross into the awaiting future: the call would hang until its timeout. It
    becomes the RuntimeError a coroutine's StopIteration becomes."""
    try:
        return handler(*args)
    except StopIteration as exc:
        raise RuntimeError("the tool's handler raised StopIteration") from exc


def _classify(tool: str, fn: Callable[..., Any]) -> tuple[bool, type[BaseModel] | None]:
    """Find the context parameter and the argument model by annotation, whatever their names."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {tool!r}: cannot resolve annotations: {exc}") from exc
    takes_ctx = False
    model: type[BaseModel] | None = None
    params = list(inspect.signature(fn).parameters.values())
    for index, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {tool!r}: *args/**kwargs are not supported")
        hint = hints.get(param.name)
        if hint is None:
            raise ToolDefinitionError(
                f"tool {tool!r}: parameter {param.name!r} has no annotation; annotate it with ToolContext or a "
                "pydantic BaseModel"
            )
        base = get_origin(hint) or hint
        if base is ToolContext:
            if index != 0:
                raise ToolDefinitionError(f"tool {tool!r}: the ToolContext parameter must come first")
            takes_ctx = True
        elif isinstance(base, type) and issubclass(base, BaseModel):
            if model is not None:
                raise ToolDefinitionError(f"tool {tool!r}: only one pydantic argument model is allowed")
            model = base
        else:
            raise ToolDefinitionError(
                f"tool {tool!r}: parameter {param.name!r} is annotated {hint!r}; expected ToolContext or a "
                "pydantic BaseModel subclass"
            )
    ret = hints.get("return")
    if ret is not None and not _returns_ok(ret):
        raise ToolDefinitionError(f"tool {tool!r}: return annotation must be ToolResult, str, dict, None or a union")
    return takes_ctx, model


def _returns_ok(ret: Any) -> bool:
    if ret in (ToolResult, str, dict, type(None)) or get_origin(ret) is dict:
        return True
    if get_origin(ret) in (typing.Union, types.UnionType):
        return all(_returns_ok(a) for a in get_args(ret))
    return False


@overload
def tool_function(fn: Handler, /) -> Tool: ...
@overload
def tool_function(
    *,
    name: str | None = None,
    description: str | None = None,
    examples: Sequence[str] = (),
    scope: Scope = "both",
    require_at: bool = False,
    admin_only: bool = False,
    group_admin: bool = False,
    confirm: bool | Confirm | None = None,
    retries: int = 2,
    timeout_s: float = 30.0,
    sequential: bool = False,
    aliases: Sequence[str] = (),
    hash_exclude: Sequence[str] = (),
    read_only: bool = False,
) -> Callable[[Handler], Tool]: ...
def tool_function(
    fn: Handler | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    examples: Sequence[str] = (),
    scope: Scope = "both",
    require_at: bool = False,
    admin_only: bool = False,
    group_admin: bool = False,
    confirm: bool | Confirm | None = None,
    retries: int = 2,
    timeout_s: float = 30.0,
    sequential: bool = False,
    aliases: Sequence[str] = (),
    hash_exclude: Sequence[str] = (),
    read_only: bool = False,
) -> Tool | Callable[[Handler], Tool]:
    """Declare a tool: ``async def f(ctx: ToolContext[D], args: Model) -> ToolResult | str``.

    Usable bare (``@tool_function``) or with options. Mistakes raise :class:`ToolDefinitionError`
    here, at decoration, with the tool's name.
    """

    def build(func: Handler) -> Tool:
        tool_name: str = name or str(getattr(func, "__name__", ""))
        if not _NAME.fullmatch(tool_name):
            raise ToolDefinitionError(f"tool name {tool_name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if scope not in ("group", "private", "both"):
            raise ToolDefinitionError(f"tool {tool_name!r}: scope must be group, private or both, not {scope!r}")
        if confirm not in (None, False, True, "requester", "admin", "input"):
            raise ToolDefinitionError(f"tool {tool_name!r}: confirm must be True, 'requester' or 'admin', not {confirm!r}")
        if retries < 0 or timeout_s <= 0:
            raise ToolDefinitionError(f"tool {tool_name!r}: retries must be >= 0 and timeout_s > 0")
        desc = description if description is not None else inspect.getdoc(func)
        if not desc:
            raise ToolDefinitionError(f"tool {tool_name!r}: needs a docstring or description= (the model reads it)")
        takes_ctx, model = _classify(tool_name, func)
        params = compact_schema(model, tool_name) if model is not None else dict(EMPTY_PARAMETERS)
        if (where := not_strict(params)) is not None:
            log.info("tool %r: field %s is a dict, which OpenAI strict mode cannot describe: the tool is sent "
                     "with strict: false even when [llm] strict_tools is on", tool_name, where)
        strict = strict_schema(params) if where is None else params  # (never an invalid strict schema)
        validator_cls = jsonschema.Draft202012Validator
        for schema in (params, strict):
            validator_cls.check_schema(schema)
        tool = Tool(
            name=tool_name, description=desc.strip(), handler=func, args_model=model,
            parameters=params, strict_parameters=strict, examples=tuple(examples), scope=scope,
            require_at=require_at, admin_only=admin_only, group_admin=group_admin,
            confirm="admin" if confirm is True else (confirm or None), retries=retries,
            timeout_s=timeout_s, sequential=sequential,
            aliases=tuple(a.lstrip("/") for a in aliases), hash_exclude=tuple(hash_exclude), read_only=read_only,
            strict_ok=where is None, _takes_ctx=takes_ctx, _validator=validator_cls(params),
            _strict_validator=validator_cls(strict),
        )
        return tool

    return build(fn) if fn is not None else build


class Toolset:
    """A named group of tools; names (and command aliases) are unique within a set."""

    def __init__(self, name: str, tools: Iterable[Tool] = ()) -> None:
        self.name = name
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> Tool:
        """Register a tool; a second tool with the same name or alias is a :class:`ToolDefinitionError`."""
        if not isinstance(tool, Tool):
            raise ToolDefinitionError(f"toolset {self.name!r}: {tool!r} is not a Tool (decorate it with @tool_function)")
        if tool.name in self._tools:
            raise ToolDefinitionError(f"toolset {self.name!r}: two tools are named {tool.name!r}")
        taken = {a.casefold() for t in self._tools.values() for a in (t.name, *t.aliases)}
        # A name equal to another tool's alias would make /name ambiguous too; a typed /command has no case.
        clash = [a for a in (tool.name, *tool.aliases) if a.casefold() in taken]
        if clash:
            raise ToolDefinitionError(f"toolset {self.name!r}: tool {tool.name!r}: name or alias {clash[0]!r} is already taken")
        self._tools[tool.name] = tool
        return tool

    def merge(self, other: Toolset) -> Toolset:
        """A new set holding both; a duplicate name is an error naming both sets."""
        merged = Toolset(f"{self.name}+{other.name}", self)
        for tool in other:
            try:
                merged.add(tool)
            except ToolDefinitionError as exc:
                raise ToolDefinitionError(f"{exc} (while adding toolset {other.name!r} to {self.name!r})") from None
        return merged

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def resolve(self, name_or_alias: str) -> Tool | None:
        """A tool by name or by command alias, whatever its case (a typed ``/command`` is lowercased)."""
        key = name_or_alias.lstrip("/")
        if (exact := self._tools.get(key)) is not None:
            return exact
        key = key.casefold()
        return next((t for t in self._tools.values() if key in (a.casefold() for a in (t.name, *t.aliases))), None)

    def names(self) -> list[str]:
        return list(self._tools)

    def filter(self, keep: Callable[[Tool], bool]) -> Toolset:
        # A subset of a valid set is valid: no per-tool clash check (quadratic, and run per message).
        subset = Toolset(self.name)
        subset._tools = {name: t for name, t in self._tools.items() if keep(t)}
        return subset

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"Toolset({self.name!r}, {self.names()})"


def collect_tools(module: types.ModuleType) -> Toolset:
    """The tools a module defines: every module-level :class:`Tool`, in definition order.

    A tool it imported (``from search import perplexity_search``) is another plugin's, not offered
    with this one; a package's own submodules' tools are its own. To offer another's tool, declare a
    ``plugin = Plugin(...)`` listing it.
    """
    inside = f"{module.__name__}." if hasattr(module, "__path__") else None
    seen: set[int] = set()
    found: list[Tool] = []
    for value in vars(module).values():
        candidates = list(value) if isinstance(value, Toolset) else [value]
        for tool in candidates:
            where = str(getattr(tool.handler, "__module__", "")) if isinstance(tool, Tool) else ""
            mine = where == module.__name__ or (inside is not None and where.startswith(inside))
            if isinstance(tool, Tool) and id(tool) not in seen and mine:
                seen.add(id(tool))
                found.append(tool)
    return Toolset(module.__name__.rsplit(".", 1)[-1], found)
