"""Time phrases for ``/remind`` without a model: what they mean, and that anything accepted is in the future."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reminders.phrases import Phrase, PhraseError, parse_phrase
from reminders.schedule import days_mask, first_fire, parse_schedule
from reminders.weekdays import weekday_number, weekday_set

SH = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 11, 23, 3, 25, 12, tzinfo=UTC)  # Monday 11:25:12 in Shanghai


def read(text: str, zone: ZoneInfo = SH, now: datetime = NOW) -> Phrase:
    return parse_phrase(text, zone, now)


@pytest.mark.parametrize(("text", "kind", "time", "extra", "content"), [
    ("10分钟后 喝水", "once", "2026-11-23 11:35", None, "喝水"),
    ("半小时后 开会", "once", "2026-11-23 11:55", None, "开会"),
    ("一个半小时后 吃饭", "once", "2026-11-23 12:55", None, "吃饭"),
    ("明天8点 开会", "once", "2026-11-24 08:00", None, "开会"),
    ("明天8点开会", "once", "2026-11-24 08:00", None, "开会"),
    ("明早8:30 跑步", "once", "2026-11-24 08:30", None, "跑步"),
    ("后天下午3点 开会", "once", "2026-11-25 15:00", None, "开会"),
    ("今晚9点 看书", "once", "2026-11-23 21:00", None, "看书"),
    ("今晚12点 睡觉", "once", "2026-11-24 00:00", None, "睡觉"),
    ("下周一 9:30 交周报", "once", "2026-11-30 09:30", None, "交周报"),
    ("周一 9:30 例会", "once", "2026-11-30 09:30", None, "例会"),  # this Monday's 9:30 has passed
    ("周三 九点半 例会", "once", "2026-11-25 09:30", None, "例会"),
    ("11月24日 15:00 面试", "once", "2026-11-24 15:00", None, "面试"),
    ("8点 开会", "once", "2026-11-23 20:00", None, "开会"),  # 8 a.m. has passed: 8 p.m., the next 8 o'clock
    ("3点 开会", "once", "2026-11-23 15:00", None, "开会"),
    ("8:00 开会", "once", "2026-11-24 08:00", None, "开会"),  # HH:MM is a 24-hour time
    ("上午8点 开会", "once", "2026-11-24 08:00", None, "开会"),
    ("下午3点 开会", "once", "2026-11-23 15:00", None, "开会"),
    ("提醒我明天下午3点开会", "once", "2026-11-24 15:00", None, "开会"),
    ("明天十点一刻，提醒我交报告", "once", "2026-11-24 10:15", None, "交报告"),
    ("明天8点 在会议室开会", "once", "2026-11-24 08:00", None, "在会议室开会"),
    ("明天的8点 开会", "once", "2026-11-24 08:00", None, "开会"),
    ("每天 8:00 起床", "daily", "08:00", None, "起床"),
    ("每天早上8点 喝水", "daily", "08:00", None, "喝水"),
    ("每晚10点 写日记", "daily", "22:00", None, "写日记"),
    ("每周五 18:00 交周报", "weekly", "18:00", 4, "交周报"),
    ("每周日 20:00 总结", "weekly", "20:00", 6, "总结"),
    ("工作日 9:00 站会", "weekdays", "09:00", (0, 1, 2, 3, 4), "站会"),
    ("周一到周五 9:00 站会", "weekdays", "09:00", (0, 1, 2, 3, 4), "站会"),
    ("每周一三五 7:00 跑步", "weekdays", "07:00", (0, 2, 4), "跑步"),
    ("周末 10:00 爬山", "weekdays", "10:00", (5, 6), "爬山"),
    ("今天8点 开会", "once", "2026-11-23 20:00", None, "开会"),  # 8 a.m. has passed: 8 p.m., as "8点" alone
    ("明天中午 吃饭", "once", "2026-11-24 12:00", None, "吃饭"),  # 中午 names its hour
    ("每天中午 吃药", "daily", "12:00", None, "吃药"),
    ("每周1 8:00 周会", "weekly", "08:00", 0, "周会"),  # digits after 周 count from 1, as in 周1
    ("每周6 9:00 打球", "weekly", "09:00", 5, "打球"),
    ("每周1,3,5 7:00 跑步", "weekdays", "07:00", (0, 2, 4), "跑步"),
    ("每周五晚上12点 倒垃圾", "weekly", "00:00", 5, "倒垃圾"),  # the midnight that ends Friday
    ("每周五 24:00 倒垃圾", "weekly", "00:00", 5, "倒垃圾"),
    ("工作日晚上12点 关电脑", "weekdays", "00:00", (1, 2, 3, 4, 5), "关电脑"),
    ("每周日晚上12点 对账", "weekly", "00:00", 0, "对账"),  # Sunday night: Monday 00:00
    ("in 10 minutes drink water", "once", "2026-11-23 11:35", None, "drink water"),
    ("in half an hour stretch", "once", "2026-11-23 11:55", None, "stretch"),
    ("tomorrow 8am standup", "once", "2026-11-24 08:00", None, "standup"),
    ("tonight at 9pm call mum", "once", "2026-11-23 21:00", None, "call mum"),
    ("every friday 6pm report", "weekly", "18:00", 4, "report"),
    ("weekdays 9:00 standup", "weekdays", "09:00", (0, 1, 2, 3, 4), "standup"),
    ("2026-11-24 08:00 开会", "once", "2026-11-24 08:00", None, "开会"),
    # The content's first word is no part of the time (these were 08:01 "起吃饭", 15:03 "楼开会", 21:00 "P考试")
    ("明天8点 一起吃饭", "once", "2026-11-24 08:00", None, "一起吃饭"),
    ("明天下午3点 3楼开会", "once", "2026-11-24 15:00", None, "3楼开会"),
    ("每天8点 一起跑步", "daily", "08:00", None, "一起跑步"),
    ("明天 9:00 PMP考试", "once", "2026-11-24 09:00", None, "PMP考试"),
    ("明天8点 整理文档", "once", "2026-11-24 08:00", None, "整理文档"),
    ("明天8点整 开会", "once", "2026-11-24 08:00", None, "开会"),
    ("3点钟 开会", "once", "2026-11-23 15:00", None, "开会"),
    ("明天8点半开会", "once", "2026-11-24 08:30", None, "开会"),
    ("明天8点10 开会", "once", "2026-11-24 08:10", None, "开会"),
    ("明天三点零五 开会", "once", "2026-11-24 03:05", None, "开会"),
    ("明天中午1点 午饭", "once", "2026-11-24 13:00", None, "午饭"),
    # The day after the clock, a dotted time, a quarter by its digit, two units: these were today's 17:00 "tomorrow
    # call mom", 15:00 ".30pm call", 08:00 "1刻 开会", 13:25 "30 minutes stretch"
    ("5pm tomorrow call mom", "once", "2026-11-24 17:00", None, "call mom"),
    ("3pm friday review", "once", "2026-11-27 15:00", None, "review"),
    ("9am monday standup", "once", "2026-11-30 09:00", None, "standup"),
    ("at 10 tomorrow dentist", "once", "2026-11-24 10:00", None, "dentist"),
    ("at 10 tonight call", "once", "2026-11-23 22:00", None, "call"),
    ("8pm next monday review", "once", "2026-11-30 20:00", None, "review"),
    ("6pm on friday: drinks", "once", "2026-11-27 18:00", None, "drinks"),
    ("下午3点 明天 开会", "once", "2026-11-24 15:00", None, "开会"),
    ("at 3.30pm call", "once", "2026-11-23 15:30", None, "call"),
    ("at 3.30 call", "once", "2026-11-23 15:30", None, "call"),  # as "at 3" is 15:00 at this hour
    ("tomorrow 9.15am standup", "once", "2026-11-24 09:15", None, "standup"),
    ("every day 7.45am pills", "daily", "07:45", None, "pills"),
    ("in 2 hours 30 minutes stretch", "once", "2026-11-23 13:55", None, "stretch"),
    ("in 1 hour and 15 minutes tea", "once", "2026-11-23 12:40", None, "tea"),
    ("in 1h 30m stretch", "once", "2026-11-23 12:55", None, "stretch"),
    ("1小时30分钟后 喝水", "once", "2026-11-23 12:55", None, "喝水"),
    ("两小时十五分钟后 取快递", "once", "2026-11-23 13:40", None, "取快递"),
    ("明天8点1刻 开会", "once", "2026-11-24 08:15", None, "开会"),
    ("明天8点2刻 开会", "once", "2026-11-24 08:30", None, "开会"),
    ("明天8点3刻 开会", "once", "2026-11-24 08:45", None, "开会"),
    ("明天8点 周五的报告", "once", "2026-11-24 08:00", None, "周五的报告"),  # a day word inside the content
    ("每天8点 今天的待办", "daily", "08:00", None, "今天的待办"),
    # The content after an English relative time is content, not more time (these were 3 days, a day ("a d"),
    # 2 days, 1h30 later, and refused as "an d")
    ("in 10 minutes 3d printer should be done", "once", "2026-11-23 11:35", None, "3d printer should be done"),
    ("in 15 min ad campaign review", "once", "2026-11-23 11:40", None, "ad campaign review"),
    ("in 5 minutes 2 days left to submit", "once", "2026-11-23 11:30", None, "2 days left to submit"),
    ("in 30 mins an hour-long call", "once", "2026-11-23 11:55", None, "an hour-long call"),
    ("in 10 minutes and call mom", "once", "2026-11-23 11:35", None, "and call mom"),
    ("in 2 hours a minute of silence", "once", "2026-11-23 13:25", None, "a minute of silence"),
    ("in 1 hour and an hour-long call", "once", "2026-11-23 12:25", None, "and an hour-long call"),
    ("in 1 day, an hour-long meeting", "once", "2026-11-24 11:25", None, "an hour-long meeting"),
    ("in 1 day and an hour-long call", "once", "2026-11-24 11:25", None, "and an hour-long call"),
    ("in 2 hours, a minute of silence", "once", "2026-11-23 13:25", None, "a minute of silence"),
    ("in 1 day, 2 hours tea", "once", "2026-11-24 13:25", None, "tea"),
    ("in 1 hour, and a minute: tea", "once", "2026-11-23 12:26", None, "tea"),
    ("in 2d 3h review", "once", "2026-11-25 14:25", None, "review"),
    # No day or piece of a clock goes on a relative time: what follows is content (these were refused)
    ("10分钟后 明天 交材料", "once", "2026-11-23 11:35", None, "明天 交材料"),
    ("10分钟后 一刻也不停", "once", "2026-11-23 11:35", None, "一刻也不停"),
    ("in 10 minutes tomorrow standup", "once", "2026-11-23 11:35", None, "tomorrow standup"),
    # 一刻钟 is a duration: these were 08:15 "钟后出发"
    ("明天8点1刻钟后出发", "once", "2026-11-24 08:00", None, "1刻钟后出发"),
    ("明天8点一刻钟后出发", "once", "2026-11-24 08:00", None, "一刻钟后出发"),
    # Words that are days too, after a bare clock, are content (these were refused)
    ("9am sun cream", "once", "2026-11-24 09:00", None, "sun cream"),
    ("8am sat exam", "once", "2026-11-24 08:00", None, "sat exam"),
    ("at 9 wed dinner", "once", "2026-11-23 21:00", None, "wed dinner"),
])
def test_common_phrases(text: str, kind: str, time: str, extra: object, content: str) -> None:
    got = read(text)
    assert (got.kind, got.time, got.content) == (kind, time, content)
    assert (got.days if kind == "weekdays" else got.weekday) == extra
    assert got.first > NOW and got.first.tzinfo is SH


@pytest.mark.parametrize(("text", "reason"), [
    ("hello", "没有看懂提醒时间"),
    ("明天 开会", "请写上几点"),
    ("每天 喝水", "重复提醒要写上几点"),
    ("今天上午8点 开会", "已经过去了"),
    ("明天25点 开会", "不存在"),
    ("2月30日 8:00 x", "不存在"),
    ("中午10点 开会", "是几点"),  # it was 22:00
    ("0.5天后8点 开会", "只能写一个"),  # it was 12 hours later, "8点 开会" the content
    # A day or a piece of the time left at the start of the content is refused, not guessed
    ("3点 明天开会", "是时间的一部分吗"),  # tomorrow at 3, or at 3 today "明天开会"?
    ("5pm tomorrow's meeting", "是时间的一部分吗"),
    ("tomorrow 5pm friday review", "是时间的一部分吗"),
    ("每天8点 明天 开始", "是时间的一部分吗"),
    ("明天8点4刻 开会", "是时间的一部分吗"),
    ("明天8点 1刻 开会", "是时间的一部分吗"),
    ("at 3 .30pm call", "是时间的一部分吗"),
    ("in 1 minute 30 seconds tea", "是时间的一部分吗"),
    ("in 2 hours 30m stretch", "是时间的一部分吗"),  # a compact unit after a word: 2h30, or "30m stretch"?
    ("in 1 hour and a half tea", "是时间的一部分吗"),
    ("at 3.75pm call", "不存在"),
])
def test_what_it_cannot_use_is_explained_in_chinese(text: str, reason: str) -> None:
    with pytest.raises(PhraseError, match=reason):
        read(text)


def test_chinese_and_english_weekday_names() -> None:
    assert [weekday_number(w) for w in ("周一", "星期日", "礼拜天", "周7", "monday", "Fri", "0", "6")] == [
        0, 6, 6, 6, 0, 4, 0, 6]
    assert [weekday_number(w) for w in ("周八", "7", "x", "周0")] == [None, None, None, None]
    assert weekday_set("工作日") == [0, 1, 2, 3, 4] and weekday_set("周末") == [5, 6]
    assert weekday_set("周一三五") == weekday_set("一、三和五") == weekday_set("0,2,4") == [0, 2, 4]
    assert weekday_set("周日") == [6] and weekday_set("每周") is None and weekday_set("8,9") is None
    # "1,3,5" was Tue/Thu/Sat and "1、3、5" Mon/Wed/Fri: bare digits say which count they use (0 or 7), or are refused
    assert weekday_set("1,3,5") is None and weekday_set("1、3、5") is None and weekday_set("0、2、4") == [0, 2, 4]
    assert weekday_set("1,3,7") == weekday_set("1、3、7") == [0, 2, 6] and weekday_set("0,7") is None


def test_n_days_later_keeps_the_wall_time_over_a_clock_change() -> None:
    """"1天后" said at noon the day before New York's clocks go back: noon, as 明天 and 1天后12点 say."""
    now = datetime(2026, 10, 31, 16, 0, tzinfo=UTC)  # Saturday 12:00 EDT
    ny = ZoneInfo("America/New_York")
    assert read("1天后 开会", ny, now).time == read("明天12点 开会", ny, now).time == "2026-11-01 12:00"
    assert read("1.5天后 开会", ny, now).time == "2026-11-01 23:00"  # a fraction of a day: 36 hours pass


