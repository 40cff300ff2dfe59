"""The personal-WeChat channel against a fake iLink server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from function_calls import Toolset
from function_calls.testing import ScriptedModel, text
from robot.channels.base import ChannelUnavailable, SendRejected
from robot.channels.state_store import ChannelState
from robot.channels.weixin import WeixinAccount, WeixinChannel, WeixinSettings, WeixinState
from robot.channels.weixin.testing import FakeILinkServer
from robot.message import ChatRef, Message, OutgoingMessage
from robot.plugin import Plugin
from robot.privacy import ForgetRequest
from robot.storage.base import StorageError
from robot.store import Database

Until = Callable[..., Awaitable[None]]
TOKEN, TOKEN2 = "tok-one", "tok-two"
BOT, BOT2 = "b0f1@im.bot", "b0f2@im.bot"
ALICE = "o9cq8alice@im.wechat"


@pytest.fixture
async def fake() -> AsyncIterator[FakeILinkServer]:
    async with FakeILinkServer(hold_s=0.2) as server:
        server.add_bot(TOKEN, BOT)
        server.add_bot(TOKEN2, BOT2)
        yield server


def settings(tmp_path: Path, **over: Any) -> WeixinSettings:
    base: dict[str, Any] = {"enabled": True, "state_dir": tmp_path / "wx", "retry_delay_s": 0.05,
                            "backoff_max_s": 0.1, "typing_refresh_s": 0.05}
    return WeixinSettings(**(base | over))


def log_in(tmp_path: Path, fake: FakeILinkServer, bot_id: str = BOT, token: str = TOKEN) -> WeixinState:
    state = WeixinState(tmp_path / "wx")
    state.save_account_sync(WeixinAccount(bot_id=bot_id, bot_token=SecretStr(token), base_url=fake.url,
                                          user_id="owner@im.wechat", saved_at=datetime.now(UTC)))
    return state


@asynccontextmanager
async def in_database(tmp_path: Path) -> AsyncIterator[WeixinState]:
    """What a bot with ``data_dir=tmp_path`` stored, read as another process would."""
    db = Database(tmp_path / "qunbot.sqlite3")
    state = WeixinState(tmp_path / "wx")
    state.attach(ChannelState(db, tmp_path / "secret.key"))
    await db.open()
    try:
        yield state
    finally:
        await db.close()


async def test_text_arrives_as_a_private_message_of_its_account(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    sent = fake.inject(TOKEN, ALICE, text="你好")
    async with running(WeixinChannel(settings(tmp_path))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.chat == ChatRef(platform="weixin", chat_id=ALICE, kind="private", account=BOT)
    assert message.text == "你好" and message.sender.user_id == ALICE
    assert message.message_id == str(sent["message_id"])  # a uint64 beyond 2**53, exact
    assert message.timestamp == datetime.fromtimestamp(sent["create_time_ms"] / 1000, UTC)
    assert not fake.errors


async def test_images_voice_files_and_quotes_become_text_and_groups_map_to_group_chats(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    fake.inject(TOKEN, ALICE, {"type": 2, "image_item": {"url": "x"}}, {"type": 1, "text_item": {"text": "看图"}})
    fake.inject(TOKEN, ALICE, {"type": 3, "voice_item": {"playtime": 2000, "text": "明天开会"}})
    fake.inject(TOKEN, ALICE, {"type": 3, "voice_item": {"playtime": 2000}})
    fake.inject(TOKEN, ALICE, {"type": 4, "file_item": {"file_name": "周报.pdf", "len": "1024"}})
    fake.inject(TOKEN, ALICE, {"type": 1, "text_item": {"text": "同意"},
                               "ref_msg": {"title": "方案", "svr_id": "998877",
                                           "message_item": {"type": 1, "text_item": {"text": "周五上线"}}}})
    fake.inject(TOKEN, ALICE, text="大家好", group_id="grp-1@chatroom")
    async with running(WeixinChannel(settings(tmp_path))):
        got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(6)]
    texts = [m.text for m in got]
    assert texts[:5] == ["[图片]\n看图", "[语音] 明天开会", "[语音]", "[文件: 周报.pdf]", "[引用: 方案 | 周五上线]\n同意"]
    assert got[4].reply_to == "998877"
    assert got[5].chat == ChatRef(platform="weixin", chat_id="grp-1@chatroom", kind="group", account=BOT)
    assert got[5].sender.user_id == ALICE


async def test_a_restart_resumes_from_the_saved_cursor_without_loss_or_duplicates(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    for i in range(3):
        fake.inject(TOKEN, ALICE, text=f"第{i}条")
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    await until(lambda: bot_has(bot, 3))
    await bot.stop()
    async with in_database(tmp_path) as state:
        cursor = await state.load_cursor(BOT)
    assert cursor, "the cursor is stored after the batch was recorded"
    for i in range(3, 5):
        fake.inject(TOKEN, ALICE, text=f"第{i}条")
    bot2, _ = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    await until(lambda: bot_has(bot2, 5))
    rows = await bot2.history.recent(ChatRef(platform="weixin", chat_id=ALICE, kind="private"), 50)
    assert sorted(r.text for r in rows if not r.from_bot) == [f"第{i}条" for i in range(5)]


async def test_a_lost_cursor_replays_and_the_bot_drops_the_duplicates(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    fake.inject(TOKEN, ALICE, text="只一次")
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    await until(lambda: bot_has(bot, 1))
    await bot.stop()
    async with in_database(tmp_path) as state:  # as if we crashed before writing it
        assert state.store is not None and await state.store.delete("weixin", BOT, "cursor")
    bot2, _ = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    await until(lambda: sum(1 for n, _ in fake.requests if n == "getupdates") >= 4)
    rows = await bot2.history.recent(ChatRef(platform="weixin", chat_id=ALICE, kind="private"), 50)
    assert [r.text for r in rows if not r.from_bot] == ["只一次"]


async def bot_has(bot: Any, n: int) -> bool:
    rows = await bot.history.recent(ChatRef(platform="weixin", chat_id=ALICE, kind="private"), 50)
    return len([r for r in rows if not r.from_bot]) >= n


async def test_a_reply_uses_the_latest_context_token_and_shows_typing_while_the_model_runs(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: Any) -> Any:
        started.set()
        await release.wait()
        return text("**好的**，已记下：\n- 周五上线")

    await make_bot(ScriptedModel(slow), channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="记一下")
    await asyncio.wait_for(started.wait(), 5)
    await until(lambda: len(fake.typing) >= 2)  # typing is shown, and refreshed, while the model works
    assert {s for _, _, s in fake.typing} == {1}
    release.set()
    await until(lambda: bool(fake.sent))
    await until(lambda: fake.typing[-1][2] == 2)  # and cleared
    sent = fake.sent[0]
    assert (sent.to_user_id, sent.token) == (ALICE, TOKEN)
    assert sent.context_token == fake.context_token(ALICE, 1)
    assert sent.text == "好的，已记下：\n• 周五上线"  # markdown flattened
    assert not fake.errors


async def test_typing_lasts_while_any_run_in_the_chat_goes_on(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    """Two quick messages: the first answer does not end "typing" while the second is still worked on."""
    log_in(tmp_path, fake)
    slow_done = asyncio.Event()

    async def answer(request: Any) -> Any:
        if "慢" in str(request.messages[-1]["content"]):
            await slow_done.wait()
        return text("答")

    bot, _ = await make_bot(ScriptedModel(answer), channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    bot.pipeline.turns.wait_s = 0.05  # (her second question waits for the first this long at most: then both run)
    fake.inject(TOKEN, ALICE, text="慢问题")
    fake.inject(TOKEN, ALICE, text="快问题")
    await until(lambda: len(fake.sent) == 1)
    await asyncio.sleep(0.3)  # the slow run goes on: typing is back after the reply, and refreshed

    def typing_after(n: int) -> list[int]:
        """The statuses of the sendtyping calls after the n-th sendmessage."""
        sends = [i for i, (name, _) in enumerate(fake.requests) if name == "sendmessage"]
        return [body["status"] for name, body in fake.requests[sends[n - 1]:] if name == "sendtyping"]

    assert typing_after(1).count(1) >= 3
    slow_done.set()
    await until(lambda: len(fake.sent) == 2)
    await asyncio.sleep(0.2)
    assert typing_after(2) == [] and fake.typing[-1][2] == 2  # cleared with the last run, before its answer
    assert not fake.errors


async def test_typing_stops_after_its_maximum_even_if_a_run_never_ends(
        tmp_path: Path, fake: FakeILinkServer, running: Any, until: Until) -> None:
    """A safety net: a run whose end never comes does not leave "typing" on; the next run shows it again."""
    log_in(tmp_path, fake)
    chat = ChatRef(platform="weixin", chat_id=ALICE, kind="private")
    async with running(WeixinChannel(settings(tmp_path))) as channel:
        channel.typing_max_s = 0.3
        await channel.typing(chat, True)  # and never False
        await asyncio.sleep(0.6)
        shown = len(fake.typing)
        await asyncio.sleep(0.2)
        assert len(fake.typing) == shown and fake.typing[-1][2] == 2  # stopped, and cleared
        await channel.typing(chat, True)  # the count started afresh: this run's end clears it
        await until(lambda: fake.typing[-1][2] == 1)
        await channel.typing(chat, False)
        assert fake.typing[-1][2] == 2
    assert not fake.errors


async def test_context_tokens_survive_a_restart_so_a_later_notice_goes_out(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    fake.inject(TOKEN, ALICE, text="一")
    fake.inject(TOKEN, ALICE, text="二")
    async with running(WeixinChannel(settings(tmp_path))):
        await asyncio.wait_for(inbox.get(), 5)
        await asyncio.wait_for(inbox.get(), 5)
    assert (tmp_path / "wx" / "accounts" / f"{BOT}.context.json").stat().st_mode & 0o777 == 0o600
    async with running(WeixinChannel(settings(tmp_path))) as channel:
        # A reminder's row: no account recorded; the only account is used.
        await channel.send(OutgoingMessage(key="r1", chat=ChatRef(platform="weixin", chat_id=ALICE,
                                                                  kind="private"), text="提醒：开会"))
    assert fake.sent[-1].context_token == fake.context_token(ALICE, 2)


async def test_without_a_context_token_the_outbox_row_fails_with_the_reason(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    bot, channel = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    stranger = ChatRef(platform="weixin", chat_id="nobody@im.wechat", kind="private", account=BOT)
    with pytest.raises(SendRejected, match="context_token"):
        await channel.send(OutgoingMessage(key="k0", chat=stranger, text="hi"))
    await bot.send(stranger, "你好", key="k1")

    async def failed() -> bool:
        return any(r["status"] == "failed" for r in await bot.outbox.rows())

    await until(failed)
    row = next(r for r in await bot.outbox.rows() if r["key"] == "k1")
    assert "context_token" in str(row["error"]) and "messaged it" in str(row["error"])
    assert fake.sent == []


async def test_long_replies_are_split_to_the_text_limit(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path, max_text_len=100)), data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="hi")

    async def settled() -> bool:
        return bool(fake.sent) and await bot.outbox.pending() == 0

    await until(settled)  # the no-LLM notice went out; the user's token is known now
    fake.sent.clear()
    long = "。".join(f"第{i}句话说了一些内容" for i in range(40))
    await bot.send(ChatRef(platform="weixin", chat_id=ALICE, kind="private", account=BOT), long, key="long")
    await until(settled)
    assert len(fake.sent) > 1 and all(len(s.text) <= 100 for s in fake.sent)
    assert "".join(s.text for s in fake.sent).replace("。", "") == long.replace("。", "")
    assert len({s.client_id for s in fake.sent}) == len(fake.sent)


async def test_a_long_code_answer_arrives_verbatim_in_every_part(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    """Parts after the first lost their opening fence, so WeChat's flattening read the code as prose:
    ``def __init__`` became ``def init``, ``# comments`` lost their mark, indentation went."""
    log_in(tmp_path, fake)
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path, max_text_len=400, typing=False)),
                            data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="hi")

    async def settled() -> bool:
        return bool(fake.sent) and await bot.outbox.pending() == 0

    await until(settled)  # the no-LLM notice went out; the user's token is known now
    fake.sent.clear()
    code = [line for i in range(30) for line in (f"class Thing{i}:", f"    # keep {i}",
                                                  "    def __init__(self, *args, **kwargs):",
                                                  f"        self.x = {i}  # __dunder__ stays")]
    answer = "下面是代码：\n\n```python\n" + "\n".join(code) + "\n```\n\n就是这样。"
    await bot.send(ChatRef(platform="weixin", chat_id=ALICE, kind="private", account=BOT), answer, key="code")
    await until(settled)
    got = [line for s in fake.sent for line in s.text.splitlines()]
    assert len(fake.sent) > 3 and all(len(s.text) <= 400 for s in fake.sent)
    assert [line for line in got if line not in ("下面是代码：", "就是这样。", "")] == code
    assert "```" not in "".join(s.text for s in fake.sent)


