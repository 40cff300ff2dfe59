"""Memories before each model run: where they go, their bound, and when they count as a recall.

The rule (memory.service): a shown memory counts as recalled only if the answer uses it (half of
its terms appear in the answer); a model's own ``recall`` call counts through that call; a memory
shown but unused changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from function_calls import ModelRequest, ModelResponse, estimate_tokens
from function_calls.testing import ScriptedModel, call, text
from memory.service import MEMORY_MARK, used_in
from tests.memory.conftest import Clock, ask, running


def memory_messages(request: ModelRequest) -> list[dict[str, Any]]:
    return [m for m in request.messages if m["role"] == "user" and str(m["content"]).startswith(MEMORY_MARK)]


async def level_of(ch: Any, needle: str, **kw: Any) -> str:
    listing = await ask(ch, "/memories", **kw)
    line = next(line for line in listing.splitlines() if needle in line)
    return line.split("·")[1]


async def test_memories_are_shown_outside_the_system_message_before_the_question(tmp_path: Path) -> None:
    model = ScriptedModel([text("好的")])
    async with running(tmp_path, model=model) as (_, ch):
        await ask(ch, "/remember 我对花生过敏", chat=ch.chat("u1", kind="private"))
        await ask(ch, "今晚吃什么？我对什么过敏来着", chat=ch.chat("u1", kind="private"))
        request = model.requests[0]
        assert "花生" not in request.messages[0]["content"]  # the system message
        shown = memory_messages(request)
        assert len(shown) == 1 and "我对花生过敏" in shown[0]["content"] and "不是指令" in shown[0]["content"]
        assert request.messages[-1]["content"].startswith("今晚吃什么")  # the question comes after them
        assert request.messages.index(shown[0]) == len(request.messages) - 2


async def test_memories_are_dated_by_the_chats_day_not_utcs(tmp_path: Path) -> None:
    """Saved at 07:30 on 3 March in Shanghai (23:30 on the 2nd in UTC): the person and the model read the 3rd."""
    clock = Clock()
    clock.now = datetime(2026, 3, 2, 23, 30, tzinfo=UTC)
    model = ScriptedModel([text("好的")])
    async with running(tmp_path, model=model, clock=clock, bot={"timezone": "Asia/Shanghai"}) as (_, ch):
        await ask(ch, "/remember 今天上午十点在三楼开周会 group")
        assert "·2026-03-03] 今天上午十点" in await ask(ch, "/memories")
        assert "·2026-03-03] 今天上午十点" in await ask(ch, "/recall 周会")
        await ask(ch, "周会在哪里开？", at_bot=True)
        assert "·2026-03-03] 今天上午十点" in memory_messages(model.requests[0])[0]["content"]


async def test_no_memory_message_when_nothing_matches_or_elsewhere(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: text("嗯"))
    async with running(tmp_path, model=model) as (_, ch):
        await ask(ch, "/remember 我对花生过敏", user="u1")
        await ask(ch, "明天天气怎么样", user="u1", at_bot=True)
        await ask(ch, "我对什么过敏", user="u2", at_bot=True)  # another member
        await ask(ch, "我对什么过敏", user="u1", at_bot=True, chat=ch.chat("g2"))  # another group
        assert [memory_messages(r) for r in model.requests] == [[], [], []]


async def test_the_context_stays_within_its_token_bound(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: text("嗯"))
    async with running(tmp_path, model=model, memory={"auto_context_n": 10, "auto_context_tokens": 120}) as (_, ch):
        for i in range(10):
            await ask(ch, f"/remember 第{i}次周会的纪要：讨论了预算、招聘、上线计划和很多很多其他的事情，结论是下周继续讨论")
        await ask(ch, "周会讨论了什么", at_bot=True)
        shown = memory_messages(model.requests[0])
        assert len(shown) == 1
        assert estimate_tokens(shown[0]["content"]) <= 120
        assert 1 <= shown[0]["content"].count("周会的纪要") < 10


async def test_short_memories_fill_the_bound_and_never_pass_it(tmp_path: Path) -> None:
    """Its header was reserved 30 tokens and counts 37: short lines filling the rest passed the bound by 7."""
    model = ScriptedModel(lambda r: text("嗯"))
    async with running(tmp_path, model=model, memory={"auto_context_n": 10, "auto_context_tokens": 70}) as (_, ch):
        for i in range(10):
            await ask(ch, f"/remember 周会{i}" + "议" * i)
        await ask(ch, "周会讨论了什么", at_bot=True)
        shown = memory_messages(model.requests[0])
        assert len(shown) == 1 and 60 <= estimate_tokens(shown[0]["content"]) <= 70


async def test_a_shown_memory_counts_as_recalled_only_when_the_answer_uses_it(tmp_path: Path) -> None:
    clock = Clock()
    answers = iter(["今天不开会。", "记得你对花生过敏，别点花生酱。"])
    model = ScriptedModel(lambda r: text(next(answers)))
    async with running(tmp_path, model=model, clock=clock) as (_, ch):
        await ask(ch, "/remember 我对花生过敏")
        await ask(ch, "晚饭点什么？我过敏的东西别点", at_bot=True)  # shown, not used
        assert memory_messages(model.requests[0])
        assert await level_of(ch, "花生") == "L0"
        await ask(ch, "那我过敏的东西是什么", at_bot=True)  # shown and used
        assert await level_of(ch, "花生") == "L1"


async def test_a_model_recall_counts_once(tmp_path: Path) -> None:
    def script(request: ModelRequest) -> ModelResponse:
        if request.messages[-1]["role"] == "tool":
            return text("你对花生过敏。")
        return call("recall", {"query": "过敏"})

    model = ScriptedModel(script)
    async with running(tmp_path, model=model) as (_, ch):
        await ask(ch, "/remember 我对花生过敏")
        reply = await ask(ch, "我对什么过敏？", at_bot=True)
        assert "花生" in reply
        assert "我对花生过敏" in model.requests[-1].messages[-1]["content"]  # the tool result
        assert await level_of(ch, "花生") == "L1"  # not L2: the answer's use is the same recall


async def test_a_used_memory_counts_even_when_the_model_recalled_something_else(tmp_path: Path) -> None:
    def script(request: ModelRequest) -> ModelResponse:
        if request.messages[-1]["role"] == "tool":
            return text("周会在周四；另外你对花生过敏。")
        return call("recall", {"query": "周会"})

    async with running(tmp_path, model=ScriptedModel(script)) as (_, ch):
        await ask(ch, "/remember 我对花生过敏")
        await ask(ch, "/remember 周会在周四")
        await ask(ch, "周会哪天？顺便提醒我对什么过敏", at_bot=True)
        assert await level_of(ch, "花生") == "L1"  # shown and used
        assert await level_of(ch, "周会在周四") == "L1"  # returned by the model's recall


async def test_the_model_saves_a_group_memory_the_group_sees(tmp_path: Path) -> None:
    def script(request: ModelRequest) -> ModelResponse:
        if request.messages[-1]["role"] == "tool":
            return text("记住了")
        return call("remember", {"content": "我们组周会改到周四了", "scope": "group"})

    async with running(tmp_path, model=ScriptedModel(script)) as (_, ch):
        await ask(ch, "记住：我们组周会改到周四了", user="u7", at_bot=True)
        listing = await ask(ch, "/memories", user="u8")
        assert "周会改到周四" in listing and "[群·" in listing


def test_used_in() -> None:
    assert used_in("我对花生过敏", "记得你对花生过敏")
    assert not used_in("我对花生过敏", "今天不开会")
    assert used_in("standup at nine", "Your standup is at nine.")


async def test_a_long_memory_ranked_first_does_not_hide_the_short_ones_below_it(tmp_path: Path) -> None:
    """A 400-character group note ranked first does not fit the 300 tokens: the memories below it still show."""
    model = ScriptedModel(lambda r: text("嗯"))
    async with running(tmp_path, model=model) as (_, ch):
        await ask(ch, "/remember 我对花生过敏", user="u1")
        await ask(ch, "/remember 过敏须知：" + "过敏的人请注意，聚餐时先问清楚菜里有什么。" * 20 + " group", user="u2")
        await ask(ch, "聚餐时要注意什么？我对什么过敏？", user="u1", at_bot=True)
        shown = memory_messages(model.requests[0])
        assert len(shown) == 1 and "我对花生过敏" in shown[0]["content"]
        assert estimate_tokens(shown[0]["content"]) <= 300
