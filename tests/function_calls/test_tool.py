"""@tool_function, Tool.invoke, Toolset and collect_tools."""

import asyncio
import contextlib
import json
import sys
import threading
import types
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel, Field

import function_calls
from function_calls import (
    Caller,
    Runner,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    ToolResult,
    Toolset,
    collect_tools,
    tool_function,
)
from function_calls.testing import ScriptedModel, call, text


class Args(BaseModel):
    city: str = Field(description="city name")
    days: int = 1


def ctx(**caller: Any) -> ToolContext[str]:
    return ToolContext(deps="deps", caller=Caller(**caller))


async def test_bare_decorator_takes_name_and_docstring_and_defaults() -> None:
    @tool_function
    async def weather(c: ToolContext[str], a: Args) -> str:
        """Look up the weather.

        More detail for the model.
        """
        return a.city

    assert isinstance(weather, Tool)
    assert weather.name == "weather"
    assert weather.description == "Look up the weather.\n\nMore detail for the model."
    assert (weather.retries, weather.timeout_s, weather.scope) == (2, 30.0, "both")
    assert not (weather.require_at or weather.admin_only or weather.confirm or weather.sequential)
    assert not weather.read_only  # undeclared, a call may have changed something (the safe reading)
    assert weather.args_model is Args
    assert (await weather.invoke(ctx(), Args(city="Paris"))).content == "Paris"


def test_every_option_is_kept() -> None:
    @tool_function(
        name="set_it", description="Overridden.", examples=["do it", "again"], scope="group", require_at=True,
        admin_only=True, confirm=True, retries=5, timeout_s=2.5, sequential=True, aliases=["/s", "si"],
        read_only=True,
    )
    async def original(a: Args) -> ToolResult:
        """Docstring loses to description=."""
        return ToolResult(content="x")

    assert original.name == "set_it"
    assert original.description == "Overridden."
    assert original.examples == ("do it", "again")
    assert (original.scope, original.require_at, original.admin_only, original.confirm) == ("group", True, True, "admin")
    assert (original.retries, original.timeout_s, original.sequential, original.read_only) == (5, 2.5, True, True)
    assert original.aliases == ("s", "si")
    assert original.definition()["function"]["name"] == "set_it"
    assert original.definition()["function"]["description"] == "Overridden."


async def test_handler_shapes_ctx_and_model_model_only_and_no_args() -> None:
    seen: list[Any] = []

    @tool_function
    async def both(context_whatever: ToolContext[str], payload: Args) -> str:
        """Both."""
        seen.append((context_whatever.deps, payload.city))
        return "both"

    @tool_function
    async def model_only(q: Args) -> str:
        """Model only."""
        seen.append(q.days)
        return "model"

    @tool_function
    async def nothing() -> str:
        """No arguments."""
        seen.append("nothing")
        return "none"

    @tool_function
    async def ctx_only(c: ToolContext[str]) -> str:
        """Context only."""
        seen.append(c.caller.user_id)
        return "ctx"

    assert (await both.invoke(ctx(), both.parse_arguments('{"city": "Oslo"}'))).content == "both"
    assert (await model_only.invoke(ctx(), model_only.parse_arguments('{"city": "x", "days": 3}'))).content == "model"
    assert (await nothing.invoke(ctx(), nothing.parse_arguments(""))).content == "none"
    assert (await ctx_only.invoke(ctx(user_id="u9"), None)).content == "ctx"
    assert seen == [("deps", "Oslo"), 3, "nothing", "u9"]
    assert nothing.args_model is None and ctx_only.args_model is None
    assert nothing.definition()["function"]["parameters"] == {
        "type": "object", "properties": {}, "additionalProperties": False,
    }


async def test_sync_handler_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    @tool_function
    def blocking(a: Args) -> str:
        """A sync handler (might block)."""
        threads.append(threading.get_ident())
        return f"sync {a.city}"

    result = await blocking.invoke(ctx(), Args(city="Rome"))
    assert result.content == "sync Rome"
    assert threads and threads[0] != threading.get_ident()


