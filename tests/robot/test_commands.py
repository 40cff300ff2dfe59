"""``/commands`` and permissions: parsing, /help, and tools a caller may not use (model and command)."""

from __future__ import annotations

import contextlib
import functools
import itertools
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from function_calls import ArgumentError, Caller, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.commands import CommandError, build_arguments, help_text, parse_command, split_words, usage_line
from robot.message import ChatRef
from robot.plugin import Plugin

GROUP = Caller(platform="memory", user_id="u1", chat_id="g1", chat_kind="group")
PRIVATE = Caller(platform="memory", user_id="u1", chat_id="u1", chat_kind="private")
DM = ChatRef(platform="memory", chat_id="u1", kind="private")


def tool(plugin: Plugin[Any], name: str) -> Any:
    found = plugin.tools.get(name)
    assert found is not None
    return found


# --- parsing -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "name", "rest"), [
    ("/help", "help", ""), ("  /N  milk 2 ", "n", "milk 2"), ("／帮助", "帮助", ""),
    ("/n\u3000牛奶", "n", "牛奶"), ("/n\nline two", "n", "line two")])
def test_parse_command(line: str, name: str, rest: str) -> None:
    parsed = parse_command(line)
    assert parsed is not None and (parsed.name, parsed.rest) == (name, rest)


@pytest.mark.parametrize("line", ["hello /n", "/", "", "http://x"])
def test_not_a_command(line: str) -> None:
    assert parse_command(line) is None


def test_positional_values_follow_field_order_named_ones_are_taken_out(plugin: Plugin[Any]) -> None:
    note = tool(plugin, "note")
    assert build_arguments(note, "milk 3") == {"text": "milk", "times": 3}
    assert build_arguments(note, "times=2 bread") == {"text": "bread", "times": 2}
    assert build_arguments(note, '"oat milk" 2') == {"text": "oat milk", "times": 2}
    assert build_arguments(note, "text='a b' times=4") == {"text": "a b", "times": 4}


def test_the_last_free_field_takes_the_rest_as_typed(plugin: Plugin[Any]) -> None:
    # shlex refused "what's new" (no closing quotation) and ate backslashes and quotes: \\d+ became d+.
    kick = tool(plugin, "kick")
    assert build_arguments(kick, "spam bot account") == {"target": "spam bot account"}
    for typed in ('"unclosed', "what's new in Python 3.14", r"regex \d+\s*  meaning", r"C:\Windows\System32 size",
                  '"exact phrase" meaning', "it's 'quoted' here", "1+1=", "x=  y  z", "=", "a='"):
        assert build_arguments(kick, typed) == {"target": typed}
    assert build_arguments(kick, '"one value"') == {"target": "one value"}
    note = tool(plugin, "note")
    assert build_arguments(note, "buy oat milk times=2") == {"text": "buy oat milk", "times": 2}
    assert build_arguments(note, "buy times=2 oat  milk") == {"text": "buy oat milk", "times": 2}  # a key between
    with pytest.raises(CommandError, match="不需要"):
        build_arguments(tool(plugin, "poke"), "extra words")


def test_a_second_plain_text_field_is_filled_by_name_only() -> None:
    # /deep_think kept the question's first word, and passed the rest on as "background".
    from tiers.tools import deep_think

    assert build_arguments(deep_think, "prove that √2 is irrational") == {"question": "prove that √2 is irrational"}
    assert build_arguments(deep_think, 'why context="we met on Monday"') == {"question": "why",
                                                                              "context": "we met on Monday"}


def test_a_second_text_field_is_shown_as_typed_by_name() -> None:
    # /help showed "/send <to> <message>", but "/send alice hello" went all into `to` and was refused.
    send = _typed_tools()["send"]
    assert usage_line(send) == "/send <to> <message=…>"
    assert parsed(send, 'alice message="hello there"') == SendArgs(to="alice", message="hello there")
    assert "/send <to> <message=…> — Send." in help_text(Toolset("t", [send]), PRIVATE, {})


