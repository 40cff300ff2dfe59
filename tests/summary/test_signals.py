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
