"""Two bot processes on one PostgreSQL (two Bots, each with its own engine and lease holder id):
one serves the Telegram bot at a time, every outbox row goes out once, and when the holder dies
the other takes the bot over after the lease expires and sends what waited."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from robot.bot import Bot
from robot.channels.base import Channel, ChannelUnavailable, SendReceipt
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.channels.web import WebChannel
from robot.channels.weixin import WeixinAccount, WeixinChannel, WeixinSettings, WeixinState
from robot.channels.weixin.testing import FakeILinkServer
from robot.config import WebSettings
from robot.message import ChatRef, Message, OutgoingMessage
from robot.storage.leases import LeaseKeeper, Leases
from robot.storage.postgres import PostgresDatabase
from robot.testing import MemoryChannel
from tests.robot.conftest import BotFactory, eventually

BOT_ID = "123456"
WX_BOT, BOB = "b0f1@im.bot", "o9cq8bob@im.wechat"
ALICE = ChatRef(platform="telegram", chat_id="777", kind="private", account=BOT_ID)


async def started(make_bot: BotFactory, pg_url: str, folder: Path, holder: str, channel: Channel,
                  prepare: Callable[[Bot], None] = lambda bot: None) -> Bot:
    """A bot "process" on the database with ``channel`` (its own engine and lease holder id, 3 s
    leases), started after ``prepare``."""
    bot, _ = await make_bot(channel=channel, plugins=[], data_dir=folder, start=False,
                            storage={"url": pg_url, "lease_s": 3})
    bot.leases.leases.holder = holder  # several "processes" in one test process
    prepare(bot)
    await bot.start()
    return bot


async def process(make_bot: BotFactory, fake: FakeBotAPI, pg_url: str, folder: Path, holder: str) -> Bot:
    tg = TelegramSettings(enabled=True, token=fake.token, api_base=fake.url, poll_timeout_s=1,
                          state_dir=folder / "tg", retry_delay_s=0.05, backoff_max_s=0.1)
    return await started(make_bot, pg_url, folder, holder, TelegramChannel(tg))


async def die(bot: Bot) -> None:
    """Stop like a killed process: its leases are not given up (they expire), it sends nothing more."""
    keeper = bot.leases
    assert keeper._task is not None
    keeper._task.cancel()
    keeper._task, keeper.held = None, set()
    await bot.stop(flush_timeout_s=0)


def sent(fake: FakeBotAPI) -> Counter[str]:
    return Counter(m.text for m in fake.sent)


async def test_one_process_serves_an_account_and_the_other_takes_over_when_it_dies(
        make_bot: BotFactory, pg_url: str, tmp_path: Path) -> None:
    async with FakeBotAPI(f"{BOT_ID}:TEST-token") as fake:
        a = await process(make_bot, fake, pg_url, tmp_path / "a", "proc-a")
        b = await process(make_bot, fake, pg_url, tmp_path / "b", "proc-b")
        tg_a, tg_b = a.channels["telegram"], b.channels["telegram"]
        assert tg_a.served == {BOT_ID} and tg_b.served == frozenset()  # only A polls
        holders = await b.leases.leases.holders("account:")
        assert holders == {f"account:telegram:{BOT_ID}": "proc-a"}

        # Rows queued by either process leave through A, the holder, each once.
        for i in range(10):
            await b.send(ALICE, f"from b {i}", key=f"b{i}")
            await a.send(ALICE, f"from a {i}", key=f"a{i}")
        await eventually(lambda: len(fake.sent) >= 20, timeout=10)
        assert tg_b.served == frozenset()

        async def all_marked_sent() -> bool:  # the fake has them; A's commit marking them sent may trail
            return await a.outbox.pending() == 0

        await eventually(all_marked_sent, timeout=10)

        # A dies holding the bot: B's rows wait until the lease expires, then B polls and sends them.
        await die(a)
        polls = len(fake.offsets)
        for i in range(10):
            await b.send(ALICE, f"after {i}", key=f"after{i}")
        await eventually(lambda: tg_b.served == {BOT_ID}, timeout=10)
        await eventually(lambda: len(fake.sent) >= 30, timeout=10)
        await eventually(lambda: len(fake.offsets) > polls, timeout=10)  # B polls now

        counts = sent(fake)
        expected = {f"from {p} {i}" for p in "ab" for i in range(10)} | {f"after {i}" for i in range(10)}
        assert set(counts) == expected and set(counts.values()) == {1}  # all out, none twice

        async def b_marked_all() -> bool:  # B's marks may trail the fake's receipt too
            return await b.outbox.pending() == 0

        await eventually(b_marked_all, timeout=10)
        rows: list[dict[str, Any]] = await b.outbox.rows()
        assert len(rows) == 30 and {r["status"] for r in rows} == {"sent"}
        senders = Counter(str(r["claimed_by"]) for r in rows)
        assert senders == {"proc-a": 20, "proc-b": 10}  # before its death A sent all; B only after


async def weixin_process(make_bot: BotFactory, pg_url: str, folder: Path, state: Path, holder: str) -> Bot:
    wx = WeixinSettings(enabled=True, state_dir=state, retry_delay_s=0.05, backoff_max_s=0.1, typing=False)
    return await started(make_bot, pg_url, folder, holder, WeixinChannel(wx, folder))


async def test_a_weixin_account_is_long_polled_by_one_process_and_taken_over_with_its_tokens(
        make_bot: BotFactory, pg_url: str, tmp_path: Path) -> None:
    async with FakeILinkServer(hold_s=0.2) as fake:
        fake.add_bot("wx-token", WX_BOT)

        def ours() -> list[str]:  # the bot's own answers (no model here) aside
            return [m.text for m in fake.sent if m.text in ("one", "two")]

        state = tmp_path / "wx"  # the login file, imported into the database by the first process
        WeixinState(state).save_account_sync(WeixinAccount(bot_id=WX_BOT, bot_token=SecretStr("wx-token"),
                                                           base_url=fake.url, saved_at=datetime.now(UTC)))
        a = await weixin_process(make_bot, pg_url, tmp_path / "a", state, "proc-a")
        (tmp_path / "b").mkdir()  # every process sharing the database has the same secret.key
        shutil.copy2(tmp_path / "a" / "secret.key", tmp_path / "b" / "secret.key")
        b = await weixin_process(make_bot, pg_url, tmp_path / "b", state, "proc-b")
        assert a.channels["weixin"].served == {WX_BOT} and b.channels["weixin"].served == frozenset()
        fake.inject("wx-token", BOB, text="你好")  # only A polls: it learns Bob's context token
        chat = ChatRef(platform="weixin", chat_id=BOB, kind="private", account=WX_BOT)
        await eventually(lambda: has_said(a, chat), timeout=20)
        await b.send(chat, "one", key="one")
        await eventually(lambda: ours() == ["one"], timeout=20)

        async def all_marked_sent() -> bool:  # the fake has it; A's commit marking it sent may trail
            return await a.outbox.pending() == 0

        await eventually(all_marked_sent, timeout=20)  # (killed before it, A's row would go out again)
        await die(a)
        await b.send(chat, "two", key="two")
        await eventually(lambda: b.channels["weixin"].served == {WX_BOT}, timeout=20)
        await eventually(lambda: ours() == ["one", "two"], timeout=20)
        fake.inject("wx-token", BOB, text="还在吗")  # B long-polls now
        await eventually(lambda: has_said(b, chat, "还在吗"), timeout=20)
        assert ours() == ["one", "two"]
        assert Counter(str(r["claimed_by"]) for r in await b.outbox.rows() if r["key"] in ("one", "two")) == {
            "proc-a": 1, "proc-b": 1}


async def has_said(bot: Bot, chat: ChatRef, text: str = "你好") -> bool:
    return any(e.text == text for e in await bot.history.recent(chat, 10))


async def test_a_process_whose_clock_runs_ahead_does_not_take_a_living_process_s_account(pg_url: str) -> None:
    # Leases are written and compared in the database's time: a machine 40 s ahead would otherwise see
    # every other process's lease (15 s) as long expired and poll the same account beside it.
    honest, ahead = PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)
    ahead.local = lambda: datetime.now(UTC) + timedelta(seconds=40)
    a, b = Leases(honest, holder="proc-a"), Leases(ahead, holder="proc-b")
    await honest.open()
    await ahead.open()
    name = f"account:telegram:{BOT_ID}"
    try:
        assert await a.acquire(name)
        assert not await b.acquire(name)  # proc-a renews: its lease is alive
        assert await b.holders("account:") == {name: "proc-a"}
        await a.release([name])
        assert await b.acquire(name) and not await a.acquire(name)  # and the other way round
    finally:
        await honest.close()
        await ahead.close()


async def test_a_clock_stepped_after_start_neither_takes_a_living_process_s_account_nor_gives_its_own_early(
        pg_url: str) -> None:
    # Measured at start (and every five minutes), the skew is right until the machine's clock is set:
    # an NTP step, a VM resumed. The database's time counts on from the last measure by this machine's
    # ticks, which no one sets.
    honest, stepped = PostgresDatabase(pg_url, max_size=2), PostgresDatabase(pg_url, max_size=2)
    off = [0.0]
    stepped.local = lambda: datetime.now(UTC) + timedelta(seconds=off[0])
    a, b = Leases(honest, holder="proc-a"), Leases(stepped, holder="proc-b")
    await honest.open()
    await stepped.open()
    name, other = f"account:telegram:{BOT_ID}", "account:telegram:999"
    try:
        assert await a.acquire(name) and await b.acquire(other)
        off[0] = 40.0  # set 40 s ahead: A's lease (15 s) would look long expired
        assert abs(stepped.now() - datetime.now(UTC)) < timedelta(seconds=1)
        assert not await b.acquire(name)
        off[0] = -40.0  # and back: B's own renewal would be written 40 s early, free for A at once
        assert await b.acquire(other) and not await a.acquire(other)
        assert await a.holders("account:") == {name: "proc-a", other: "proc-b"}
    finally:
        await honest.close()
        await stepped.close()


async def test_a_lost_lease_stops_polling_and_retaking_it_resumes(pg_url: str, tmp_path: Path) -> None:
    db = PostgresDatabase(pg_url, max_size=2)
    keeper = LeaseKeeper(Leases(db, ttl_s=3, holder="proc-a"))
    other = Leases(db, ttl_s=3, holder="proc-b")
    await db.open()
    await keeper.start()
    name = f"account:telegram:{BOT_ID}"
    try:
        async with FakeBotAPI(f"{BOT_ID}:TEST-token") as fake:
            channel = TelegramChannel(TelegramSettings(enabled=True, token=fake.token, api_base=fake.url,
                                                       poll_timeout_s=1, state_dir=tmp_path / "tg"))
            channel.attach_leases(keeper)

            async def sink(message: Message) -> None:
                return None

            channel.bind(sink)
            await channel.start()
            try:
                assert channel.served == {BOT_ID}
                # Another process took it (this one had stalled past the TTL): the next renewal loses it.
                await db.run(lambda tx: tx.execute("UPDATE leases SET holder = 'proc-b' WHERE name = ?", [name]))
                await eventually(lambda: channel.served == frozenset(), timeout=10)
                assert not keeper.holds(name)
                await other.release([name])  # the other one stops cleanly: this one takes the bot back
                await eventually(lambda: channel.served == {BOT_ID}, timeout=10)
                polls = len(fake.offsets)
                await eventually(lambda: len(fake.offsets) > polls, timeout=10)
            finally:
                await channel.stop()
    finally:
        await keeper.stop()
        await db.close()


class PlaygroundLike(MemoryChannel):
    """A channel that keeps what it serves in its process's memory, as the web playground and WeCom do:
    it sends only while it runs (a stopped playground has no page to show a reply on)."""

    one_process = True

    def __init__(self) -> None:
        super().__init__()
        self.running = False
        self.starts = 0

    async def start(self) -> None:
        self.running, self.starts = True, self.starts + 1

    async def stop(self) -> None:
        self.running = False

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        assert self.running, "a stopped one-process channel was asked to send"
        return await super().send(message)


async def one_process_bot(make_bot: BotFactory, pg_url: str, folder: Path, holder: str,
                          channel: Channel | None = None,
                          prepare: Callable[[Bot], None] = lambda bot: None) -> tuple[Bot, Channel]:
    ch = channel or PlaygroundLike()
    return await started(make_bot, pg_url, folder, holder, ch, prepare), ch


async def test_a_one_process_channel_runs_in_one_process_and_another_takes_it_over_when_it_dies(
        make_bot: BotFactory, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    chat = ChatRef(platform="memory", chat_id="g1", kind="group")
    a, a_ch = await one_process_bot(make_bot, pg_url, tmp_path / "a", "proc-a")
    with caplog.at_level(logging.WARNING, logger="robot.channels.one_process"):
        b, b_ch = await one_process_bot(make_bot, pg_url, tmp_path / "b", "proc-b")
    assert isinstance(a_ch, PlaygroundLike) and isinstance(b_ch, PlaygroundLike)
    assert "memory" in a.channels and "memory" not in b.channels  # the second process stands by
    assert a_ch.running and not b_ch.running
    assert "memory: proc-a runs it" in caplog.text and "stands by" in caplog.text
    assert "QUNBOT_CHANNELS__MEMORY__ENABLED=false" in caplog.text
    await b.send(chat, "queued by b", key="b1")  # a reminder fired in b, say: it leaves through a
    await eventually(lambda: [m.text for m in a_ch.sent] == ["queued by b"], timeout=20)

    async def a_marked_it_sent() -> bool:  # the channel has it; A's commit marking it sent may trail
        return await a.outbox.pending() == 0

    await eventually(a_marked_it_sent, timeout=20)  # (killed before it, the row would go out again from b)

    # A dies: what b queues meanwhile waits, and once A's lease expires b runs the channel and sends it.
    await die(a)
    await b.send(chat, "queued while nobody ran it", key="b2")
    await eventually(lambda: "memory" in b.channels, timeout=20)
    assert b_ch.running and b_ch.starts == 1
    await eventually(lambda: [m.text for m in b_ch.sent] == ["queued while nobody ran it"], timeout=20)
    assert [m.text for m in a_ch.sent] == ["queued by b"]
    assert await b.leases.leases.holders("channel:") == {"channel:memory": "proc-b"}

    # B loses the lease (it stalled past the TTL and another process took it): it stops the channel
    # at once, so that two processes never serve it, and its rows wait for the new holder.
    with caplog.at_level(logging.ERROR, logger="robot.channels.one_process"):
        await b.db.run(lambda tx: tx.execute("UPDATE leases SET holder = 'proc-c' WHERE name = 'channel:memory'"))
        await eventually(lambda: "memory" not in b.channels and not b_ch.running, timeout=20)
    assert "lost the channel's lease" in caplog.text
    await b.send(chat, "queued while proc-c held it", key="b3")
    await asyncio.sleep(0.5)
    assert [m.text for m in b_ch.sent] == ["queued while nobody ran it"]
    # proc-c stops cleanly: b takes the channel back and sends what waited, once.
    await b.db.run(lambda tx: tx.execute("DELETE FROM leases WHERE name = 'channel:memory'"))
    await eventually(lambda: b_ch.running and "memory" in b.channels, timeout=20)
    await eventually(lambda: len(b_ch.sent) == 2, timeout=20)
    assert b_ch.starts == 2
    assert [m.text for m in b_ch.sent] == ["queued while nobody ran it", "queued while proc-c held it"]
    await b.stop()
    assert not b_ch.running


@pytest.mark.unrehearsed(reason="waits out a lease (seconds): the first one-process test rehearses the takeover's units")
async def test_the_web_playground_is_taken_over_and_serves_pages_in_its_new_process(
        make_bot: BotFactory, pg_url: str, tmp_path: Path) -> None:
    def playground() -> WebChannel:
        return WebChannel(WebSettings(enabled=True, port=0), bot_name="qunbot")

    a, a_web = await one_process_bot(make_bot, pg_url, tmp_path / "a", "proc-a", playground())
    b, b_web = await one_process_bot(make_bot, pg_url, tmp_path / "b", "proc-b", playground())
    assert isinstance(a_web, WebChannel) and isinstance(b_web, WebChannel)
    assert "web" in a.channels and "web" not in b.channels

    async def chat() -> str:
        async with aiohttp.ClientSession() as http, http.ws_connect(b_web.url + "ws") as page:
            assert (await page.receive_json(timeout=5))["type"] == "welcome"
            await page.send_json({"type": "send", "kind": "private", "user": {"id": "u-alice", "name": "Alice"},
                                  "text": "/help"})
            async with asyncio.timeout(10):
                while (frame := await page.receive_json())["type"] != "reply":
                    pass
            return str(frame["text"])

    await die(a)
    await eventually(lambda: "web" in b.channels, timeout=20)
    assert "/help" in await chat()
    # Lost and taken back: the same playground serves again (a channel that stopped can start again).
    await b.db.run(lambda tx: tx.execute("UPDATE leases SET holder = 'proc-c' WHERE name = 'channel:web'"))
    await eventually(lambda: "web" not in b.channels, timeout=20)
    await b.db.run(lambda tx: tx.execute("DELETE FROM leases WHERE name = 'channel:web'"))
    await eventually(lambda: "web" in b.channels, timeout=20)
    assert "/help" in await chat()
    await b.stop()


@pytest.mark.unrehearsed(reason="waits out a lease (seconds): the first one-process test rehearses the takeover's units")
async def test_a_lease_that_falls_free_while_the_bot_starts_is_taken_once_it_has_started(
        make_bot: BotFactory, pg_url: str, tmp_path: Path) -> None:
    class SlowStart(MemoryChannel):
        async def start(self) -> None:
            await asyncio.sleep(4)  # past the dead holder's lease (3 s): it falls free meanwhile

    a, _ = await one_process_bot(make_bot, pg_url, tmp_path / "a", "proc-a")
    await die(a)

    def add_slow(bot: Bot) -> None:
        bot.channels["slow"] = SlowStart("slow")

    # The channels start one after the other; the takeover must not join them mid-way.
    b, b_ch = await one_process_bot(make_bot, pg_url, tmp_path / "b", "proc-b", prepare=add_slow)
    assert isinstance(b_ch, PlaygroundLike)
    await eventually(lambda: "memory" in b.channels, timeout=20)
    assert b_ch.running and b_ch.starts == 1


@pytest.mark.unrehearsed(reason="waits out a lease (seconds): the first one-process test rehearses the takeover's units")
async def test_a_takeover_that_cannot_start_the_channel_leaves_it_to_the_others_and_asks_again_later(
        make_bot: BotFactory, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class PortTakenOnce(PlaygroundLike):
        async def start(self) -> None:
            if not self.starts:
                self.starts += 1
                raise ChannelUnavailable("web playground cannot listen on 127.0.0.1:8080: address in use")
            await super().start()

    a, _ = await one_process_bot(make_bot, pg_url, tmp_path / "a", "proc-a")

    def soon(bot: Bot) -> None:
        bot.one_process.retry_s = 2.0

    b, b_ch = await one_process_bot(make_bot, pg_url, tmp_path / "b", "proc-b", PortTakenOnce(), prepare=soon)
    assert isinstance(b_ch, PlaygroundLike)
    with caplog.at_level(logging.ERROR, logger="robot.channels.one_process"):
        await die(a)
        await eventually(lambda: "taking the channel over failed" in caplog.text, timeout=20)
    assert "address in use" in caplog.text and "memory" not in b.channels
    # It holds no lease for a channel it does not run: another process could take it meanwhile.
    assert await b.leases.leases.holders("channel:") == {}
    assert "channel:memory" not in b.leases.wanted
    # After retry_s it asks again, and this time the channel starts.
    await eventually(lambda: "memory" in b.channels, timeout=20)
    assert b_ch.running and b_ch.starts == 2
    assert await b.leases.leases.holders("channel:") == {"channel:memory": "proc-b"}


async def test_on_sqlite_the_one_process_runs_every_channel(make_bot: BotFactory, tmp_path: Path) -> None:
    bot, _ = await make_bot(channel=PlaygroundLike(), plugins=[], data_dir=tmp_path / "a")
    assert "memory" in bot.channels and bot.leases.holds("channel:memory")
