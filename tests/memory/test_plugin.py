"""The memory plugin inside a real bot: commands, privacy, /forget, sleep and dreams."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import memory
from memory import MemoryDeps
from tests.memory.conftest import Clock, ask, running


def deps(bot: object) -> MemoryDeps:
    found = bot._deps["memory"]  # type: ignore[attr-defined]
    assert isinstance(found, MemoryDeps)
    return found


def ids_in(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"#(\d+)", text)]


async def test_remember_then_recall_by_a_two_character_word_and_by_a_question(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, ch):
        assert "记住了" in await ask(ch, "/remember 我对花生过敏")
        assert "花生过敏" in await ask(ch, "/recall 过敏")
        assert "花生过敏" in await ask(ch, "/recall 我对什么过敏？")
        assert "没有找到" in await ask(ch, "/recall 周会")
        listing = await ask(ch, "/memories")
        assert "花生过敏" in listing and "L1" in listing  # the second recall came within the 1 h interval


async def test_levels_shown_by_memories_follow_the_rules(tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock=clock) as (_, ch):
        await ask(ch, "/remember 我们组周会改到周四了 group")
        await ask(ch, "/recall 周会")  # level 0 -> 1 (always)
        await ask(ch, "/recall 周会")  # within 3 h: stays 1
        assert "L1" in await ask(ch, "/memories")
        clock.now = clock.now.replace(hour=16)
        await ask(ch, "/recall 周会")  # idle 4 h > 3 h: 2
        assert "L2" in await ask(ch, "/memories")


async def test_a_users_memories_stay_in_their_chat_and_with_them(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, ch):
        g1, g2, dm = ch.chat("g1"), ch.chat("g2"), ch.chat("u1", kind="private")
        await ask(ch, "/remember 我对花生过敏", user="u1", chat=g1)
        await ask(ch, "/remember 本群的年会在三亚 group", user="u1", chat=g1)
        await ask(ch, "/remember 我的银行卡尾号是1234", user="u1", chat=dm)
        assert "花生" in await ask(ch, "/recall 过敏", user="u1", chat=g1)
        assert "没有找到" in await ask(ch, "/recall 过敏", user="u2", chat=g1)  # another member
        assert "没有找到" in await ask(ch, "/recall 过敏", user="u1", chat=g2)  # another group
        assert "没有找到" in await ask(ch, "/recall 过敏", user="u1", chat=dm)  # not even their private chat
        assert "三亚" in await ask(ch, "/recall 年会", user="u2", chat=g1)  # group memories: the group's
        assert "没有找到" in await ask(ch, "/recall 年会", user="u1", chat=g2)
        assert "1234" in await ask(ch, "/recall 银行卡", user="u1", chat=dm)
        assert "没有找到" in await ask(ch, "/recall 银行卡", user="u1", chat=g1)
        dm2 = ch.chat("u2", kind="private")
        assert "没有找到" in await ask(ch, "/recall 银行卡", user="u2", chat=dm2)
        assert "1234" not in await ask(ch, "/memories", user="u2", chat=g1)


async def test_group_scope_is_refused_in_a_private_chat(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, ch):
        reply = await ask(ch, "/remember 周会改到周四 group", chat=ch.chat("u1", kind="private"))
        assert "私聊里只能记住关于你自己的事" in reply


async def test_forget_by_id_author_group_admin_and_others(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, ch):
        mine = ids_in(await ask(ch, "/remember 我对花生过敏", user="u1"))[0]
        group = ids_in(await ask(ch, "/remember 周会改到周四 group", user="u1"))[0]
        # Someone else's personal memory does not exist for another member, even a group admin.
        assert "没有找到" in await ask(ch, f"/forget {mine}", user="u2", role="admin")
        assert "只有保存者和群管理员" in await ask(ch, f"/forget {group}", user="u2")
        assert f"已删除记忆 #{group}" in await ask(ch, f"/forget #{group}", user="u3", role="admin")
        assert "没有找到" in await ask(ch, f"/forget {mine}", user="u1", chat=ch.chat("g2"))  # not from elsewhere
        assert f"已删除记忆 #{mine}" in await ask(ch, f"/forget {mine}", user="u1")
        assert "没有找到" in await ask(ch, "/recall 过敏", user="u1")
        assert "参数有误" in await ask(ch, "/forget everything", user="u1")


async def test_forget_me_removes_memories_with_the_history(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ask(ch, "/remember 我对花生过敏", user="u1")
        await ask(ch, "/remember 我住在杭州", user="u1")
        await ask(ch, "/remember 我对猫过敏", user="u2")
        reply = await ask(ch, "/forget me", user="u1")
        assert "2 条记忆" in reply
        assert "没有找到" in await ask(ch, "/recall 杭州", user="u1")
        assert "猫" in await ask(ch, "/recall 过敏", user="u2")  # only the caller's
        left = await bot.db.run(lambda db: db.execute("SELECT count(*) FROM memory_terms").fetchone()[0])
        assert left == 1  # no copy stays in the index either


@pytest.mark.parametrize("how", ["/forget me", "/forget <id>"])
async def test_a_forgotten_memorys_words_are_in_no_file(tmp_path: Path, how: str) -> None:
    """FTS5's DELETE leaves the words in its old index segments: the file must not keep them."""
    secret = "zanzibarpasscode"
    async with running(tmp_path) as (bot, ch):
        for i in range(3):
            await ask(ch, f"/remember 别人的事 other{i}", user="u2")
        mid = ids_in(await ask(ch, f"/remember 我的密码是 {secret}", user="u1"))[0]
        await ask(ch, "/forget me" if how == "/forget me" else f"/forget {mid}", user="u1")
        blocks = await bot.db.run(lambda db: db.execute("SELECT block FROM memory_terms_data").fetchall())
        assert not any(secret.encode() in bytes(block) for (block,) in blocks)
        if how == "/forget me":  # with the history: the whole file (its WAL checkpointed) holds no copy
            files = b"".join(f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())
            assert secret.encode() not in files
        assert "other1" in await ask(ch, "/recall other1", user="u2")  # the index still finds the rest


