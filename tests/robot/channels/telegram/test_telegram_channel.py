"""The Telegram channel against a fake Bot API server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from function_calls import Toolset
from function_calls.testing import ScriptedModel, text
from robot.channels.state_store import ChannelState
from robot.channels.telegram import TelegramChannel, TelegramSettings, split_utf16
from robot.channels.telegram.convert import read_entities
from robot.channels.telegram.testing import FakeBotAPI
from robot.hooks import observe
from robot.message import ChatRef, Message, OutgoingMessage
from robot.plugin import Plugin
from robot.store import Database, iso, parse_iso

Until = Callable[..., Awaitable[None]]
BOT_ID = "123456"
PRIVATE = {"id": 777, "type": "private", "first_name": "Alice"}
GROUP = {"id": -100500, "type": "supergroup", "title": "Team"}
FORUM = {"id": -100900, "type": "supergroup", "title": "Forum", "is_forum": True}
ALICE = 777


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI(f"{BOT_ID}:TEST-token") as server:
        yield server


def settings(tmp_path: Path, fake: FakeBotAPI, **over: Any) -> TelegramSettings:
    base: dict[str, Any] = {"enabled": True, "token": fake.token, "api_base": fake.url, "poll_timeout_s": 1,
                            "state_dir": tmp_path / "tg", "retry_delay_s": 0.05, "backoff_max_s": 0.1}
    return TelegramSettings(**(base | over))


def mention(text: str, word: str, kind: str = "mention") -> dict[str, Any]:
    start = text.index(word)
    return {"type": kind, "offset": len(text[:start].encode("utf-16-le")) // 2,
            "length": len(word.encode("utf-16-le")) // 2}


async def test_private_text_arrives_with_its_account_and_per_chat_id(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    update = fake.message(PRIVATE, ALICE, "你好")
    async with running(TelegramChannel(settings(tmp_path, fake))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.chat == ChatRef(platform="telegram", chat_id="777", kind="private", account=BOT_ID)
    assert message.message_id == f"777:{update['message']['message_id']}"
    assert (message.text, message.sender.user_id, message.sender.name) == ("你好", "777", "Alice")
    assert not fake.errors


async def test_mentions_replies_and_commands_with_the_bots_name_address_it(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    t1 = "@qun_test_bot 明天几点开会？ @bob"
    fake.message(GROUP, ALICE, t1, entities=[mention(t1, "@qun_test_bot"), mention(t1, "@bob")])
    fake.message(GROUP, ALICE, "对的", reply_to=fake.bot_message(GROUP, "要我提醒吗？"))
    t3 = "/note@qun_test_bot 买牛奶"
    fake.message(GROUP, ALICE, t3, entities=[{"type": "bot_command", "offset": 0, "length": 18}])
    t4 = "/note@other_bot 别的"
    fake.message(GROUP, ALICE, t4, entities=[{"type": "bot_command", "offset": 0, "length": 15}])
    t5 = "😀 @QUN_TEST_BOT 表情在前"
    fake.message(GROUP, ALICE, t5, entities=[mention(t5, "@QUN_TEST_BOT")])
    async with running(TelegramChannel(settings(tmp_path, fake))):
        got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(5)]
    assert (got[0].text, got[0].mentions_bot, got[0].mentions) == ("明天几点开会？ @bob", True, ("bob",))
    assert got[0].chat.kind == "group" and got[0].chat.chat_id == "-100500"
    assert got[1].reply_to_bot and got[1].reply_to is not None and got[1].reply_to.startswith("-100500:")
    assert (got[2].text, got[2].mentions_bot) == ("/note 买牛奶", True)
    assert (got[3].text, got[3].mentions_bot) == ("/note@other_bot 别的", False)
    assert (got[4].text, got[4].mentions_bot) == ("😀 表情在前", True)  # offsets in UTF-16 units


async def test_a_group_reply_quotes_the_question_and_a_foreign_command_is_ignored(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    t = "/note@other_bot 不归我管"
    fake.message(GROUP, ALICE, t, entities=[{"type": "bot_command", "offset": 0, "length": 15}])
    t = "/note@qun_test_bot 买牛奶"
    asked = fake.message(GROUP, ALICE, t, entities=[{"type": "bot_command", "offset": 0, "length": 18}])
    await until(lambda: bool(fake.sent))
    await asyncio.sleep(0.2)
    (sent,) = fake.sent
    assert sent.chat_id == -100500 and sent.text == "noted for Alice: 买牛奶 x1"
    assert sent.reply_to == asked["message"]["message_id"]


async def test_forum_topics_are_chats_of_their_own_and_replies_stay_in_the_topic(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    topic_start = {"message_id": 42, "date": 0, "chat": FORUM, "forum_topic_created": {"name": "周会"}}
    t = "@qun_test_bot /note 议程"
    fake.message(FORUM, ALICE, t, thread=42, reply_to=topic_start, entities=[mention(t, "@qun_test_bot")])
    await until(lambda: bool(fake.sent))
    assert (fake.sent[0].chat_id, fake.sent[0].thread_id) == (-100900, 42)
    rows = await bot.history.recent(ChatRef(platform="telegram", chat_id="-100900/42", kind="group"), 10)
    assert [r.text for r in rows if not r.from_bot] == ["/note 议程"]


async def test_a_migrated_group_keeps_getting_its_replies(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    old = {"id": -4001, "type": "group", "title": "Old"}
    fake.message(old, ALICE, "", migrate_to_chat_id=-1004001)
    fake.message(PRIVATE, ALICE, "marker")
    from robot.message import OutgoingMessage

    async with running(TelegramChannel(settings(tmp_path, fake))) as channel:
        await asyncio.wait_for(inbox.get(), 5)  # the marker: the migration notice came before it
        await channel.send(OutgoingMessage(key="r", chat=ChatRef(platform="telegram", chat_id="-4001",
                                                                 kind="group"), text="提醒"))
        # A migration learned from a send's refusal is followed too.
        fake.migrated[-4002] = -1004002
        await channel.send(OutgoingMessage(key="s", chat=ChatRef(platform="telegram", chat_id="-4002",
                                                                 kind="group"), text="又一个"))
    assert [(s.chat_id, s.text) for s in fake.sent] == [(-1004001, "提醒"), (-1004002, "又一个")]
    async with running(TelegramChannel(settings(tmp_path, fake))) as channel:  # remembered on disk
        await channel.send(OutgoingMessage(key="t", chat=ChatRef(platform="telegram", chat_id="-4002",
                                                                 kind="group"), text="重启后"))
    assert fake.sent[-1].chat_id == -1004002


def test_text_is_split_at_4096_utf16_units() -> None:
    text = "😀" * 3000  # 6000 UTF-16 units
    parts = split_utf16(text)
    assert "".join(parts) == text and all(len(p.encode("utf-16-le")) // 2 <= 4096 for p in parts)
    lines = "\n".join("行" * 99 for _ in range(60))
    parts = split_utf16(lines)
    assert len(parts) == 2 and parts[0].endswith("\n")  # cut at a line break


async def test_long_replies_are_split_and_accepted(tmp_path: Path, fake: FakeBotAPI, make_bot: Any,
                                                   until: Until) -> None:
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    long = "。".join("😀这是一句很长的话" for _ in range(800))
    await bot.send(ChatRef(platform="telegram", chat_id="777", kind="private"), long, key="long")
    await until(lambda: sum(len(s.text) for s in fake.sent) >= len(long) - 10)
    assert len(fake.sent) >= 2 and not fake.errors


async def test_a_failed_piece_of_a_long_reply_never_sends_the_earlier_ones_again(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    """3,000 emoji were one outbox part and two Telegram messages: a 5xx on the second sent the first again."""
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    real, calls = fake._send_message, [0]

    async def flaky(body: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            fake.flood(1)  # (a flood wait: the outbox retries the part)
        return await real(body)

    fake._send_message = flaky  # type: ignore[method-assign]
    text = "😀" * 3000
    await bot.send(ChatRef(platform="telegram", chat_id="777", kind="private"), text, key="emoji")
    await until(lambda: sum(len(s.text) for s in fake.sent) >= len(text), timeout=10)
    await bot.outbox.flush()
    assert "".join(s.text for s in fake.sent) == text


async def test_a_reply_quotes_only_a_message_of_the_chat_it_goes_to(tmp_path: Path, fake: FakeBotAPI) -> None:
    """A reply queued before a migration quoted message 17 of the new group, someone else's message."""
    from robot.message import OutgoingMessage

    channel = TelegramChannel(settings(tmp_path, fake))
    channel.bind(lambda m: None)  # type: ignore[arg-type,return-value]
    await channel.start()
    try:
        fake.migrated[-4001] = -1004001  # the group became a supergroup
        group = ChatRef(platform="telegram", chat_id="-4001", kind="group")
        await channel.send(OutgoingMessage(key="r", chat=group, text="答复", reply_to="-4001:17"))
        await channel.send(OutgoingMessage(key="s", chat=ChatRef(platform="telegram", chat_id="777", kind="private"),
                                           text="hi", reply_to="-100500:18"))
        await channel.send(OutgoingMessage(key="t", chat=ChatRef(platform="telegram", chat_id="777", kind="private"),
                                           text="ok", reply_to="777:19"))
    finally:
        await channel.stop()
    assert [(s.chat_id, s.reply_to) for s in fake.sent] == [(-1004001, None), (777, None), (777, 19)]


