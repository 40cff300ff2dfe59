"""Lexical terms: CJK bigrams match two-character queries where SQLite's trigram tokenizer cannot."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from memory.store import MemoryStore
from memory.terms import fts_query, index_terms, query_terms, trigram_query
from robot.storage.sqlite import SQLiteTx

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def store_with(lexical: str, *texts: str) -> tuple[MemoryStore, SQLiteTx]:
    store = MemoryStore(lexical)  # type: ignore[arg-type]
    db = SQLiteTx(sqlite3.connect(":memory:"))
    store.schema(db)
    for t in texts:
        store.insert(db, chat="c", kind="group", user_id="u", user_name="", text=t, now=NOW)
    return store, db


def test_index_and_query_terms() -> None:
    assert index_terms("我对花生过敏 OK!") == "我 对 花 生 过 敏 我对 对花 花生 生过 过敏 ok"
    assert query_terms("我对什么过敏？") == ["我对", "对什", "么过", "过敏"]  # 什么: two function characters
    assert query_terms("猫") == ["猫"] and query_terms("的") == []


def test_two_character_queries_match_with_bigrams_not_with_trigrams() -> None:
    facts = ("我对花生过敏", "我们组周会改到周四了")
    bigram, bdb = store_with("bigram", *facts)
    trigram, tdb = store_with("trigram", *facts)
    for query, expected in (("过敏", 1), ("周会", 2), ("我对什么过敏", 1)):
        assert bigram.lexical_search(bdb, "c", "u", query, 5)[:1] == [expected]
        assert trigram.lexical_search(tdb, "c", "u", query, 5) == []


def test_switching_the_tokenizer_rebuilds_the_index() -> None:
    _, db = store_with("bigram", "我对花生过敏")
    trigram = MemoryStore("trigram")
    trigram.schema(db)
    assert trigram.lexical_search(db, "c", "u", "花生过敏", 5) == [1]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_any_question_is_a_valid_fts_query(question: str) -> None:
    store, db = store_with("bigram", "我对花生过敏", 'quote " and * and NEAR( and AND OR')
    got = store.lexical_search(db, "c", "u", question, 5)  # never an FTS5 syntax error
    assert set(got) <= {1, 2}
    if fts_query(question) is None:
        assert got == []
    tri = trigram_query(question)
    if tri is not None:
        db.execute("SELECT count(*) FROM memory_trigrams WHERE memory_trigrams MATCH ?", [tri]).fetchone()