async def test_sleep_is_for_bot_admins_and_dreams_are_stored_not_posted(tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock=clock) as (bot, ch):
        await ask(ch, "/remember 阳台的花要浇水 group")
        assert "只有机器人管理员" in await ask(ch, "/sleep", user="u2", role="owner")
        clock.now = clock.now.replace(hour=20)
        reply = await ask(ch, "/sleep", user="boss")
        assert "遗忘 1 条" in reply and "梦境" in reply
        dreams = await bot.db.run(lambda db: deps(bot).service.store.dreams(db, "memory:group:g1"))
        assert len(dreams) == 1 and "浇水" in dreams[0][1]
        await asyncio.sleep(0.05)
        assert not any(m.text.startswith("💤") for m in ch.sent)


async def test_a_members_own_memory_in_a_group_sleeps_away_without_a_dream_the_group_reads(tmp_path: Path) -> None:
    """Only u1 may see their memory in g1: neither the /sleep reply nor the posted dream may quote it."""
    clock = Clock()
    async with running(tmp_path, clock=clock, memory={"post_dreams": True}) as (bot, ch):
        await ask(ch, "/remember 我的银行卡密码是八八六六", user="u1")
        await ask(ch, "/remember 阳台的花要浇水 group", user="u1")
        assert "没有找到" in await ask(ch, "/recall 银行卡", user="u2")
        clock.now = clock.now.replace(hour=20)
        before = len(ch.sent)
        await ch.inject("/sleep", user="boss")
        reply, posted = sorted((m.text for m in (await ch.wait_sent(before + 2))[before:]), key=len, reverse=True)
        assert "遗忘 2 条" in reply and "浇水" in reply and posted.startswith("💤") and "浇水" in posted
        await asyncio.sleep(0.05)
        assert not any("八八六六" in m.text for m in ch.sent[before:])
        dreams = await bot.db.run(lambda db: deps(bot).service.store.dreams(db, "memory:group:g1"))
        assert len(dreams) == 1 and "八八六六" not in dreams[0][1]


