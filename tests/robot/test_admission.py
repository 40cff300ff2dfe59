"""When incoming messages start: a bounded number at once, and a burst of sends (reminders) first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from function_calls import ModelRequest
from function_calls.testing import ScriptedModel, text
from robot.admission import CLEAR, CROWD, Admission, Crowd
from robot.channels.base import NotTaken, SendReceipt
from robot.message import ChatRef, OutgoingMessage
from robot.privacy import ForgetRequest
from robot.storage.postgres import PostgresDatabase
from robot.testing import MemoryChannel
from tests.robot.conftest import eventually

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")


def burst(count: int) -> list[OutgoingMessage]:
    """One message to each of ``count`` chats, as a reminder burst queues them."""
    return [OutgoingMessage(key=f"burst-{i}", chat=ChatRef(platform="memory", chat_id=f"b{i}", kind="group"),
                            text=f"提醒 {i}") for i in range(count)]


class PacedChannel(MemoryChannel):
    """Each send takes 10 ms (a burst of 128 chats lasts about 0.3 s); while ``stuck``, the burst's
    sends never finish (a platform that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: dict[str, float] = {}
        self.stuck = False

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if self.stuck and message.text.startswith("提醒"):
            await asyncio.Event().wait()
        await asyncio.sleep(0.01)
        self.sent_at[message.text] = time.monotonic()
        return await super().send(message)


def timed_model(started: list[float]) -> ScriptedModel:
    async def answer(request: ModelRequest) -> Any:
        started.append(time.monotonic())
        return text("好的")

    return ScriptedModel(answer)


async def test_a_burst_of_sends_goes_out_before_messages_arriving_meanwhile_start(make_bot: Any) -> None:
    started: list[float] = []
    bot, channel = await make_bot(timed_model(started), channel=PacedChannel(), outbox={"burst_priority_s": 10})
    rows = burst(CROWD * 2)
    await bot.outbox.enqueue(*rows)
    await eventually(lambda: bot.outbox.crowd.holding)  # the burst's lanes are open
    asked = [asyncio.create_task(channel.inject(f"问题 {i}", chat=G1, at_bot=True, user=f"u{i}")) for i in range(5)]
    await eventually(lambda: len(started) == 5, timeout=20)
    await asyncio.gather(*asked)
    out_before = sum(channel.sent_at.get(m.text, float("inf")) < min(started) for m in rows)
    # The burst had gone out (but for the last few chats) when the first message started. Without the
    # priority, each message reached the model at once, in the middle of the burst.
    assert out_before >= len(rows) - CLEAR


async def test_a_burst_that_does_not_go_out_holds_new_messages_for_its_window_once(make_bot: Any) -> None:
    started: list[float] = []
    channel = PacedChannel()
    channel.stuck = True  # the platform takes the burst's sends and never answers
    bot, _ = await make_bot(timed_model(started), channel=channel, outbox={"burst_priority_s": 0.3})
    await bot.outbox.enqueue(*burst(CROWD * 2))
    await eventually(lambda: bot.outbox.crowd.holding)
    await channel.inject("第一个问题", chat=G1, at_bot=True, user="u1")  # waits out the window, then starts
    assert len(started) == 1
    # The backlog still stands (every send hangs), and grew by the reply's chat; but it had its window:
    # the next message starts at once.
    await eventually(lambda: bot.outbox.crowd._lanes.get("memory") == CROWD * 2 + 1)
    assert not bot.outbox.crowd.holding
    await channel.inject("第二个问题", chat=G1, at_bot=True, user="u2")
    assert len(started) == 2 and not channel.sent_at


async def test_a_burst_gets_no_priority_when_it_is_turned_off(make_bot: Any) -> None:
    started: list[float] = []
    channel = PacedChannel()
    channel.stuck = True
    bot, _ = await make_bot(timed_model(started), channel=channel, outbox={"burst_priority_s": 0})
    await bot.outbox.enqueue(*burst(CROWD * 2))
    await eventually(lambda: bot.outbox.crowd._lanes.get("memory", 0) > CROWD)
    assert not bot.outbox.crowd.holding
    async with asyncio.timeout(5):
        await channel.inject("问题", chat=G1, at_bot=True)
    assert len(started) == 1


async def test_on_postgresql_the_units_of_running_messages_wait_out_a_bursts_window(pg_url: str) -> None:
    # Messages already running when a burst begins: their units wait, the burst's (urgent) go on.
    db = PostgresDatabase(pg_url, max_size=2)
    await db.open()
    try:
        crowd = Crowd(30, hold=db.hold_ordinary)
        crowd.sending("memory", CROWD + 1)
        ordinary = asyncio.ensure_future(db.run(lambda tx: tx.execute("SELECT 1").fetchone()))
        assert await db.run(lambda tx: tx.execute("SELECT 2").fetchone(), urgent=True) == (2,)
        await asyncio.sleep(0.05)
        assert not ordinary.done()
        assert db.stalled_s() == 0.0  # held, not stalled: the leases must not take it for a dead database
        crowd.sending("memory", CLEAR)  # the burst has gone out
        assert await asyncio.wait_for(ordinary, 5) == (1,)
    finally:
        await db.close()


async def test_at_most_so_many_messages_start_together_and_each_keeps_its_place_for_a_while() -> None:
    admission = Admission(2, Crowd(0), hold_s=30)
    release = asyncio.Event()
    began: list[str] = []

    async def handle(name: str) -> None:
        async with admission.turn():
            began.append(name)
            if name != "c":
                await release.wait()

    tasks = [asyncio.create_task(handle(name)) for name in "abc"]
    await eventually(lambda: began == ["a", "b"])
    await asyncio.sleep(0.05)
    assert began == ["a", "b"]  # c waits for a place
    release.set()
    await asyncio.gather(*tasks)
    assert began == ["a", "b", "c"]


async def test_a_message_that_waits_long_gives_its_place_up() -> None:
    # One waiting on a slow model or on a person's answer: the answer must still get in.
    admission = Admission(1, Crowd(0), hold_s=0.05)
    forever = asyncio.Event()
    began: list[str] = []

    async def handle(name: str, wait: bool) -> None:
        async with admission.turn():
            began.append(name)
            if wait:
                await forever.wait()

    slow = asyncio.create_task(handle("slow", True))
    await eventually(lambda: began == ["slow"])
    await asyncio.wait_for(handle("next", False), 5)
    await asyncio.wait_for(handle("after", False), 5)  # the given-up place is not given back twice
    assert began == ["slow", "next", "after"]
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)
    assert admission._slots._value == 1  # the slow one's exit released nothing more than it held


