"""The message path: model, dedupe, history, gate, routing to the model with the chat's history."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from function_calls import Caller, ModelAPIError, ModelRequest, ToolContext, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.message import ChatRef, Message, OutgoingMessage, Sender
from robot.pipeline import NO_LLM_REPLY
from robot.plugin import Plugin
from robot.testing import MemoryChannel

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")
P1 = ChatRef(platform="memory", chat_id="u1", kind="private")


def echo_model() -> ScriptedModel:
    """Answers every request with ``re: <the user's text>``."""
    return ScriptedModel(lambda req: text("re: " + str(req.messages[-1]["content"])))


def contents(request: ModelRequest) -> list[str]:
    return [str(m.get("content")) for m in request.messages]


# --- the message model -------------------------------------------------------------------------

def test_message_model_fields() -> None:
    chat = ChatRef(platform="onebot", chat_id="123456", kind="group")
    assert chat.key == "onebot:group:123456" and ChatRef.from_key(chat.key) == chat
    assert ChatRef.from_key("wecom:private:a:b").chat_id == "a:b"
    with pytest.raises(ValueError):
        ChatRef.from_key("onebot:channel:1")
    msg = Message(chat=chat, sender=Sender(user_id="20002", name="小明", role="admin"), message_id="2001",
                  text="hi", timestamp=datetime(2026, 3, 1, tzinfo=UTC), mentions=("10001",), mentions_bot=True)
    assert msg.platform == "onebot" and msg.qualified_sender == "onebot:20002"
    assert (msg.reply_to, msg.reply_to_bot, msg.from_bot, msg.raw) == (None, False, False, None)
    with pytest.raises(ValidationError):
        msg.text = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError):  # naive timestamps are refused
        Message(chat=chat, sender=Sender(user_id="1"), message_id="x", text="", timestamp=datetime(2026, 3, 1))
    with pytest.raises(ValidationError):
        ChatRef(platform="onebot", chat_id="1", kind="channel")
    out = OutgoingMessage(key="k", chat=chat, text="t")
    assert out.mention == () and out.reply_to is None


# --- dedupe and history ------------------------------------------------------------------------

async def test_a_redelivered_message_is_answered_once_even_after_a_restart(make_bot: Any, tmp_path: Any) -> None:
    model = echo_model()
    bot, ch = await make_bot(model)
    await ch.inject("hello", at_bot=True, message_id="dup")
    await ch.inject("hello", at_bot=True, message_id="dup")
    await ch.wait_sent(1)
    await bot.stop()
    assert len(model.requests) == 1 and len(ch.sent) == 1

    bot2, ch2 = await make_bot(model, data_dir=tmp_path)
    await ch2.inject("hello", at_bot=True, message_id="dup")
    await ch2.inject("hello again", at_bot=True, message_id="new")
    await ch2.wait_sent(1)
    await bot2.outbox.flush()
    assert [m.text for m in ch2.sent] == ["re: hello again"]
    texts = [e.text for e in await bot2.history.recent(G1)]
    assert texts.count("hello") == 1


async def test_every_message_is_recorded_including_the_bots_replies(make_bot: Any) -> None:
    bot, ch = await make_bot(echo_model())
    await ch.inject("just chatting", user="u2")
    await ch.inject("question", at_bot=True)
    await ch.wait_sent(1)
    entries = await bot.history.recent(G1)
    assert [(e.user_id, e.text, e.from_bot) for e in entries] == [
        ("u2", "just chatting", False), ("u1", "question", False), ("bot", "re: question", True)]