async def test_each_account_polls_and_replies_through_its_own_token(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    fake.inject(TOKEN, ALICE, text="找一号")
    fake.inject(TOKEN2, ALICE, text="找二号")
    async with running(WeixinChannel(settings(tmp_path))) as channel:
        got = {m.chat.account: m for m in [await asyncio.wait_for(inbox.get(), 5) for _ in range(2)]}
        assert set(got) == {BOT, BOT2}
        for account, message in got.items():
            await channel.send(OutgoingMessage(key=f"re-{account}", chat=message.chat, text=f"我是{account}"))
        with pytest.raises(SendRejected, match="several weixin accounts"):
            await channel.send(OutgoingMessage(key="amb", chat=ChatRef(platform="weixin", chat_id=ALICE,
                                                                       kind="private"), text="?"))
    by_token = {s.token: s.text for s in fake.sent}
    assert by_token == {TOKEN: f"我是{BOT}", TOKEN2: f"我是{BOT2}"}


async def test_only_the_configured_accounts_are_served(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    fake.inject(TOKEN, ALICE, text="一号")
    fake.inject(TOKEN2, ALICE, text="二号")
    async with running(WeixinChannel(settings(tmp_path, accounts=[BOT2]))) as channel:
        message = await asyncio.wait_for(inbox.get(), 5)
        await asyncio.sleep(0.3)
        assert list(channel.accounts) == [BOT2]
    assert message.text == "二号" and inbox.empty()


async def test_the_servers_long_poll_timeout_is_used_for_the_next_poll(
        tmp_path: Path, fake: FakeILinkServer, running: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    fake.longpolling_timeout_ms = 1234
    channel = WeixinChannel(settings(tmp_path, poll_timeout_ms=5000))
    seen: list[int] = []
    async with running(channel):
        api = channel.accounts[BOT].api
        real = api.get_updates

        async def spy(buf: str, timeout_ms: int) -> Any:
            seen.append(timeout_ms)
            return await real(buf, timeout_ms)

        api.get_updates = spy  # type: ignore[method-assign]
        await until(lambda: len(seen) >= 2)
    assert seen[-1] == 1234


async def test_errors_back_off_and_polling_recovers(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message],
        caplog: pytest.LogCaptureFixture) -> None:
    log_in(tmp_path, fake)
    fake.fail_next = [500, 502, 503]
    fake.inject(TOKEN, ALICE, text="终于")
    with caplog.at_level(logging.WARNING):
        async with running(WeixinChannel(settings(tmp_path))):
            message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "终于" and fake.fail_next == []
    retries = [r.getMessage() for r in caplog.records if "getupdates failed" in r.getMessage()]
    assert len(retries) == 3 and "HTTP 500" in retries[0] and TOKEN not in "".join(retries)


async def test_session_expiry_is_told_once_and_a_new_login_resumes(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message],
        caplog: pytest.LogCaptureFixture, until: Until) -> None:
    state = log_in(tmp_path, fake)
    fake.expire(TOKEN)
    with caplog.at_level(logging.WARNING):
        async with running(WeixinChannel(settings(tmp_path, session_pause_s=0.1))) as channel:
            await until(lambda: sum(1 for n, _ in fake.requests if n == "getupdates") >= 3)
            told = [r for r in caplog.records if "qunbot login weixin" in r.getMessage()]
            assert len(told) == 1 and told[0].levelno == logging.ERROR
            assert TOKEN not in told[0].getMessage()
            # The owner logs in again (a new token for the same bot): the poller picks it up.
            fake.add_bot("tok-new", BOT)
            state.save_account_sync(WeixinAccount(bot_id=BOT, bot_token=SecretStr("tok-new"), base_url=fake.url))
            fake.inject("tok-new", ALICE, text="又能收到了")
            message = await asyncio.wait_for(inbox.get(), 10)
            assert not channel.accounts[BOT].expired
    assert message.text == "又能收到了"


async def test_a_session_expiry_first_seen_by_a_send_is_told_once(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message],
        caplog: pytest.LogCaptureFixture, until: Until) -> None:
    """A reminder hit errcode -14 while the poller backed off: the flag was set without a word, and the
    poller, seeing it set, never said it either; the owner never learnt to log in again."""
    log_in(tmp_path, fake)
    channel = WeixinChannel(settings(tmp_path, retry_delay_s=0.5, backoff_max_s=0.5, session_pause_s=0.1,
                                     typing=False))
    with caplog.at_level(logging.WARNING):
        async with running(channel):
            fake.inject(TOKEN, ALICE, text="你好")
            await asyncio.wait_for(inbox.get(), 5)
            fake.fail_next = [502]  # the poller backs off half a second
            await until(lambda: not fake.fail_next)
            fake.expire(TOKEN)
            with pytest.raises(ChannelUnavailable, match="expired"):
                await channel.send(OutgoingMessage(key="r1", chat=ChatRef(
                    platform="weixin", chat_id=ALICE, kind="private", account=BOT), text="提醒：开会"))
            polls = sum(1 for n, _ in fake.requests if n == "getupdates")
            await until(lambda: sum(1 for n, _ in fake.requests if n == "getupdates") >= polls + 2)
    told = [r for r in caplog.records if "qunbot login weixin" in r.getMessage() and r.levelno == logging.ERROR]
    assert len(told) == 1 and TOKEN not in told[0].getMessage()


