"""The summary tool (and its part of /forget me) inside a real bot (MemoryChannel, scripted model)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import summary
import summary.mapreduce as mapreduce_module
import summary.tools as tools_module
from function_calls import (
    ArgumentError,
    Caller,
    ModelAPIError,
    ModelRequest,
    ModelResponse,
    ToolContext,
    ToolResult,
    estimate_messages,
)
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import ConfigError, Settings
from robot.message import ChatRef
from robot.testing import MemoryChannel
from summary import SummaryArgs, extractive_summary
from summary.window import read_mark

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


@asynccontextmanager
async def running(tmp_path: Path, model: Any = None, clock: Clock | None = None,
                  **sections: Any) -> AsyncIterator[tuple[Bot, MemoryChannel]]:
    ch = MemoryChannel()
    sections["limits"] = {"user_burst": 50, "chat_burst": 50, **sections.get("limits", {})}
    sections["summary"] = {"user_cooldown_s": 0, **sections.get("summary", {})}  # tests/summary/test_features.py has it
    settings = Settings(bot={"data_dir": tmp_path}, **sections)
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin], clock=clock or Clock())
    await bot.start()
    try:
        yield bot, ch
    finally:
        await bot.stop()


def summariser() -> ScriptedModel:
    """Calls the summary tool when offered tools; otherwise answers a map/reduce request."""
    return ScriptedModel(lambda r: call("summary", {}) if r.tools else text("模型总结"))


def chat_lines(model: ScriptedModel) -> list[str]:
    out: list[str] = []
    for request in model.requests:
        if not request.tools:
            body = str(request.messages[-1]["content"])
            out += [line.split("] ", 1)[1] for line in body.splitlines() if line.startswith("[")]
    return out


async def run_tool(bot: Bot, args: SummaryArgs, *, user: str = "1", chat: ChatRef = G1,
                   message_id: str = "") -> ToolResult:
    caller = Caller(platform=chat.platform, user_id=user, user_name=user, chat_id=chat.chat_id, chat_kind=chat.kind,
                    message_id=message_id)
    ctx: ToolContext[Any] = ToolContext(deps=bot.deps_for(summary.summary), caller=caller, zone=bot.zone,
                                        clock=bot.clock)
    return await summary.summary.invoke(ctx, args)


def test_arguments_window_rules_are_readable_errors() -> None:
    tool = summary.summary
    with pytest.raises(ArgumentError, match="hours 和 messages 只能给一个"):
        tool.parse_arguments({"hours": 2, "messages": 10})
    for bad in ({"hours": 0}, {"hours": 169}, {"messages": 0}, {"messages": 5001}, {"days": 1}):
        with pytest.raises(ArgumentError):
            tool.parse_arguments(bad)
    assert tool.parse_arguments({}) == SummaryArgs()
    assert tool.name == "summary" and tool.aliases == ()


async def test_default_window_is_since_the_last_summary_and_the_mark_moves(tmp_path: Path) -> None:
    model, clock = summariser(), Clock()
    async with running(tmp_path, model, clock) as (bot, ch):
        await ch.inject("上周的旧消息", user="1", at=ago(25 * 60))
        await ch.inject("今天开会吗", user="1", at=ago(30))
        await ch.inject("下午三点", user="2", at=ago(20))
        first = await run_tool(bot, SummaryArgs())
        assert chat_lines(model) == ["1(1): 今天开会吗", "2(2): 下午三点"]  # no mark yet: the last 24 h
        await bot.send(G1, first.user_messages[0], key="summary-1")  # the summary lands in history too
        clock.now = NOW + timedelta(minutes=5)
        await ch.inject("那我订会议室", user="3", at=NOW + timedelta(minutes=1))
        model.requests.clear()
        await run_tool(bot, SummaryArgs())
        assert chat_lines(model) == ["3(3): 那我订会议室"]  # not the old ones, not the bot's summary
        third = await run_tool(bot, SummaryArgs())
    assert third.user_messages[0] == "【群聊总结】自上次总结以来：没有可以总结的新消息。"


@pytest.mark.unrehearsed(reason="its slow unit waits on an event the test sets: a rehearsal runs it twice, the second "
                         "time in a transaction begun after the summary's horizon (seen to fail once under load)")
async def test_on_postgresql_a_message_stored_slowly_is_in_the_next_summary_not_behind_the_mark(
        tmp_path: Path, pg_url: str) -> None:
    # PostgreSQL gives the slower unit's message an id at INSERT and shows it at COMMIT: a younger
    # message committed first moved the mark past it, and no summary ever read it.
    from robot.history import HistoryStore

    model = summariser()
    async with running(tmp_path, model, storage={"url": pg_url}) as (bot, ch):
        await ch.inject("第一条", user="1", at=ago(3))
        await run_tool(bot, SummaryArgs())
        hold, inserted = threading.Event(), threading.Event()

        def slow(db: Any) -> None:  # another process's unit (or this one's, slower): id taken, not committed
            HistoryStore.insert_sync(db, G1, "2", "2", "明天下午三点开会，我来订会议室", ago(2), message_id="slow-1")
            inserted.set()
            hold.wait(10)

        slow_unit = asyncio.ensure_future(bot.db.transaction(slow))
        while not inserted.is_set():
            await asyncio.sleep(0.01)
        await ch.inject("好的", user="3", at=ago(1))  # a higher id, committed first
        model.requests.clear()
        second = asyncio.ensure_future(run_tool(bot, SummaryArgs()))
        await asyncio.sleep(0.3)
        assert not second.done()  # it waits for the insert in flight
        # ... and holds up nobody: a table lock queued every process's intake behind it.
        await asyncio.wait_for(ch.inject("收到", user="4", at=ago(0.5)), 2)
        hold.set()
        await slow_unit
        await second
        assert chat_lines(model)[:2] == ["2(2): 明天下午三点开会，我来订会议室", "3(3): 好的"]
        model.requests.clear()
        third = await run_tool(bot, SummaryArgs())
    assert "没有可以总结的新消息" in third.user_messages[0]


async def test_a_message_in_the_same_second_as_the_last_summarised_one_is_not_lost(tmp_path: Path) -> None:
    # OneBot timestamps are whole seconds: a later message can carry the mark's own second.
    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        await ch.inject("第一条", user="1", at=ago(1))
        await run_tool(bot, SummaryArgs())
        await ch.inject("同一秒的第二条", user="2", at=ago(1))
        model.requests.clear()
        await run_tool(bot, SummaryArgs())
        assert chat_lines(model) == ["2(2): 同一秒的第二条"]  # neither skipped nor the first one again
        model.requests.clear()
        again = await run_tool(bot, SummaryArgs())
    assert "没有可以总结的新消息" in again.user_messages[0] and model.requests == []


async def test_hours_and_messages_windows(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        for i, minutes in enumerate((300, 150, 90, 30, 10)):
            await ch.inject(f"消息{i}", user=str(i), at=ago(minutes))
        result = await run_tool(bot, SummaryArgs(hours=2))
        assert chat_lines(model) == ["2(2): 消息2", "3(3): 消息3", "4(4): 消息4"]
        assert result.user_messages[0].startswith("【群聊总结】最近 2 小时 · 3 条消息 · 3 人发言")
        model.requests.clear()
        await run_tool(bot, SummaryArgs(messages=2))
        assert chat_lines(model) == ["3(3): 消息3", "4(4): 消息4"]


async def test_a_summary_never_includes_another_chats_messages(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        await ch.inject("这边的消息", user="1", chat=G1, at=ago(3))
        await ch.inject("那边的秘密", user="1", chat=G2, at=ago(2))
        await run_tool(bot, SummaryArgs(messages=50))
    assert chat_lines(model) == ["1(1): 这边的消息"]
    assert all("秘密" not in str(r.messages) for r in model.requests)


async def test_usage_is_returned_in_the_tool_data(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model, summary={"max_request_tokens": 900, "chunk_output_tokens": 100}) as (bot, ch):
        for i in range(60):
            await ch.inject(f"第{i}条：" + "讨论内容" * 20, user=str(i % 4), at=ago(60 - i))
        result = await run_tool(bot, SummaryArgs())
    data = result.data or {}
    assert data["model_calls"] == len(model.requests) > 2
    assert data["prompt_tokens"] == sum(estimate_messages(r.messages) for r in model.requests)
    assert 0 < int(str(data["largest_request_tokens"])) <= 900
    assert data["messages"] == 60 and data["completion_tokens"] and data["mode"] == "llm"
    assert not result.continue_ and result.user_messages[0] == result.content


async def test_asked_in_chat_the_summary_is_the_answer_without_another_model_turn(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model) as (_bot, ch):
        await ch.inject("周六去爬山吧", user="1", name="Alice", at=ago(5))
        await ch.inject("好呀", user="2", name="Bob", at=ago(4))
        await ch.inject("帮我总结一下", user="2", name="Bob", at=ago(1), at_bot=True)
        sent = await ch.wait_sent(1)
    with_tools = [r for r in model.requests if r.tools]
    assert len(with_tools) == 1  # the tool's reply ended the run
    assert len(sent) == 1 and sent[0].mention == ("2",)
    assert sent[0].text.startswith("【群聊总结】最近 24 小时 · 2 条消息 · 2 人发言") and sent[0].text.endswith("模型总结")
    assert chat_lines(model) == ["Alice(1): 周六去爬山吧", "Bob(2): 好呀"]  # not the request itself


async def test_the_request_is_not_one_of_the_last_n_messages(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: call("summary", {"messages": 2}) if r.tools else text("模型总结"))
    async with running(tmp_path, model) as (bot, ch):
        for i in range(3):
            await ch.inject(f"消息{i}", user=str(i), at=ago(10 - i))
        await ch.inject("总结最近两条", user="9", at=ago(1), at_bot=True)
        await ch.wait_sent(1)
        assert chat_lines(model) == ["1(1): 消息1", "2(2): 消息2"]
        model.requests.clear()
        await run_tool(bot, SummaryArgs())  # messages= left the mark: what it skipped is still to summarise
    assert "0(0): 消息0" in chat_lines(model)


class LoopProbe:
    """Wraps a function so it returns only after the event loop ran something else meanwhile."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.loop_ran = threading.Event()
        self.loop_was_free: list[bool] = []

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.loop_ran.clear()
            self.started.set()
            # On the event loop's own thread this waits in vain: the watcher cannot run.
            self.loop_was_free.append(self.loop_ran.wait(3))
            return real(*args, **kwargs)
        return wrapper

    async def watch(self) -> None:
        while True:
            if self.started.is_set():
                self.started.clear()
                self.loop_ran.set()
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("with_model", [True, False])
async def test_heavy_summary_work_leaves_the_event_loop_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             with_model: bool) -> None:
    probe = LoopProbe()
    if with_model:
        monkeypatch.setattr(mapreduce_module, "plan_chunks", probe.wrap(mapreduce_module.plan_chunks))
    else:
        monkeypatch.setattr(tools_module, "extractive_summary", probe.wrap(extractive_summary))
    async with running(tmp_path, summariser() if with_model else None) as (bot, ch):
        await ch.inject("周六打球", user="1", at=ago(3))
        watcher = asyncio.create_task(probe.watch())
        try:
            result = await run_tool(bot, SummaryArgs())
        finally:
            watcher.cancel()
    assert probe.loop_was_free == [True]
    assert "周六打球" in result.user_messages[0] or result.user_messages[0].endswith("模型总结")