async def test_flood_control_is_waited_out_through_the_outbox(tmp_path: Path, fake: FakeBotAPI, make_bot: Any,
                                                              until: Until) -> None:
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    fake.flood(2)
    before = datetime.now(UTC)
    await bot.send(ChatRef(platform="telegram", chat_id="777", kind="private"), "稍后", key="flood")

    async def retried_later() -> bool:  # a flood wait is not a failure of the message: no attempt is counted
        rows = [r for r in await bot.outbox.rows() if r["key"] == "flood"]
        return bool(rows) and "retry after" in str(rows[0]["error"]) and int(str(rows[0]["attempts"])) == 0

    await until(retried_later)
    (row,) = [r for r in await bot.outbox.rows() if r["key"] == "flood"]
    # The test outbox retries after 0.02-0.1 s; Telegram asked for 2 s, and that wins.
    assert (parse_iso(str(row["next_at"])) - before).total_seconds() >= 1.9
    assert "retry after 2" in str(row["error"]) and fake.sent == []
    await until(lambda: bool(fake.sent), timeout=10)
    assert fake.sent[0].text == "稍后"


async def test_the_offset_is_saved_and_a_restart_neither_loses_nor_repeats(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    fake.message(PRIVATE, ALICE, "一")
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)

    async def count(b: Any, n: int) -> bool:
        rows = await b.history.recent(ChatRef(platform="telegram", chat_id="777", kind="private"), 50)
        return len([r for r in rows if not r.from_bot]) >= n

    await until(lambda: count(bot, 1))
    await bot.stop()
    saved = fake.offsets[-1]
    db = Database(tmp_path / "qunbot.sqlite3")  # kept in the database, for whichever process polls next
    await db.open()
    assert await ChannelState(db).get("telegram", BOT_ID, "offset") == str(saved)
    await db.close()
    second = fake.message(PRIVATE, ALICE, "二")
    polls_before = len(fake.offsets)
    bot2, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    await until(lambda: count(bot2, 2))
    await until(lambda: fake.offsets[-1] == second["update_id"] + 1)
    assert fake.offsets[polls_before] == saved == second["update_id"]  # resumed where it left off
    rows = await bot2.history.recent(ChatRef(platform="telegram", chat_id="777", kind="private"), 50)
    assert sorted(r.text for r in rows if not r.from_bot) == ["一", "二"]


