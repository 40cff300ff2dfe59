"""Channel state in the database, on SQLite and a real PostgreSQL: the store, sealed credentials,
channels resuming in another process, and the import of the JSON files older versions wrote."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from robot.channels.state_store import ChannelState, ChannelStateError
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.channels.weixin import WeixinAccount, WeixinChannel, WeixinSettings, WeixinState, login
from robot.channels.weixin.testing import FakeILinkServer
from robot.message import ChatRef, Message, OutgoingMessage
from robot.storage import Engine, SQLiteDatabase, open_database
from robot.storage.postgres import PostgresDatabase

Running = Callable[[Any], AbstractAsyncContextManager[Any]]
TOKEN, BOT = "wx-bearer-0123456789abcdef", "b0f1@im.bot"
ALICE, BOB = "o9cq8alice@im.wechat", "o9cq8bob@im.wechat"
PRIVATE = {"id": 777, "type": "private", "first_name": "Alice"}


def another_process(engine: Engine) -> Engine:
    """A new engine on the same database, as a second process (or machine) would open it."""
    if isinstance(engine, PostgresDatabase):
        return PostgresDatabase(engine.url, max_size=2)
    return SQLiteDatabase(engine.where)


async def everything_stored(engine: Engine) -> list[dict[str, Any]]:
    return await engine.run(lambda tx: tx.query("SELECT * FROM channel_state ORDER BY platform, account, key"))


def weixin_settings(state_dir: Path) -> WeixinSettings:
    return WeixinSettings(enabled=True, state_dir=state_dir, retry_delay_s=0.05, backoff_max_s=0.1)


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_values_are_kept_per_platform_account_and_key(engine: Engine, tmp_path: Path) -> None:
    store = ChannelState(engine, tmp_path / "secret.key")
    await engine.open()
    try:
        assert await store.get("telegram", "1", "offset") is None
        await store.put("telegram", "1", "offset", "41")
        await store.put("telegram", "1", "offset", "42")
        await store.put("telegram", "2", "offset", "7")
        assert (await store.get("telegram", "1", "offset"), await store.get("weixin", "1", "offset")) == ("42", None)
        # A key prefix is matched literally: % and _ are not wildcards.
        await store.update("weixin", "b1", {"context:a%": "t1", "context:b_c": "t2", "contextual": "x", "cursor": "c"})
        assert await store.items("weixin", account="b1", prefix="context:") == {
            ("b1", "context:a%"): "t1", ("b1", "context:b_c"): "t2"}
        assert await store.items("weixin", prefix="context:a%") == {("b1", "context:a%"): "t1"}
        # One update writes and deletes together; only_new keeps what is there (an import of old files).
        assert await store.update("weixin", "b1", {"cursor": "c2"}, ["context:a%"]) == 2
        assert await store.update("weixin", "b1", {"cursor": "old", "context:new": "t3"}, only_new=True) == 1
        assert await store.get("weixin", "b1", "cursor") == "c2"
        await store.update("weixin", "b2", {"context:b_c": "t4"})
        assert await store.delete_keys("weixin", ["context:b_c", "context:none"], keep_accounts=["b2"]) == 1
        assert await store.items("weixin", key="context:b_c") == {("b2", "context:b_c"): "t4"}
        assert await store.delete("weixin", "b2", "context:b_c") is True
        assert await store.delete("weixin", "b2", "context:b_c") is False
        assert await store.items("telegram", key="offset") == {("1", "offset"): "42", ("2", "offset"): "7"}
    finally:
        await engine.close()


async def test_a_credential_is_sealed_and_opens_only_with_the_same_secret_key(
        engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    key = tmp_path / "secret.key"
    store = ChannelState(engine, key)
    await engine.open()
    try:
        await store.put("weixin", BOT, "account", json.dumps({"bot_token": TOKEN}), secret=True, durable=True)
        await store.put("weixin", BOT, "cursor", "plain-cursor")
        rows = await everything_stored(engine)
        assert TOKEN not in repr(rows) and base64.b64encode(TOKEN.encode()).decode() not in repr(rows)
        assert [(r["key"], r["secret"]) for r in rows] == [("account", 1), ("cursor", 0)]
        assert json.loads(await store.get("weixin", BOT, "account") or "{}") == {"bot_token": TOKEN}
    finally:
        await engine.close()

    same_key = another_process(engine)  # another process with the install's secret.key copied
    store = ChannelState(same_key, key)
    await same_key.open()
    try:
        assert json.loads(await store.get("weixin", BOT, "account") or "{}") == {"bot_token": TOKEN}
    finally:
        await same_key.close()
    other_key = another_process(engine)  # a process with a secret.key of its own cannot open it
    store = ChannelState(other_key, tmp_path / "other" / "secret.key")
    await other_key.open()
    try:
        with pytest.raises(ChannelStateError, match=r"same secret\.key"):
            await store.get("weixin", BOT, "account")
        caplog.clear()
        assert await store.items("weixin") == {(BOT, "cursor"): "plain-cursor"}  # the rest stays readable
        assert "same secret.key" in caplog.text
    finally:
        await other_key.close()
    assert TOKEN not in caplog.text


async def test_a_restarted_telegram_channel_resumes_at_its_offset_from_the_database(
        engine: Engine, tmp_path: Path, running: Running, inbox: asyncio.Queue[Message]) -> None:
    async with FakeBotAPI("123456:TEST-token") as fake:
        def channel(machine: str) -> TelegramChannel:  # each process has a data folder of its own
            return TelegramChannel(TelegramSettings(enabled=True, token=fake.token, api_base=fake.url, poll_timeout_s=1,
                                                    state_dir=tmp_path / machine, retry_delay_s=0.05))

        first = fake.message(PRIVATE, 777, "一")
        store = ChannelState(engine, tmp_path / "secret.key")
        await engine.open()
        one = channel("one")
        one.attach_state(store)
        async with running(one):
            assert (await asyncio.wait_for(inbox.get(), 5)).text == "一"
            await eventually(lambda: _equals(store.get("telegram", "123456", "offset"), str(first["update_id"] + 1)))
        await engine.close()

        second = fake.message(PRIVATE, 777, "二")
        polls_before = len(fake.offsets)
        engine2 = another_process(engine)
        store2 = ChannelState(engine2, tmp_path / "secret.key")
        await engine2.open()
        try:
            two = channel("two")
            two.attach_state(store2)
            async with running(two):
                assert (await asyncio.wait_for(inbox.get(), 5)).text == "二"
                await eventually(lambda: _equals(store2.get("telegram", "123456", "offset"),
                                                 str(second["update_id"] + 1)))
            assert fake.offsets[polls_before] == first["update_id"] + 1  # resumed, nothing replayed
            assert inbox.empty()
        finally:
            await engine2.close()
        # No state file written: the offset lives in the database (each update passed through the spool, now empty).
        assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("qunbot.sqlite3")]


async def _equals(value: Any, expected: object) -> bool:
    return bool(await value == expected)


async def test_a_weixin_account_logged_in_by_one_process_is_served_by_another(
        engine: Engine, tmp_path: Path, running: Running, inbox: asyncio.Queue[Message],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeILinkServer(hold_s=0.2) as fake:
        fake.add_bot(TOKEN, BOT)
        fake.qr_script = [{"status": "scaned"},
                          {"status": "confirmed", "bot_token": TOKEN, "ilink_bot_id": BOT, "baseurl": fake.url}]
        # Process one: `qunbot login weixin` on one machine.
        store = ChannelState(engine, tmp_path / "secret.key")
        await engine.open()
        state = WeixinState(tmp_path / "one" / "weixin")
        state.attach(store)
        out = io.StringIO()
        assert await login(WeixinSettings(api_base=fake.url), state, out=out, poll_interval_s=0) is not None
        rows = await everything_stored(engine)
        await engine.close()
        assert [(r["platform"], r["account"], r["key"]) for r in rows] == [("weixin", BOT, "account")]
        assert TOKEN not in repr(rows)  # sealed: a dump of the database does not give the token away

        # Process two: new objects, the same database and secret.key, another data folder.
        fake.inject(TOKEN, ALICE, text="你好")
        engine2 = another_process(engine)
        store2 = ChannelState(engine2, tmp_path / "secret.key")
        await engine2.open()
        try:
            channel = WeixinChannel(weixin_settings(tmp_path / "two" / "weixin"))
            channel.attach_state(store2)
            async with running(channel):
                message = await asyncio.wait_for(inbox.get(), 5)
                assert (message.text, message.chat.account) == ("你好", BOT)
                await channel.send(OutgoingMessage(key="r1", chat=message.chat, text="收到"))
            assert [s.text for s in fake.sent] == ["收到"]
            assert (await store2.items("weixin", account=BOT, prefix="context:")).keys() == {(BOT, f"context:{ALICE}")}
        finally:
            await engine2.close()
    assert "已保存到 数据库" in out.getvalue() and TOKEN not in out.getvalue() and TOKEN not in caplog.text


async def test_an_upgrade_imports_the_old_files_and_loses_no_login_cursor_or_token(
        engine: Engine, tmp_path: Path, running: Running, inbox: asyncio.Queue[Message]) -> None:
    async with FakeILinkServer(hold_s=0.2) as fake, FakeBotAPI("123456:TEST-token") as tg:
        fake.add_bot(TOKEN, BOT)
        from_bob = fake.inject(TOKEN, BOB, text="早")
        seen = fake.inject(TOKEN, ALICE, text="已读过")
        # What an older qunbot left on disk, in its own format.
        old = WeixinState(tmp_path / "weixin")
        old.save_account_sync(WeixinAccount(bot_id=BOT, bot_token=SecretStr(TOKEN), base_url=fake.url,
                                            saved_at=datetime.now(UTC)))
        await old.save_cursor(BOT, base64.b64encode(str(seen["seq"]).encode()).decode())
        await old.save_context_tokens(BOT, {BOB: str(from_bob["context_token"])})
        tg_dir = tmp_path / "telegram"
        tg_dir.mkdir()
        (tg_dir / "123456-offset.json").write_text(json.dumps({"offset": 500}))
        (tg_dir / "123456-migrated.json").write_text(json.dumps({"-4001": "-1004001"}))
        fake.inject(TOKEN, ALICE, text="新消息")

        store = ChannelState(engine, tmp_path / "secret.key")
        await engine.open()
        try:
            wx = WeixinChannel(weixin_settings(tmp_path / "weixin"))
            telegram = TelegramChannel(TelegramSettings(enabled=True, token=tg.token, api_base=tg.url,
                                                        poll_timeout_s=1, state_dir=tg_dir))
            for channel in (wx, telegram):
                channel.attach_state(store)
            async with running(wx), running(telegram):
                assert (await asyncio.wait_for(inbox.get(), 5)).text == "新消息"  # the cursor came along
                await wx.send(OutgoingMessage(key="r1", text="早上好", chat=ChatRef(
                    platform="weixin", chat_id=BOB, kind="private", account=BOT)))  # so did Bob's token
                await eventually(lambda: _true(bool(tg.offsets)))
                assert tg.offsets[0] == 500 and telegram.migrated == {"-4001": "-1004001"}
            assert [(s.to_user_id, s.text) for s in fake.sent] == [(BOB, "早上好")] and inbox.empty()
            rows = await everything_stored(engine)
            assert {(r["platform"], r["key"]) for r in rows} >= {
                ("weixin", "account"), ("weixin", "cursor"), ("weixin", f"context:{BOB}"),
                ("telegram", "offset"), ("telegram", "migrated:-4001")}
            assert TOKEN not in repr(rows)
        finally:
            await engine.close()
    left = sorted(p.name for p in [*(tmp_path / "weixin" / "accounts").iterdir(), *tg_dir.iterdir()])
    assert left == sorted(["123456-migrated.json.imported", "123456-offset.json.imported",
                           f"{BOT}.json.imported", f"{BOT}.sync.json.imported", f"{BOT}.context.json.imported"])


async def _true(value: bool) -> bool:
    return value


async def test_qunbot_login_weixin_stores_the_account_where_the_bot_finds_it(
        engine: Engine, tmp_path: Path, make_bot: Any, running: Running, inbox: asyncio.Queue[Message]) -> None:
    from robot.cli import _login_weixin
    from robot.config import Settings

    url = engine.url if isinstance(engine, PostgresDatabase) else ""  # SQLite: the file in the data folder
    async with FakeILinkServer(hold_s=0.2) as fake:
        fake.add_bot(TOKEN, BOT)
        fake.qr_script = [{"status": "confirmed", "bot_token": TOKEN, "ilink_bot_id": BOT, "baseurl": fake.url}]
        settings = Settings(bot={"data_dir": tmp_path}, storage={"url": url},
                            channels={"weixin": {"enabled": True, "api_base": fake.url}})
        assert await _login_weixin(settings) == 0
        fake.inject(TOKEN, ALICE, text="/help")
        if url:  # the other stores are not on PostgreSQL yet: the channel as the bot wires it
            db = open_database(url, tmp_path)
            store = ChannelState(db, tmp_path / "secret.key")
            await db.open()
            try:
                channel = WeixinChannel(weixin_settings(tmp_path / "weixin"))
                channel.attach_state(store)
                async with running(channel):
                    assert (await asyncio.wait_for(inbox.get(), 5)).text == "/help"
            finally:
                await db.close()
            return
        bot, channel = await make_bot(channel=WeixinChannel(weixin_settings(tmp_path / "weixin")), data_dir=tmp_path)
        await eventually(lambda: _true(bool(fake.sent)))  # served: the /help answer went out
        assert channel.accounts.keys() == {BOT} and fake.sent[0].to_user_id == ALICE
        await bot.stop()