async def test_half_an_emoji_from_a_peer_is_recorded_and_answered(make_bot: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    # A peer's JSON may carry a lone "\\ud83d" (an emoji cut in half): UTF-8 cannot hold it, so the
    # record, the model's request and the reply all failed; it is U+FFFD from the boundary on.
    bot, ch = await make_bot(echo_model())
    await ch.inject("好的\ud83d", user="u2", name="小\udc00明", at_bot=True)
    (reply,) = await ch.wait_sent(1)
    assert reply.text == "re: 好的\ufffd"
    entries = await bot.history.recent(G1)
    assert [(e.name, e.text) for e in entries] == [("小\ufffd明", "好的\ufffd"), ("qunbot", "re: 好的\ufffd")]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_messages_from_the_bot_itself_are_recorded_not_answered(make_bot: Any) -> None:
    model = echo_model()
    bot, ch = await make_bot(model)
    own = Message(chat=G1, sender=Sender(user_id="bot"), message_id="echoed", text="/help",
                  timestamp=datetime.now(UTC), from_bot=True, mentions_bot=True)
    await ch.deliver(own)
    assert [e.text for e in await bot.history.recent(G1)] == ["/help"]
    assert await bot.outbox.rows() == [] and model.requests == []


# --- the gate ----------------------------------------------------------------------------------

async def test_group_messages_need_addressing_private_ones_do_not(make_bot: Any) -> None:
    model = echo_model()
    bot, ch = await make_bot(model)
    await ch.inject("nobody asked you", user="u2")
    await ch.inject("about qunbot, it is nice", user="u2")  # the name, but not as a prefix
    assert await bot.outbox.rows() == [] and model.requests == []
    await ch.inject("in private", chat=P1)
    await ch.inject("@-ed", at_bot=True)
    await ch.deliver(Message(chat=G1, sender=Sender(user_id="u3"), message_id="r1", text="replying",
                             timestamp=datetime.now(UTC), reply_to="m1", reply_to_bot=True))
    await ch.inject("/n milk")
    sent = await ch.wait_sent(4)
    assert sorted(m.text for m in sent) == sorted(
        ["re: in private", "re: @-ed", "re: replying", "noted for u1: milk x1"])
    assert len(model.requests) == 3


async def test_a_reply_to_any_part_of_a_long_answer_is_a_reply_to_the_bot(make_bot: Any) -> None:
    # A channel that cannot tell whose message a reply quotes (OneBot gives only the id) leaves it
    # to the outbox's receipts: every part the bot sent counts, not only the last one.
    model = ScriptedModel(lambda req: text("re: " + str(req.messages[-1]["content"])
                                           + (" " + "长" * 100 if req.messages[-1]["content"] == "long please" else "")))
    bot, ch = await make_bot(model, channel=MemoryChannel(max_text_len=40))
    await ch.inject("long please", at_bot=True)
    parts = await ch.wait_sent(3)
    await bot.outbox.flush()
    assert len(parts) == 3 and [r["status"] for r in await bot.outbox.rows()] == ["sent"]
    for n, receipt in enumerate(["m1", "m2", "m3"]):  # MemoryChannel's receipts, in order
        await ch.deliver(Message(chat=G1, sender=Sender(user_id="u2"), message_id=f"r{n}", text=f"why {n}?",
                                 timestamp=datetime.now(UTC), reply_to=receipt))
    await ch.deliver(Message(chat=G2, sender=Sender(user_id="u2"), message_id="r9", text="other chat",
                             timestamp=datetime.now(UTC), reply_to="m1"))  # not the bot's message there
    answers = [m.text for m in (await ch.wait_sent(6))[3:]]
    assert sorted(answers) == ["re: why 0?", "re: why 1?", "re: why 2?"] and len(model.requests) == 4


async def test_the_bots_own_name_on_a_platform_addresses_it_too(make_bot: Any) -> None:
    # [channels.onebot] bot_name: the QQ nickname people call it by, beside [bot] name.
    model = echo_model()
    channel = MemoryChannel()
    channel.bot_name = "小助手"  # type: ignore[attr-defined]
    _bot, ch = await make_bot(model, channel=channel)
    for said in ("小助手，明天几号？", "小助手们好", "qunbot 在吗"):
        await ch.inject(said)
    await ch.wait_sent(2)
    assert [r.messages[-1]["content"] for r in model.requests] == ["明天几号？", "在吗"]
    assert "你的名字是「小助手」" in str(model.requests[0].messages[0]["content"])  # the model knows it too


@pytest.mark.parametrize(("said", "seen"), [
    ("qunbot 你好", "你好"), ("QunBot，帮个忙", "帮个忙"), ("qunbot: 在吗", "在吗")])
async def test_the_bots_name_as_prefix_addresses_it_and_is_stripped(make_bot: Any, said: str, seen: str) -> None:
    model = echo_model()
    _bot, ch = await make_bot(model)
    await ch.inject(said)
    await ch.wait_sent(1)
    assert model.requests[0].messages[-1] == {"role": "user", "content": seen}


@pytest.mark.parametrize("said", ["qunbot.com 打不开了，谁知道怎么回事", "qunbot@example.com 是谁的邮箱？"])
async def test_the_name_in_a_domain_or_an_email_address_calls_nobody(make_bot: Any, said: str) -> None:
    model = echo_model()
    bot, ch = await make_bot(model)
    await ch.inject(said, user="u2")
    await bot.outbox.flush()
    assert model.requests == [] and ch.sent == []  # it answered ".com 打不开了…"


@pytest.mark.parametrize("said", ["／ｎ 买牛奶", "/ｎ\u200b 买牛奶"])
async def test_a_command_typed_in_an_imes_full_width_mode_is_that_command(make_bot: Any, said: str) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject(said)  # it was dropped in silence: no tool is named "ｎ"
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "noted for u1: 买牛奶 x1"


async def test_the_name_prefix_reaches_commands_stripped(make_bot: Any) -> None:
    _bot, ch = await make_bot(None)
    await ch.inject("qunbot /n tea 2")
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "noted for u1: tea x2"


async def test_per_group_gate_overrides(make_bot: Any) -> None:
    model = echo_model()
    bot, ch = await make_bot(model, gate={"always": ["memory:g2"], "never": ["memory:group:g3"]})
    g3 = ChatRef(platform="memory", chat_id="g3", kind="group")
    await ch.inject("@ in a never group", chat=g3, at_bot=True)
    await ch.inject("/help", chat=g3)
    assert await bot.outbox.rows() == []
    assert await bot.history.recent(g3) == []  # told to ignore it: nothing of it is kept either
    await ch.inject("plain talk", chat=G2)
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "re: plain talk" and sent.chat == G2


async def test_an_unknown_slash_word_in_an_always_group_is_talk_for_the_model(make_bot: Any) -> None:
    """It was answered "没有 /usr/bin/python3 这个命令" and never reached the model answering every other line."""
    model = echo_model()
    bot, ch = await make_bot(model, gate={"always": ["memory:g2"]})
    await ch.inject("/usr/bin/python3 怎么升级？", chat=G2)
    await ch.inject("/shrug", chat=G2)
    await ch.inject("/n tea", chat=G2)  # a known command still runs as one
    await ch.inject("/nosuch", chat=G2, at_bot=True)  # and asked of the bot, an unknown one is still told so
    await ch.inject("/nosuch", chat=P1)
    sent = await ch.wait_sent(5)
    await bot.outbox.flush()
    assert sorted(m.text for m in ch.sent) == sorted([
        "re: /usr/bin/python3 怎么升级？", "re: /shrug", "noted for u1: tea x1",
        "没有 /nosuch 这个命令。发送 /help 查看可用命令。", "没有 /nosuch 这个命令。发送 /help 查看可用命令。"])
    assert len(sent) == 5 and len(model.requests) == 2


async def test_without_an_llm_an_always_group_is_told_only_when_it_asks(make_bot: Any) -> None:
    """Every line of an always group got the "no model yet" notice: 5 lines of chat, 5 replies."""
    bot, ch = await make_bot(None, gate={"always": ["memory:g2"]},
                             limits={"user_burst": 1, "chat_burst": 1, "user_per_minute": 1})
    for i in range(5):
        await ch.inject(f"大家晚上好 {i}", chat=G2, user=f"m{i}")
    await ch.inject("/shrug", chat=G2)
    await bot.outbox.flush()
    assert ch.sent == []  # neither the notice nor a "too fast" one: nobody asked the bot anything
    await ch.inject("在吗？", chat=G2, user="m9", at_bot=True)
    await ch.inject("在吗？", chat=P1, user="m8")
    assert [m.text for m in await ch.wait_sent(2)] == [NO_LLM_REPLY, NO_LLM_REPLY]


async def test_allowlist_limits_groups_not_private_chats(make_bot: Any) -> None:
    _bot, ch = await make_bot(echo_model(), gate={"allowlist": ["memory:g1"]})
    await ch.inject("outside", chat=G2, at_bot=True)
    await ch.inject("inside", chat=G1, at_bot=True)
    await ch.inject("private", chat=P1)
    await ch.wait_sent(2)
    await _bot.outbox.flush()
    assert sorted(m.text for m in ch.sent) == ["re: inside", "re: private"]
    assert await _bot.history.recent(G2) == []  # outside the allowlist: not recorded
    assert "inside" in [e.text for e in await _bot.history.recent(G1)]


async def test_a_huge_message_is_stored_cut_with_a_mark(make_bot: Any) -> None:
    bot, ch = await make_bot(None, history={"max_message_chars": 1000})
    await ch.inject("长" * 5000 + "尾巴")
    [entry] = await bot.history.recent(G1)
    assert entry.text.startswith("长" * 1000) and "尾巴" not in entry.text
    assert entry.text.endswith("〔已截断：原文 5002 字，只保存了前 1000 字〕")


# --- replies -----------------------------------------------------------------------------------

async def test_group_replies_mention_the_asker_private_ones_do_not(make_bot: Any) -> None:
    _bot, ch = await make_bot(echo_model())
    await ch.inject("group q", user="20002", at_bot=True)
    await ch.inject("private q", user="20002", chat=ChatRef(platform="memory", chat_id="20002", kind="private"))
    sent = {m.text: m for m in await ch.wait_sent(2)}
    assert sent["re: group q"].mention == ("20002",)
    assert sent["re: private q"].mention == ()
    assert sent["re: group q"].reply_to is not None


async def test_without_an_llm_commands_work_and_questions_get_setup_help(make_bot: Any) -> None:
    bot, ch = await make_bot(None)
    assert bot.router is None
    await ch.inject("what's the weather?", at_bot=True)
    await ch.inject("/n bread")
    first, second = await ch.wait_sent(2)
    assert first.text == NO_LLM_REPLY and "[llm]" in first.text and "QUNBOT_LLM__MODEL" in first.text
    assert second.text == "noted for u1: bread x1"


async def test_an_action_tool_answers_through_the_model(make_bot: Any) -> None:
    model = ScriptedModel([call("note", {"text": "call mom"})])
    _bot, ch = await make_bot(model)
    await ch.inject("remind me to call mom", at_bot=True, name="Alice")
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "noted for Alice: call mom x1" and sent.mention == ("u1",)
    assert len(model.requests) == 1  # the tool's reply ends the run


# --- the history window ------------------------------------------------------------------------

async def test_the_model_sees_this_chats_recent_history_only(make_bot: Any) -> None:
    model = echo_model()
    _bot, ch = await make_bot(model)
    await ch.inject("apples are red", user="u2", name="Bob")
    await ch.inject("cherry secret", user="u3", chat=G2)
    await ch.inject("bananas are yellow", user="u3")
    await ch.inject("which fruits?", at_bot=True)
    await ch.wait_sent(1)
    await ch.inject("and then?", at_bot=True)
    await ch.wait_sent(2)
    first, second = (contents(r) for r in model.requests)
    assert any("apples are red" in c and "Bob" in c for c in first)
    assert any("bananas are yellow" in c for c in first)
    assert not any("cherry" in c for c in first + second)
    assert first[-1] == "which fruits?" and sum("which fruits?" in c for c in first) == 1
    # The second request sees the first exchange, the bot's reply as the assistant's turn.
    assert {"role": "assistant", "content": "re: which fruits?"} in model.requests[1].messages


async def test_the_model_is_told_when_a_late_answered_message_was_sent(make_bot: Any) -> None:
    # Sent 23:58, answered 00:05 (kept while the bot restarted): the model, told only "现在是 00:05", set
    # "明天8点" a day late. It is told the sent time; a message answered at once adds nothing.
    model = echo_model()
    bot, ch = await make_bot(model)
    zone = bot.zone_for(G1)
    sent = datetime.now(UTC) - timedelta(minutes=7)
    await ch.inject("明天8点提醒我开会", at_bot=True, at=sent)
    await ch.inject("现在几点", at_bot=True)
    await ch.wait_sent(2)
    late, prompt = (str(r.messages[0]["content"]) for r in model.requests)
    assert f"这条消息发送于 {sent.astimezone(zone):%Y-%m-%d %H:%M}" in late and "相对时间从发送时算起" in late
    assert "发送于" not in prompt


async def test_a_message_left_unanswered_by_a_crash_gets_its_context_on_redelivery(make_bot: Any) -> None:
    # The window is read with the message's record; a redelivery of a recorded but unanswered
    # message is not recorded again, so its window must still be read.
    model = echo_model()
    bot, ch = await make_bot(model)
    await ch.inject("the meeting moved to 3pm", user="u2")
    asking = Message(chat=G1, sender=Sender(user_id="u1"), message_id="cut", text="when is it?",
                     timestamp=datetime.now(UTC), mentions_bot=True)
    assert await bot.dedupe.receive("memory", "cut", bot.clock(), lambda db: bot.history.record_sync(db, asking))
    await ch.deliver(asking)  # the process died before answering; the platform delivers it again
    await ch.wait_sent(1)
    seen = contents(model.requests[0])
    assert any("moved to 3pm" in c for c in seen)
    assert seen[-1] == "when is it?" and sum("when is it?" in c for c in seen) == 1


@pytest.mark.parametrize("landed", [True, False])
async def test_a_reply_whose_commit_is_in_doubt_goes_out_once(make_bot: Any, landed: bool) -> None:
    # PostgreSQL's connection lost at COMMIT (CommitUnknown): the reply was sent directly as well as
    # by the outbox when the commit had landed (twice). Retried until it lands, it goes out once.
    from robot.storage.base import CommitUnknown

    bot, ch = await make_bot(echo_model())
    bot.pending.first_s = 0.02
    real, doubted = bot.db.transaction, []

    async def transaction(fn: Any, **kw: Any) -> Any:
        if getattr(fn, "__name__", "") == "enqueue" and not doubted:
            doubted.append(1)
            if landed:
                await real(fn, **kw)
            raise CommitUnknown("the connection failed while committing")
        return await real(fn, **kw)

    bot.db.transaction = transaction
    await ch.inject("hello", at_bot=True, message_id="m1")
    await ch.wait_sent(1)
    await bot.outbox.flush()
    await asyncio.sleep(0.1)
    assert doubted and [m.text for m in ch.sent] == ["re: hello"]


async def test_a_message_whose_reply_is_queued_is_handled_even_if_what_follows_fails(make_bot: Any) -> None:
    # The reply's unit of work marks the message handled: a failure after it (announcing approvals)
    # must not make the redelivery run the model (and its tools) again.
    model = echo_model()
    bot, ch = await make_bot(model)
    announce, failures = bot.approvals.announce, []

    async def failing_once() -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("announcing failed")
        await announce()

    bot.approvals.announce = failing_once
    await ch.inject("hello", at_bot=True, message_id="m1")
    await ch.wait_sent(1)
    assert failures and await bot.db.run(lambda db: db.query("SELECT handled FROM seen WHERE message_id = 'm1'")) == [
        {"handled": 1}]
    await ch.inject("hello", at_bot=True, message_id="m1")
    await ch.inject("/help", message_id="m2")  # a command's reply marks it too
    await ch.wait_sent(2)
    assert len(model.requests) == 1 and ch.sent[0].text == "re: hello"
    assert await bot.db.run(lambda db: db.query("SELECT message_id, handled FROM seen ORDER BY message_id")) == [
        {"message_id": "m1", "handled": 1}, {"message_id": "m2", "handled": 1}]


async def test_a_message_answered_without_a_reply_is_marked_handled_too(make_bot: Any) -> None:
    model = ScriptedModel(lambda req: text("   "))  # nothing to send
    bot, ch = await make_bot(model)
    await ch.inject("chatting", message_id="c1")  # not addressed: recorded, not answered
    await ch.inject("hi", at_bot=True, message_id="c2")
    for _ in range(100):
        rows = await bot.db.run(lambda db: db.query("SELECT message_id, handled FROM seen ORDER BY message_id"))
        if all(r["handled"] for r in rows):
            break
        await asyncio.sleep(0.01)
    assert rows == [{"message_id": "c1", "handled": 1}, {"message_id": "c2", "handled": 1}]


async def test_a_handled_mark_the_database_refused_is_retried_so_a_redelivery_is_not_run_again(
        make_bot: Any, until: Any) -> None:
    # The database refuses the reply's unit (the reply is sent directly) and then the mark that the
    # message was handled: the mark is retried, so the platform's redelivery does not run it again.
    model = echo_model()
    bot, ch = await make_bot(model)
    bot.pending.first_s = 0.01
    enqueue, done, refused = bot.outbox.enqueue_many_sync, bot.dedupe.done, []

    def enqueue_refused_once(db: Any, messages: Any) -> Any:
        if "r1" not in refused:  # every run of the unit (a rehearsal runs it twice) until the mark's turn
            refused[:] = ["reply"]
            raise sqlite3.OperationalError("database or disk is full")
        return enqueue(db, messages)

    async def done_refused_once(platform: str, message_id: str) -> None:
        if refused == ["reply"]:
            refused.append(message_id)
            raise sqlite3.OperationalError("database or disk is full")
        await done(platform, message_id)

    bot.outbox.enqueue_many_sync, bot.dedupe.done = enqueue_refused_once, done_refused_once
    await ch.inject("hi", at_bot=True, message_id="r1")
    await ch.wait_sent(1)

    async def handled() -> bool:
        return await bot.db.run(lambda db: db.query("SELECT handled FROM seen WHERE message_id = 'r1'")) == [
            {"handled": 1}]

    await until(handled)
    assert refused == ["reply", "r1"] and not bot.pending
    await ch.inject("hi", at_bot=True, message_id="r1")  # the platform delivers it again
    await ch.inject("/help", message_id="r2")
    await ch.wait_sent(2)
    assert len(model.requests) == 1 and ch.sent[0].text == "re: hi"  # the model (and any tool) ran once


async def test_the_history_window_is_token_bounded(make_bot: Any) -> None:
    model = echo_model()
    _bot, ch = await make_bot(model, llm={"history_tokens": 120})
    for i in range(30):
        await ch.inject(f"message number {i:02d} " + "blah " * 10, user="u2")
    await ch.inject("summarise", at_bot=True)
    await ch.wait_sent(1)
    seen = [c for c in contents(model.requests[0]) if "message number" in c]
    assert 0 < len(seen) < 30
    assert "message number 29" in seen[-1]  # the newest are kept, in order
    numbers = [int(c.split("message number ")[1][:2]) for c in seen]
    assert numbers == sorted(numbers) and numbers[-1] == 29


async def test_a_failing_model_is_explained_without_internals(make_bot: Any) -> None:
    model = ScriptedModel([ModelAPIError("upstream 400", retryable=False)])
    _bot, ch = await make_bot(model)
    await ch.inject("hi", at_bot=True)
    (sent,) = await ch.wait_sent(1)
    assert "AI 服务暂时不可用" in sent.text and "Traceback" not in sent.text


async def test_a_stream_broken_off_on_a_channel_that_cannot_stream_is_retried(make_bot: Any) -> None:
    # OneBot, Telegram, WeChat show nothing before the answer is whole: a stream cut after its first words
    # counted as "text already shown" there and was never retried; the person got the error instead.
    from function_calls.testing import FakeOpenAIServer, Reply
    from robot.channels.base import Capabilities

    plain = MemoryChannel()
    plain.capabilities = Capabilities(max_text_len=4000, streaming=False)
    async with FakeOpenAIServer() as server:
        server.script(Reply("北京今天晴，最高 25 度，适合出门。", break_after=3), Reply("北京今天晴，25 度。"))
        bot, ch = await make_bot(channel=plain, plugins=[],
                                 llm={"base_url": server.base_url, "api_key": "k", "model": "fake-model"})
        assert bot.router is not None

        async def no_wait(_: float) -> None:
            return None

        bot.router.runner.sleep = no_wait
        await ch.inject("北京天气？", at_bot=True)
        (sent,) = await ch.wait_sent(1)
        await bot.stop()
    assert sent.text == "北京今天晴，25 度。" and len(server.requests) == 2 and ch.deltas == []


async def test_stop_waits_for_in_flight_work_and_flushes(make_bot: Any) -> None:
    model = echo_model()
    bot, ch = await make_bot(model)
    for i in range(10):
        await ch.inject(f"q{i}", at_bot=True, user=f"u{i}")
    await bot.stop()
    assert len(ch.sent) == 10



class BrokenChannel(MemoryChannel):
    def __init__(self, platform: str) -> None:
        super().__init__(platform)
        self.stopped = False

    async def start(self) -> None:
        if self.platform == "broken":
            raise OSError("address already in use")

    async def stop(self) -> None:
        self.stopped = True


async def test_a_failed_start_undoes_what_did_start(tmp_path: Any) -> None:
    torn_down: list[str] = []

    async def setup(bot: Bot) -> str:
        return "deps"

    async def teardown(deps: str) -> None:
        torn_down.append(deps)

    good, bad = BrokenChannel("good"), BrokenChannel("broken")
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[good, bad],
              plugins=[Plugin("p", Toolset("p"), setup=setup, teardown=teardown)])
    with pytest.raises(OSError, match="address already in use"):
        await bot.start()
    assert good.stopped and torn_down == ["deps"] and not bot.started
    again = Bot(Settings(bot={"data_dir": tmp_path}), channels=[BrokenChannel("good")], plugins=[])
    await again.start()  # nothing was left holding the store
    await again.stop()