async def test_messages_still_waiting_for_their_turn_when_the_bot_stops_do_not_start(make_bot: Any) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def answer(request: ModelRequest) -> Any:
        started.append(str(request.messages[-1]["content"]))
        await release.wait()
        return text("好的")

    bot, channel = await make_bot(ScriptedModel(answer), limits={"user_burst": 1000, "chat_burst": 1000,
                                                                  "messages_at_once": 1})
    first = asyncio.create_task(channel.inject("第一个", chat=G1, at_bot=True))
    await eventually(lambda: len(started) == 1)
    second = asyncio.create_task(channel.inject("第二个", chat=G1, at_bot=True))
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(bot.stop(flush_timeout_s=0.2))
    await asyncio.sleep(1.2)  # the first one gives its place up after 1 s: but for the stop, the second would start
    late = await asyncio.gather(channel.inject("停机中", chat=G1, at_bot=True), return_exceptions=True)
    release.set()
    results = await asyncio.gather(first, second, stopping, return_exceptions=True)
    assert started == ["第一个"] and bot.pipeline.admission.turned_away == 2
    # The channel learns that neither was taken: it leaves them to the platform's redelivery
    # (no poll cursor past them, no "success" to a callback) instead of acknowledging them.
    assert isinstance(results[1], NotTaken) and isinstance(late[0], NotTaken)
    assert not isinstance(results[0], BaseException)