async def test_a_database_error_while_a_session_is_expired_does_not_end_the_polling(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message], until: Until) -> None:
    """Waiting out an expired session re-reads the stored login every step: one failed read (the
    database restarting) must not kill the account's poller for good."""
    state = log_in(tmp_path, fake)
    fake.expire(TOKEN)
    channel = WeixinChannel(settings(tmp_path, session_pause_s=0.1))
    real, failed = channel.state.load_account, []

    async def flaky(bot_id: str) -> WeixinAccount | None:
        if not failed:
            failed.append(bot_id)
            raise StorageError("channel state: the database is unreachable")
        return await real(bot_id)

    channel.state.load_account = flaky  # type: ignore[method-assign]
    async with running(channel):
        await until(lambda: bool(failed))
        fake.add_bot("tok-new", BOT)
        state.save_account_sync(WeixinAccount(bot_id=BOT, bot_token=SecretStr("tok-new"), base_url=fake.url))
        fake.inject("tok-new", ALICE, text="还在")
        assert (await asyncio.wait_for(inbox.get(), 10)).text == "还在"


async def test_a_long_poll_answered_empty_at_once_is_not_asked_again_in_a_busy_loop(
        tmp_path: Path, running: Any) -> None:
    async with FakeILinkServer(hold_s=0) as server:  # a proxy answering every long poll at once
        server.add_bot(TOKEN, BOT)
        log_in(tmp_path, server)
        async with running(WeixinChannel(settings(tmp_path, retry_delay_s=0.2))):
            await asyncio.sleep(0.6)
        polls = sum(1 for n, _ in server.requests if n == "getupdates")
    assert 1 <= polls <= 8  # a busy loop asks thousands of times in 0.6 s