async def test_a_message_polled_while_the_bot_stops_is_delivered_after_the_restart(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    # Polling again would confirm it to Telegram, and the stopping bot no longer takes it: spooled.
    late: list[dict[str, Any]] = []

    async def teardown(_: None) -> None:  # the bot is stopping (it takes no more messages) meanwhile
        late.append(fake.message(PRIVATE, ALICE, "停机时到的"))  # the poll in flight returns it at once
        await asyncio.sleep(0.3)  # its delivery meets the stopping bot; without the fix, the next poll confirmed it

    polls = 0
    async def setup(_: Any) -> None:
        return None

    plugin = Plugin("slow-stop", Toolset("slow-stop"), setup=setup, teardown=teardown)
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path, plugins=[plugin])
    await until(lambda: bool(fake.offsets))
    polls = len(fake.offsets)
    await bot.stop()
    assert len(fake.offsets) <= polls + 1  # no poll after the one in flight: it confirmed nothing new
    db = Database(tmp_path / "qunbot.sqlite3")  # nor was the offset saved past it (another process polls next)
    await db.open()
    saved = await ChannelState(db).get("telegram", BOT_ID, "offset")
    await db.close()
    assert saved is None or int(saved) <= late[0]["update_id"]
    bot2, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    chat = ChatRef(platform="telegram", chat_id="777", kind="private")

    async def arrived() -> bool:
        return [r.text for r in await bot2.history.recent(chat, 50) if not r.from_bot] == ["停机时到的"]

    await until(arrived)
    await until(lambda: not list((tmp_path / "tg").glob("*-webhook/*.json")))


async def test_webhook_mode_checks_the_secret_token(tmp_path: Path, fake: FakeBotAPI, running: Any,
                                                    inbox: asyncio.Queue[Message]) -> None:
    cfg = settings(tmp_path, fake, mode="webhook", webhook_secret="s3cret-Token_1", port=0,
                   webhook_url="https://bot.example.com/telegram/webhook")
    update = {"update_id": 9, "message": {"message_id": 5, "date": 1_790_000_000, "chat": PRIVATE,
                                          "from": {"id": ALICE, "first_name": "Alice"}, "text": "经由 webhook"}}
    async with running(TelegramChannel(cfg)) as channel, aiohttp.ClientSession() as http:
        assert fake.webhook is not None and fake.webhook["secret_token"] == "s3cret-Token_1"
        url = channel.location()
        async with http.post(url, json=update) as resp:
            assert resp.status == 401
        async with http.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "wrong"}) as resp:
            assert resp.status == 401
        async with http.post(url, data=b"{not json", headers={"X-Telegram-Bot-Api-Secret-Token":
                                                              "s3cret-Token_1"}) as resp:
            assert resp.status == 400
        async with http.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token":
                                                        "s3cret-Token_1"}) as resp:
            assert resp.status == 200
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "经由 webhook" and inbox.empty()
    assert "getupdates" not in fake.calls


