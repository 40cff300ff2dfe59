"""Lexical terms: CJK bigrams match two-character queries where trigrams cannot, on both engines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.store import MemoryStore
from memory.terms import fts_query, index_terms, query_terms, trigram_query
from robot import Tx

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def store_with(db: Tx, lexical: str, *texts: str, chat: str = "c") -> MemoryStore:
    store = MemoryStore(lexical)  # type: ignore[arg-type]
    store.migrate(db)
    for t in texts:
        store.insert(db, chat=chat, kind="group", user_id="u", user_name="", text=t, now=NOW)
    return store


def test_index_and_query_terms() -> None:
    assert index_terms("我对花生过敏 OK!") == "我 对 花 生 过 敏 我对 对花 花生 生过 过敏 ok"
    assert query_terms("我对什么过敏？") == ["我对", "对什", "么过", "过敏"]  # 什么: two function characters
    assert query_terms("猫") == ["猫"] and query_terms("的") == []


def test_two_character_queries_match_with_bigrams_not_with_trigrams(raw_tx: Tx) -> None:
    facts = ("我对花生过敏", "我们组周会改到周四了")
    bigram = store_with(raw_tx, "bigram", *facts)
    first, second = bigram.lexical_search(raw_tx, "c", "u", "花生", 5) + bigram.lexical_search(raw_tx, "c", "u", "周四", 5)
    for query, expected in (("过敏", first), ("周会", second), ("我对什么过敏", first)):
        assert bigram.lexical_search(raw_tx, "c", "u", query, 5)[:1] == [expected]
    trigram = store_with(raw_tx, "trigram")  # the same rows, re-indexed as trigrams
    for query in ("过敏", "周会", "我对什么过敏"):
        assert trigram.lexical_search(raw_tx, "c", "u", query, 5) == []
    assert trigram.lexical_search(raw_tx, "c", "u", "花生过敏", 5) == [first]


def test_switching_the_tokenizer_rebuilds_the_index(raw_tx: Tx) -> None:
    mine = store_with(raw_tx, "bigram", "我对花生过敏")
    (mid,) = mine.lexical_search(raw_tx, "c", "u", "过敏", 5)
    trigram = store_with(raw_tx, "trigram")
    assert trigram.lexical_search(raw_tx, "c", "u", "花生过敏", 5) == [mid]
    later = trigram.insert(raw_tx, chat="c", kind="group", user_id="u", user_name="", text="周会改到周四", now=NOW)
    back = store_with(raw_tx, "bigram")  # and back: what was added meanwhile is found by bigrams too
    assert back.lexical_search(raw_tx, "c", "u", "周会", 5) == [later]
    assert back.lexical_search(raw_tx, "c", "u", "过敏", 5) == [mid]


@pytest.mark.parametrize(("fact", "query"), [
    ("ABC公司的周会改到周四", "周会"), ("明天3点开会讨论预算", "开会"), ("我买了iPhone手机", "手机"),
    ("我买了iPhone手机", "iphone"), ("Q3的目标是营收翻倍", "目标"), ("我的 ＱＱ 号是 １２３４５", "QQ"),
    ("我的 ＱＱ 号是 １２３４５", "12345"), ("Café au lait", "cafe"), ("他叫𠮷野家", "𠮷野")])
def test_cjk_after_latin_or_digits_full_width_and_accents_match(raw_tx: Tx, fact: str, query: str) -> None:
    """CJK right after a letter or digit was one word with it; full-width (IME) text and accents differ by engine."""
    store = store_with(raw_tx, "bigram", fact)
    assert len(store.lexical_search(raw_tx, "c", "u", query, 5)) == 1
    trigram = store_with(raw_tx, "trigram")
    assert len(trigram.lexical_search(raw_tx, "c", "u", query + " " + fact, 5)) == 1


CHATTER = ("大家好，今天天气真不错，下午要不要一起去公园走走，顺便在附近找个地方吃晚饭？"
           "我上次去的那家店味道挺好的，价格也不贵，老板人也很热情，菜量足够大家分着吃。")


def test_a_long_message_is_searched_for_what_it_asks_at_its_end(raw_tx: Tx) -> None:
    """Only a long message's first 48 terms were searched: the question at its end was not."""
    store = store_with(raw_tx, "bigram", "周会改到周四")
    assert len(store.lexical_search(raw_tx, "c", "u", CHATTER + "对了，周会改到哪天了？", 5)) == 1
    trigram = store_with(raw_tx, "trigram")
    assert len(trigram.lexical_search(raw_tx, "c", "u", CHATTER + "对了，周会改到哪天了？", 5)) == 1
    assert len(store_with(raw_tx, "bigram").lexical_search(raw_tx, "c", "u", "周会改到哪天了？" + CHATTER, 5)) == 1


def test_bm25_ranks_a_rare_term_above_a_common_one(raw_tx: Tx) -> None:
    """Both engines weigh terms by rarity (IDF): the memory with 年糕 beats the shorter ones with 周会."""
    store = store_with(raw_tx, "bigram", "周会上的那只猫叫年糕", *[f"第{n}次周会" for n in "一二三四五六七八"])
    got = store.lexical_search(raw_tx, "c", "u", "周会年糕", 3)
    assert len(got) == 3 and store.get(raw_tx, got[0]).text == "周会上的那只猫叫年糕"  # type: ignore[union-attr]


def test_quotes_and_backslashes_are_plain_text(raw_tx: Tx) -> None:
    for lexical in ("bigram", "trigram"):
        store = store_with(raw_tx, lexical, "it's a \\server\\share path: C:\\x | y & !z", chat=lexical)
        assert len(store.lexical_search(raw_tx, lexical, "u", "it's the server share", 5)) == 1
        assert store.lexical_search(raw_tx, lexical, "u", "'|&!:*()\\", 5) == []


@pytest.fixture
def seeded(raw_tx: Tx) -> Tx:
    store_with(raw_tx, "bigram", "我对花生过敏", 'quote " and * and NEAR( and AND OR \' | ! :*')
    return raw_tx


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
def test_any_question_is_a_valid_query(seeded: Tx, question: str) -> None:
    raw_tx, store = seeded, MemoryStore("bigram")
    got = store.lexical_search(raw_tx, "c", "u", question, 5)  # never a query syntax error
    assert len(got) <= 2
    if fts_query(question) is None:
        assert got == []
    tri = trigram_query(question)
    if tri is not None and raw_tx.dialect == "sqlite":
        raw_tx.execute("SELECT count(*) FROM memory_trigrams WHERE memory_trigrams MATCH ?", [tri]).fetchone()