PHRASES = st.sampled_from(["明天8点", "明天下午3点", "今晚9点", "每天8点", "每周五下午5点", "明天 9:00", "明天8点整",
                           "明天8点半", "后天十点一刻", "明天 8:00", "工作日 9:00", "3天后", "明天中午", "明天8点1刻",
                           "5pm tomorrow", "at 10 friday", "at 3.30pm", "in 2 hours 30 minutes", "1小时30分钟后"])
CONTENTS = st.sampled_from(["一起吃饭", "3楼开会", "10个人开会", "两周一次的复盘", "整理文档", "半价", "PMP考试", "一刻钟后出发", "十五个人", "零食", "开会"])


@settings(max_examples=150, deadline=None)
@given(phrase=PHRASES, first=CONTENTS, second=CONTENTS)
def test_the_time_does_not_depend_on_the_content_after_a_space(phrase: str, first: str, second: str) -> None:
    # (A lone "pm" after a clock is p.m. whatever follows it: "8:00 pm日报" reads as 20:00, its confirmation says so.)
    one, two = read(f"{phrase} {first}"), read(f"{phrase} {second}")
    assert (one.kind, one.time, one.content, two.content) == (two.kind, two.time, first, second)


def test_a_relative_time_in_a_repeated_hour_is_never_placed_in_the_past() -> None:
    ny = ZoneInfo("America/New_York")
    # 2026-11-01: clocks go back at 02:00 EDT -> 01:00 EST; 06:00 UTC is 01:00 EST, the second pass.
    now = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
    got = read("10分钟后 喝水", ny, now)
    assert got.first > now
    assert first_fire(parse_schedule("once", got.time, ny.key, None), now) == got.first.astimezone(UTC)