@pytest.mark.parametrize("said", ["", "   ", "qunbot", "qunbot，"])
async def test_a_bare_mention_gets_a_hint_not_an_empty_model_turn(make_bot: Any, said: str) -> None:
    """OneBot turns a bare @ into empty text: some providers refuse an empty turn with a 400."""
    model = echo_model()
    _bot, ch = await make_bot(model)
    await ch.inject(said, at_bot=not said.startswith("qunbot"))
    assert "想让我做什么" in (await ch.wait_sent(1))[0].text and model.requests == []


async def test_a_copy_delivered_while_the_first_is_being_stored_is_not_handled_again(make_bot: Any) -> None:
    """The handling mark was taken after the dedupe's await: both copies ran (a tool twice, the model twice)."""
    model = ScriptedModel(lambda req: text("re"))
    bot, ch = await make_bot(model)
    copy = Message(chat=ChatRef(platform="memory", chat_id="g1", kind="group"), sender=Sender(user_id="u1"),
                   message_id="dup-1", text="hello", timestamp=datetime.now(UTC), mentions_bot=True)
    await asyncio.gather(ch.deliver(copy), ch.deliver(copy))
    await bot.outbox.flush()
    assert len(model.requests) == 1 and len(ch.sent) == 1


@pytest.mark.parametrize("hook", ["typing", "trace"])
async def test_a_channel_whose_typing_or_trace_raises_still_gets_its_reply(make_bot: Any, hook: str) -> None:
    """They were awaited unguarded: the answer (already paid for) was lost, and the next message got it."""
    class Flaky(MemoryChannel):
        async def typing(self, chat: ChatRef, active: bool) -> None:
            if hook == "typing":
                raise RuntimeError("typing endpoint down")

        async def trace(self, chat: ChatRef, event: dict[str, object]) -> None:
            if hook == "trace":
                raise RuntimeError("trace sink down")

    model = ScriptedModel(lambda req: text("answer"))
    _bot, ch = await make_bot(model, channel=Flaky())
    await ch.inject("question", at_bot=True)
    (sent,) = await ch.wait_sent(1)
    assert sent.text == "answer"