@pytest.mark.parametrize("restart_mode", ["webhook", "polling"])
async def test_a_webhook_update_answered_200_survives_a_crash_before_the_bot_recorded_it(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message], restart_mode: str) -> None:
    cfg = settings(tmp_path, fake, mode="webhook", webhook_secret="s3cret", port=0)
    update = {"update_id": 41, "message": {"message_id": 6, "date": 1_790_000_000, "chat": PRIVATE,
                                           "from": {"id": ALICE, "first_name": "Alice"}, "text": "别丢了我"}}
    stuck = asyncio.Event()

    async def never_records(message: Message) -> None:  # the bot is busy (or about to crash)
        stuck.set()
        await asyncio.Event().wait()

    first = TelegramChannel(cfg)
    first.bind(never_records)
    await first.start()
    try:
        async with aiohttp.ClientSession() as http, http.post(
                first.location() or "", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
            assert resp.status == 200  # Telegram will never send update 41 again
        async with aiohttp.ClientSession() as http, http.post(
                first.location() or "", json=update | {"update_id": -3},
                headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
            assert resp.status == 200  # no real update: acknowledged, skipped, not spooled
        await asyncio.wait_for(stuck.wait(), 5)
        spooled = list((tmp_path / "tg").glob("*-webhook/*.json"))
        assert [p.name for p in spooled] == ["41.json"] and spooled[0].stat().st_mode & 0o777 == 0o600
    finally:
        await first.stop()  # the process goes down before the update was recorded
    again = cfg if restart_mode == "webhook" else settings(tmp_path, fake)  # polling: Telegram won't resend it
    async with running(TelegramChannel(again)):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "别丢了我"
    assert not list((tmp_path / "tg").glob("*-webhook/*.json"))  # recorded now: the spool is empty


async def test_a_webhook_update_with_a_lone_surrogate_is_spooled_and_delivered(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    """JSON can carry "\\ud83d" alone, UTF-8 cannot: refusing it with 500 made Telegram resend it forever."""
    cfg = settings(tmp_path, fake, mode="webhook", webhook_secret="s3cret", port=0)
    update = {"update_id": 77, "message": {"message_id": 8, "date": 1_790_000_000, "chat": PRIVATE,
                                           "from": {"id": ALICE, "first_name": "A"}, "text": "半个表情 @"}}
    body = json.dumps(update).replace("@", "\\ud83d")  # escaped: the only way a lone surrogate travels
    async with running(TelegramChannel(cfg)) as channel, aiohttp.ClientSession() as http:
        async with http.post(channel.location(), data=body.encode(),
                             headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
            assert resp.status == 200
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text.startswith("半个表情") and not list((tmp_path / "tg").rglob("*.tmp"))


async def test_short_polling_that_finds_nothing_is_not_a_busy_loop(
        tmp_path: Path, fake: FakeBotAPI, running: Any) -> None:
    async with running(TelegramChannel(settings(tmp_path, fake, poll_timeout_s=0, retry_delay_s=0.2))):
        await asyncio.sleep(0.6)
    assert 1 <= fake.calls.count("getupdates") <= 8  # a busy loop asks thousands of times in 0.6 s


def test_a_bot_api_url_is_shown_without_its_token() -> None:
    from robot.redact import redact_url

    shown = redact_url("https://api.telegram.org/bot123456:AAE-s3cret_x/getUpdates?offset=5")
    assert shown == "https://api.telegram.org/bot123456:***/getUpdates?offset=5"


def test_webhook_mode_without_a_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="webhook_secret"):
        TelegramSettings(enabled=True, token="1:x", mode="webhook")


async def test_the_command_menu_comes_from_the_tools(tmp_path: Path, fake: FakeBotAPI, make_bot: Any) -> None:
    await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    assert fake.commands is not None
    menu = {c["command"]: c["description"] for c in fake.commands}
    assert menu["note"] == "Take a note (answers the user by itself)."
    assert "purge" not in menu and "help" in menu  # admin-only tools stay out of everyone's menu
    assert not fake.errors


async def test_typing_is_shown_while_the_model_runs(tmp_path: Path, fake: FakeBotAPI, make_bot: Any,
                                                    until: Until) -> None:
    release = asyncio.Event()

    async def slow(request: Any) -> Any:
        await release.wait()
        return text("好")

    await make_bot(ScriptedModel(slow), channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    fake.message(PRIVATE, ALICE, "在吗")
    await until(lambda: (777, "typing") in fake.actions)
    release.set()
    await until(lambda: bool(fake.sent))


async def test_typing_lasts_while_any_run_in_the_chat_goes_on(tmp_path: Path, fake: FakeBotAPI, make_bot: Any,
                                                             until: Until) -> None:
    """Two members ask at once: the quick answer does not end the group's "typing…" (Telegram clears it
    when a message arrives) while the other question is still worked on; the last answer ends it."""
    slow_done = asyncio.Event()

    async def answer(request: Any) -> Any:
        if "慢" in str(request.messages[-1]["content"]):
            await slow_done.wait()
        return text("答")

    channel = TelegramChannel(settings(tmp_path, fake))
    channel.typing_refresh_s = 0.05
    await make_bot(ScriptedModel(answer), channel=channel, data_dir=tmp_path)
    for user, question in ((ALICE, "@qun_test_bot 慢问题"), (778, "@qun_test_bot 快问题")):
        fake.message(GROUP, user, question, entities=[mention(question, "@qun_test_bot")])
    await until(lambda: len(fake.sent) == 1)
    await asyncio.sleep(0.3)  # the slow run goes on: typing is back after the reply, and refreshed
    first = fake.calls.index("sendmessage")
    assert fake.calls[first:].count("sendchataction") >= 3
    slow_done.set()
    await until(lambda: len(fake.sent) == 2)
    await asyncio.sleep(0.2)
    last = len(fake.calls) - fake.calls[::-1].index("sendmessage")
    assert "sendchataction" not in fake.calls[last:]  # the last run's end stops it
    assert {chat for chat, _ in fake.actions} == {GROUP["id"]} and not fake.errors


async def test_a_failed_or_cancelled_run_ends_its_own_typing_only(tmp_path: Path, fake: FakeBotAPI, running: Any,
                                                                   until: Until) -> None:
    """Each run turns typing off on its way out, even cancelled: the chat's other run keeps it on."""
    chat = ChatRef(platform="telegram", chat_id=str(GROUP["id"]), kind="group", account=BOT_ID)
    async with running(TelegramChannel(settings(tmp_path, fake))) as channel:
        channel.typing_refresh_s = 0.05

        async def run(done: asyncio.Event) -> None:  # as the pipeline calls it
            async with contextlib.AsyncExitStack() as stack:
                await observe(channel.typing(chat, True), "typing")
                stack.push_async_callback(lambda: observe(channel.typing(chat, False), "typing"))
                await done.wait()

        cancelled, other = asyncio.create_task(run(asyncio.Event())), asyncio.Event()
        going = asyncio.create_task(run(other))
        await until(lambda: bool(fake.actions))
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        shown = len(fake.actions)
        await asyncio.sleep(0.3)
        assert len(fake.actions) >= shown + 3  # still refreshed for the run going on
        other.set()
        await going
        shown = len(fake.actions)
        await asyncio.sleep(0.2)
        assert len(fake.actions) == shown  # the last run's end stopped it


async def test_malformed_updates_are_skipped(tmp_path: Path, fake: FakeBotAPI, running: Any,
                                             inbox: asyncio.Queue[Message]) -> None:
    fake.push({"message": {"message_id": 1, "chat": {"type": "private"}}})  # no chat id, no date
    fake.push({"message": "nonsense"})
    fake.push({"channel_post": {"message_id": 2}})
    fake.message(PRIVATE, ALICE, "正常")
    async with running(TelegramChannel(settings(tmp_path, fake))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "正常"


async def test_a_migrated_group_takes_its_history_and_reminders_along(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    import reminders
    from reminders.store import Reminder, new_id

    old = {"id": -4001, "type": "group", "title": "Old"}
    new = {"id": -1004001, "type": "supergroup", "title": "Old"}
    old_ref = ChatRef(platform="telegram", chat_id="-4001", kind="group")
    new_ref = ChatRef(platform="telegram", chat_id="-1004001", kind="group")
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path,
                            plugins=[reminders.plugin])
    fake.message(old, ALICE, "旧群里说的话")
    await until(lambda: bot.history.recent(old_ref, 10))
    now = datetime.now(UTC)
    store = bot._deps["reminders"].store
    await store.create(Reminder(
        id=new_id(), owner="telegram:777", owner_name="Alice", chat=old_ref.key, type="daily", wall="09:00:00",
        zone="Asia/Shanghai", weekday=None, content="交周报", mode="text", created_at=now, updated_at=now,
        next_fire=now + timedelta(hours=20), status="active"), reminders.ReminderSettings(), now)
    code = await bot.approvals.store.insert({  # a paused run waiting there: its code must work in the new chat
        "kind": "approval", "approver": "admin", "requester": "telegram:777", "chat": old_ref.key, "account": "",
        "caller": "{}", "state": "{}", "origin": "chat", "reply_to": None, "tip": None, "created_at": iso(now),
        "expires_at": iso(now + timedelta(minutes=30)), "tools": "[]"})
    fake.message(old, ALICE, "", migrate_to_chat_id=-1004001)
    fake.message(new, ALICE, "", migrate_from_chat_id=-4001)

    async def moved() -> bool:
        return bool(await store.for_chat(new_ref.key))

    await until(moved)
    assert [r.text for r in await bot.history.recent(new_ref, 10)] == ["旧群里说的话"]
    assert await bot.history.recent(old_ref, 10) == [] and await store.for_chat(old_ref.key) == []
    assert [r.content for r in await store.for_chat(new_ref.key)] == ["交周报"]
    paused = await bot.approvals.store.pending(now, chat=new_ref.key)
    assert [r["code"] for r in paused if bot.approvals.store.verify(r)] == [code]  # signed anew, still valid


def test_a_refused_token_stops_qunbot_run_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from robot.cli import main

    loop = asyncio.new_event_loop()  # the fake runs beside main()'s own asyncio.run
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeBotAPI("42:real-token")
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(5)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUNBOT_BOT__DATA_DIR", str(tmp_path))
    monkeypatch.setenv("QUNBOT_CHANNELS__TELEGRAM__ENABLED", "true")
    monkeypatch.setenv("QUNBOT_CHANNELS__TELEGRAM__TOKEN", "42:wrong-token")
    monkeypatch.setenv("QUNBOT_CHANNELS__TELEGRAM__API_BASE", fake.url)
    try:
        assert main(["run"]) == 1
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    err = capsys.readouterr().err
    assert "error: cannot start: getMe: 401 Unauthorized" in err and "wrong-token" not in err
    assert "Traceback" not in err


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["id", "type", "text", "chat", "from", "date", "message_id", "entities",
                                          "offset", "length", "user", "reply_to_message", "message_thread_id",
                                          "is_topic_message", "migrate_to_chat_id", "caption", "document", "poll",
                                          "contact", "dice", "venue", "question", "title", "value"]),
                         inner, max_size=6), max_leaves=20)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(update=st.dictionaries(st.sampled_from(["update_id", "message", "edited_message"]), _json, max_size=3))
def test_any_update_is_read_or_skipped_never_raised(tmp_path: Path, update: dict[str, Any]) -> None:
    channel = TelegramChannel(TelegramSettings(enabled=True, token="1:x", state_dir=tmp_path))
    channel.bot_id, channel.username = "1", "qun_test_bot"
    got: list[Message] = []

    async def sink(message: Message) -> None:
        got.append(message)

    async def accept() -> None:
        channel.bind(sink)
        task = channel._accept(update)  # the poller calls this outside any try: it must not raise
        if task is not None:
            await task

    asyncio.run(accept())
    assert all(m.chat.platform == "telegram" and m.chat.account == "1" for m in got)


@hsettings(max_examples=150, deadline=None)
@given(words=st.text(max_size=30), entities=st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["mention", "bot_command", "text_mention", "url"]),
    "offset": st.integers(-5, 40), "length": st.integers(-5, 40),
    "user": st.fixed_dictionaries({"id": st.integers(0, 3)})}), max_size=4))
