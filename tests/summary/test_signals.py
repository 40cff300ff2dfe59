"""Noise, decisions, action items, dates and whole links, read without a model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from summary.signals import LINK, classify, clip_keeping_links, is_noise, links, names_for_mentions


def test_stickers_laughter_plus_ones_and_single_characters_are_noise() -> None:
    for text in ("[动画表情]", "[捂脸][捂脸]", "哈哈哈哈", "hhhh", "233333", "+1", "＋1", "👍", "😂😂", "6666", "嗯",
                 "好", "?", "  ", "[图片]"):
        assert is_noise(text), text
    for text in ("收到", "好的", "我来", "周二 10 点", "https://a.example", "哈哈，那就周六吧"):
        assert not is_noise(text), text


def test_decisions_and_action_items_are_told_apart_from_chatter() -> None:
    assert classify("结论：v2.3 上线推迟到 6 月 18 日").decision
    assert classify("周会改到每周二上午 10:00").decision
    assert not classify("周会改到周二？").decision  # a question proposes, it does not decide
    assert not classify("今天下午两点过一下上线计划").fact
    mine = classify("我来写发布说明，周五下班前发群里")
    assert mine.action and mine.when == "周五"
    theirs = classify("@小明 你负责把修复在周三之前提交")
    assert theirs.action and theirs.mentions == ["小明"] and theirs.when == "周三"
    assert classify("记得明天 9 点前交周报").when == "明天"
    assert not classify("中午吃什么？").fact


def test_an_undecided_remark_is_no_decision_and_a_negated_plan_still_is() -> None:
    """"我还不确定能不能去" and "地点还没决定吧" were listed under 结论/决定."""
    for undecided in ("我还不确定能不能去", "地点还没决定吧，等老板拍板", "还没有结论", "这事没定下来", "不太确定",
                      "时间尚未决定", "我不同意了", "方案待确定"):
        assert not classify(undecided).decision, undecided
    for decided in ("好的，定了：周六去爬香山", "决定不去了，周六加班", "这个方案不错，就这么定了", "不管怎样，决定了周五发版",
                    "我还不确定，不过老板已经拍板了", "会议不推迟了，照常周三开", "不如就这么定了"):
        assert classify(decided).decision, decided


def test_a_link_ends_where_the_chinese_text_after_it_starts() -> None:
    """WeChat/QQ end a link at the first non-ASCII character; it was listed with the words after it."""
    assert links("攻略在这https://docs.qq.com/doc/DQ2abc大家看下") == ["https://docs.qq.com/doc/DQ2abc"]
    assert links("报名表：https://wj.qq.com/s2/123你们填一下") == ["https://wj.qq.com/s2/123"]
    encoded = "https://zh.wikipedia.org/wiki/%E9%A6%99%E5%B1%B1?from=a&b=1#x"
    assert links(f"看{encoded}这个") == [encoded] and links("www.example.com/a看看") == ["www.example.com/a"]


def test_dates_numbers_and_mentions_are_not_read_from_inside_a_link() -> None:
    signup = classify("报名表：https://wj.qq.com/s2/123你们填一下")
    assert signup.action and signup.when is None  # (it read "2/12" as a due date)
    assert classify("https://example.org/2025-03-01/12:30 记得明天交").when == "明天"
    assert classify("看 https://medium.com/@alice/post").mentions == []
    assert not classify("https://example.org/todo/deadline").fact


def test_mentions_by_id_become_names() -> None:
    names = {"wxid_ming02": "小明"}
    assert names_for_mentions("@wxid_ming02 你负责，@老王 看一下", names) == "@小明 你负责，@老王 看一下"
    assert names_for_mentions("没有提到人", names) == "没有提到人"


def test_links_are_found_whole_before_chinese_punctuation() -> None:
    url = "https://docs.qq.com/sheet/DTk9?tab=BB08J2&u=3f1c"
    assert links(f"表格：{url}，记得填") == [url]
    assert links(f"{url} 和 {url}") == [url]


def test_clipping_a_long_message_never_cuts_a_link() -> None:
    url = "https://www.figma.com/file/8Hk2LmNpQr/v2-3-redesign?node-id=120%3A4581&t=xyz"
    text = "设计稿最终版用 B 方案，" + "理由很多" * 20 + f"，链接 {url} 大家看看"
    clipped = clip_keeping_links(text, 60)
    assert url in clipped and clipped.index("…") < clipped.index(url)
    cut_through = clip_keeping_links(f"看 {url} 吧" + "啊" * 50, 20)
    assert url in cut_through


@given(st.text(max_size=60), st.lists(st.from_regex(r"https://[a-z]{1,10}\.example/[a-zA-Z0-9?=&%/-]{0,60}",
                                                    fullmatch=True), max_size=3),
       st.integers(min_value=5, max_value=120))
def test_every_link_survives_clipping(prefix: str, urls: list[str], limit: int) -> None:
    text = prefix + " " + " ".join(urls) + " 结束"
    clipped = clip_keeping_links(text, limit)
    for match in LINK.finditer(text):
        assert match.group(0) in clipped
