"""Two bot processes on one PostgreSQL (two Bots, each with its own engine and lease holder id):
one serves the Telegram bot at a time, every outbox row goes out once, and when the holder dies
the other takes the bot over after the lease expires and sends what waited."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from robot.bot import Bot
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.message import ChatRef
from tests.robot.conftest import BotFactory, eventually

BOT_ID = "123456"
ALICE = ChatRef(platform="telegram", chat_id="777", kind="private", account=BOT_ID)


async def process(make_bot: BotFactory, fake: FakeBotAPI, pg_url: str, folder: Path, holder: str) -> Bot:
    tg = TelegramSettings(enabled=True, token=fake.token, api_base=fake.url, poll_timeout_s=1,
                          state_dir=folder / "tg", retry_delay_s=0.05, backoff_max_s=0.1)
    bot, _ = await make_bot(channel=TelegramChannel(tg), plugins=[], data_dir=folder, start=False,
                            storage={"url": pg_url, "lease_s": 3})
    bot.leases.leases.holder = holder  # two "processes" in one test process
    await bot.start()
    return bot


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
        assert await a.outbox.pending() == 0

        # A dies holding the bot: B's rows wait until the lease expires, then B polls and sends them.
        await die(a)
        polls = len(fake.offsets)
        for i in range(10):
            await b.send(ALICE, f"after {i}", key=f"after{i}")
        assert tg_b.served == frozenset() and len(fake.sent) == 20  # nobody holds the bot yet
        await eventually(lambda: tg_b.served == {BOT_ID}, timeout=10)
        await eventually(lambda: len(fake.sent) >= 30, timeout=10)
        await eventually(lambda: len(fake.offsets) > polls, timeout=10)  # B polls now

        counts = sent(fake)
        expected = {f"from {p} {i}" for p in "ab" for i in range(10)} | {f"after {i}" for i in range(10)}
        assert set(counts) == expected and set(counts.values()) == {1}  # all out, none twice
        rows: list[dict[str, Any]] = await b.outbox.rows()
        assert len(rows) == 30 and {r["status"] for r in rows} == {"sent"}
        senders = Counter(str(r["claimed_by"]) for r in rows)
        assert senders == {"proc-a": 20, "proc-b": 10}  # before its death A sent all; B only after