async def test_forget_me_all_takes_the_dreams_of_memories_that_already_slept_away(tmp_path: Path) -> None:
    clock = Clock()
    async with running(tmp_path, clock=clock) as (bot, ch):
        await ask(ch, "/remember 老王的手机号是一三八 group", user="u1")
        clock.now = clock.now.replace(hour=20)
        assert "一三八" in await ask(ch, "/sleep", user="boss")  # the memory is gone, its dream stays
        assert "已删除" in await ask(ch, "/forget me all", user="u1", chat=ch.chat("u1", kind="private"))
        dreams = await bot.db.run(lambda db: db.execute("SELECT text FROM memory_dreams").fetchall())
        assert dreams == []


async def test_nightly_sleep_runs_once_per_local_night_and_posts_dreams_when_asked(tmp_path: Path) -> None:
    clock = Clock()  # 12:00 UTC = 20:00 in Shanghai
    async with running(tmp_path, clock=clock, memory={"post_dreams": True, "sleep_time": "21:00"}) as (bot, ch):
        await ask(ch, "/remember 阳台的花要浇水 group")
        service = deps(bot).service
        assert await service.nightly() == []  # 20:00 local: not yet
        clock.now = clock.now.replace(hour=13, minute=5)  # 21:05 local
        reports = await service.nightly()
        assert [r.deleted for r in reports] == [1]
        assert await service.nightly() == []  # once a night
        sent = await ch.wait_sent(2)
        assert sent[-1].text.startswith("💤 梦境") and "浇水" in sent[-1].text


async def test_memory_text_never_reaches_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    async with running(tmp_path, clock=clock) as (_, ch):
        await ask(ch, "/remember 秘密暗号是蓝色大象")
        await ask(ch, "/recall 暗号")
        clock.now = clock.now.replace(hour=22)
        await ask(ch, "/sleep", user="boss")
    assert "蓝色大象" not in caplog.text


def test_the_plugin_is_a_builtin() -> None:
    from robot import load_plugin

    assert load_plugin("memory") is memory.plugin


async def test_forget_person_everywhere_on_the_platform(tmp_path: Path) -> None:
    async with running(tmp_path) as (bot, ch):
        await ask(ch, "/remember 我对花生过敏", user="u1", chat=ch.chat("g1"))
        await ask(ch, "/remember 我住在杭州", user="u1", chat=ch.chat("g2"))
        await ask(ch, "/remember 我的猫叫年糕", user="u1", chat=ch.chat("u1", kind="private"))
        await ask(ch, "/remember 我对猫过敏", user="u2", chat=ch.chat("g1"))
        service = deps(bot).service
        assert await service.forget_person("other", "u1", None) == 0
        assert await service.forget_person("memory", "u1", None) == 3
        assert "猫" in await ask(ch, "/recall 过敏", user="u2")


async def test_the_model_cannot_delete_a_memory_by_id(tmp_path: Path) -> None:
    from function_calls import ModelRequest, ModelResponse
    from function_calls.testing import ScriptedModel, call, text

    def script(request: ModelRequest) -> ModelResponse:
        if request.messages[-1]["role"] == "tool":
            return text(str(request.messages[-1]["content"]))
        return call("forget", {"target": "1"})

    async with running(tmp_path, model=ScriptedModel(script)) as (_, ch):
        await ask(ch, "/remember 我对花生过敏")
        await ask(ch, "忘掉记忆 1", at_bot=True)
        assert "花生" in await ask(ch, "/recall 过敏")


async def test_sleep_is_neither_offered_nor_listed_to_other_members(tmp_path: Path) -> None:
    from function_calls.testing import ScriptedModel, text

    model = ScriptedModel([text("好"), text("好")])
    async with running(tmp_path, model=model) as (_, ch):
        assert "/sleep" not in await ask(ch, "/help", user="u2", role="owner")
        assert "/sleep" in await ask(ch, "/help", user="boss")
        await ask(ch, "你好", user="u2", at_bot=True)
        await ask(ch, "你好", user="boss", at_bot=True)
        offered = [{t["function"]["name"] for t in r.tools} for r in model.requests]
        assert "sleep" not in offered[0] and "sleep" in offered[1]