class CityArgs(BaseModel):
    city: str


class Forecast:
    today = "晴，-3°C"


@tool_function()
async def weather(ctx: ToolContext[Forecast], args: CityArgs) -> str:
    """The weather in a city."""
    return f"{args.city}：{ctx.deps.today}"


async def test_a_scheduled_run_started_while_plugins_set_up_waits_for_them(make_bot: Any) -> None:
    # A prompt caught up at start (reminders' setup, due while the bot was down) called a later
    # plugin's tool before that plugin was set up: the tool got the Bot as its deps and failed.
    async def slow_setup(bot: Bot) -> Forecast:
        await asyncio.sleep(0.2)
        return Forecast()

    runs: list[asyncio.Task[Any]] = []
    caller = Caller(platform="memory", user_id="u1", user_name="u1", chat_id="g1", chat_kind="group")

    async def catch_up(bot: Bot) -> None:
        runs.append(asyncio.create_task(bot.run_scheduled("北京天气", caller, ["weather"])))

    model = ScriptedModel(lambda req: call("weather", {"city": "北京"}) if req.messages[-1]["role"] == "user"
                          else text(str(req.messages[-1]["content"])))
    await make_bot(model, plugins=[Plugin("first", Toolset("first", []), setup=catch_up),
                                   Plugin("weather", Toolset("weather", [weather]), setup=slow_setup)])
    result = await runs[0]
    assert result is not None and result.replies == ["北京：晴，-3°C"], result


