"""Speaker attribution and the model-free summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import summary
from robot.bot import Bot
from robot.config import Settings
from robot.history import HistoryEntry
from robot.testing import MemoryChannel
from summary.extractive import (
    BOT_TAG,
    HEADER,
    Speakers,
    clean_name,
    extractive_summary,
    near_duplicate,
    one_line,
    salient,
    scores,
)

T0 = datetime(2025, 3, 1, 2, 0, tzinfo=UTC)  # 10:00 in Shanghai
ZONE = ZoneInfo("Asia/Shanghai")


def msg(user: str, name: str, text: str, minute: float, *, bot: bool = False) -> HistoryEntry:
    return HistoryEntry(chat="memory:group:g1", user_id=user, name=name, text=text,
                        at=T0 + timedelta(minutes=minute), from_bot=bot)


def test_one_id_with_several_names_uses_the_latest_and_lists_aliases_once() -> None:
    entries = [msg("1", "小张", "早上好", 0), msg("1", "张三", "在吗", 1), msg("1", "zz", "好的", 2),
               msg("1", "zz", "嗯嗯", 3)]
    speakers = Speakers(entries)
    person = speakers.of(entries[0])
    assert person.label == "zz(1)"
    assert person.aliases == ["小张", "张三"]
    assert person.count == 4
    text = extractive_summary(entries, zone=ZONE, title="测试")
    assert text.count("小张") == 1 and text.count("张三") == 1
    assert "zz(1)（曾用名：小张、张三） 4 条" in text


def test_two_ids_with_the_same_display_name_stay_distinct() -> None:
    entries = [msg("1", "阿强", "我周六有空打球吗？", 0), msg("2", "阿强", "我不去了，周六加班", 1)]
    speakers = Speakers(entries)
    assert speakers.label(entries[0]) == "阿强(1)"
    assert speakers.label(entries[1]) == "阿强(2)"
    assert [p.user_id for p in speakers.members()] == ["1", "2"]


def test_returning_to_an_old_name_does_not_list_it_as_an_alias() -> None:
    speakers = Speakers([msg("1", "A", "x", 0), msg("1", "B", "x", 1), msg("1", "A", "x", 2)])
    person = speakers.members()[0]
    assert person.name == "A" and person.aliases == ["B"]


def test_bot_messages_are_labelled_as_the_bot_even_if_a_member_copies_its_name() -> None:
    entries = [msg("bot", "qunbot", "好的，已设置提醒", 0, bot=True), msg("7", "qunbot", "我才是机器人", 1)]
    speakers = Speakers(entries)
    assert speakers.label(entries[0]) == f"qunbot{BOT_TAG}"
    assert speakers.label(entries[1]) == "qunbot(7)"
    assert [p.user_id for p in speakers.members()] == ["7"]  # the bot is not a member


def test_spoofed_names_and_multiline_text_cannot_forge_a_transcript_line() -> None:
    assert clean_name("张三(10002): 我同意\n李四") == "张三 10002 我同意 李四"
    assert clean_name("【管理员】") == "管理员"
    assert clean_name("") == "?"
    assert one_line("第一行\n[10:00] 李四(10003): 我同意转账\n\n") == "第一行 / [10:00] 李四(10003): 我同意转账"


def test_near_duplicates_ignore_case_spacing_and_punctuation() -> None:
    assert near_duplicate("明天下午3点开会！", "明天下午 3 点开会")
    assert near_duplicate("Meeting at 3pm in room A", "meeting at 3pm, in room A!!")
    assert not near_duplicate("明天下午3点开会", "后天上午10点聚餐")
    assert not near_duplicate("好的", "好滴")


def test_questions_links_numbers_and_responses_score_higher() -> None:
    entries = [
        msg("1", "A", "今天天气不错呀大家好", 0),
        msg("2", "B", "周六下午3点去哪打球？", 1),
        msg("3", "C", "体育馆吧", 2),
        msg("4", "D", "我也去", 3),
        msg("1", "A", "看这个 https://example.com/x", 30),
        msg("bot", "qunbot", "这是一个很长很长很长很长很长很长的机器人回答？", 31, bot=True),
        msg("5", "E", "嗯", 32),
    ]
    marks = scores(entries)
    assert marks[1] > marks[0]  # question + time + two responders
    assert marks[4] > marks[0]  # link
    assert marks[5] == 0 and marks[6] == 0  # the bot, and near-empty text
    assert salient(entries, 2) == [1, 4]


def test_salient_messages_skip_near_identical_repeats() -> None:
    entries = [msg(str(i), f"P{i}", "明天早上8点在东门集合，带身份证！", i) for i in range(5)]
    entries.append(msg("9", "Q", "有人知道集合地点在哪吗？", 10))
    picks = salient(entries, 3)
    assert len(picks) == 2
    assert 5 in picks


def test_extractive_summary_reports_count_period_members_and_salient_messages() -> None:
    entries = [msg("1", "Alice", "大家周五晚上7点聚餐可以吗？", 0)]
    entries += [msg("2", "Bob", f"第{i}条普通消息内容", 1 + i) for i in range(3)]
    entries += [msg("3", "Carol", "可以，地点定在 https://maps.example/abc", 9)]
    text = extractive_summary(entries, zone=ZONE, title="最近 24 小时", top_members=2, salient_count=2)
    lines = text.splitlines()
    assert lines[0] == f"{HEADER}最近 24 小时 · 共 5 条消息 · 3 人发言"
    assert "时间：03-01 周六 10:00 — 03-01 周六 10:09（Asia/Shanghai）" in text
    assert "最活跃：Bob(2) 3 条；" in text and "Carol" not in text.split("最活跃：")[1].split("\n")[0]
    assert "Alice(1): 大家周五晚上7点聚餐可以吗？" in text
    assert "Carol(3): 可以，地点定在 https://maps.example/abc" in text


def test_an_ordinary_chinese_chat_gives_its_one_decision_and_clickable_links() -> None:
    chat = [("1", "小明", "周末团建去哪？"), ("2", "小红", "我还不确定能不能去"), ("3", "小刚", "地点还没决定吧，等老板拍板"),
            ("1", "小明", "攻略在这https://docs.qq.com/doc/DQ2abc大家看下"),
            ("2", "小红", "报名表：https://wj.qq.com/s2/123你们填一下"), ("3", "小刚", "好的，定了：周六去爬香山")]
    out = extractive_summary([msg(u, n, t, i) for i, (u, n, t) in enumerate(chat)], zone=ZONE, title="今天")
    decisions = out.split("结论/决定：\n")[1].split("\n待办")[0].splitlines()
    assert len(decisions) == 1 and decisions[0].endswith("定了：周六去爬香山")
    assert out.split("链接：\n")[1].splitlines() == [
        "- https://docs.qq.com/doc/DQ2abc （小明(1)，03-01 周六 10:03）",
        "- https://wj.qq.com/s2/123 （小红(2)，03-01 周六 10:04）"]
    assert "何时" not in out  # (a due date "2/12" was read from inside the link)


async def test_summary_command_without_a_model_is_extractive_and_stays_in_its_chat(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ch = MemoryChannel()
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[ch], plugins=[summary.plugin], clock=lambda: now)
    assert bot.model is None
    await bot.start()
    try:
        here, there = ch.chat("g1"), ch.chat("g2")
        await ch.inject("下午3点开会，记得带电脑？", user="1", name="Alice", chat=here, at=now - timedelta(minutes=9))
        await ch.inject("收到", user="2", name="Bob", chat=here, at=now - timedelta(minutes=8))
        await ch.inject("别的群的秘密", user="3", name="Eve", chat=there, at=now - timedelta(minutes=7))
        await ch.inject("/summary", user="2", name="Bob", chat=here, at=now - timedelta(minutes=1))
        sent = await ch.wait_sent(1)
    finally:
        await bot.stop()
    reply = sent[0]
    assert reply.chat == here
    assert reply.text.startswith(f"{HEADER}最近 24 小时 · 共 2 条消息 · 2 人发言")
    assert "Alice(1): 下午3点开会，记得带电脑？" in reply.text
    assert "秘密" not in reply.text and "Eve" not in reply.text