async def test_a_dream_spends_no_model_tokens_beyond_the_bots_daily_budget(tmp_path: Path) -> None:
    """Every chat dreams each night: the bot's daily cap (the bill's ceiling) must hold for it too."""
    from function_calls.testing import ScriptedModel, text

    model = ScriptedModel([text("梦见一片花海")])
    clock = Clock()
    async with running(tmp_path, model=model, clock=clock, limits={"bot_daily_tokens": 50}) as (_bot, ch):
        await ask(ch, "/remember 阳台的花要浇水 group")
        clock.now = clock.now.replace(hour=20)
        reply = await ask(ch, "/sleep", user="boss")
    assert model.requests == [] and "梦里闪过" in reply and "浇水" in reply  # the plain dream, no model


async def test_a_dream_whose_request_timed_out_is_charged_what_the_provider_may_have_billed(tmp_path: Path) -> None:
    """A timed-out request may have been done and billed: it was charged 0, and a hung provider's
    nightly dreams never counted against the bot's daily cap."""
    from function_calls import ModelAPIError
    from function_calls.testing import ScriptedModel

    timed_out = ModelAPIError("the model call timed out", network=True, retryable=True)
    timed_out.billed_output = 0  # as OpenAIChatModel says of a request it sent and heard nothing back from
    clock = Clock()
    async with running(tmp_path, model=ScriptedModel([timed_out]), clock=clock,
                       limits={"bot_daily_tokens": 10_000}) as (bot, ch):
        await ask(ch, "/remember 阳台的花要浇水 group")
        clock.now = clock.now.replace(hour=20)
        assert "浇水" in await ask(ch, "/sleep", user="boss")  # the plain dream still
        assert await bot.budget.used("bot") > 0


async def test_a_dream_cut_off_after_the_provider_reported_its_prompt_is_charged_that_prompt(tmp_path: Path) -> None:
    """A reply broken off after the provider reported its usage is charged the reported prompt, as the agent
    loop charges it: the dream charged its own short estimate (a few dozen tokens for a 9,000-token prompt)."""
    from function_calls import ModelAPIError
    from function_calls.testing import ScriptedModel

    cut = ModelAPIError("the model's reply broke off", network=True, retryable=True)
    cut.billed_output, cut.billed_prompt = 40, 9_000
    clock = Clock()
    async with running(tmp_path, model=ScriptedModel([cut]), clock=clock,
                       limits={"bot_daily_tokens": 100_000}) as (bot, ch):
        await ask(ch, "/remember 阳台的花要浇水 group")
        clock.now = clock.now.replace(hour=20)
        assert "浇水" in await ask(ch, "/sleep", user="boss")
        assert await bot.budget.used("bot") == 9_040


async def test_forget_an_id_with_all_is_answered_clearly_and_deletes_nothing(tmp_path: Path) -> None:
    """``/forget 3 all`` mixes two commands: say so rather than ignore ``all``; the memory stays."""
    async with running(tmp_path) as (_, ch):
        mine = ids_in(await ask(ch, "/remember 我对花生过敏", user="u1"))[0]
        reply = await ask(ch, f"/forget {mine} all", user="u1")
        assert f"/forget {mine}" in reply and "/forget me all" in reply and "已删除" not in reply
        assert "花生" in await ask(ch, "/recall 花生", user="u1")


async def test_a_chat_given_a_new_id_keeps_its_memories_and_opt_outs(tmp_path: Path) -> None:
    """A Telegram group become a supergroup: what the plugins keep under its old key follows it, so
    recall still finds a memory there, /forget me there reaches it, and an opted-out member's
    messages stay out of the summaries."""
    async with running(tmp_path) as (bot, ch):
        old, new = ch.chat("g1"), ch.chat("g9")
        await ask(ch, "/remember 我对花生过敏", user="u1", chat=old)
        opted = await ask(ch, "/summary optout", user="u2", chat=old)
        await bot.move_chat(old, new)
        assert "花生过敏" in await ask(ch, "/recall 过敏", user="u1", chat=new)
        await ch.inject("我的秘密计划是周五去钓鱼", user="u2", chat=new)
        await ch.inject("明天开会讨论预算", user="u3", chat=new)
        summary = await ask(ch, "/summary", user="u3", chat=new)
        assert "钓鱼" not in summary and "预算" in summary, (opted, summary)
        assert "1 条记忆" in await ask(ch, "/forget me", user="u1", chat=new)
        left = await bot.db.run(lambda db: db.execute("SELECT count(*) FROM memories").fetchone()[0])
        assert left == 0