async def test_a_plugin_cannot_post_into_a_chat_the_gate_ignores(make_bot: Any) -> None:
    # A digest or a dream post set up before the owner put the group in [gate] never went out there.
    bot, ch = await make_bot(None, gate={"never": ["memory:g2"]})
    assert bot.ignores(G2) and not await bot.send(G2, "【群聊总结】…", key="digest-g2")
    assert await bot.send(G1, "【群聊总结】…", key="digest-g1")
    await bot.outbox.flush()
    assert [m.chat.chat_id for m in ch.sent] == ["g1"]


async def test_a_forum_topic_is_held_to_its_groups_gate_zone_budget_and_rate(make_bot: Any) -> None:
    # A Telegram forum topic's chat is "<group>/<thread>": what the owner set for the group missed every
    # topic (an ignored group answered in its topics, a fresh chat budget per topic, Shanghai's hour).
    from zoneinfo import ZoneInfo

    model = echo_model()
    bot, ch = await make_bot(model, gate={"never": ["memory:-100800"]},
                             bot={"zones": {"memory:-100900": "America/New_York"}}, limits={"user_burst": 1000, "chat_burst": 1, "chat_per_minute": 1})
    topic, other_topic = ch.chat("-100900/42"), ch.chat("-100900/43")
    closed = ch.chat("-100800/7")
    assert bot.zone_for(topic) == ZoneInfo("America/New_York") and bot.ignores(closed)
    await ch.inject("机密议程", at_bot=True, chat=closed)
    await ch.inject("你好", at_bot=True, chat=topic, user="u1")
    await ch.wait_sent(1)
    await ch.inject("你好", at_bot=True, chat=other_topic, user="u2")  # the group's one-a-minute is spent
    await ch.wait_sent(2)
    assert ch.sent[0].text == "re: 你好" and "re:" not in ch.sent[1].text and len(model.requests) == 1
    assert await bot.budget.used("chat:memory:group:-100900") > 0
    assert await bot.history.recent(closed) == []