async def test_messages_turned_away_as_the_bot_stopped_are_answered_at_its_next_start(
        make_bot: Any, tmp_path: Any) -> None:
    # OneBot's sockets, a WeCom callback answered "success", the web page: nothing sends them again.
    release, started = asyncio.Event(), []

    async def answer(request: ModelRequest) -> Any:
        started.append(str(request.messages[-1]["content"]))
        if started == ["第一个"]:
            await release.wait()
        return text("好的：" + started[-1])

    bot, channel = await make_bot(ScriptedModel(answer), limits={"user_burst": 1000, "chat_burst": 1000,
                                                                  "messages_at_once": 1})
    first = asyncio.create_task(channel.inject("第一个", chat=G1, at_bot=True))
    await eventually(lambda: len(started) == 1)
    stopping = asyncio.create_task(bot.stop(flush_timeout_s=0.2))
    await eventually(lambda: bot.pipeline.admission.closed)
    late = await asyncio.gather(channel.inject("停机中", chat=G1, at_bot=True, user="u2"),
                                channel.inject("我的秘密", chat=G1, at_bot=True, user="u3"), return_exceptions=True)
    assert all(isinstance(r, NotTaken) for r in late)
    release.set()
    await asyncio.gather(first, stopping)
    again, channel2 = await make_bot(ScriptedModel(answer), limits={"user_burst": 1000, "chat_burst": 1000},
                                     start=False)
    await again.db.open()  # u3 said /forget me (in another process) before this one started: theirs goes too
    assert await again.parked.forget(ForgetRequest("memory", "u3", (G1,))) == 1
    await again.db.close()
    await again.start()
    await eventually(lambda: "好的：停机中" in [m.text for m in channel2.sent])
    assert "我的秘密" not in started
    assert {"停机中", "好的：停机中"} <= {e.text for e in await again.history.recent(G1)}
    await eventually(lambda: again.db.run(lambda db: not db.execute("SELECT * FROM parked_messages").fetchall()))


_UPDATES = st.lists(st.one_of(st.tuples(st.sampled_from(["memory", "telegram", "wecom"]), st.integers(0, 150)),
                              st.just(("wait", 0))), max_size=25)


@settings(max_examples=150, deadline=None)
@given(_UPDATES)
def test_a_burst_window_opens_once_per_burst_and_closes_when_it_clears_or_expires(updates: list[tuple[str, int]]) -> None:
    # Whatever the outbox reports, in whatever order: new messages wait only while a burst that
    # crossed CROWD has not yet come down to CLEAR, and each burst holds them back once.
    async def check() -> None:
        crowd = Crowd(0.002)
        lanes: dict[str, int] = {}
        spent = holding = False
        for platform, chats in updates:
            if platform == "wait":  # past the window
                await asyncio.sleep(0.004)
                holding = False
            else:
                crowd.sending(platform, chats)
                lanes[platform] = chats
                total = sum(lanes.values())
                if total <= CLEAR:
                    spent = holding = False
                elif total > CROWD and not spent:
                    spent = holding = True
            assert crowd.holding == holding, (platform, chats, lanes)
            if holding:
                assert sum(lanes.values()) > CLEAR
        async with asyncio.timeout(1):
            await crowd.wait()  # never for longer than the window

    asyncio.run(check())


async def test_a_kept_message_this_version_cannot_read_holds_up_none_of_the_others(make_bot: Any) -> None:
    bot, channel = await make_bot(ScriptedModel(lambda r: text("好的：" + str(r.messages[-1]["content"]))),
                                  start=False)
    await bot.db.open()
    from datetime import UTC, datetime

    from robot.message import Message, Sender

    for i in range(2):
        await bot.parked.park(Message(chat=G1, sender=Sender(user_id=f"u{i}"), message_id=f"m{i}", text=f"问题{i}",
                                      timestamp=datetime.now(UTC), mentions_bot=True))
    await bot.db.run(lambda db: db.execute(
        "INSERT INTO parked_messages (platform, message_id, chat, user_id, body, parked_at) VALUES "
        "('memory', 'm9', 'memory:group:g1', 'u9', '{\"chat\": 1}', ?)", [datetime.now(UTC).isoformat()]))
    await bot.db.close()
    await bot.start()
    await eventually(lambda: sorted(m.text for m in channel.sent) == ["好的：问题0", "好的：问题1"])
    left = await bot.db.run(lambda db: [r[0] for r in db.execute("SELECT message_id FROM parked_messages")])
    assert left == ["m9"]


async def test_a_message_another_process_kept_as_it_stopped_is_answered_by_one_still_running(make_bot: Any) -> None:
    # A rolling restart or a scale-down: nobody starts, and the kept message waited a day to be dropped.
    from datetime import UTC, datetime

    from robot.message import Message, Sender

    bot, channel = await make_bot(ScriptedModel(lambda r: text("好的：" + str(r.messages[-1]["content"]))),
                                  start=False)
    bot.parked.every_s = 0.1
    await bot.start()
    await bot.parked.park(Message(chat=G1, sender=Sender(user_id="u7"), message_id="elsewhere-1", text="还在吗",
                                  timestamp=datetime.now(UTC), mentions_bot=True))  # as the other process did
    await eventually(lambda: [m.text for m in channel.sent] == ["好的：还在吗"])