def test_any_entities_leave_readable_text(words: str, entities: list[dict[str, Any]]) -> None:
    clean, mentions, _ = read_entities(words, entities, "qun_test_bot", "1")
    assert isinstance(clean, str) and all(isinstance(m, str) for m in mentions)


def test_a_message_keeps_its_own_spaces_only_the_cut_mention_leaves_none() -> None:
    # Every message's runs of spaces were collapsed: a pasted function lost its indentation.
    code = "def f(x):\n    if x:\n        return 1\n\tprint(x)  # two spaces"
    assert read_entities(code, [], "qun_test_bot", "1")[0] == code
    said = "看看  @qun_test_bot  这段：\n    return 1"
    clean, _, hit = read_entities(said, [mention(said, "@qun_test_bot")], "qun_test_bot", "1")
    assert hit and clean == "看看  这段：\n    return 1"


_CHILD = """
import asyncio, sys
from pathlib import Path
from robot.channels.telegram import TelegramChannel, TelegramSettings

async def main() -> None:
    channel = TelegramChannel(TelegramSettings(enabled=True, token=sys.argv[1], api_base=sys.argv[2], poll_timeout_s=1,
                                               state_dir=Path(sys.argv[3]), retry_delay_s=0.05, backoff_max_s=0.1))
    async def busy(message) -> None:  # the bot has not recorded it yet (a slow turn, a busy database)
        print("GOT", message.text, flush=True)
        await asyncio.Event().wait()
    channel.bind(busy)
    await channel.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_polled_message_survives_a_sigkill_after_telegram_counted_it_delivered(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message], until: Until) -> None:
    """The next getUpdates confirms the batch before it (Telegram never sends it again): it must be ours by then."""
    import os
    import signal
    import sys

    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, fake.token, fake.url, str(tmp_path / "tg"), stdout=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parents[4], env={k: v for k, v in os.environ.items() if not k.startswith("QUNBOT_")})
    try:
        assert child.stdout is not None
        update = fake.message(PRIVATE, ALICE, "/note 牛奶")
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).decode().startswith("GOT")
        await until(lambda: any(o > update["update_id"] for o in fake.offsets))  # confirmed to Telegram
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert fake.updates == []  # Telegram holds it no more
    async with running(TelegramChannel(settings(tmp_path, fake))):
        message = await asyncio.wait_for(inbox.get(), 5)
        assert message.text == "/note 牛奶"
        await until(lambda: not list((tmp_path / "tg").glob("*-webhook/*.json")))  # taken: the spool is empty


@contextlib.asynccontextmanager
async def holding(tmp_path: Path, fake: FakeBotAPI) -> AsyncIterator[tuple[list[str], asyncio.Event]]:
    """A running polling channel whose bot notes each message's text and holds it until the event is set."""
    release = asyncio.Event()
    got: list[str] = []

    async def slow(message: Message) -> None:
        got.append(message.text)
        await release.wait()

    channel = TelegramChannel(settings(tmp_path, fake))
    channel.bind(slow)
    await channel.start()
    try:
        yield got, release
    finally:
        await channel.stop()


