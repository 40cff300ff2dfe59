"""By default a group's reminders due together share one message (``[reminders] merge_chat``): it is
each mentioned person's, and ``/forget me`` by any of them takes it out of the history."""

from __future__ import annotations

from datetime import UTC, datetime

from function_calls import Caller
from robot.message import ChatRef

from .conftest import RigFactory

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
BOB = Caller(platform="memory", user_id="u2", user_name="Bob", chat_id="g1", chat_kind="group")
CAROL = Caller(platform="memory", user_id="u3", user_name="Carol", chat_id="g1", chat_kind="group")
NOW = datetime(2030, 1, 7, 0, 0, tzinfo=UTC)  # 08:00 in Shanghai


async def test_forget_me_by_the_second_person_of_a_shared_reminder_message_removes_it(
        rig_factory: RigFactory) -> None:
    rig = await rig_factory(NOW.replace(day=6, hour=23))  # the default settings
    await rig.add("daily", "08:00", "交周报 PRIVATE-u1")
    await rig.add("daily", "08:00", "私事 PRIVATE-u2", caller=BOB)
    await rig.add("daily", "09:00", "Carol 的另一件事", caller=CAROL)
    await rig.bot.outbox.flush()
    before = len(rig.ch.sent)
    assert await rig.fire(NOW) == 2
    shared = rig.ch.sent[before:]
    assert len(shared) == 1 and set(shared[0].mention) == {"u1", "u2"}  # one send for both people
    assert "PRIVATE-u1" in shared[0].text and "PRIVATE-u2" in shared[0].text
    second = shared[0].mention[1]  # the one the history's to_user does not name
    assert any("PRIVATE" in e.text for e in await rig.bot.history.recent(G1))
    assert await rig.fire(NOW.replace(hour=1)) == 1  # Carol's, alone: her own message

    await rig.ch.inject("/forget me", user=second, chat=G1)
    await rig.ch.wait_sent(before + 3)
    texts = [e.text for e in await rig.bot.history.recent(G1)]
    assert not any("PRIVATE" in t for t in texts)
    assert "⏰ 提醒：Carol 的另一件事" in texts  # not theirs to take