def test_a_word_typed_inside_the_text_stays_only_in_the_text() -> None:
    # "/remember my group locker code is 4711" was saved as a group memory; "/todo 买 2 斤苹果" got priority 2.
    from memory.tools import remember

    assert build_arguments(remember, "my group locker code is 4711") == {"content": "my group locker code is 4711"}
    assert build_arguments(remember, "my locker code is 4711 group") == {"content": "my locker code is 4711",
                                                                          "scope": "group"}
    todo = _typed_tools()["todo"]
    assert parsed(todo, "买 2 斤苹果") == TodoArgs(text="买 2 斤苹果")
    assert parsed(todo, "call mom 3 times") == TodoArgs(text="call mom 3 times")
    assert parsed(todo, "call mom 3 yes") == TodoArgs(text="call mom", priority=3, done=True)  # values at the end
    assert parsed(todo, "a 2 done=yes b") == TodoArgs(text="a 2 b", done=True)  # a key between: not undone
    assert parsed(todo, "a priority=3 2 b") == TodoArgs(text="a 2 b", priority=3)
    assert parsed(_typed_tools()["count"], "apples 5 red") == CountArgs(what="apples", n=5, colour="red")
    with pytest.raises(ArgumentError, match=r"required|missing"):
        parsed(_typed_tools()["count"], "apples 5 green")  # a required field undone: asked for


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "买", "2", "3", "9", "yes", "no", "x"]), min_size=1, max_size=8))
def test_each_typed_word_fills_one_field(words: list[str]) -> None:
    args = build_arguments(_typed_tools()["todo"], " ".join(words))
    assert len(args["text"].split()) + ("priority" in args) + ("done" in args) == len(words)