ZONES = ["Asia/Shanghai", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago", "UTC"]
# Instants near DST changes (and ordinary ones): the parser must stay right around them.
NOWS = st.one_of(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)),
    st.sampled_from([datetime(2026, 3, 8, 6, 55, tzinfo=UTC), datetime(2026, 11, 1, 5, 50, tzinfo=UTC),
                     datetime(2026, 3, 29, 0, 59, tzinfo=UTC), datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
                     datetime(2026, 4, 4, 14, 45, tzinfo=UTC)]).flatmap(
        lambda t: st.integers(-7200, 7200).map(lambda s: t + timedelta(seconds=s))),
)
NUM = st.one_of(st.integers(0, 30).map(str), st.sampled_from(["一", "两", "三", "八", "十", "十二", "二十", "半"]))
PIECES = st.lists(st.one_of(
    st.sampled_from(["明天", "后天", "大后天", "今天", "今晚", "明早", "下周", "周", "每周", "每天", "工作日", "周末", "每",
                     "下午", "上午", "晚上", "凌晨", "中午", "点", "点半", "分", ":", "：", "后", "分钟后", "小时后", "天后",
                     "个", "in ", " minutes", " hours", "tomorrow ", "tonight ", "every ", "am", "pm", "at ", "weekdays ",
                     "一", "三", "五", "日", "月", "号", "-", "/", " ", "提醒我", "开会", "prompt"]),
    NUM), max_size=8).map("".join)