async def test_a_gate_entry_naming_one_forum_topic_still_holds_for_that_topic(make_bot: Any) -> None:
    # Owners listed topics before a group's entries covered its topics: such an entry then matched nothing.
    model = echo_model()
    bot, ch = await make_bot(model, gate={"allowlist": ["memory:-100900/42"], "always": ["memory:group:-100900/42"]})
    topic, other = ch.chat("-100900/42"), ch.chat("-100900/43")
    assert not bot.ignores(topic) and bot.ignores(other)
    await ch.inject("不用@也回答", chat=topic)
    assert [m.text for m in await ch.wait_sent(1)] == ["re: 不用@也回答"]


@pytest.mark.parametrize(("key", "group"), [
    ("telegram:group:-100900/42", "telegram:group:-100900"), ("telegram:group:-100900", "telegram:group:-100900"),
    ("web:private:a/b", "web:private:a/b"), ("x:group:/5", "x:group:/5"), ("x:group:a/", "x:group:a/"),
    ("nonsense", "nonsense")])
def test_only_a_groups_thread_takes_its_groups_settings(key: str, group: str) -> None:
    from robot.message import group_key

    assert group_key(key) == group


async def test_a_chat_given_a_new_id_is_held_to_what_was_set_for_its_old_one(make_bot: Any, tmp_path: Any) -> None:
    """A Telegram group become a supergroup (a new id) escaped its [gate] never entry: read, stored and
    answered; its zone was lost. The old id's settings hold for the new one, after a restart too."""
    import robot.message

    old, new = ChatRef(platform="memory", chat_id="g1", kind="group"), ChatRef(platform="memory", chat_id="g9", kind="group")
    settings: dict[str, Any] = {"gate": {"never": ["memory:g1"]}, "bot": {"zones": {"memory:g1": "Europe/Berlin"}}}
    bot, ch = await make_bot(ScriptedModel(lambda req: text("答")), **settings)
    await bot.move_chat(old, new)
    await ch.inject("工资表：张三 30000", chat=new)
    await ch.inject("/help", chat=new, at_bot=True)
    assert ch.sent == [] and str(bot.zone_for(new)) == "Europe/Berlin"
    assert await bot.db.run(lambda db: db.execute("SELECT count(*) FROM history").fetchone()[0]) == 0
    await bot.stop()
    robot.message._FORMER.clear()  # a new process knows only what the database kept
    robot.message._NAMES.clear()
    again, ch2 = await make_bot(ScriptedModel(lambda req: text("答")), data_dir=tmp_path, **settings)
    await ch2.inject("/help", chat=new, at_bot=True)
    assert ch2.sent == [] and str(again.zone_for(new)) == "Europe/Berlin"