async def test_a_sync_handler_past_its_timeout_holds_no_thread_others_need() -> None:
    # It kept a thread of the loop's default pool: once full, every to_thread and DNS lookup waited.
    from concurrent.futures import ThreadPoolExecutor

    from function_calls.threads import MAX_OVERDUE

    release = threading.Event()
    ran: list[str] = []

    @tool_function(timeout_s=0.05)
    def hangs(a: Args) -> str:
        """A blocking client with no timeout of its own."""
        ran.append(a.city)
        release.wait(10)
        return "late"

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
    try:
        for _ in range(MAX_OVERDUE):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(hangs.timeout_s):
                    await hangs.invoke(ctx(), Args(city="a"))
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 1) == "free"
        await asyncio.wait_for(loop.getaddrinfo("localhost", 80), 1)
        with pytest.raises(ToolError, match=r"still running.*timeout") as refused:
            await hangs.invoke(ctx(), Args(city="b"))
        assert refused.value.user_message and len(ran) == MAX_OVERDUE  # refused before it ran
    finally:
        release.set()
    for _ in range(100):  # once the earlier calls end, it runs again
        await asyncio.sleep(0.01)
        with contextlib.suppress(ToolError):
            assert (await hangs.invoke(ctx(), Args(city="c"))).content == "late"
            break
    assert ran[-1] == "c"


async def test_a_sync_handler_raising_stop_iteration_fails_at_once_like_an_async_one() -> None:
    # asyncio refuses StopIteration on a future: passed through, the call would hang until its timeout.
    @tool_function
    def first_hit(a: Args) -> str:
        """Looks a city up (finds none)."""
        return str(next(iter([])))

    with pytest.raises(RuntimeError, match="StopIteration") as caught:
        await asyncio.wait_for(first_hit.invoke(ctx(), Args(city="Rome")), 5)
    assert isinstance(caught.value.__cause__, StopIteration)


async def test_a_result_of_another_type_is_reported_as_run_never_as_a_failure_to_retry() -> None:
    # It ran (its action is done): "failed internally" made the model call it again.
    @tool_function
    async def sneaky() -> str:
        """Returns the wrong type despite its annotation."""
        return 42  # type: ignore[return-value]

    result = await sneaky.invoke(ctx(), None)
    assert "sneaky" in result.content and "ran" in result.content and "could not be read" in result.content
    assert "failed" not in result.content and "not call it again" in result.content


async def test_a_handler_returning_none_or_a_dict_ran() -> None:
    sent: list[str] = []

    @tool_function
    async def send_sms(a: Args):  # type: ignore[no-untyped-def]  # (no annotation: None at run time)
        """Send an SMS."""
        sent.append(a.city)

    @tool_function
    def create_ticket(a: Args) -> dict[str, Any]:
        """Open a ticket."""
        return {"id": 42, "status": "open", "city": a.city}

    model = ScriptedModel([call("send_sms", {"city": "Oslo"}), call("create_ticket", {"city": "Oslo"}), text("ok")])
    await Runner(model).run([{"role": "user", "content": "go"}], Toolset("t", [send_sms, create_ticket]))
    told = [m for m in model.requests[-1].messages if m.get("role") == "tool"]
    assert sent == ["Oslo"] and told[0]["content"] == "done"
    assert json.loads(told[1]["content"]) == {"id": 42, "status": "open", "city": "Oslo"}
    ticket = await create_ticket.invoke(ctx(), Args(city="Rome"))
    assert ticket.data == {"id": 42, "status": "open", "city": "Rome"} and not ticket.is_error


def _define_missing_annotation() -> Tool:
    async def no_hint(a) -> str:  # type: ignore[no-untyped-def]
        """Doc."""
        return ""

    return tool_function(no_hint)


def _define_plain_annotation() -> Tool:
    async def plain_dict(a: dict[str, int]) -> str:
        """Doc."""
        return ""

    return tool_function(plain_dict)


def _define_no_docstring() -> Tool:
    async def undocumented(a: Args) -> str:
        return ""

    return tool_function(undocumented)


def _define_bad_return() -> Tool:
    async def returns_int(a: Args) -> int:
        """Doc."""
        return 1

    return tool_function(returns_int)  # type: ignore[arg-type]