CLOCK = st.tuples(st.integers(0, 25), st.sampled_from(["点", "点半", "点一刻", "点15分", ":00", ":30", ":59", "am", "pm", "时",
                                                      "点1刻", "点3刻", ".30pm", ".05am"])
                  ).map(lambda p: f"{p[0]}{p[1]}")
WELL_FORMED = st.one_of(
    st.tuples(st.sampled_from(["", "今天", "明天", "后天", "大后天", "今早", "明早", "今晚", "明晚", "下周一", "周三", "这周五",
                               "11月24日", "2月29日", "3月8日 ", "tomorrow ", "today ", "tonight ", "next monday ",
                               "friday "]),
              st.sampled_from(["", "上午", "下午", "晚上", "凌晨", "中午", " at "]), CLOCK).map("".join),
    st.tuples(st.sampled_from(["每天", "每晚", "每周五", "工作日", "周末", "每周一三五", "every day ", "weekdays ",
                               "every sunday "]), CLOCK).map("".join),
    st.tuples(st.one_of(NUM, st.integers(1, 5000).map(str)), st.sampled_from(["分钟后", "个小时后", "小时后", "天后", "天后 8点"])
              ).map("".join),
    st.integers(1, 5000).map(lambda n: f"in {n} minutes"),
    st.tuples(st.integers(0, 30), st.integers(0, 90)).map(lambda p: f"in {p[0]} hours {p[1]} minutes"),
    st.tuples(st.integers(0, 30), st.integers(0, 90)).map(lambda p: f"{p[0]}小时{p[1]}分钟后"),
    st.tuples(st.sampled_from(["at ", ""]), st.integers(0, 25).map(str), st.sampled_from(["", "am", "pm", ".30", ".30pm", ":15"]),
              st.sampled_from([" tomorrow", " tonight", " today", " friday", " next monday", " on sunday"])).map("".join),
).map(lambda phrase: f"{phrase} 开会")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=60), PIECES, WELL_FORMED), zone=st.sampled_from(ZONES), now=NOWS)
def test_any_text_either_is_refused_or_fires_in_the_future_in_the_chats_zone(
        text: str, zone: str, now: datetime) -> None:
    tz = ZoneInfo(zone)
    try:
        got = parse_phrase(text, tz, now)
    except PhraseError:
        return
    assert got.first.tzinfo is tz and got.first.utcoffset() is not None
    assert got.first > now
    mask = days_mask(got.days) if got.days is not None else got.weekday
    # The arguments reminder_set receives give the same first fire (compared in UTC: an instant in a
    # repeated hour never equals one in another zone, PEP 495).
    assert first_fire(parse_schedule(got.kind, got.time, zone, mask), now) == got.first.astimezone(UTC)
    assert got.content == got.content.strip()


