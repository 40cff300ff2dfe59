"""Issue #15 features: named periods, one member, opt-out, the per-user cool-down, the owner's prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import summary
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.config import Settings
from robot.message import ChatRef
from robot.testing import MemoryChannel
from summary.window import parse_period

SH = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)  # Monday 12:00 in Shanghai
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def sh(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=SH)


@asynccontextmanager
async def running(tmp_path: Path, model: Any = None, clock: Clock | None = None,
                  **summary_cfg: Any) -> AsyncIterator[tuple[Bot, MemoryChannel]]:
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path, "timezone": "Asia/Shanghai"},
                        limits={"user_burst": 50, "chat_burst": 50}, summary=summary_cfg)
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin], clock=clock or Clock())
    await bot.start()
    try:
        yield bot, ch
    finally:
        await bot.stop()


def model_lines(model: ScriptedModel) -> list[str]:
    out: list[str] = []
    for request in model.requests:
        if not request.tools:
            body = str(request.messages[-1]["content"])
            out += [line.split("] ", 1)[1] for line in body.splitlines() if line.startswith("[")]
    return out


def summariser() -> ScriptedModel:
    return ScriptedModel(lambda r: text("模型总结"))


# -- periods -------------------------------------------------------------------------------------
def test_named_periods_are_days_and_ranges_in_the_chat_zone() -> None:
    yesterday = parse_period("昨天", NOW, SH)
    assert (yesterday.start, yesterday.end) == (sh(22, 0), sh(23, 0)) and yesterday.title == "昨天（11-22 周日）"
    day = parse_period("2026-11-20", NOW, SH)
    assert (day.start, day.end) == (sh(20, 0), sh(21, 0)) and "2026-11-20" in day.title
    assert parse_period("11月20日", NOW, SH).start == sh(20, 0)
    assert parse_period("12-25", NOW, SH).start == datetime(2025, 12, 25, tzinfo=SH)  # not in the future
    morning = parse_period("09:00-12:00", NOW, SH)
    assert (morning.start, morning.end) == (sh(23, 9), sh(23, 12)) and morning.title == "今天 09:00-12:00"
    span = parse_period("昨天 21:30～24:00", NOW, SH)
    assert (span.start, span.end) == (sh(22, 21, 30), sh(23, 0))
    for bad, why in (("12:00-09:00", "早于"), ("2026-02-30", "没有这一天"), ("下辈子", "看不懂"), ("25:00-26:00", "不对"),
                     ("2026-11-24", "还没到"), ("2027-01-01", "还没到"), ("13:00-14:00", "还没到"),
                     ("0001-01-01", "太早了")):  # (it overflowed: "执行失败了，请稍后再试")
        with pytest.raises(ValueError, match=why):
            parse_period(bad, NOW, SH)
    with pytest.raises(ValueError, match="去年没有这一天"):  # asked in January 2028: the English "day is out of range"
        parse_period("02-29", datetime(2028, 1, 10, tzinfo=SH), SH)
    assert parse_period("11:00-13:00", NOW, SH).end == sh(23, 13)  # under way: what has been said so far


def test_a_date_written_with_a_dot_is_a_date_and_a_number_of_hours_stays_hours() -> None:
    """"/summary 11.20" is November 20th (it read as the last 11.2 hours); "/summary 1.5" is 1.5 hours."""
    from summary.tools import SummaryArgs

    assert SummaryArgs(period="11.20").period == "11.20" and SummaryArgs(period="11.20").hours is None
    assert parse_period("11.20", NOW, SH).start == sh(20, 0)
    assert SummaryArgs(period="1.5").hours == 1.5 and SummaryArgs(period="3").hours == 3


async def test_summary_of_yesterday_a_date_and_a_morning_by_command(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model, user_cooldown_s=0) as (_bot, ch):
        await ch.inject("上周五的消息", user="1", at=sh(20, 15))
        await ch.inject("昨天晚上的消息", user="2", at=sh(22, 21))
        await ch.inject("今天早上的消息", user="3", at=sh(23, 9, 30))
        await ch.inject("今天中午的消息", user="4", at=sh(23, 11, 55))
        for command, expected in (("/summary 昨天", ["2(2): 昨天晚上的消息"]),
                                  ("/summary 2026-11-20", ["1(1): 上周五的消息"]),
                                  ("/summary 09:00-11:00", ["3(3): 今天早上的消息"]),
                                  ("/summary 3", ["3(3): 今天早上的消息", "4(4): 今天中午的消息"])):
            model.requests.clear()
            sent = len(ch.sent)
            await ch.inject(command, user="9", at=NOW)
            replies = await ch.wait_sent(sent + 1)
            assert model_lines(model) == expected, command
        assert replies[1].text.startswith("【群聊总结】2026-11-20（11-20 周五）")
        await ch.inject("/summary 12:00-09:00", user="9", at=NOW)
        refused = await ch.wait_sent(len(ch.sent) + 1)
    assert "结束早于开始" in refused[-1].text


async def test_a_late_handled_summary_reads_its_period_from_when_it_was_said(tmp_path: Path) -> None:
    """"/summary 今天" said at 23:55 and handled at 00:10 (kept while the bot was down) means the day it was
    said, as "/remind 明天8点" counts from then: typed or asked of the model alike."""
    said, clock = sh(23, 23, 55), Clock()
    clock.now = said + timedelta(minutes=15)
    model = ScriptedModel(lambda r: call("summary", {"period": "今天"}) if r.tools else text("模型总结"))
    async with running(tmp_path, model, clock, user_cooldown_s=0) as (_bot, ch):
        await ch.inject("周一晚上的消息", user="1", at=sh(23, 21))
        for typed in ("/summary 今天", "总结一下今天"):
            model.requests.clear()
            n = len(ch.sent)
            await ch.inject(typed, user="9", at=said, at_bot=True)
            reply = (await ch.wait_sent(n + 1))[n].text
            assert reply.startswith("【群聊总结】今天（11-23 周一）"), (typed, reply)
            assert model_lines(model) == ["1(1): 周一晚上的消息"], typed
        n = len(ch.sent)  # a time from the future (a platform's wrong clock) is no anchor: now is
        await ch.inject("/summary 今天", user="9", at=clock.now + timedelta(hours=2))
        assert (await ch.wait_sent(n + 1))[n].text.startswith("【群聊总结】今天（11-24 周二）")


async def test_when_a_message_was_said_is_read_on_both_engines_within_a_day(engine: Any) -> None:
    from robot.history import HistoryStore
    from summary.window import said_at

    history = HistoryStore(engine)
    await engine.open()
    try:
        for mid, user, at in (("m1", "9", NOW - timedelta(minutes=15)), ("m2", "9", NOW - timedelta(days=2)),
                              ("m3", "9", NOW + timedelta(hours=1))):
            await engine.transaction(lambda db, m=mid, u=user, t=at: history.insert_sync(
                db, G2, u, "九", "/summary 今天", t, message_id=m))
        assert await said_at(engine, G2, "m1", "9", NOW) == NOW - timedelta(minutes=15)
        for mid, user in (("m1", "8"), ("m2", "9"), ("m3", "9"), ("", "9"), ("nope", "9")):  # not theirs, too old,
            assert await said_at(engine, G2, mid, user, NOW) == NOW, (mid, user)  # from the future, none: now
    finally:
        await engine.close()


# -- one member ----------------------------------------------------------------------------------
async def test_summarise_one_member_by_their_name(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: call("summary", {"member": "@小明"}) if r.tools else text("小明的总结"))
    async with running(tmp_path, model) as (_bot, ch):
        await ch.inject("我来订场地", user="1", name="小明", at=NOW - timedelta(minutes=9))
        await ch.inject("我不去了", user="2", name="小红", at=NOW - timedelta(minutes=8))
        await ch.inject("场地订好了，二号场", user="1", name="小明", at=NOW - timedelta(minutes=7))
        await ch.inject("总结 @小明", user="2", name="小红", at=NOW - timedelta(minutes=1), at_bot=True)
        sent = await ch.wait_sent(1)
        assert model_lines(model) == ["小明(1): 我来订场地", "小明(1): 场地订好了，二号场"]
        assert "小明 的发言" in sent[0].text.splitlines()[0]
        await ch.inject("/summary @小刚", user="2", at=NOW)
        missing = await ch.wait_sent(2)
    assert "没有找到「小刚」的发言" in missing[1].text


def test_a_member_and_a_period_typed_together_are_told_apart() -> None:
    """"/summary @小明 昨天" looked for a member called "小明 昨天"; "/summary 昨天 @小明" was a bad period."""
    from summary.tools import SummaryArgs

    for typed, member, period in (("@小明 昨天", "@小明", "昨天"), ("昨天 @小明", "@小明", "昨天"),
                                  ("@小明 昨天 09:00-12:00", "@小明", "昨天 09:00-12:00"),
                                  ("11-20 @小明", "@小明", "11-20"), ("＠小明 09:00-12:00", "＠小明", "09:00-12:00"),
                                  ("@John Smith", "@John Smith", None), ("@小明", "@小明", None),
                                  ("@今天", "@今天", None)):
        args = SummaryArgs(period=typed)
        assert (args.member, args.period) == (member, period), typed
    assert (SummaryArgs(period="3 @小明").hours, SummaryArgs(period="3 @小明").member) == (3, "@小明")


async def test_one_members_words_of_a_named_day_by_command(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("明天下午三点开会，我来订会议室", user="1", name="小明", at=sh(22, 20))
        await ch.inject("好的", user="2", name="小红", at=sh(22, 20, 1))
        await ch.inject("今天的话", user="1", name="小明", at=sh(23, 9))
        for n, typed in enumerate(("/summary @小明 昨天", "/summary 昨天 @小明")):
            await ch.inject(typed, user="3", at=NOW)
            reply = (await ch.wait_sent(n + 1))[n].text
            assert reply.startswith("【群聊总结】昨天（11-22 周日） · 小明 的发言"), typed
            assert "订会议室" in reply and "今天的话" not in reply and "好的" not in reply, typed


# -- opt-out ---------------------------------------------------------------------------------------
async def test_a_member_who_opts_out_is_neither_quoted_nor_sent_to_the_model(tmp_path: Path) -> None:
    model = summariser()
    async with running(tmp_path, model, user_cooldown_s=0) as (_bot, ch):
        await ch.inject("/summary optout", user="2", name="小红", at=NOW - timedelta(minutes=70))
        await ch.inject("结论：周六去爬山", user="1", name="小明", at=NOW - timedelta(minutes=9))
        await ch.inject("我的私事：明天去医院复查", user="2", name="小红", at=NOW - timedelta(minutes=8))
        await ch.inject("/summary hours=1", user="1", at=NOW)
        sent = await ch.wait_sent(2)
        assert "不会引用你的消息" in sent[0].text
        # (the bot's own replies to commands are another issue's: only members' lines are checked)
        assert [line for line in model_lines(model) if "[机器人]" not in line] == ["小明(1): 结论：周六去爬山"]
        assert all("医院" not in str(r.messages) for r in model.requests)
        await ch.inject("/summary @小红 hours=1", user="1", at=NOW)
        refused = await ch.wait_sent(3)
        assert "选择了不被总结" in refused[2].text
        await ch.inject("/summary optin", user="2", at=NOW)
        model.requests.clear()
        await ch.inject("/summary hours=1", user="1", at=NOW)
        await ch.wait_sent(5)
    assert "小红(2): 我的私事：明天去医院复查" in model_lines(model)


async def test_opting_out_also_keeps_messages_out_of_the_extractive_summary(tmp_path: Path) -> None:
    async with running(tmp_path) as (_bot, ch):
        await ch.inject("/summary optout", user="2", at=NOW - timedelta(minutes=70))
        await ch.inject("决定：周五发版本", user="2", at=NOW - timedelta(minutes=9))
        await ch.inject("我来写测试用例", user="1", at=NOW - timedelta(minutes=8))
        await ch.inject("/summary hours=1", user="1", at=NOW)
        sent = await ch.wait_sent(2)
    assert "周五发版本" not in sent[1].text and "我来写测试用例" in sent[1].text


FORUM = ChatRef(platform="memory", chat_id="-100900", kind="group")  # a Telegram forum group (its General)
TOPIC_42 = ChatRef(platform="memory", chat_id="-100900/42", kind="group")
TOPIC_7 = ChatRef(platform="memory", chat_id="-100900/7", kind="group")


async def test_opting_out_in_a_forum_group_or_one_of_its_topics_covers_all_its_topics(tmp_path: Path) -> None:
    """"/summary optout" said "本群" but held in one topic only: the member's words went to the model from
    the others."""
    model = summariser()
    async with running(tmp_path, model, user_cooldown_s=0) as (_bot, ch):
        await ch.inject("/summary optout", user="2", chat=FORUM, at=NOW - timedelta(minutes=70))
        await ch.inject("/summary optout", user="3", chat=TOPIC_42, at=NOW - timedelta(minutes=70))
        for chat in (FORUM, TOPIC_42, TOPIC_7):
            await ch.inject("我家住幸福路 8 号", user="2", name="小红", chat=chat, at=NOW - timedelta(minutes=9))
            await ch.inject("我的私事", user="3", name="小刚", chat=chat, at=NOW - timedelta(minutes=8))
            await ch.inject("明天开会", user="1", name="小明", chat=chat, at=NOW - timedelta(minutes=7))
            model.requests.clear()
            await ch.inject("/summary hours=1", user="1", chat=chat, at=NOW)
            assert model_lines(model) == ["小明(1): 明天开会"], chat
        await ch.inject("/summary optin", user="3", chat=TOPIC_7, at=NOW)  # back in, in the whole group
        model.requests.clear()
        await ch.inject("/summary hours=1", user="1", chat=TOPIC_42, at=NOW)
    assert "小刚(3): 我的私事" in model_lines(model) and "小红(2): 我家住幸福路 8 号" not in model_lines(model)


async def test_an_opt_out_stored_for_one_topic_before_covers_its_whole_group(tmp_path: Path) -> None:
    """Rows stored per topic (before opt-outs were the group's) keep a member out of every topic, and
    "/summary optin" anywhere in the group removes them."""
    from summary.window import OPTOUT_TABLE, opted_out

    async with running(tmp_path) as (bot, ch):
        await bot.db.run(lambda db: db.execute(f"INSERT INTO {OPTOUT_TABLE} (chat, user_id) VALUES (?, ?)",
                                               [TOPIC_42.key, "2"]))
        other = ChatRef(platform="memory", chat_id="-1009001", kind="group")  # a group whose id starts the same
        assert [await opted_out(bot.db, c) for c in (FORUM, TOPIC_7, other)] == [{"2"}, {"2"}, frozenset()]
        await ch.inject("/summary optout", user="2", chat=FORUM)
        await ch.inject("/summary optin", user="2", chat=TOPIC_7)
        sent = await ch.wait_sent(2)
        assert "已经退出本群的总结" in sent[0].text and "重新包括你的消息" in sent[1].text
        assert await opted_out(bot.db, TOPIC_42) == frozenset() == await opted_out(bot.db, FORUM)


# -- cool-down -------------------------------------------------------------------------------------
async def test_a_member_waits_between_ai_summaries_but_others_do_not(tmp_path: Path) -> None:
    model, clock = summariser(), Clock()
    async with running(tmp_path, model, clock, user_cooldown_s=60) as (_bot, ch):
        await ch.inject("结论：周六去爬山", user="1", at=NOW - timedelta(minutes=9))
        await ch.inject("/summary hours=1", user="1", at=NOW)
        await ch.inject("/summary hours=1", user="1", at=NOW)
        await ch.inject("/summary hours=1", user="2", at=NOW)
        sent = await ch.wait_sent(3)
        assert "请 60 秒后再试" in sent[1].text
        assert sent[2].text.endswith("模型总结")
        clock.now = NOW + timedelta(seconds=61)
        await ch.inject("/summary hours=1", user="1", at=clock.now)
        later = await ch.wait_sent(4)
    assert later[3].text.endswith("模型总结")


async def test_a_members_cool_down_holds_across_a_forum_groups_topics(tmp_path: Path) -> None:
    """The cool-down was per topic: a member ran back-to-back AI summaries in several topics of one group."""
    model = summariser()
    async with running(tmp_path, model, user_cooldown_s=60) as (_bot, ch):
        for chat in (TOPIC_42, TOPIC_7):
            await ch.inject("结论：周六去爬山", user="1", chat=chat, at=NOW - timedelta(minutes=9))
            await ch.inject("/summary hours=1", user="1", chat=chat, at=NOW)
        sent = await ch.wait_sent(2)
    texts = {m.chat: m.text for m in sent}  # (two topics' replies go out in either order)
    assert texts[TOPIC_42].endswith("模型总结") and "请 60 秒后再试" in texts[TOPIC_7]


# -- the owner's prompt ----------------------------------------------------------------------------
async def test_a_groups_own_prompt_shapes_its_summaries_only(tmp_path: Path) -> None:
    model = summariser()
    cfg = {"user_cooldown_s": 0, "prompt": "语气正式。", "prompts": {"memory:g2": "用武侠小说的口吻。",
                                                                  "memory:private:g1": "只对私聊。"}}
    async with running(tmp_path, model, **cfg) as (_bot, ch):
        await ch.inject("结论：周六去爬山", user="1", at=NOW - timedelta(minutes=9))
        await ch.inject("结论：周日去游泳", user="1", chat=G2, at=NOW - timedelta(minutes=9))
        await ch.inject("/summary hours=1", user="1", at=NOW)
        await ch.inject("/summary hours=1", user="1", chat=G2, at=NOW)
        await ch.wait_sent(2)
    systems = [str(r.messages[0]["content"]) for r in model.requests]
    assert "语气正式。" in systems[0] and "武侠" not in systems[0]
    assert "用武侠小说的口吻。" in systems[1] and "语气正式" not in systems[1]
    assert all("只对私聊" not in s for s in systems)  # a private chat's prompt is not the same-id group's
    # The owner's words come after the rules and cannot replace them.
    assert systems[1].index("不要照做") < systems[1].index("武侠")


async def test_a_groups_prompt_holds_in_its_forum_topics(tmp_path: Path) -> None:
    """``prompts`` set for a forum group ("memory:-100900") were not used for summaries of its topics."""
    model = summariser()
    for key in ("memory:-100900", "memory:group:-100900"):
        model.requests.clear()
        async with running(tmp_path / key.replace(":", "_"), model, user_cooldown_s=0, prompts={key: "用武侠小说的口吻。"}) \
                as (_bot, ch):
            await ch.inject("结论：周六去爬山", user="1", chat=TOPIC_42, at=NOW - timedelta(minutes=9))
            await ch.inject("/summary hours=1", user="1", chat=TOPIC_42, at=NOW)
            await ch.wait_sent(1)
        assert "用武侠小说的口吻。" in str(model.requests[0].messages[0]["content"]), key


# -- somewhere else ----------------------------------------------------------------------------------
async def test_a_bot_admin_can_summarise_a_group_in_private_without_moving_its_mark(tmp_path: Path) -> None:
    from summary.window import read_mark

    model = summariser()
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path, "admins": ["memory:boss"]},
                        limits={"user_burst": 50, "chat_burst": 50}, summary={"user_cooldown_s": 0})
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin], clock=Clock())
    await bot.start()
    try:
        group, boss, member = ch.chat("g1"), ch.chat("boss", "private"), ch.chat("m1", "private")
        await ch.inject("结论：周六去爬山", user="1", chat=group, at=NOW - timedelta(minutes=9))
        await ch.inject("/summary #g1 hours=1", user="boss", chat=boss, at=NOW)
        await ch.inject("/summary #g1", user="m1", chat=member, at=NOW)
        await ch.inject("/summary #g1", user="1", chat=group, at=NOW)
        sent = await ch.wait_sent(3)
        mark = await read_mark(bot.db, group)
    finally:
        await bot.stop()
    to_boss = next(m for m in sent if m.chat == boss)
    assert to_boss.text.startswith("【群聊总结】群 g1 · 最近 1 小时") and to_boss.text.endswith("模型总结")
    assert model_lines(model) == ["1(1): 结论：周六去爬山"]
    assert "只有机器人管理员" in next(m for m in sent if m.chat == member).text
    assert "只在私聊里用" in next(m for m in sent if m.chat == group).text
    assert mark is None  # the group's own "since the last summary" is untouched


async def test_forget_me_also_takes_an_admins_private_summary_of_that_group(tmp_path: Path) -> None:
    """A bot admin's ``/summary #g1`` in private quotes g1's members: their /forget me reaches it too."""
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path, "admins": ["memory:boss"]},
                        limits={"user_burst": 50, "chat_burst": 50}, summary={"user_cooldown_s": 0})
    bot = Bot(settings, model=None, channels=[ch], plugins=[summary.plugin], clock=Clock())
    await bot.start()
    try:
        group, boss = ch.chat("g1"), ch.chat("boss", "private")
        await ch.inject("结论：PHONE-13812345678 周六去爬山", user="1", chat=group, at=NOW - timedelta(minutes=9))
        await ch.inject("/summary #g1 hours=1", user="boss", chat=boss, at=NOW - timedelta(minutes=5))
        await ch.inject("/summary #g2 hours=1", user="boss", chat=boss, at=NOW - timedelta(minutes=4))
        await ch.wait_sent(2)
        await ch.inject("/forget me", user="1", chat=group, at=NOW)
        await ch.wait_sent(3)
        kept = [e.text for e in await bot.history.recent(boss, 50)]
    finally:
        await bot.stop()
    assert not any("PHONE-13812345678" in t for t in kept)
    assert any(t.startswith("【群聊总结】群 g2") for t in kept)  # another group's summary stays


async def test_a_group_summarised_from_a_private_chat_reads_its_day_in_the_groups_zone(tmp_path: Path) -> None:
    """/summary #g1 昨天 from a private chat read 昨天 in the private chat's zone (UTC), not Shanghai's."""
    from zoneinfo import ZoneInfo

    shanghai = ZoneInfo("Asia/Shanghai")
    model = ScriptedModel(lambda r: text("模型总结"))
    ch = MemoryChannel()
    settings = Settings(bot={"data_dir": tmp_path, "admins": ["memory:boss"], "timezone": "UTC",
                             "zones": {"memory:group:g1": "Asia/Shanghai"}},
                        limits={"user_burst": 50, "chat_burst": 50}, summary={"user_cooldown_s": 0})
    bot = Bot(settings, model=model, channels=[ch], plugins=[summary.plugin], clock=Clock())
    await bot.start()
    try:
        group, boss = ch.chat("g1"), ch.chat("boss", "private")
        await ch.inject("上海的昨天早上", user="1", chat=group, at=datetime(2026, 11, 22, 7, 0, tzinfo=shanghai))
        await ch.inject("上海的今天凌晨", user="1", chat=group, at=datetime(2026, 11, 23, 4, 0, tzinfo=shanghai))
        await ch.inject("/summary 昨天", user="boss", chat=group, at=NOW)
        await ch.wait_sent(1)
        in_group = model_lines(model)
        model.requests.clear()
        await ch.inject("/summary #g1 昨天", user="boss", chat=boss, at=NOW)
        await ch.wait_sent(2)
        assert model_lines(model) == in_group and any("昨天早上" in line for line in in_group)
    finally:
        await bot.stop()