def _define_two_models() -> Tool:
    async def two_models(a: Args, b: Args) -> str:
        """Doc."""
        return ""

    return tool_function(two_models)


def _define_ctx_second() -> Tool:
    async def ctx_second(a: Args, c: ToolContext[None]) -> str:
        """Doc."""
        return ""

    return tool_function(ctx_second)


def _define_bad_name() -> Tool:
    async def f(a: Args) -> str:
        """Doc."""
        return ""

    return tool_function(name="提醒")(f)  # OpenAI accepts ASCII names only


def _define_bad_scope() -> Tool:
    async def scoped(a: Args) -> str:
        """Doc."""
        return ""

    return tool_function(scope="channel")(scoped)  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize(
    ("define", "tool_name", "hint"),
    [
        (_define_missing_annotation, "no_hint", "no annotation"),
        (_define_plain_annotation, "plain_dict", "pydantic BaseModel"),
        (_define_no_docstring, "undocumented", "docstring"),
        (_define_bad_return, "returns_int", "return annotation"),
        (_define_two_models, "two_models", "only one"),
        (_define_ctx_second, "ctx_second", "must come first"),
        (_define_bad_name, "提醒", "must match"),
        (_define_bad_scope, "scoped", "scope"),
    ],
)
def test_definition_mistakes_raise_naming_the_tool(define: Any, tool_name: str, hint: str) -> None:
    with pytest.raises(ToolDefinitionError) as info:
        define()
    assert tool_name in str(info.value)
    assert hint in str(info.value)


def test_scope_require_at_and_admin_only_decide_who_may_use_a_tool() -> None:
    @tool_function(scope="group", require_at=True)
    async def grp(a: Args) -> str:
        """Group only, must be addressed."""
        return ""

    @tool_function(admin_only=True)
    async def admin(a: Args) -> str:
        """Admins only."""
        return ""

    assert grp.allowed_for(Caller(chat_kind="group", addressed=True))
    assert not grp.allowed_for(Caller(chat_kind="group", addressed=False))
    assert not grp.allowed_for(Caller(chat_kind="private"))
    assert admin.allowed_for(Caller(is_admin=True, bot_admin=True))
    assert not admin.allowed_for(Caller(is_admin=False))
    owner = Caller(chat_kind="group", is_admin=True)  # a group's owner: not the bot's admin
    assert not admin.allowed_for(owner)

    @tool_function(group_admin=True)
    async def moderate(a: Args) -> str:
        """Group owners/admins here, or bot admins."""
        return ""

    assert moderate.allowed_for(owner) and moderate.allowed_for(Caller(bot_admin=True))
    assert not moderate.allowed_for(Caller(chat_kind="group"))
    assert not moderate.allowed_for(Caller(chat_kind="private", is_admin=True))


def _tool(name: str, aliases: tuple[str, ...] = (), module: str | None = None) -> Tool:
    async def handler(a: Args) -> str:
        """Doc."""
        return name

    if module is not None:  # as if defined in that module
        handler.__module__ = module
    return tool_function(name=name, aliases=aliases)(handler)


def test_toolset_rejects_two_tools_with_one_name() -> None:
    with pytest.raises(ToolDefinitionError, match="'dup'"):
        Toolset("plugin", [_tool("dup"), _tool("dup")])


def test_toolset_rejects_duplicate_aliases_and_names_shadowing_aliases() -> None:
    with pytest.raises(ToolDefinitionError, match="'r'"):
        Toolset("p", [_tool("remind", ("r",)), _tool("rate", ("/r",))])
    with pytest.raises(ToolDefinitionError, match="'rate'"):
        Toolset("p", [_tool("remind", ("rate",)), _tool("rate")])