async def test_forget_me_empties_the_kept_window_of_an_admins_private_chat_that_quoted_the_person(
        tmp_path: Path) -> None:
    """A summary sent to an admin's private chat quotes u1; /forget me in the group deletes that copy,
    and the admin chat's window kept in memory for the next message must not keep it either."""
    from datetime import timedelta

    from function_calls import ModelRequest, ModelResponse
    from function_calls.testing import ScriptedModel, text
    from robot import history

    secret = "我的住址是幸福路八号"

    def echo(request: ModelRequest) -> ModelResponse:
        return text(str(request.messages[-1]["content"])[-300:])

    clock = Clock()
    async with running(tmp_path, model=ScriptedModel(echo), clock=clock, summary={"user_cooldown_s": 0}) as (_, ch):
        group, admin = ch.chat("g1"), ch.chat("admin", kind="private")
        await ch.inject(secret, user="u1", chat=group)
        await ch.inject(secret + " 记住", user="u1", chat=group)
        clock.now += timedelta(minutes=1)
        await ask(ch, "/summary to me", user="admin", chat=group, role="admin")
        await ch.wait_sent(2)
        await ask(ch, "你好", user="admin", chat=admin)  # answered: the private chat's window is kept
        assert secret in repr(history._windows.get(admin.key))
        assert "已删除" in await ask(ch, "/forget me", user="u1", chat=group)
        assert secret not in repr(history._windows.get(admin.key))


async def test_a_bot_admin_can_delete_a_group_memory_but_not_see_a_members_own(tmp_path: Path) -> None:
    """A personal memory is its author's alone: to the bot's admin too it reads as missing."""
    async with running(tmp_path) as (_, ch):
        mine = ids_in(await ask(ch, "/remember 我的银行卡密码是八八六六", user="u1"))[0]
        ours = ids_in(await ask(ch, "/remember 周会改到周四 group", user="u1"))[0]
        assert "没有找到" in await ask(ch, f"/forget {mine}", user="boss")
        assert f"已删除记忆 #{ours}" in await ask(ch, f"/forget {ours}", user="boss")
        assert "八八六六" in await ask(ch, "/recall 银行卡", user="u1")


async def test_an_anonymous_member_cannot_save_a_personal_memory(tmp_path: Path) -> None:
    """Anonymous members share one id: a "me" memory would be recalled by every other anonymous sender."""
    from robot.message import Message, Sender

    async with running(tmp_path) as (_, ch):
        async def anonymous(text: str) -> str:
            before = len(ch.sent)
            await ch.deliver(Message(chat=ch.chat(), sender=Sender(user_id="anonymous:unknown", name="匿名",
                                                                    anonymous=True),
                                     message_id=f"anon-{before}", text=text, timestamp=ch.clock(), mentions_bot=True))
            return (await ch.wait_sent(before + 1))[before].text

        assert "匿名" in await anonymous("/remember 我的密码是一二三")
        assert "没有找到" in await anonymous("/recall 密码")
        assert "记住了" in await anonymous("/remember 周会改到周四 group")