async def test_a_failing_model_falls_back_to_the_extractive_summary_and_keeps_the_mark(tmp_path: Path) -> None:
    def broken(request: ModelRequest) -> ModelResponse | ModelAPIError:
        return ModelAPIError("the model endpoint answered HTTP 401", status=401)

    async with running(tmp_path, ScriptedModel(broken)) as (bot, ch):
        await ch.inject("明天8点集合？", user="1", name="Alice", at=ago(5))
        result = await run_tool(bot, SummaryArgs())
        assert await read_mark(bot.db, G1) is None
    reply = result.user_messages[0]
    assert "AI 总结暂时失败" in reply and "Alice(1): 明天8点集合？" in reply
    assert result.data and result.data["mode"] == "fallback" and result.data["model_calls"] == 1


async def test_without_budget_left_the_summary_is_extractive(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model, limits={"user_daily_tokens": 0}) as (_bot, ch):
        await ch.inject("明天8点集合？", user="1", at=ago(5))
        await ch.inject("/summary", user="1", at=ago(1))
        sent = await ch.wait_sent(1)
    assert model.requests == []
    assert "今天的 AI 用量已达上限" in sent[0].text and "1(1): 明天8点集合？" in sent[0].text


async def test_an_empty_window_says_so(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        await ch.inject("/summary hours=1", user="1", at=ago(1))
        sent = await ch.wait_sent(1)
        assert await read_mark(bot.db, G1) is None
    assert sent[0].text == "【群聊总结】最近 1 小时：没有可以总结的新消息。"
    assert model.requests == []


async def test_both_window_arguments_on_the_command_line_are_refused(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("/summary hours=2 messages=10", user="1", at=ago(1))
        sent = await ch.wait_sent(1)
    assert "参数有误" in sent[0].text and "hours 和 messages 只能给一个" in sent[0].text


async def test_window_mistakes_are_told_in_chinese_without_echoing_the_input(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("/summary 999", user="1", at=ago(2))
        await ch.inject("/summary 昨天 hours=3", user="1", at=ago(1))
        sent = await ch.wait_sent(2)
    for reply in (m.text for m in sent):
        first = reply.split("用法")[0]
        assert "参数有误" in first and '{"' not in first  # no JSON of the whole input
        assert not re.search(r"[A-Za-z]{4,} [A-Za-z]{2,} [A-Za-z]{2,}", first), first  # no English sentence


async def test_the_fetch_cap_keeps_the_newest_messages_and_says_so(tmp_path: Path) -> None:
    async with running(tmp_path, summary={"max_fetch": 100}) as (bot, ch):
        for i in range(130):
            await ch.inject(f"消息{i}", user="1", at=ago(200 - i))
        result = await run_tool(bot, SummaryArgs())
    assert "这段时间共 130 条，只看最近 100 条" in result.user_messages[0]
    assert result.data and result.data["messages"] == 100


async def test_forget_me_deletes_only_the_callers_messages_in_this_chat(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ch.inject("我的第一条", user="1", chat=G1, at=ago(9))
        await ch.inject("别人的", user="2", chat=G1, at=ago(8))
        await ch.inject("我的第二条", user="1", chat=G1, at=ago(7))
        await ch.inject("我在别的群", user="1", chat=G2, at=ago(6))
        await bot.send(G1, "机器人的话", key="k1")
        await ch.inject("/forget me", user="1", chat=G1, at=ago(1))
        sent = await ch.wait_sent(2)
        left_here = [(h.user_id, h.text) for h in await bot.history.recent(G1, 50)]
        left_there = [(h.user_id, h.text) for h in await bot.history.recent(G2, 50)]
    assert sent[-1].text == "已删除你在本群的记录：3 条消息。"  # two messages and the /forget line itself
    assert ("2", "别人的") in left_here and ("bot", "机器人的话") in left_here
    assert not any(user == "1" for user, _ in left_here)
    assert left_there == [("1", "我在别的群")]


async def test_forget_me_also_removes_earlier_summaries_that_may_quote_the_caller(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ch.inject("我的手机号是 138xxxx", user="1", chat=G1, at=ago(9))
        await ch.inject("那边的话", user="1", chat=G2, at=ago(8))
        for chat, key in ((G1, "s1"), (G2, "s2")):
            await bot.send(chat, (await run_tool(bot, SummaryArgs(), chat=chat)).user_messages[0], key=key)
        await bot.send(G1, "机器人的话", key="k1")
        await ch.wait_sent(3)
        await ch.inject("/forget me", user="1", chat=G1, at=ago(1))
        sent = await ch.wait_sent(4)
        here = [h.text for h in await bot.history.recent(G1, 50)]
        there = [h.text for h in await bot.history.recent(G2, 50)]
    assert sent[-1].text == "已删除你在本群的记录：2 条消息、1 条可能引用你的聊天总结。"
    assert not any("138xxxx" in t for t in here) and "机器人的话" in here
    assert any(t.startswith("【群聊总结】") and "那边的话" in t for t in there)  # another chat: untouched


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
async def test_forget_me_all_removes_summaries_quoting_them_after_their_messages_aged_out(
        tmp_path: Path, request: pytest.FixtureRequest, storage: str) -> None:
    """``/forget me all`` in private left a group's summary that quoted the person's phone number once their
    own messages there had aged out of [history]: the group was no longer among their traces. Summaries
    stored before their authors were recorded go by the ``(<id>)`` label they quote the person with."""
    clock = Clock()
    sections: dict[str, Any] = {"history": {"retention_days": 1}}
    if storage == "postgresql":
        sections["storage"] = {"url": request.getfixturevalue("pg_url")}
    g3 = ChatRef(platform="memory", chat_id="g3", kind="group")
    model = ScriptedModel(lambda r: text("小明说他的手机号是 13912345678" if "139" in str(r.messages) else "别的话题"))
    async with running(tmp_path, model, clock, **sections) as (bot, ch):
        await ch.inject("我的手机号是 13912345678", user="1", name="小明", chat=G1, at=clock.now)
        await ch.inject("别的群的话", user="2", chat=G2, at=clock.now)
        clock.now += timedelta(hours=12)
        await ch.inject("好的，周五见", user="2", chat=G1, at=clock.now)
        for chat, key in ((G1, "s1"), (G2, "s2")):
            await bot.send(chat, (await run_tool(bot, SummaryArgs(), user="2", chat=chat)).user_messages[0], key=key)
        await bot.send(g3, "【群聊总结】最近 24 小时\n- 小明(1): 我的手机号是 13912345678", key="s3")  # (an older one)
        await ch.wait_sent(3)
        clock.now += timedelta(hours=13)  # 小明's message is past the day kept; the summaries are not
        await bot.history.apply_retention(clock.now)
        assert not [h for h in await bot.history.recent(G1, 50) if h.user_id == "1"]
        await ch.inject("/forget me all", user="1", chat=ChatRef(platform="memory", chat_id="1", kind="private"),
                        at=clock.now)
        reply = (await ch.wait_sent(4))[-1].text
        left = [h.text for chat in (G1, G2, g3) for h in await bot.history.recent(chat, 50)]
        recorded = await bot.db.run(lambda db: db.execute("SELECT chat, user_id FROM summary_authors").fetchall())
    assert not any("13912345678" in t for t in left), left
    assert sorted(tuple(r) for r in recorded) == [("memory:group:g1", "2"), ("memory:group:g2", "2")]  # theirs went
    assert "2 条可能引用你的聊天总结" in reply, reply
    assert any(t.startswith("【群聊总结】") and "别的话题" in t for t in left)  # they never spoke in g2: kept


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
async def test_who_a_summary_read_follows_its_chat_to_a_new_id(tmp_path: Path, request: pytest.FixtureRequest,
                                                               storage: str) -> None:
    """A Telegram group become a supergroup: its summaries move with its history, so who they read does too."""
    sections: dict[str, Any] = {} if storage == "sqlite" else {"storage": {"url": request.getfixturevalue("pg_url")}}
    g9 = ChatRef(platform="memory", chat_id="g9", kind="group")
    async with running(tmp_path, None, **sections) as (bot, ch):
        for chat, user in ((G1, "1"), (G1, "2"), (g9, "2")):
            await ch.inject("说过的话", user=user, chat=chat, at=ago(5))
            await run_tool(bot, SummaryArgs(), user="3", chat=chat)
        await bot.move_chat(G1, g9)
        rows = await bot.db.run(lambda db: db.execute("SELECT chat, user_id FROM summary_authors").fetchall())
    assert sorted(tuple(r) for r in rows) == [("memory:group:g9", "1"), ("memory:group:g9", "2")]


async def test_forget_needs_the_explicit_target_me(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ch.inject("留着", user="1", at=ago(5))
        await ch.inject("/forget", user="1", at=ago(2))
        await ch.inject("/forget everyone", user="1", at=ago(1))
        sent = await ch.wait_sent(2)
        kept = await bot.history.recent(G1, 50)
    assert all("参数有误" in m.text for m in sent)
    assert any(h.text == "留着" for h in kept)


def test_bad_summary_settings_are_a_config_error(tmp_path: Path) -> None:
    settings = Settings(bot={"data_dir": tmp_path}, summary={"max_chunks": 0})
    with pytest.raises(ConfigError, match=r"\[summary\] max_chunks"):
        settings.section("summary", summary.SummarySettings)


async def test_the_bots_own_replies_are_not_counted_as_messages(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ch.inject("周五聚餐？", user="1", name="Alice", at=ago(9))
        await bot.send(G1, "好的，已设置提醒 #abcd", key="k1")
        await ch.inject("好啊", user="2", name="Bob", at=ago(5))
        await ch.wait_sent(1)
        await ch.inject("/summary", user="2", name="Bob", at=ago(1))
        reply = (await ch.wait_sent(2))[-1].text
    assert reply.startswith("【群聊总结】最近 24 小时 · 共 2 条消息 · 2 人发言"), reply
    assert "已设置提醒" not in reply


async def test_the_last_n_messages_are_n_said_by_people(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        for i in range(4):
            await ch.inject(f"消息{i}", user=str(i), at=ago(20 - i))
        await ch.inject("/summary", user="9", at=ago(5))
        await ch.inject("/summary", user="9", at=ago(4))
        await ch.wait_sent(2)
        await ch.inject("/summary messages=3", user="9", at=ago(1))
        reply = (await ch.wait_sent(3))[-1].text
    assert reply.startswith("【群聊总结】最近 3 条 · 共 3 条消息 · 3 人发言"), reply
    assert "消息0" not in reply


async def test_a_private_chat_summary_is_not_headed_group_chat(tmp_path: Path) -> None:
    dm = ChatRef(platform="memory", chat_id="u1", kind="private")
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("明天记得交报告", user="u1", chat=dm, at=ago(9))
        await ch.inject("/summary", user="u1", chat=dm, at=ago(1))  # after the bot's "no model" answer
        reply = (await ch.wait_sent(2))[1].text
        await ch.inject("/forget me", user="u1", chat=dm, at=ago(0.5))
        forgot = (await ch.wait_sent(3))[2].text
        left = await _bot.history.recent(dm, 50)
    assert reply.startswith("【聊天总结】最近 24 小时") and "群聊" not in reply
    assert forgot.startswith("已删除")
    assert not any(e.text.startswith("【聊天总结】") for e in left)  # /forget also takes private summaries


async def test_approval_commands_are_not_conversation(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("我们决定周六去爬山", user="1", at=ago(9))
        await ch.inject("/pending", user="2", at=ago(8))
        await ch.inject("/approve ABCDE", user="2", at=ago(7))
        await ch.inject("/拒绝 ABCDE 太贵", user="3", at=ago(6))
        await ch.inject("/summary", user="1", at=ago(1))
        sent = await ch.wait_sent(4)
    digest = sent[-1].text
    assert "爬山" in digest and "共 1 条消息" in digest
    assert "/pending" not in digest and "ABCDE" not in digest


async def test_one_members_summary_and_an_hours_window_leave_the_mark_where_it_was(tmp_path: Path) -> None:
    """"总结 @小明" or hours=1 summarise part of what came since the last summary: the next plain
    /summary must still see the rest (it skipped it: "没有可以总结的新消息")."""
    model = summariser()
    async with running(tmp_path, model) as (bot, ch):
        await ch.inject("旧的", user="1", at=ago(300))
        await run_tool(bot, SummaryArgs())  # the mark
        await ch.inject("小明的话", user="1", name="小明", at=ago(120))
        await ch.inject("小红的决定：周五发版", user="2", name="小红", at=ago(110))
        await ch.inject("十分钟前", user="3", at=ago(10))
        await run_tool(bot, SummaryArgs(member="@小明"))
        await run_tool(bot, SummaryArgs(hours=1))
        model.requests.clear()
        await run_tool(bot, SummaryArgs())
        assert "小红(2): 小红的决定：周五发版" in chat_lines(model) and "1(1): 旧的" not in chat_lines(model)


async def test_the_window_note_never_counts_an_opted_out_members_messages(tmp_path: Path) -> None:
    """"共 6 条，只看最近 1 条" told the chat how many messages the opted-out member had sent."""
    async with running(tmp_path) as (bot, ch):
        await ch.inject("/summary optout", user="2", at=ago(100))
        for i in range(5):
            await ch.inject(f"小红消息{i}", user="2", name="小红", at=ago(20 - i))
        await ch.inject("小明说：我来订会议室", user="1", name="小明", at=ago(10))
        for args in (SummaryArgs(hours=1), SummaryArgs(member="@小明")):
            assert "只看最近" not in (await run_tool(bot, args)).user_messages[0]


async def test_two_summaries_asked_together_pay_for_one(tmp_path: Path) -> None:
    """Two members asking at once both read the same mark, and the model ran twice over the same messages."""
    from function_calls import ModelResponse, Usage

    class Slow:
        name, calls = "slow", 0

        async def complete(self, request: Any, *, on_text: Any = None) -> ModelResponse:
            Slow.calls += 1
            await asyncio.sleep(0.2)
            return ModelResponse(text="模型总结", usage=Usage(requests=1, prompt_tokens=100, completion_tokens=10),
                                 finish_reason="stop")

    async with running(tmp_path, Slow()) as (bot, ch):
        await ch.inject("周六去爬山", user="1", at=ago(5))
        await ch.inject("好呀", user="2", at=ago(4))
        first, second = await asyncio.gather(run_tool(bot, SummaryArgs(), user="1"),
                                             run_tool(bot, SummaryArgs(), user="2"))
    assert Slow.calls == 1 and "没有可以总结的新消息" in first.user_messages[0] + second.user_messages[0]