async def test_a_malformed_message_is_skipped_and_the_rest_arrive(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    bad = fake.inject(TOKEN, ALICE, text="坏的")
    bad["item_list"] = "not a list"
    fake.inject(TOKEN, ALICE, text="好的")
    async with running(WeixinChannel(settings(tmp_path))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "好的"


async def test_a_message_without_an_id_arrives_under_one_made_up_from_its_content(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message],
        caplog: pytest.LogCaptureFixture) -> None:
    """The server left the optional id out: the message was dropped without a word and the cursor moved
    past it. The reference client makes an id up; this one stays the same when the message comes again."""
    from robot.channels.weixin.api import WeixinMessage
    from robot.channels.weixin.convert import to_message

    log_in(tmp_path, fake)
    raw = fake.inject(TOKEN, ALICE, text="明天 9 点提醒我开会")
    del raw["message_id"]
    fake.inject(TOKEN, ALICE, text="下一条")
    with caplog.at_level(logging.WARNING):
        async with running(WeixinChannel(settings(tmp_path, typing=False))):
            got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(2)]
    assert [m.text for m in got] == ["明天 9 点提醒我开会", "下一条"]
    again = to_message(BOT, WeixinMessage.model_validate(raw))  # a redelivery: the bot's dedupe drops it
    assert again is not None and again.message_id == got[0].message_id != got[1].message_id
    assert any("no message_id" in r.getMessage() for r in caplog.records)