async def test_a_summary_quoting_the_person_still_waiting_to_be_sent_is_not_sent_after_forget_me(
        tmp_path: Path) -> None:
    """An admin's "/summary to me" waited in the outbox (the platform down): it went out once it was back."""
    from datetime import timedelta

    from function_calls import ModelRequest, ModelResponse
    from function_calls.testing import ScriptedModel, text

    secret = "我的住址是幸福路八号"

    def echo(request: ModelRequest) -> ModelResponse:
        return text(str(request.messages[-1]["content"])[-300:])

    clock = Clock()
    async with running(tmp_path, model=ScriptedModel(echo), clock=clock, summary={"user_cooldown_s": 0}) as (bot, ch):
        group = ch.chat("g1")
        await ch.inject(secret, user="u1", chat=group)
        await ch.inject(secret + " 记住", user="u1", chat=group)
        clock.now += timedelta(minutes=1)
        ch.down = True
        await ch.inject("/summary to me", user="admin", chat=group, role="admin")
        waiting = await bot.db.run(lambda db: db.execute(
            "SELECT count(*) FROM outbox WHERE status = 'pending' AND text LIKE ?", [f"%{secret}%"]).fetchone()[0])
        assert waiting == 1
        await ch.inject("/forget me", user="u1", chat=group)
        ch.down = False
        for _ in range(100):
            if any("已删除" in m.text for m in ch.sent):
                break
            await asyncio.sleep(0.05)
        await bot.outbox.flush()
        assert not [m for m in ch.sent if secret in m.text]


async def test_forget_me_takes_the_bots_messages_that_carried_a_dream_too(tmp_path: Path) -> None:
    """The stored dream went, but the /sleep report and the posted dream stayed in the history the model reads."""
    clock = Clock()
    async with running(tmp_path, clock=clock, memory={"post_dreams": True}) as (bot, ch):
        await ask(ch, "/remember 老王的手机号是一三八 group", user="u1")
        clock.now = clock.now.replace(hour=20)
        assert "一三八" in await ask(ch, "/sleep", user="boss")  # its dream quotes u1's memory
        await ch.wait_sent(3)
        assert "已删除" in await ask(ch, "/forget me", user="u1")
        left = await bot.db.run(lambda db: db.execute("SELECT text FROM history WHERE text LIKE '%一三八%'").fetchall())
        assert left == [] and await bot.db.run(lambda db: db.execute("SELECT * FROM memory_dreams").fetchall()) == []


async def test_forget_me_in_a_migrated_group_reaches_the_admins_private_summaries_of_it(tmp_path: Path) -> None:
    """Titled "群 <old id> · …", they were not found by the new id's title: the person's words stayed quoted."""
    from datetime import timedelta

    from function_calls import ModelRequest, ModelResponse
    from function_calls.testing import ScriptedModel, text

    secret = "我的住址是幸福路八号"

    def echo(request: ModelRequest) -> ModelResponse:
        return text(str(request.messages[-1]["content"])[-300:])

    def copies(db: Any) -> list[Any]:
        return db.execute("SELECT chat FROM history WHERE from_bot = 1 AND text LIKE ?", [f"%{secret}%"]).fetchall()

    clock = Clock()
    async with running(tmp_path, model=ScriptedModel(echo), clock=clock, summary={"user_cooldown_s": 0}) as (bot, ch):
        old, new = ch.chat("g1"), ch.chat("g9")
        await ch.inject(secret, user="u1", chat=old)
        await ch.inject(secret + " 记住", user="u1", chat=old)
        clock.now += timedelta(minutes=1)
        await ask(ch, "/summary to me", user="admin", chat=old, role="admin")
        await ch.wait_sent(2)
        assert [tuple(r) for r in await bot.db.run(copies)] == [("memory:private:admin",)]
        await bot.move_chat(old, new)
        assert "已删除" in await ask(ch, "/forget me", user="u1", chat=new)
        assert await bot.db.run(copies) == []


