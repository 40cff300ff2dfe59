"""The console channel: typed lines in group and private mode, printed replies, streaming."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from function_calls import ModelRequest, ModelResponse, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.channels.console import ConsoleChannel
from robot.message import ChatRef, OutgoingMessage
from robot.plugin import Plugin

Until = Callable[..., Awaitable[None]]


def console(*, group: bool = False, stdin: str = "") -> tuple[ConsoleChannel, io.StringIO]:
    out = io.StringIO()
    return ConsoleChannel(bot_name="qunbot", group=group, user="me", stdin=io.StringIO(stdin), stdout=out), out


def test_group_mode_lines_name_the_speaker_and_may_address_the_bot() -> None:
    ch, _ = console(group=True)
    first = ch.parse_line("小明: @qunbot 你好\n")
    assert first is not None
    assert (first.sender.user_id, first.sender.name, first.text, first.mentions_bot) == ("小明", "小明", "你好", True)
    assert first.chat == ChatRef(platform="console", chat_id="console-group", kind="group")
    follow = ch.parse_line("顺便问一下")  # the current speaker goes on talking
    assert follow is not None and follow.sender.user_id == "小明" and not follow.mentions_bot
    other = ch.parse_line("阿强：今晚打球")  # a full-width colon works too
    assert other is not None and (other.sender.user_id, other.text) == ("阿强", "今晚打球")
    command = ch.parse_line("/help")
    assert command is not None and command.text == "/help" and command.sender.user_id == "阿强"
    assert ch.parse_line("   \n") is None
    assert first.message_id != follow.message_id


def test_only_a_whole_word_mention_calls_the_bot() -> None:
    ch, _ = console(group=True)
    for line in ("写信给 bob@qunbot.io 吧", "@qunbotfan 你好", "email@qunbot"):
        got = ch.parse_line(line)
        assert got is not None and not got.mentions_bot and got.text == line  # it was mangled: "bob .io"
    called = ch.parse_line("你好 @QunBot，在吗")
    assert called is not None and called.mentions_bot and called.text == "你好 ，在吗"


def test_mentioning_the_bot_keeps_the_spaces_of_the_rest_of_the_line() -> None:
    """Cutting the @mention folded every run of spaces in the line (aligned code, a table)."""
    ch, _ = console(group=True)
    for line, said in (("@qunbot   x =   [1,   2]", "x =   [1,   2]"), ("a   b @qunbot  c", "a   b c"),
                       ("a   b，@qunbot", "a   b，"), ("你好@qunbot  在吗", "你好 在吗")):
        got = ch.parse_line(line)
        assert got is not None and got.mentions_bot and got.text == said, line


async def test_no_control_sequence_the_bot_writes_reaches_the_terminal() -> None:
    """A reply quoting anyone (a search result) could set the window title, write the clipboard (OSC 52)
    or erase lines."""
    ch, out = console()
    sneaky = "天气晴\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b]0;pwned\x07\x1b[1A\x1b[2K\u009b2J\tok"
    await ch.send(OutgoingMessage(key="k", chat=ch.chat, text=sneaky))
    await ch.stream_delta(ch.chat, "r", "\x1b[2J清屏")
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue() and "\u009b" not in out.getvalue()
    assert "天气晴]52;c;Y3VybCBldmlsLnNoIHwgc2g=]0;pwned[1A[2K2J\tok" in out.getvalue()


def test_private_mode_lines_are_the_users_own() -> None:
    ch, _ = console()
    msg = ch.parse_line("小明: hello")
    assert msg is not None
    assert (msg.sender.user_id, msg.text) == ("me", "小明: hello")
    assert msg.chat == ChatRef(platform="console", chat_id="me", kind="private")


async def test_send_prints_mentions_by_name() -> None:
    ch, out = console(group=True)
    ch.parse_line("小明: hi")
    await ch.send(OutgoingMessage(key="k", chat=ch.chat, text="你好", mention=("小明",)))
    assert out.getvalue() == "qunbot ▸ @小明 你好\n"


async def test_typed_lines_reach_the_bot_and_the_answer_is_printed(make_bot: Any, until: Until) -> None:
    ended: list[bool] = []
    out = io.StringIO()
    ch = ConsoleChannel(bot_name="qunbot", group=True, stdin=io.StringIO("小明: @qunbot /n 牛奶\n小红: 路过\n"),
                        stdout=out, on_eof=lambda: ended.append(True))
    bot, _ = await make_bot(None, channel=ch)
    await until(lambda: ended == [True])
    await bot.outbox.flush()
    shown = out.getvalue()
    assert "qunbot ▸ @小明 noted for 小明: 牛奶 x1" in shown
    replies = [line for line in shown.splitlines() if line.startswith("qunbot ▸")]
    assert len(replies) == 1  # 小红 did not address the bot: recorded only
    assert [e.text for e in await bot.history.recent(ch.chat)] == ["/n 牛奶", "noted for 小明: 牛奶 x1", "路过"]


@tool_function
async def announce(ctx: ToolContext[object]) -> ToolResult:
    """Tell the user something and let the model go on."""
    return ToolResult(content="announced", user_messages=("工具先说一句",))


async def test_a_streamed_reply_is_not_printed_twice(make_bot: Any) -> None:
    out = io.StringIO()
    ch = ConsoleChannel(bot_name="qunbot", stdin=io.StringIO(""), stdout=out)
    model = ScriptedModel([call("announce"), text("最后的回答"), text("第二次回答")])
    bot, _ = await make_bot(model, channel=ch, plugins=[Plugin("a", Toolset("a", [announce]))])
    await ch.deliver(ch.parse_line("hi") or _never())
    await bot.outbox.flush()
    await ch.deliver(ch.parse_line("again") or _never())
    await bot.outbox.flush()
    shown = out.getvalue()
    assert shown.count("最后的回答") == 1 and shown.count("工具先说一句") == 1
    assert shown.count("第二次回答") == 1
    assert shown.endswith("\n")


def _never() -> Any:
    raise AssertionError("parse_line returned None")


def test_in_group_mode_the_bots_name_before_a_colon_addresses_the_bot() -> None:
    ch, _ = console(group=True)
    ch.parse_line("小明: 大家好")
    msg = ch.parse_line("qunbot: /summary")
    assert msg is not None and msg.sender.user_id == "小明" and msg.text == "qunbot: /summary"
    assert ch.parse_line("QunBot：在吗") is not None and ch.user == "小明"  # any case, full-width colon


def test_a_time_a_link_or_a_heading_is_not_taken_for_a_speakers_name() -> None:
    """Any colon before the first space switched the speaker: "12:30 开会" was said by "12", and stayed so."""
    ch, _ = console(group=True)
    for line in ("12:30 开会，别迟到", "https://example.com/a 大家看看", "note:bring cake", "12: 开会"):
        msg = ch.parse_line(line)
        assert msg is not None and (msg.sender.user_id, msg.text) == ("me", line), line
    assert ch.user == "me"
    assert (m := ch.parse_line("小明: 你好")) is not None and m.sender.user_id == "小明"  # as the help says
    assert (m := ch.parse_line("me:我回来了")) is not None and (m.sender.user_id, m.text) == ("me", "我回来了")
    assert (m := ch.parse_line("小明:好的")) is not None and (m.sender.user_id, m.text) == ("小明", "好的")  # known


async def test_no_control_sequence_in_a_name_reaches_the_terminal() -> None:
    """The prompt wrote the speaker's name raw: a pasted "name: text" line or --user could set the window
    title or write the clipboard (OSC 52)."""
    out = io.StringIO()
    ch = ConsoleChannel(bot_name="qunbot", group=True, user="\x1b]0;title\x07me", stdin=io.StringIO(""),
                        stdout=out, prompt=True)
    ch._show_prompt()
    msg = ch.parse_line("\x1b]52;c;Y3VybA==\x07bob: 大家好")
    assert msg is not None and msg.sender.user_id == ch.user == "\x1b]0;title\x07me"  # not a name
    await ch.send(OutgoingMessage(key="k", chat=ch.chat, text="你好", mention=(msg.sender.user_id,)))
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert out.getvalue().endswith("]0;titleme › ")


async def test_the_prompt_names_the_speaker_and_is_redrawn_below_each_reply() -> None:
    out = io.StringIO()
    ch = ConsoleChannel(bot_name="qunbot", group=True, user="me", stdin=io.StringIO(""), stdout=out, prompt=True)
    ch._show_prompt()
    assert out.getvalue() == "me › "
    ch.parse_line("小明: hi")
    await ch.send(OutgoingMessage(key="k", chat=ch.chat, text="你好", mention=("小明",)))
    assert out.getvalue() == "me › \nqunbot ▸ @小明 你好\n小明 › "  # off the prompt's line, then a new prompt
    assert console()[0].prompt is False  # not a terminal: no prompt by default


async def test_a_restarted_console_still_reads_every_line(make_bot: Any, until: Until) -> None:
    # A standby process takes the console over, loses it and takes it back: the terminal keeps one
    # reader. With a reader per start, the stopped one took every other line, which went nowhere.
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "r", encoding="utf-8") as stdin, os.fdopen(write_end, "w", encoding="utf-8") as typed:
        ch = ConsoleChannel(bot_name="qunbot", group=True, stdin=stdin, stdout=io.StringIO())
        bot, _ = await make_bot(None, channel=ch)
        await ch.stop()
        await ch.start()
        for i in range(6):
            typed.write(f"小明: 第{i}行\n")
            typed.flush()

        async def all_recorded() -> bool:
            return len(await bot.history.recent(ch.chat)) == 6

        await until(all_recorded)
        assert [e.text for e in await bot.history.recent(ch.chat)] == [f"第{i}行" for i in range(6)]
        await bot.stop()


async def test_a_line_that_is_not_valid_text_is_read_with_replacements_and_the_session_goes_on(
        make_bot: Any, until: Until) -> None:
    """A line typed in a GBK terminal (你好 is c4e3 bac3) ended the whole session: its decode error was
    taken for the end of input, and every later line went unanswered."""
    ended: list[bool] = []
    out = io.StringIO()
    typed = io.BytesIO("/n 牛奶\n".encode() + b"/n \xc4\xe3\xba\xc3\n" + "/n 面包\n".encode())
    stdin = io.TextIOWrapper(typed, encoding="utf-8", errors="strict")
    ch = ConsoleChannel(bot_name="qunbot", stdin=stdin, stdout=out, on_eof=lambda: ended.append(True))
    bot, _ = await make_bot(None, channel=ch)
    await until(lambda: ended == [True])
    await bot.outbox.flush()
    shown = out.getvalue()
    replies = [line for line in shown.splitlines() if line.startswith("qunbot ▸")]
    assert len(replies) == 3 and "noted for me: 面包 x1" in replies[2], shown
    assert "\ufffd" in replies[1] and "not valid utf-8" in shown  # said so, before its answer
    assert shown.index("not valid utf-8") < shown.index(replies[1])


def slow_model(answer: str, after: asyncio.Event) -> ScriptedModel:
    async def script(request: ModelRequest) -> ModelResponse:
        await after.wait()
        return text(answer)
    return ScriptedModel(script)


async def test_a_question_being_answered_when_the_bot_stops_is_answered(make_bot: Any, until: Until) -> None:
    """Ctrl-C (or SIGTERM, SIGHUP) while the model worked cancelled the console's reader, and the
    question's handling with it: no answer, nothing kept for the next start."""
    out, answered = io.StringIO(), asyncio.Event()
    model = slow_model("周末去爬山吧", answered)
    ch = ConsoleChannel(bot_name="qunbot", stdin=io.StringIO("周末去哪\n"), stdout=out)
    bot, _ = await make_bot(model, channel=ch)
    await until(lambda: len(model.requests) == 1)
    stopping = asyncio.create_task(bot.stop(flush_timeout_s=0.05))  # the bot's own grace runs out first
    await until(lambda: ch._reader is None)  # the console is stopping: its reader is gone
    answered.set()  # within the console's grace
    await stopping
    assert out.getvalue().count("周末去爬山吧") == 1  # streamed to the screen as the bot stopped
    db = sqlite3.connect(bot.db.path)
    kept = db.execute("SELECT text, status FROM outbox").fetchall()
    db.close()
    assert kept in ([("周末去爬山吧", "pending")], [("周末去爬山吧", "sent")])  # and kept, if the outbox had stopped