def test_a_bare_noon_already_past_is_the_next_midnight_not_a_crash() -> None:
    """Found by the property test: "12点" at 12:00 sharp tried hour 24. The next 12 o'clock is midnight."""
    zone = ZoneInfo("Asia/Shanghai")
    now = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)  # 12:00 in Shanghai
    got = parse_phrase("12点 吃饭", zone, now)
    assert got.first.astimezone(zone) == datetime(2026, 11, 24, 0, 0, tzinfo=zone)
    assert parse_phrase("中午12点 吃饭", zone, now).first == datetime(2026, 11, 24, 12, 0, tzinfo=zone)


@pytest.mark.parametrize(("text", "now", "hours"), [
    ("2小时后 喝水", datetime(2026, 11, 1, 4, 30, tzinfo=UTC), 2),  # 00:30 EDT: 2 h on is 01:30 EST
    ("in 90 minutes stretch", datetime(2026, 11, 1, 5, 0, tzinfo=UTC), 1.5),  # 01:00 EDT: 01:30 EST
    ("10分钟后 喝水", datetime(2026, 11, 1, 5, 55, tzinfo=UTC), 1 / 6),  # 01:55 EDT: 01:05 EST, exact
])
def test_a_relative_time_ending_in_a_repeated_hour_never_fires_early(text: str, now: datetime, hours: float) -> None:
    """New York's clocks go back at 02:00 EDT: a wall time in 01:xx names the first pass, which a
    reminder due in the second would fire an hour early at. It is the next wall time that is not early."""
    zone = ZoneInfo("America/New_York")
    phrase = parse_phrase(text, zone, now)
    stored = first_fire(parse_schedule("once", phrase.time, zone.key, None), now)  # as reminder_set resolves it
    due = now + timedelta(hours=hours)
    assert due - timedelta(seconds=30) <= stored <= due + timedelta(hours=1)