async def test_a_polled_update_is_spooled_until_the_bot_took_it(
        tmp_path: Path, fake: FakeBotAPI, until: Until) -> None:
    async with holding(tmp_path, fake) as (got, release):
        update = fake.message(PRIVATE, ALICE, "一")
        await until(lambda: any(o > update["update_id"] for o in fake.offsets))
        spooled = list((tmp_path / "tg").glob("*-webhook/*.json"))
        assert [p.name for p in spooled] == [f"{update['update_id']}.json"] and got == ["一"]
        assert spooled[0].stat().st_mode & 0o777 == 0o600
        release.set()
        await until(lambda: not list((tmp_path / "tg").glob("*-webhook/*.json")))


async def test_group_mentions_carry_a_text_mention_entity_at_utf16_offsets(
        tmp_path: Path, fake: FakeBotAPI, running: Any) -> None:
    """A reminder or an approval notice in a group names and notifies its person (Telegram: a text_mention)."""
    fake.message(GROUP, ALICE, "随便说一句", first_name="Alice😀")  # the channel learns the name (or asks getChatMember)
    group = ChatRef(platform="telegram", chat_id=str(GROUP["id"]), kind="group", account=BOT_ID)
    async with running(TelegramChannel(settings(tmp_path, fake))) as channel:
        await channel.send(OutgoingMessage(key="rem:1", chat=group, text="⏰ 提醒：交周报", mention=(str(ALICE), "888")))
        long = "😀" * 2040 + "\n" + "尾" * 30  # the mention pushes it past 4096 units: split, the entity in part one
        await channel.send(OutgoingMessage(key="rem:2", chat=group, text=long, mention=(str(ALICE),)))
        await channel.send(OutgoingMessage(key="r:3", chat=group, text="回答", mention=(str(ALICE),),
                                           reply_to=f"{GROUP['id']}:5"))  # a quote notifies its author already
        private = ChatRef(platform="telegram", chat_id="777", kind="private", account=BOT_ID)
        await channel.send(OutgoingMessage(key="p:4", chat=private, text="私聊", mention=(str(ALICE),)))
    assert fake.errors == []
    first = fake.sent[0]
    assert first.text.endswith("⏰ 提醒：交周报") and first.text.startswith("@Alice😀")
    units = first.text.encode("utf-16-le")
    labels = [units[e["offset"] * 2:(e["offset"] + e["length"]) * 2].decode("utf-16-le") for e in first.entities]
    assert labels == ["@Alice😀", "@888"]  # 888 is nobody the bot knows: the id stands in for the name
    assert [(e["type"], e["user"]["id"]) for e in first.entities] == [("text_mention", ALICE), ("text_mention", 888)]
    assert len(fake.sent) == 5 and fake.sent[1].entities and not fake.sent[2].entities
    assert fake.sent[1].text.startswith("@Alice😀 ") and fake.sent[2].text.endswith("尾" * 30)
    assert fake.sent[3].text == "回答" and not fake.sent[3].entities
    assert fake.sent[4].text == "私聊" and not fake.sent[4].entities