async def test_a_question_still_unanswered_after_the_grace_is_answered_at_the_next_start(
        make_bot: Any, until: Until, tmp_path: Path) -> None:
    never = asyncio.Event()
    model = slow_model("不会到的回答", never)
    ch = ConsoleChannel(bot_name="qunbot", stdin=io.StringIO("周末去哪\n"), stdout=io.StringIO())
    ch.stop_grace_s = 0.05
    bot, _ = await make_bot(model, channel=ch)
    ch.park = bot.parked.park
    await until(lambda: len(model.requests) == 1)
    await bot.stop(flush_timeout_s=0.05)
    out = io.StringIO()
    again = ConsoleChannel(bot_name="qunbot", stdin=io.StringIO(""), stdout=out)
    bot2, _ = await make_bot(ScriptedModel([text("去爬山吧")]), channel=again, data_dir=tmp_path)

    async def answered() -> bool:  # (streamed to the screen before the reply is queued and recorded)
        await bot2.outbox.flush()
        said = [e.text for e in await bot2.history.recent(again.chat)]
        return "去爬山吧" in out.getvalue() and said == ["周末去哪", "去爬山吧"]

    await until(answered)


async def test_a_streamed_answer_longer_than_one_message_is_printed_once(make_bot: Any) -> None:
    """The outbox sends a long reply in parts of max_text_len: every part but the last was printed again
    after the streamed whole."""
    out = io.StringIO()
    ch = ConsoleChannel(bot_name="qunbot", stdin=io.StringIO(""), stdout=out)
    lines = [f"第{i}行：这是一段很长的回答。" for i in range(1200)]  # ~20,000 characters: three parts
    bot, _ = await make_bot(ScriptedModel([text("\n".join(lines)), text("短回答")]), channel=ch)
    await ch.deliver(ch.parse_line("讲个长故事") or _never())
    await bot.outbox.flush()
    await ch.deliver(ch.parse_line("再来") or _never())  # what was streamed for the first is forgotten
    await bot.outbox.flush()
    shown = out.getvalue()
    assert all(shown.count(f"第{i}行：") == 1 for i in range(1200)), len(shown)
    assert shown.count("短回答") == 1 and not ch._streaming