def test_toolset_merge_names_both_sets_on_conflict_and_resolves_aliases() -> None:
    a = Toolset("reminders", [_tool("reminder_set", ("remind",))])
    b = Toolset("search", [_tool("search_web", ("s",))])
    merged = a.merge(b)
    assert merged.names() == ["reminder_set", "search_web"]
    resolved = merged.resolve("/remind")
    assert resolved is not None and resolved.name == "reminder_set"
    assert merged.resolve("nope") is None
    with pytest.raises(ToolDefinitionError) as info:
        a.merge(Toolset("other", [_tool("reminder_set")]))
    assert "'other'" in str(info.value) and "'reminders'" in str(info.value)
    with pytest.raises(ToolDefinitionError, match="not a Tool"):
        Toolset("p").add(lambda: None)  # type: ignore[arg-type]


def test_names_and_aliases_resolve_whatever_their_case_and_clash_alike() -> None:
    # /getWeather was listed in /help but never found: a typed command is lowercased.
    tools = Toolset("p", [_tool("getWeather", ("TR",))])
    for typed in ("getweather", "/GETWEATHER", "tr", "/Tr"):
        found = tools.resolve(typed)
        assert found is not None and found.name == "getWeather"
    with pytest.raises(ToolDefinitionError, match="'gw'"):
        Toolset("p", [_tool("weather", ("GW",)), _tool("gw")])
    with pytest.raises(ToolDefinitionError, match="'Weather'"):
        Toolset("p", [_tool("weather"), _tool("Weather")])


def _module_state() -> dict[str, str]:
    mods = [m for name, m in sys.modules.items() if name.split(".")[0] == "function_calls"]
    return {f"{m.__name__}.{k}": repr(v) for m in mods for k, v in vars(m).items() if not k.startswith("__")}


def test_decorating_registers_nothing_and_collect_tools_finds_module_level_tools() -> None:
    before = _module_state()
    local = _tool("local_only")
    assert isinstance(local, Tool)
    assert _module_state() == before  # no registry anywhere got the tool

    module = types.ModuleType("myplugin.tools")
    first, second = _tool("first", module="myplugin.tools"), _tool("second", module="myplugin.tools")
    module.first = first  # type: ignore[attr-defined]
    module.helper = 42  # type: ignore[attr-defined]
    module.toolset = Toolset("x", [second, first])  # type: ignore[attr-defined]
    module.second_again = second  # type: ignore[attr-defined]
    found = collect_tools(module)
    assert found.name == "tools"
    assert found.names() == ["first", "second"]
    assert "local_only" not in found
    assert len(collect_tools(types.ModuleType("empty"))) == 0
    assert len(collect_tools(function_calls)) == 0


def test_collect_tools_leaves_out_the_tools_a_module_only_imported() -> None:
    # `from search import perplexity_search` offered /search with the owner's search plugin left out.
    module = types.ModuleType("myhelpers")
    module.echo = _tool("echo", module="myhelpers")  # type: ignore[attr-defined]
    module.perplexity_search = _tool("perplexity_search", module="search.tools")  # type: ignore[attr-defined]
    module.theirs = Toolset("search", [_tool("search_news", module="search")])  # type: ignore[attr-defined]
    assert collect_tools(module).names() == ["echo"]
    package = types.ModuleType("mypkg")
    package.__path__ = []  # a package: the tools of its own submodules are its own
    package.remind = _tool("remind", module="mypkg.tools")  # type: ignore[attr-defined]
    package.other = _tool("other", module="mypkgx.tools")  # type: ignore[attr-defined]
    assert collect_tools(package).names() == ["remind"]


def test_tool_context_clock_and_zone() -> None:
    fixed = datetime(2025, 1, 1, 16, 30, tzinfo=UTC)
    c = ToolContext(deps=None, zone=ZoneInfo("Asia/Shanghai"), clock=lambda: fixed)
    assert c.now() == fixed
    assert c.local_now().hour == 0 and c.local_now().day == 2
    assert c.local_now().utcoffset() is not None


def test_the_built_in_tools_that_change_nothing_are_declared_read_only() -> None:
    from reminders.tools import reminder_delete, reminder_list, reminder_set
    from search.tools import deep_research, perplexity_search
    from summary.tools import summary

    assert reminder_list.read_only and perplexity_search.read_only
    # A summary moves the chat's mark, and may opt someone out, schedule a digest or send a private copy.
    assert not any(t.read_only for t in (reminder_set, reminder_delete, deep_research, summary))