async def test_commands_validate_like_model_calls(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("/n milk 9")  # times <= 5
    await ch.inject("/note")
    await ch.inject("/n boom")
    await ch.inject("/nope", at_bot=True)  # an unknown /command answers only when the bot is addressed
    await ch.inject("/N Milk")
    bad_value, missing, tool_error, unknown, alias = (m.text for m in await ch.wait_sent(5))
    assert "times" in bad_value and "用法：/n <text> [times]" in bad_value
    assert "text" in missing and "参数有误" in missing
    assert tool_error == "记不下来：boom"
    assert "没有 /nope 这个命令" in unknown and "/help" in unknown
    assert alias == "noted for u1: Milk x1"


# --- /help -------------------------------------------------------------------------------------

def test_help_is_generated_from_tool_metadata_for_this_caller(plugin: Plugin[Any]) -> None:
    group_help = help_text(plugin.tools, GROUP, {})
    assert "/n <text> [times] — Take a note" in group_help and "（也可用 /note）" in group_help
    assert "例：/n 买牛奶 2" in group_help
    assert "/kick <target>" in group_help and "/poke" in group_help
    assert "/whisper" not in group_help and "/purge" not in group_help
    private_help = help_text(plugin.tools, PRIVATE, {})
    assert "/whisper" in private_help and "/kick" not in private_help
    owner_help = help_text(plugin.tools, GROUP.model_copy(update={"is_admin": True}), {"note": "no key"})
    assert "/mute" in owner_help and "/purge" not in owner_help and "[未启用：no key]" in owner_help
    admin_help = help_text(plugin.tools, GROUP.model_copy(update={"is_admin": True, "bot_admin": True}), {})
    assert "/purge" in admin_help and "/mute" in admin_help


async def test_help_command_works_without_an_llm(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("/help")
    (sent,) = await ch.wait_sent(1)
    assert sent.text.startswith("可用命令") and "/n" in sent.text and "/purge" not in sent.text


# --- permissions: not offered to the model, refused as commands ---------------------------------

def offered(model: ScriptedModel, index: int = -1) -> set[str]:
    return {t["function"]["name"] for t in model.requests[index].tools}


async def test_a_group_member_is_offered_only_what_they_may_use(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("ok"))
    _bot, ch = await make_bot(model)
    await ch.inject("hi", at_bot=True)
    await ch.inject("hi", chat=DM)
    await ch.wait_sent(2)
    assert offered(model, 0) == {"note", "kick", "poke", "ask_user"}
    assert offered(model, 1) == {"note", "whisper", "poke", "ask_user"}


async def test_require_at_tools_are_not_offered_when_answering_unaddressed(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("ok"))
    _bot, ch = await make_bot(model, gate={"always": ["memory:g1"]})
    await ch.inject("chatting along")  # answered because of gate.always, but not addressed
    await ch.inject("poke someone", at_bot=True)
    await ch.wait_sent(2)
    assert "poke" not in offered(model, 0) and "poke" in offered(model, 1)


async def test_disallowed_tools_are_refused_as_commands(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("/purge")
    await ch.inject("/whisper")
    await ch.inject("/kick someone", chat=DM)
    sent = await ch.wait_sent(3)
    # Ordered within a chat; the group's and the private chat's lanes do not wait for each other.
    purge, whisper = (m.text for m in sent if m.chat.kind == "group")
    (kick,) = (m.text for m in sent if m.chat.kind != "group")
    assert "只有机器人管理员" in purge and "只能在私聊" in whisper and "只能在群聊" in kick


async def test_configured_admins_are_platform_qualified(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("ok"))
    _bot, ch = await make_bot(model, bot={"admins": ["memory:u9", "other:u1"]})
    await ch.inject("/purge", user="u9")
    await ch.inject("/purge", user="u1")  # admin on another platform only
    await ch.inject("hi", user="u9", at_bot=True)
    admin, other, _ = await ch.wait_sent(3)
    assert admin.text == "purged by u9" and "只有机器人管理员" in other.text
    assert "purge" in offered(model)


async def test_group_owners_and_admins_pass_group_admin_tools_there_only(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("/mute", user="o1", role="owner")
    await ch.inject("/mute", user="a1", role="admin")
    await ch.inject("/mute", user="m1")
    await ch.inject("/mute", user="a1", role="admin", chat=ChatRef(platform="memory", chat_id="a1",
                                                                 kind="private"))
    owner, admin, member, private = (m.text for m in await ch.wait_sent(4))
    assert owner == "muted by o1" and admin == "muted by a1"
    assert "只有群主、群管理员或机器人管理员" in member
    assert "只有群主" in private  # a group role means nothing in a private chat


async def test_owning_a_group_does_not_make_anyone_a_bot_admin(make_bot: Any) -> None:
    # Anyone can create a group and add the bot: its owner must not pass admin_only, on either path.
    model = ScriptedModel([call("purge"), text("done")])
    _bot, ch = await make_bot(model, bot={"admins": ["memory:boss"]})
    await ch.inject("/purge", user="o1", role="owner")
    (refused,) = await ch.wait_sent(1)
    assert "只有机器人管理员" in refused.text
    await ch.inject("purge everything", user="o1", role="owner", at_bot=True)
    await ch.wait_sent(2)
    assert "purge" not in offered(model, 0) and "mute" in offered(model, 0)
    assert not any("purged" in m.text for m in ch.sent)
    await ch.inject("/purge", user="boss")
    assert (await ch.wait_sent(3))[-1].text == "purged by boss"


class QueryArgs(BaseModel):
    q: str = Field(description="what to look up")


@tool_function
async def websearch(ctx: ToolContext[str], args: QueryArgs) -> ToolResult:
    """Search the web."""
    return ToolResult.reply(f"results for {args.q} with {ctx.deps}")


def web_plugin(key: str) -> Plugin[str]:
    async def setup(bot: Any) -> str:
        return key

    return Plugin("web", Toolset("web", [websearch]), setup=setup,
                  unavailable=lambda deps: None if deps else "没有配置 API key")


async def test_an_unavailable_plugins_tools_are_hidden_and_explained(make_bot: Any, plugin: Plugin[Any]) -> None:
    model = ScriptedModel(lambda req: text("ok"))
    _bot, ch = await make_bot(model, plugins=[plugin, web_plugin("")])
    await ch.inject("search something", at_bot=True)
    await ch.inject("/websearch cats")
    await ch.inject("/help")
    _, refused, helped = (m.text for m in await ch.wait_sent(3))
    assert "websearch" not in offered(model)
    assert refused == "/websearch 暂不可用：没有配置 API key"
    assert "/websearch <q> — Search the web. [未启用：没有配置 API key]" in helped


async def test_a_plugins_tools_get_the_deps_its_setup_built(make_bot: Any, plugin: Plugin[Any]) -> None:
    _bot, ch = await make_bot(None, plugins=[plugin, web_plugin("key-1")])
    await ch.inject("/websearch cats and dogs")
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "results for cats and dogs with key-1"


# --- validation messages -----------------------------------------------------------------------

async def test_validation_messages_are_in_the_bots_language_not_validator_text(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("/n milk 9")
    await ch.inject("/n")
    await ch.inject("/n milk times=many")
    bad, missing, word = (m.text for m in await ch.wait_sent(3))
    assert bad == "参数有误：\n- times：不能大于 5（收到 9）\n用法：/n <text> [times]"
    assert "- text：必须填写" in missing
    assert "- times：应为整数（收到 \"many\"）" in word
    for reply in (bad, missing, word):
        assert not any(raw in reply for raw in ("maximum", "less than", "required", "is not of type"))


async def test_english_bots_explain_in_english(make_bot: Any) -> None:
    _bot, ch = await make_bot(None, bot={"language": "en"})
    await ch.inject("/n milk 9")
    (reply,) = (m.text for m in await ch.wait_sent(1))
    assert reply == "Invalid arguments:\n- times: must be at most 5 (got 9)\nUsage: /n <text> [times]"


async def test_no_reply_quotes_a_long_input_back(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    long = "x" * 500
    await ch.inject(f"/poke {long}", at_bot=True)
    await ch.inject(f"/{long}", at_bot=True)
    await ch.inject(f"/n milk times={long}")
    replies = [m.text for m in await ch.wait_sent(3)]
    assert all("x" * 30 not in reply for reply in replies), replies
    assert "共 500 字" in replies[0] and "共 500 字" in replies[1] and "收到 500 个字" in replies[2]


def test_a_tool_named_like_a_core_command_is_refused_at_start(tmp_path: Path) -> None:
    """/pending, /approve, /deny and /help are the bot's own: a tool there would never run."""
    from function_calls import ToolDefinitionError, ToolResult, Toolset, tool_function
    from robot.bot import Bot
    from robot.config import Settings

    @tool_function(aliases=["pending"])
    async def my_pending(ctx: ToolContext[object]) -> ToolResult:
        """My own pending list."""
        return ToolResult(content="mine")

    with pytest.raises(ToolDefinitionError, match="pending"):
        Bot(Settings(bot={"data_dir": tmp_path}), model=None, channels=[],
            plugins=[Plugin("clash", Toolset("clash", [my_pending]))])


async def test_a_command_past_its_tools_timeout_is_told_so_and_the_tool_stopped(make_bot: Any) -> None:
    import asyncio

    stopped: list[bool] = []

    @tool_function(timeout_s=0.05)
    async def slow(ctx: ToolContext[object]) -> ToolResult:
        """Never finishes in time."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(True)
            raise
        return ToolResult(content="late")

    _bot, ch = await make_bot(None, plugins=[Plugin("slow", Toolset("slow", [slow]))])
    await ch.inject("/slow")
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "/slow 执行超时（0.05 秒），请稍后再试。" and stopped == [True]


class ModeArgs(BaseModel):
    mode: Literal["fast", "slow"] | None = None


async def test_an_optional_choice_is_explained_without_python_s_none(make_bot: Any) -> None:
    @tool_function
    async def run(ctx: ToolContext[object], args: ModeArgs) -> ToolResult:
        """Run."""
        return ToolResult.reply("ran")

    _bot, ch = await make_bot(None, plugins=[Plugin("r", Toolset("r", [run]))])
    await ch.inject("/run medium")
    (sent,) = await ch.wait_sent(1)
    assert "只能是 fast、slow" in sent.text and "None" not in sent.text  # it read "fast 、slow 、None"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab =\"' \\\t中x")), max_size=40))
def test_any_command_line_splits_into_words_where_they_were_typed(line: str) -> None:
    # "1+1=" at the end of a line read past it (IndexError: "执行失败了").
    words = split_words(line)
    assert all(0 <= w.start < w.end <= len(line) for w in words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(words))
    assert "".join(line[w.start:w.end] for w in words).replace(" ", "") or not line.strip(" \t")


# --- typed positional values: unions, dates and times, lists, objects ----------------------------

class TipArgs(BaseModel):
    to: str = Field(description="who gets the tip")
    amount: Decimal = Field(Decimal("1"), gt=0)


class BookArgs(BaseModel):
    room: str
    day: date
    at: time


class TagArgs(BaseModel):
    tags: list[str]
    counts: list[int] = []


class Place(BaseModel):
    x: int


class ShapeArgs(BaseModel):
    name: str
    where: Place | None = None


class MeetArgs(BaseModel):
    when: datetime
    what: str


class SendArgs(BaseModel):
    to: str
    message: str


class TodoArgs(BaseModel):
    text: str
    priority: int = Field(1, ge=1, le=3)
    done: bool = False


class CountArgs(BaseModel):
    what: str
    n: int
    colour: Literal["red", "blue"] | None = None


class MixArgs(BaseModel):
    what: str
    more: list[str] | None = None
    pt: tuple[int, int] | None = None
    on: bool = False


@functools.cache
def _typed_tools() -> dict[str, Any]:
    async def tip(args: TipArgs) -> str:
        """Tip."""
        return ""

    async def book(args: BookArgs) -> str:
        """Book."""
        return ""

    async def tag(args: TagArgs) -> str:
        """Tag."""
        return ""

    async def shape(args: ShapeArgs) -> str:
        """Shape."""
        return ""

    async def meet(args: MeetArgs) -> str:
        """Meet."""
        return ""

    async def mix(args: MixArgs) -> str:
        """Mix."""
        return ""

    async def send(args: SendArgs) -> str:
        """Send."""
        return ""

    async def todo(args: TodoArgs) -> str:
        """Todo."""
        return ""

    async def count(args: CountArgs) -> str:
        """Count."""
        return ""

    return {f.__name__: tool_function(f) for f in (tip, book, tag, shape, meet, mix, send, todo, count)}


def parsed(tool: Any, line: str) -> Any:
    return tool.parse_arguments(build_arguments(tool, line))


def test_a_value_typed_by_position_goes_into_its_field_whatever_its_schema() -> None:
    # "/tip alice 5" tipped "alice 5" one yuan (Decimal is an anyOf); "/book A101 2026-12-01 10:00" was refused.
    tools = _typed_tools()
    assert parsed(tools["tip"], "alice 5") == TipArgs(to="alice", amount=Decimal("5"))
    assert parsed(tools["tip"], "alice 0.5") == TipArgs(to="alice", amount=Decimal("0.5"))
    assert parsed(tools["tip"], "alice smith") == TipArgs(to="alice smith")  # a word continues the text
    assert parsed(tools["book"], "A101 2026-12-01 10:00") == BookArgs(room="A101", day=date(2026, 12, 1),
                                                                      at=time(10, 0))
    assert parsed(tools["book"], "A101 2026/12/1 9：30") == BookArgs(room="A101", day=date(2026, 12, 1),
                                                                     at=time(9, 30))
    assert parsed(tools["meet"], "2026-11-22 15:00 lunch with Bo") == MeetArgs(
        when=datetime(2026, 11, 22, 15, 0), what="lunch with Bo")  # a date-time typed unquoted stays one value


def test_lists_are_typed_with_commas_and_objects_by_name_as_json() -> None:
    tools = _typed_tools()
    tag, shape = tools["tag"], tools["shape"]
    assert parsed(tag, "tags=a,b") == TagArgs(tags=["a", "b"])
    assert parsed(tag, "a,b counts=1,2") == TagArgs(tags=["a", "b"], counts=[1, 2])
    assert parsed(tag, "a b") == TagArgs(tags=["a", "b"])  # the last field: the surplus is more items
    assert parsed(tag, "a 1,2") == TagArgs(tags=["a"], counts=[1, 2])
    assert parsed(shape, "box of tools") == ShapeArgs(name="box of tools")  # an object is never positional
    assert parsed(shape, "box where='{\"x\": 3}'") == ShapeArgs(name="box", where=Place(x=3))
    assert usage_line(tag) == "/tag <tags,…> [counts,…]"
    assert usage_line(shape) == "/shape <name> [where={…}]"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["tip", "book", "tag", "shape", "meet", "mix"]),
       st.lists(st.sampled_from([*"a1 ,，=\"':-/{}[]中.\t", "null", "2026-12-01", "10:00", "more="]),
                max_size=12).map("".join))
def test_any_line_gives_arguments_or_says_what_is_wrong(name: str, line: str) -> None:
    tool = _typed_tools()[name]
    try:
        args = build_arguments(tool, line)
    except CommandError:
        return
    with contextlib.suppress(ArgumentError):
        tool.parse_arguments(args)


def test_a_tuple_takes_its_items_by_position() -> None:
    mix = _typed_tools()["mix"]
    assert parsed(mix, "x pt=1,2 more=a,b on=yes") == MixArgs(what="x", more=["a", "b"], pt=(1, 2), on=True)
    assert parsed(mix, "x a,b c") == MixArgs(what="x", more=["a", "b", "c"])
    assert parsed(mix, "x a,b pt=1,2 on=no null") == MixArgs(what="x", more=["a", "b", "null"], pt=(1, 2))


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z\u4e00-\u4e09]{1,8}", fullmatch=True), st.integers(1, 10**6),
       st.dates(date(2000, 1, 1), date(2099, 12, 31)), st.times().map(lambda t: t.replace(second=0, microsecond=0)))
def test_typed_values_after_a_text_word_land_in_their_fields(who: str, amount: int, day: date, at: time) -> None:
    tools = _typed_tools()
    assert parsed(tools["tip"], f"{who} {amount}") == TipArgs(to=who, amount=Decimal(amount))
    assert parsed(tools["book"], f"{who} {day.isoformat()} {at.strftime('%H:%M')}") == BookArgs(
        room=who, day=day, at=at)


async def test_a_tool_or_alias_with_capitals_runs_as_a_command(make_bot: Any) -> None:
    @tool_function(aliases=["TR"])
    async def getWeather(ctx: ToolContext[object], args: QueryArgs) -> ToolResult:
        """Weather for a city."""
        return ToolResult.reply(f"{args.q}: sunny")

    _bot, ch = await make_bot(None, plugins=[Plugin("w", Toolset("w", [getWeather]))])
    await ch.inject("/getWeather 北京")
    await ch.inject("/TR 上海")
    assert [m.text for m in await ch.wait_sent(2)] == ["北京: sunny", "上海: sunny"]