@pytest.mark.parametrize("how", ["/sleep", "nightly", "recall miss"])
async def test_a_memory_that_faded_away_leaves_no_words_in_any_file_after_forget_me(tmp_path: Path, how: str) -> None:
    """A decay's FTS5 DELETE is a tombstone: the words stayed in the index file, and /forget me, finding no
    memory of theirs left, did not rewrite it."""
    secret = "zanzibarpasscode"
    clock = Clock()
    settings = {"sleep_time": "00:00"} if how == "nightly" else {"top_n": 1} if how == "recall miss" else {}
    async with running(tmp_path, clock=clock, memory=settings) as (bot, ch):
        await ask(ch, f"/remember 站会的暗号是 {secret}", user="u1")
        await ask(ch, "/remember 每天的站会在九点 group", user="u2")
        clock.now = clock.now.replace(hour=14)  # idle for two hours: a miss takes a level-0 memory away
        if how == "/sleep":
            assert "遗忘 2 条" in await ask(ch, "/sleep", user="boss")
        elif how == "nightly":
            assert [r.deleted for r in await deps(bot).service.nightly()] == [2]
        else:
            assert "九点" in await ask(ch, "/recall 每天的站会在九点", user="u1")
        assert "没有找到" in await ask(ch, "/recall 暗号", user="u1")  # it faded away
        await ask(ch, "/forget me", user="u1")
        blocks = await bot.db.run(lambda db: db.execute("SELECT block FROM memory_terms_data").fetchall())
        assert not any(secret.encode() in bytes(block) for (block,) in blocks)
        files = b"".join(f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())
        assert secret.encode() not in files


async def test_forget_me_all_takes_a_dream_of_theirs_after_the_retention_dropped_their_messages(
        tmp_path: Path) -> None:
    """With no message of theirs left in the group, the dream quoting their slept-away memory was not found."""
    from datetime import timedelta

    clock = Clock()
    async with running(tmp_path, clock=clock) as (bot, ch):
        await ask(ch, "/remember 老王的手机号是一三八零零 group", user="u1")
        await ask(ch, "/remember 阳台的花要浇水 group", user="u2", chat=ch.chat("g2"))
        clock.now += timedelta(hours=8)
        for group in ("g1", "g2"):
            await deps(bot).service.sleep(f"memory:group:{group}")
        clock.now += timedelta(days=31)
        await bot.history.apply_retention(clock.now)
        assert "已删除" in await ask(ch, "/forget me all", user="u1", chat=ch.chat("u1", kind="private"))
        dreams = await bot.db.run(lambda db: db.execute("SELECT chat, text FROM memory_dreams").fetchall())
        assert [tuple(d) for d in dreams] == [("memory:group:g2", "梦里闪过：阳台的花要浇水")]  # only u2's stays


async def test_a_dream_being_written_when_its_author_forgets_is_neither_kept_nor_posted(tmp_path: Path) -> None:
    from function_calls import ModelRequest, ModelResponse
    from function_calls.testing import ScriptedModel, text

    started, release = asyncio.Event(), asyncio.Event()

    class SlowModel(ScriptedModel):
        async def complete(self, request: ModelRequest, *, on_text: Any = None) -> ModelResponse:
            started.set()
            await release.wait()  # a dream takes seconds at a real provider
            return await super().complete(request, on_text=on_text)

    clock = Clock()
    model = SlowModel(lambda r: text("梦里老王念着一三八零零"))
    async with running(tmp_path, model=model, clock=clock, memory={"post_dreams": True}) as (bot, ch):
        await ask(ch, "/remember 老王的手机号是一三八零零 group", user="u1")
        clock.now = clock.now.replace(hour=20)
        night = asyncio.create_task(deps(bot).service.sleep("memory:group:g1"))
        await started.wait()
        assert "已删除" in await ask(ch, "/forget me", user="u1")
        release.set()
        report = await night
        await bot.outbox.flush()
        assert report.dream is None
        assert await bot.db.run(lambda db: db.execute("SELECT * FROM memory_dreams").fetchall()) == []
        assert not [m for m in ch.sent if "一三八" in m.text]
        left = await bot.db.run(lambda db: db.execute("SELECT text FROM history WHERE text LIKE '%一三八%'").fetchall())
        assert left == []