@pytest.mark.parametrize(("text", "at"), [
    ("12点 睡觉", "2030-01-08 00:00"),  # the next 12 o'clock is tonight's midnight, not noon tomorrow
    ("12点半 睡觉", "2030-01-08 00:30"),
    ("十二点 睡觉", "2030-01-08 00:00"),
    ("at 12 sleep", "2030-01-08 00:00"),
    ("11点 睡觉", "2030-01-07 23:00"),
    # A half said stays that half
    ("中午12点 吃饭", "2030-01-08 12:00"),
    ("晚上12点 睡觉", "2030-01-08 00:00"),
    ("12pm lunch", "2030-01-08 12:00"),
    ("12am sleep", "2030-01-08 00:00"),
    ("noon lunch", "2030-01-08 12:00"),
    ("12:00 吃饭", "2030-01-08 12:00"),  # HH:MM is a 24-hour clock
    ("明天12点 吃饭", "2030-01-08 12:00"),
])
def test_a_bare_twelve_oclock_is_the_next_one_late_in_the_evening(text: str, at: str) -> None:
    now = datetime(2030, 1, 7, 14, 30, tzinfo=UTC)  # Monday 22:30 in Shanghai
    assert read(text, SH, now).first.strftime("%Y-%m-%d %H:%M") == at


def test_a_bare_twelve_oclock_in_the_morning_is_todays_noon() -> None:
    now = datetime(2030, 1, 7, 1, 0, tzinfo=UTC)  # 09:00 in Shanghai
    assert read("12点 吃饭", SH, now).first.strftime("%Y-%m-%d %H:%M") == "2030-01-07 12:00"
    assert read("今天12点 吃饭", SH, now).first.strftime("%Y-%m-%d %H:%M") == "2030-01-07 12:00"
    just_after_midnight = datetime(2030, 1, 6, 16, 10, tzinfo=UTC)  # 00:10 in Shanghai
    assert read("12点半 睡觉", SH, just_after_midnight).first.strftime("%Y-%m-%d %H:%M") == "2030-01-07 00:30"


@settings(max_examples=150, deadline=None)
@given(hour=st.integers(1, 12), half=st.booleans(), zone=st.sampled_from(["Asia/Shanghai", "UTC"]), now=NOWS)
def test_a_bare_hour_is_the_next_time_the_clock_shows_it(hour: int, half: bool, zone: str, now: datetime) -> None:
    """"N点" with no half of the day said: the earliest N o'clock (either half) after now."""
    tz = ZoneInfo(zone)
    today = now.astimezone(tz).date()
    minute = 30 if half else 0
    candidates = [datetime.combine(today + timedelta(days=d), datetime.min.time(), tz).replace(hour=h, minute=minute)
                  for d in (0, 1) for h in (hour % 12, hour % 12 + 12)]
    want = min(c for c in candidates if c > now)
    assert read(f"{hour}点{'半' if half else ''} 开会", tz, now).first == want