async def test_an_entry_that_is_not_a_message_is_skipped_and_its_batch_still_arrives(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    log_in(tmp_path, fake)
    fake.junk = [None, "garbage", 42]
    fake.inject(TOKEN, ALICE, text="同批的好消息")
    async with running(WeixinChannel(settings(tmp_path))):
        message = await asyncio.wait_for(inbox.get(), 5)  # not stuck re-polling the same batch forever
        fake.inject(TOKEN, ALICE, text="下一条")
        later = await asyncio.wait_for(inbox.get(), 5)
    assert (message.text, later.text) == ("同批的好消息", "下一条")


def test_account_files_are_private(tmp_path: Path) -> None:
    state = WeixinState(tmp_path / "wx")
    path = state.save_account_sync(WeixinAccount(bot_id="../evil", bot_token=SecretStr("t"), base_url="http://x"))
    assert path.parent == tmp_path / "wx" / "accounts"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [a.bot_id for a in state.load_accounts_sync()] == ["../evil"]


async def test_one_user_on_two_accounts_is_answered_by_each_through_the_outbox(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    await make_bot(ScriptedModel(lambda request: text(f"答：{request.messages[-1]['content']}")),
                   channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="问一号")
    fake.inject(TOKEN2, ALICE, text="问二号")
    await until(lambda: len(fake.sent) == 2)
    assert {(s.token, s.text) for s in fake.sent} == {(TOKEN, "答：问一号"), (TOKEN2, "答：问二号")}


async def test_an_account_logged_in_while_running_is_served(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    async with running(WeixinChannel(settings(tmp_path, account_scan_s=0.05))) as channel:
        assert channel.accounts == {}
        log_in(tmp_path, fake)  # `qunbot login weixin` (or the playground) in another process
        fake.inject(TOKEN, ALICE, text="新账号")
        message = await asyncio.wait_for(inbox.get(), 5)
    assert (message.text, message.chat.account) == ("新账号", BOT)


async def test_an_account_logged_in_while_the_database_fails_is_served_at_the_next_scan(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    channel = WeixinChannel(settings(tmp_path, account_scan_s=0.05))
    real, failed = channel.state.load_context_tokens, []

    async def flaky(bot_id: str) -> dict[str, str]:
        if len(failed) < 2:
            failed.append(bot_id)
            raise StorageError("channel state: the database is unreachable")
        return await real(bot_id)

    channel.state.load_context_tokens = flaky  # type: ignore[method-assign]
    async with running(channel):
        log_in(tmp_path, fake)
        fake.inject(TOKEN, ALICE, text="新账号")
        message = await asyncio.wait_for(inbox.get(), 5)
    assert (message.text, len(failed)) == ("新账号", 2)


async def test_forget_me_deletes_the_persons_context_tokens_on_every_account(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until, running: Any) -> None:
    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    fake.inject(TOKEN2, ALICE, text="你好")
    fake.inject(TOKEN, "bob@im.wechat", text="我是 Bob")
    await until(lambda: len(fake.sent) == 2)  # the no-LLM notices: both tokens are known and stored
    fake.inject(TOKEN, ALICE, text="/forget me all")
    await until(lambda: len(fake.sent) == 3)
    assert "已删除" in fake.sent[-1].text and "微信会话凭据" in fake.sent[-1].text  # the reply still went out
    await bot.stop()
    async with in_database(tmp_path) as state:
        assert list(await state.load_context_tokens(BOT)) == ["bob@im.wechat"]
        assert await state.load_context_tokens(BOT2) == {}
    _, channel = await make_bot(channel=WeixinChannel(settings(tmp_path)), data_dir=tmp_path)
    for account in (BOT, BOT2):  # after a restart: nothing to write with
        with pytest.raises(SendRejected, match="context_token"):
            await channel.send(OutgoingMessage(key=f"after-{account}", chat=ChatRef(
                platform="weixin", chat_id=ALICE, kind="private", account=account), text="还在吗"))


async def test_forget_me_also_clears_the_tokens_of_an_account_not_served_now(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until) -> None:
    log_in(tmp_path, fake)
    state = log_in(tmp_path, fake, BOT2, TOKEN2)
    await state.save_context_tokens(BOT2, {ALICE: "ctx-old", "bob@im.wechat": "ctx-bob"})
    await make_bot(channel=WeixinChannel(settings(tmp_path, accounts=[BOT])), data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="/forget me")
    await until(lambda: bool(fake.sent))
    assert "2 个微信会话凭据" in fake.sent[-1].text
    async with in_database(tmp_path) as stored:  # the files were imported at start, then cleared there
        assert await stored.load_context_tokens(BOT2) == {"bob@im.wechat": "ctx-bob"}


@pytest.mark.parametrize("ids", [{"group_id": " grp-1@chatroom "}, {"group_id": "  "}, {"group_id": 123456789},
                                 {"from_user_id": 987654321, "group_id": None}])
async def test_a_context_token_is_kept_under_the_chat_its_message_is_delivered_to(
        tmp_path: Path, ids: dict[str, Any]) -> None:
    """A padded, blank or numeric id was kept under another key than the chat's: the reply had no token."""
    from robot.channels.weixin.api import WeixinMessage
    from robot.channels.weixin.convert import to_message
    from robot.channels.weixin.live import LiveAccount

    item = {"seq": 1, "message_id": 7300000000000000001, "to_user_id": "b0f1@im.bot", "message_type": 1,
            "item_list": [{"type": 1, "text_item": {"text": "hi"}}], "context_token": "ctx-new",
            "from_user_id": "alice@im.wechat", **ids}
    channel = WeixinChannel(WeixinSettings(state_dir=tmp_path))
    account = LiveAccount(WeixinAccount(bot_id="b0f1@im.bot", bot_token=SecretStr("t"), base_url="http://x"),
                          api=None, tokens={})  # type: ignore[arg-type]
    await channel._remember_tokens(account, [item])
    message = to_message(account.bot_id, WeixinMessage.model_validate(item))
    assert message is not None and account.tokens == {message.chat.chat_id: "ctx-new"}


async def test_a_new_login_the_account_scan_found_first_resumes_an_expired_account_at_once(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message], until: Until) -> None:
    """The scan swapped the new token in first: the paused poller compared the stored token with that
    new one, saw no change and waited out ``session_pause_s`` (an hour)."""
    state = log_in(tmp_path, fake)
    fake.expire(TOKEN)
    channel = WeixinChannel(settings(tmp_path, session_pause_s=3600, account_scan_s=0.05))
    async with running(channel):
        await until(lambda: channel.accounts[BOT].expired)
        fake.add_bot("tok-new", BOT)
        state.save_account_sync(WeixinAccount(bot_id=BOT, bot_token=SecretStr("tok-new"), base_url=fake.url))
        fake.inject("tok-new", ALICE, text="重新登录了")
        assert (await asyncio.wait_for(inbox.get(), 3)).text == "重新登录了"
        assert not channel.accounts[BOT].expired


@asynccontextmanager
async def other_process(tmp_path: Path, channel: WeixinChannel) -> AsyncIterator[WeixinState]:
    """``channel`` on the bot's database, and that database as another process sees it (its own connection)."""
    dbs = [Database(tmp_path / "qunbot.sqlite3") for _ in range(2)]
    stores = [ChannelState(db, tmp_path / "secret.key") for db in dbs]  # (its tables: before opening)
    for db in dbs:
        await db.open()
    channel.attach_state(stores[0])
    other = WeixinState(tmp_path / "wx-other")
    other.attach(stores[1])
    try:
        yield other
    finally:
        for db in dbs:
            await db.close()


async def test_a_token_read_from_the_database_is_not_deleted_by_the_next_save(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    """A token another process learned, read to send, then Bob's message saved the tokens: the save
    counted Alice's as deleted here and removed it from the database; her reminder was refused."""
    log_in(tmp_path, fake)
    channel = WeixinChannel(settings(tmp_path, typing=False))
    alice = ChatRef(platform="weixin", chat_id=ALICE, kind="private", account=BOT)
    async with other_process(tmp_path, channel) as other, running(channel):
        fake.bots[TOKEN].issued.setdefault(ALICE, set()).add("ctx-alice")  # issued to the other process
        await other.save_context_tokens(BOT, {ALICE: "ctx-alice"})
        await channel.send(OutgoingMessage(key="r1", chat=alice, text="回复"))
        fake.inject(TOKEN, "bob@im.wechat", text="我是 Bob")
        await asyncio.wait_for(inbox.get(), 5)  # Bob's token is saved before his message is handed over
        assert sorted(await other.load_context_tokens(BOT)) == sorted([ALICE, "bob@im.wechat"])
        await channel.send(OutgoingMessage(key="r2", chat=alice, text="提醒"))
    assert [s.text for s in fake.sent if s.to_user_id == ALICE] == ["回复", "提醒"]


async def test_forget_me_all_deletes_tokens_another_process_learned_after_this_one_started(
        tmp_path: Path, fake: FakeILinkServer, running: Any) -> None:
    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    channel = WeixinChannel(settings(tmp_path, typing=False))
    async with other_process(tmp_path, channel) as other, running(channel):
        await other.save_context_tokens(BOT2, {ALICE: "ctx-on-2", "bob@im.wechat": "ctx-bob"})
        removed = await channel._forget(ForgetRequest(platform="weixin", user_id=ALICE, chats=(), everywhere=True))
        assert await other.load_context_tokens(BOT2) == {"bob@im.wechat": "ctx-bob"}
    assert removed == 1


async def test_forget_me_all_in_one_process_stops_another_process_writing_to_the_person(
        tmp_path: Path, fake: FakeILinkServer, pg_url: str) -> None:
    """Two processes on one PostgreSQL, each serving one account; Alice talked to both. After her
    ``/forget me all`` on account 1, the process serving account 2 still held her token in memory
    and its next reminder went out to her."""
    from robot.storage.postgres import PostgresDatabase

    log_in(tmp_path, fake)
    log_in(tmp_path, fake, BOT2, TOKEN2)
    dbs = [PostgresDatabase(pg_url, max_size=2) for _ in range(2)]
    stores = [ChannelState(db, tmp_path / "secret.key") for db in dbs]
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    procs = [WeixinChannel(settings(tmp_path, typing=False, accounts=[bot])) for bot in (BOT, BOT2)]
    for db in dbs:
        await db.open()
    try:
        for channel, store in zip(procs, stores, strict=True):
            channel.attach_state(store)
            channel.bind(inbox.put)  # type: ignore[arg-type]
            await channel.start()
        fake.inject(TOKEN, ALICE, text="你好 1")
        fake.inject(TOKEN2, ALICE, text="你好 2")
        await asyncio.wait_for(inbox.get(), 5)
        await asyncio.wait_for(inbox.get(), 5)
        alice = ChatRef(platform="weixin", chat_id=ALICE, kind="private", account=BOT)
        assert await procs[0]._forget(ForgetRequest(platform="weixin", user_id=ALICE, chats=(alice,),
                                                    everywhere=True)) >= 2
        later = OutgoingMessage(key="later", chat=alice.model_copy(update={"account": BOT2}), text="每日摘要")
        with contextlib.suppress(TimeoutError):  # (the other process hears of it a moment later)
            async with asyncio.timeout(3):
                while ALICE in procs[1].accounts[BOT2].tokens:
                    await asyncio.sleep(0.02)
        with pytest.raises(SendRejected, match="context_token"):
            await procs[1].send(later)
    finally:
        for channel in procs:
            await channel.stop()
        for db in dbs:
            await db.close()
    assert not [s for s in fake.sent if s.to_user_id == ALICE]


async def test_after_notices_may_have_been_missed_only_the_stored_tokens_are_used(
        tmp_path: Path, fake: FakeILinkServer, running: Any, inbox: asyncio.Queue[Message]) -> None:
    """The LISTEN connection was cut while another process forgot Alice: her token must not stay usable here."""
    log_in(tmp_path, fake)
    channel = WeixinChannel(settings(tmp_path, typing=False))
    async with other_process(tmp_path, channel) as other, running(channel):
        fake.inject(TOKEN, ALICE, text="你好")
        fake.inject(TOKEN, "bob@im.wechat", text="我是 Bob")
        await asyncio.wait_for(inbox.get(), 5)
        await asyncio.wait_for(inbox.get(), 5)
        await other.forget_context_tokens({ALICE}, skip=set())  # its notice never arrived
        assert channel.state.store is not None
        channel.state.store.db._gap()
        with pytest.raises(SendRejected, match="context_token"):
            async with asyncio.timeout(3):
                while True:  # (the re-read runs in the background)
                    await channel.send(OutgoingMessage(key="x", chat=ChatRef(
                        platform="weixin", chat_id=ALICE, kind="private", account=BOT), text="还在吗"))
                    fake.sent.clear()
                    await asyncio.sleep(0.02)
        await channel.send(OutgoingMessage(key="y", chat=ChatRef(
            platform="weixin", chat_id="bob@im.wechat", kind="private", account=BOT), text="Bob 你好"))
    assert [s.to_user_id for s in fake.sent] == ["bob@im.wechat"]


async def test_a_message_arriving_while_the_bot_stops_is_handled_after_the_restart(
        tmp_path: Path, fake: FakeILinkServer, make_bot: Any, until: Until, plugin: Plugin[Any]) -> None:
    """Turned away (admission closed while plugins tear down), yet the cursor was saved past it: lost."""
    log_in(tmp_path, fake)

    async def setup(_: object) -> None:
        return None

    async def slow_teardown(_: object) -> None:  # closing a client, flushing a cache: the channel still polls
        await asyncio.sleep(0.5)

    slow = Plugin("slowstop", Toolset("slowstop", []), setup=setup, teardown=slow_teardown)
    bot, _ = await make_bot(channel=WeixinChannel(settings(tmp_path, typing=False)), plugins=[plugin, slow],
                            data_dir=tmp_path)
    fake.inject(TOKEN, ALICE, text="一")
    await until(lambda: bot_has(bot, 1))
    stopping = asyncio.create_task(bot.stop())
    await until(lambda: bot.pipeline.admission.closed)
    fake.inject(TOKEN, ALICE, text="二")
    await stopping
    bot2, _ = await make_bot(channel=WeixinChannel(settings(tmp_path, typing=False)), plugins=[plugin, slow],
                             data_dir=tmp_path)
    await until(lambda: bot_has(bot2, 2))


@pytest.mark.parametrize("outcome", ["cancelled", "not taken"])
async def test_the_cursor_never_passes_a_batch_that_was_not_taken(tmp_path: Path, outcome: str) -> None:
    """Batch 1 cut short by stop() (or refused): batch 2's commit, fully handed over, must not write
    its cursor either, since it also covers batch 1."""
    from robot.channels.weixin.live import LiveAccount

    channel = WeixinChannel(WeixinSettings(state_dir=tmp_path))
    account = LiveAccount(WeixinAccount(bot_id=BOT, bot_token=SecretStr("t"), base_url="http://x"),
                          api=None)  # type: ignore[arg-type]

    async def delivery(taken: bool) -> bool:
        if outcome == "cancelled" and not taken:
            await asyncio.sleep(3600)
        return taken

    first = asyncio.create_task(delivery(False))
    second = asyncio.create_task(delivery(True))
    commit1 = asyncio.create_task(channel._commit(account, None, [first], "buf-1"))
    commit2 = asyncio.create_task(channel._commit(account, commit1, [second], "buf-2"))
    await asyncio.sleep(0)
    if outcome == "cancelled":
        first.cancel()
    await asyncio.gather(commit1, commit2)
    assert await channel.state.load_cursor(BOT) == ""