async def test_forget_me_takes_other_members_recall_and_listing_replies_quoting_their_memory(tmp_path: Path) -> None:
    secret = "老王的手机号是一三八零零"
    async with running(tmp_path) as (bot, ch):
        await ask(ch, f"/remember {secret} group", user="u1")
        assert secret in await ask(ch, "/recall 老王", user="u2")
        assert secret in await ask(ch, "/memories", user="u3")
        await ask(ch, "/remember 我对猫过敏", user="u2", chat=ch.chat("g2"))
        assert "猫" in await ask(ch, "/memories", user="u2", chat=ch.chat("g2"))
        assert "1 条记忆" in await ask(ch, "/forget me", user="u1")
        window = await bot.history.recent(ch.chat("g1"), 50)
        assert [h.text for h in window if secret in h.text] == []
        rows = await bot.db.run(lambda db: db.execute("SELECT chat FROM history WHERE text LIKE ?",
                                                      [f"%{secret}%"]).fetchall())
        assert rows == []
        assert [h.text for h in await bot.history.recent(ch.chat("g2"), 50) if "猫" in h.text]  # another chat's stay


async def test_one_member_cannot_fill_the_chats_group_memories(tmp_path: Path) -> None:
    async with running(tmp_path, memory={"max_per_scope": 4, "group_share": 0.5}) as (_, ch):
        for i in range(2):
            assert "记住了" in await ask(ch, f"/remember 广告{i} 加我微信 group", user="spammer")
        refused = await ask(ch, "/remember 广告2 group", user="spammer")
        assert "2 条" in refused and "记住了" not in refused
        assert "记住了" in await ask(ch, "/remember 我对花生过敏", user="spammer")  # their own: another quota
        assert "记住了" in await ask(ch, "/remember 周会改到周四 group", user="u2")


async def test_nightly_sleep_asks_no_model_for_a_chat_the_gate_ignores(tmp_path: Path) -> None:
    from datetime import timedelta

    from function_calls.testing import ScriptedModel, text

    clock = Clock()
    async with running(tmp_path, clock=clock) as (_, ch):
        for i in range(3):
            await ask(ch, f"/remember 第{i}件群里的事 group", user="u1")
        await ask(ch, "/remember 第三件事 group", user="u1", chat=ch.chat("g2"))
    model = ScriptedModel(lambda r: text("梦见一片花海"))
    clock.now += timedelta(days=1)
    async with running(tmp_path, model=model, clock=clock, memory={"post_dreams": True},
                       gate={"never": ["memory:group:g1"]}) as (bot, ch):
        reports = {r.chat: r for r in await deps(bot).service.nightly()}
        assert reports["memory:group:g1"].deleted == 3 and reports["memory:group:g1"].dream is None
        assert reports["memory:group:g2"].dream == "梦见一片花海"
        assert len(model.requests) == 1  # g2's only
        dreams = await bot.db.run(lambda db: db.execute("SELECT chat FROM memory_dreams").fetchall())
        assert [d[0] for d in dreams] == ["memory:group:g2"]


async def test_forget_by_an_id_that_is_no_memory_here_reaches_the_next_hook(tmp_path: Path) -> None:
    """A forget hook answers for its own ids only (robot.hooks): memory's swallowed every /forget <id>."""
    async with running(tmp_path) as (bot, ch):
        mine = ids_in(await ask(ch, "/remember 我对花生过敏", user="u1"))[0]
        asked: list[str] = []

        async def forget_note(caller: Any, item: str) -> str | None:
            asked.append(item)
            return "已删除笔记 #7。" if item == "7" else None

        bot.forget_hooks.append(forget_note)
        assert await ask(ch, "/forget 7", user="u1") == "已删除笔记 #7。"
        # Someone else's memory is "not found" in the very words of an id nobody has, the id as typed: its
        # existence is private ("0001" was answered "1" for a memory that exists, "0002" for one that does not).
        assert await ask(ch, "/forget 8", user="u1") == "没有找到编号为 8 的记录。"
        assert await ask(ch, f"/forget {mine}", user="u2") == f"没有找到编号为 {mine} 的记录。"
        assert await ask(ch, f"/forget 000{mine}", user="u2") == f"没有找到编号为 000{mine} 的记录。"
        assert await ask(ch, f"/forget {mine}", user="u1", chat=ch.chat("g2")) == f"没有找到编号为 {mine} 的记录。"
        asked.clear()
        assert f"已删除记忆 #{mine}" in await ask(ch, f"/forget {mine}", user="u1")
        assert asked == []  # (the memory was the owner's: no other hook was asked)