@pytest.mark.parametrize(("chat", "text", "entities"), [
    (PRIVATE, "/start", [{"type": "bot_command", "offset": 0, "length": 6}]),
    (PRIVATE, "/start ref_group42", [{"type": "bot_command", "offset": 0, "length": 6}]),
    (GROUP, "/start@qun_test_bot", [{"type": "bot_command", "offset": 0, "length": 19}]),
])
async def test_start_is_answered_with_the_help(tmp_path: Path, fake: FakeBotAPI, running: Any,
                                               inbox: asyncio.Queue[Message], chat: dict[str, Any], text: str,
                                               entities: list[dict[str, Any]]) -> None:
    fake.message(chat, ALICE, text, entities=entities)
    async with running(TelegramChannel(settings(tmp_path, fake))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "/help"


async def test_a_start_for_another_bot_is_left_alone(tmp_path: Path, fake: FakeBotAPI, running: Any,
                                                     inbox: asyncio.Queue[Message]) -> None:
    fake.message(GROUP, ALICE, "/start@other_bot", entities=[{"type": "bot_command", "offset": 0, "length": 16}])
    async with running(TelegramChannel(settings(tmp_path, fake))):
        message = await asyncio.wait_for(inbox.get(), 5)
    assert message.text == "/start@other_bot"


_PHOTO = [{"file_id": "a", "file_unique_id": "b", "width": 90, "height": 90}]


@pytest.mark.parametrize(("extra", "expected"), [
    ({"photo": _PHOTO, "caption": "这张图里是什么花？"}, "[图片] 这张图里是什么花？"),
    ({"video_note": {"file_id": "x", "file_unique_id": "y", "length": 240, "duration": 3}}, "[视频]"),
    ({"contact": {"phone_number": "+8613800000000", "first_name": "Bob", "last_name": "Li"}}, "[联系人: Bob Li]"),
    ({"poll": {"id": "1", "question": "周五聚餐?", "options": [], "total_voter_count": 0, "is_closed": False,
               "is_anonymous": True, "type": "regular", "allows_multiple_answers": False}}, "[投票: 周五聚餐?]"),
    ({"dice": {"emoji": "🎲", "value": 3}}, "[骰子 🎲: 3]"),
    ({"venue": {"location": {"latitude": 1, "longitude": 2}, "title": "咖啡馆", "address": "x路1号"},
      "location": {"latitude": 1, "longitude": 2}}, "[位置: 咖啡馆, x路1号]"),
    ({"story": {"chat": PRIVATE, "id": 3}}, "[动态]"),
    ({"photo": _PHOTO, "caption": "/remind 明天9点 交这张表"}, "/remind 明天9点 交这张表 [图片]"),  # still a command
])
def test_media_reach_the_bot_with_a_marker(tmp_path: Path, extra: dict[str, Any], expected: str) -> None:
    channel = TelegramChannel(TelegramSettings(enabled=True, token="1:x", state_dir=tmp_path))
    channel.bot_id, channel.username = BOT_ID, "qun_test_bot"
    update = {"update_id": 1, "message": {"message_id": 2, "date": 1_790_000_000, "chat": PRIVATE,
                                          "from": {"id": ALICE, "first_name": "Alice"}, **extra}}
    message = channel.to_message(update)
    assert message is not None and message.text == expected


async def test_two_copies_of_one_webhook_update_at_once_both_get_200(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    cfg = settings(tmp_path, fake, mode="webhook", webhook_secret="s3cret", port=0)
    headers = {"X-Telegram-Bot-Api-Secret-Token": "s3cret"}
    async with running(TelegramChannel(cfg)) as channel, aiohttp.ClientSession() as http:
        for i in range(5):
            update = {"update_id": 100 + i, "message": {"message_id": 5 + i, "date": 1_790_000_000, "chat": PRIVATE,
                                                        "from": {"id": ALICE, "first_name": "A"}, "text": f"第{i}条"}}
            answers = await asyncio.gather(*(http.post(channel.location(), json=update, headers=headers)
                                             for _ in range(4)))
            assert [r.status for r in answers] == [200] * 4
            for r in answers:
                r.release()


async def test_a_batch_that_cannot_be_spooled_is_confirmed_only_once_the_bot_took_it(
        tmp_path: Path, fake: FakeBotAPI, until: Until) -> None:
    (tmp_path / "tg").mkdir()
    (tmp_path / "tg" / f"{BOT_ID}-webhook").write_text("a file where the spool folder goes")  # (a full disk, say)
    async with holding(tmp_path, fake) as (got, release):
        update = fake.message(PRIVATE, ALICE, "一")
        await until(lambda: got == ["一"])
        await asyncio.sleep(0.3)
        assert all(o <= update["update_id"] for o in fake.offsets)  # not confirmed while only in memory
        release.set()
        await until(lambda: any(o > update["update_id"] for o in fake.offsets))


async def test_a_revoked_token_keeps_queued_messages_waiting_and_says_so_once(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until, caplog: pytest.LogCaptureFixture) -> None:
    """The token revoked in @BotFather while running: every queued reply and reminder was marked failed for
    good (401 read as this message's refusal). They wait for the fixed token, and the log says so once."""
    bot, _ = await make_bot(channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    bot.outbox.park_s = 0.05
    real, fake.token = fake.token, f"{BOT_ID}:NEW-token"  # the old token now gets 401 Unauthorized
    chat = ChatRef(platform="telegram", chat_id=str(ALICE), kind="private", account=BOT_ID)
    for i in range(3):
        await bot.send(chat, f"提醒 {i}", key=f"rem-{i}")

    async def tried() -> bool:  # (the chat's rows go in order: the first one is tried again and again)
        return any(r["key"] == "rem-0" and (r["error"] or r["status"] != "pending") for r in await bot.outbox.rows())

    await until(tried)
    await asyncio.sleep(0.3)  # several more tries
    rows = [r for r in await bot.outbox.rows() if str(r["key"]).startswith("rem-")]
    assert {r["status"] for r in rows} == {"pending"}, rows
    told = [r for r in caplog.records if r.levelname == "ERROR" and "token" in r.getMessage()]
    assert len(told) == 1 and "BotFather" in told[0].getMessage() and "NEW-token" not in caplog.text
    assert "TEST-token" not in caplog.text
    fake.token = real  # the owner put the right token back
    await until(lambda: sorted(s.text for s in fake.sent) == [f"提醒 {i}" for i in range(3)])


def _album_part(fake: FakeBotAPI, chat: dict[str, Any], group: str, **extra: Any) -> dict[str, Any]:
    """One update of an album as Telegram sends it: each part its own message, sharing ``media_group_id``."""
    return fake.message(chat, ALICE, media_group_id=group, photo=_PHOTO, **extra)


async def test_an_album_in_a_private_chat_is_one_question_answered_once(
        tmp_path: Path, fake: FakeBotAPI, make_bot: Any, until: Until) -> None:
    """Three photos sent together got three answers (each part its own message); they are one question now."""
    model = ScriptedModel(lambda r: text("看到了"))
    bot, _ = await make_bot(model, channel=TelegramChannel(settings(tmp_path, fake)), data_dir=tmp_path)
    first = _album_part(fake, PRIVATE, "1357", caption="这几张图里有什么？")
    _album_part(fake, PRIVATE, "1357")
    last = _album_part(fake, PRIVATE, "1357")
    await until(lambda: bool(fake.sent))
    await until(lambda: any(o > last["update_id"] for o in fake.offsets))  # every part confirmed
    await asyncio.sleep(0.3)
    assert [s.text for s in fake.sent] == ["看到了"]
    assert len(model.requests) == 1
    assert model.requests[0].messages[-1]["content"] == "[图片] [图片] [图片] 这几张图里有什么？"
    assert fake.sent[0].reply_to in (None, first["message"]["message_id"])
    rows = await bot.history.recent(ChatRef(platform="telegram", chat_id=str(ALICE), kind="private"), 10)
    assert [r.text for r in rows if not r.from_bot] == ["[图片] [图片] [图片] 这几张图里有什么？"]


async def test_a_group_album_mentioning_the_bot_in_its_caption_addresses_it_as_one_message(
        tmp_path: Path, fake: FakeBotAPI, running: Any, inbox: asyncio.Queue[Message]) -> None:
    caption = "@qun_test_bot 哪张好看？"
    _album_part(fake, GROUP, "9", caption=caption, caption_entities=[mention(caption, "@qun_test_bot")])
    fake.message(GROUP, ALICE, media_group_id="9", video={"file_id": "v", "file_unique_id": "w", "width": 1,
                                                          "height": 1, "duration": 2})
    fake.message(GROUP, ALICE, "另一条")  # not of the album: its own message
    _album_part(fake, GROUP, "10")  # another album
    async with running(TelegramChannel(settings(tmp_path, fake))):
        got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(3)]
        await asyncio.sleep(1.2)
        assert inbox.empty()
    by_text = {m.text: m for m in got}
    assert set(by_text) == {"[图片] [视频] 哪张好看？", "另一条", "[图片]"}
    album = by_text["[图片] [视频] 哪张好看？"]
    assert album.mentions_bot and not by_text["[图片]"].mentions_bot and album.chat.chat_id == "-100500"


@pytest.mark.parametrize(("caption", "expected"), [
    ("/remind 明天9点 交这些表", "/remind 明天9点 交这些表 [图片] [图片]"),  # a /command caption stays one
    ("", "[图片] [图片]"),
])
def test_an_albums_parts_merge_around_its_caption(tmp_path: Path, caption: str, expected: str) -> None:
    from robot.channels.telegram.albums import merged
    from robot.channels.telegram.convert import placeholder

    channel = TelegramChannel(TelegramSettings(enabled=True, token="1:x", state_dir=tmp_path))
    channel.bot_id, channel.username = BOT_ID, "qun_test_bot"
    parts, markers = [], []
    for i, extra in enumerate(({"caption": caption} if caption else {}, {})):
        msg = {"message_id": 20 - i, "date": 1_790_000_000, "chat": PRIVATE, "media_group_id": "5",
               "from": {"id": ALICE, "first_name": "Alice"}, "photo": _PHOTO, **extra}
        message = channel.to_message({"update_id": i, "message": msg})
        assert message is not None
        parts.append(message)
        markers.append(placeholder(msg))
    album = merged(parts, markers)
    assert album.text == expected
    assert album.message_id == f"{ALICE}:19"  # the first part's id (a redelivered album is a duplicate)
