"""format_answer / format_for_model: citation renumbering, source limits, safe trimming."""

from __future__ import annotations

import inspect
import re

import pytest

from search import format as format_module
from search.client import SearchAnswer, SearchUsage, Source
from search.format import SOURCES_HEADER, format_answer, format_for_model

MARKER = re.compile(r"\[(\d+)\]")


def src(n: int, *, date: str | None = None) -> Source:
    return Source(title=f"Title {n}", url=f"https://example.com/articles/{n}/page", date=date)


def make(text: str, sources: list[Source]) -> SearchAnswer:
    return SearchAnswer(text=text, sources=sources, usage=SearchUsage(), endpoint="chat", model="sonar")


def split(reply: str) -> tuple[str, list[str]]:
    """(body, source lines) of a formatted reply."""
    if f"\n\n{SOURCES_HEADER}\n" not in reply:
        return reply, []
    body, lines = reply.split(f"\n\n{SOURCES_HEADER}\n")
    return body, lines.split("\n")


def test_sources_renumbered_in_citation_order_uncited_last() -> None:
    answer = make("Alpha[3] and beta[1]. Alpha again[3].", [src(1), src(2), src(3), src(4)])
    body, lines = split(format_answer(answer, max_chars=1000, max_sources=5))
    assert body == "Alpha[1] and beta[2]. Alpha again[1]."
    assert lines == [
        "[1] Title 3 - https://example.com/articles/3/page",
        "[2] Title 1 - https://example.com/articles/1/page",
        "[3] Title 2 - https://example.com/articles/2/page",
        "[4] Title 4 - https://example.com/articles/4/page",
    ]


def test_uncited_sources_go_first_when_over_max_sources() -> None:
    answer = make("One[2]. Two[4].", [src(1), src(2), src(3), src(4), src(5)])
    body, lines = split(format_answer(answer, max_chars=1000, max_sources=2))
    assert body == "One[1]. Two[2]."
    assert [line.split(" - ")[1] for line in lines] == [src(2).url, src(4).url]


def test_cited_sources_beyond_max_sources_lose_their_markers() -> None:
    answer = make("A[1]. B[2]. C[3][1].", [src(1), src(2), src(3)])
    body, lines = split(format_answer(answer, max_chars=1000, max_sources=2))
    assert body == "A[1]. B[2]. C[1]."
    assert len(lines) == 2


def test_zero_sources_and_unknown_markers() -> None:
    answer = make("Fact[1]. Other[9].", [src(1)])
    assert format_answer(answer, max_chars=1000, max_sources=0) == "Fact. Other."
    assert split(format_answer(answer, max_chars=1000, max_sources=3))[0] == "Fact[1]. Other."


def test_repeated_urls_share_one_number_and_runs_are_sorted() -> None:
    answer = make("X[3][1]. Y[2].", [src(1), src(1), src(2)])
    body, lines = split(format_answer(answer, max_chars=1000, max_sources=5))
    assert body == "X[1][2]. Y[2]."
    assert len(lines) == 2


def test_short_answer_is_untouched_and_has_no_header_without_sources() -> None:
    assert format_answer(make("就这样。", []), max_chars=100, max_sources=5) == "就这样。"


LONG_EN = (
    "Paris is the capital of France[2]. Its population is about 2.1 million[1][2]. "
    "The Eiffel Tower, finished in 1889, is 330 m tall[3]. More at https://example.org/a/very/long/path/to/read "
    "and in the census tables[4]. Tourism brings tens of millions of visitors a year[5]."
)
LONG_ZH = (
    "巴黎是法国的首都和最大城市[1]。巴黎人口约210万[2]，是欧洲最重要的文化中心之一[1][3]。"
    "埃菲尔铁塔建于1889年[4]，高约330米。详情见https://example.org/zh/paris/guide，以及人口普查资料[2]。"
    "每年有数千万游客到访巴黎[5]。"
)
LONG_URLS = (
    "Start here[1]. Query https://example.com/search?q=paris;lang=fr!top?page=2 then "
    "https://example.org/faq?a=1;b=2 and words after them[2]. Last one[3]."
)


@pytest.mark.parametrize("text", [LONG_EN, LONG_ZH, LONG_URLS])
@pytest.mark.parametrize("max_chars", list(range(20, 420, 9)))
def test_trimmed_reply_fits_and_keeps_markers_urls_and_sources_consistent(text: str, max_chars: int) -> None:
    sources = [src(n) for n in range(1, 6)]
    reply = format_answer(make(text, sources), max_chars=max_chars, max_sources=3)
    assert len(reply) <= max_chars
    body, lines = split(reply)
    # Every bracket in the body is a whole marker pointing at a listed source.
    assert body.count("[") == body.count("]") == len(MARKER.findall(body))
    assert all(1 <= int(n) <= len(lines) for n in MARKER.findall(body))
    # URLs in the text are whole or gone.
    for url in re.findall(r"https?://[^\s，]+", body):
        assert url.rstrip("…") in text and not url.endswith("…")
    # Source lines are whole, numbered 1..N, and each one still cited.
    assert [line.split(" ")[0] for line in lines] == [f"[{k}]" for k in range(1, len(lines) + 1)]
    for line in lines:
        assert line.split(" - ", 1)[1] in {s.url for s in sources}
    cited = {int(n) for n in MARKER.findall(body)}
    assert cited == set(range(1, len(lines) + 1))
    if len(reply) < len(text):
        assert body.endswith("…")


def test_chinese_answer_is_cut_after_a_full_sentence_with_its_markers() -> None:
    sources = [src(n) for n in range(1, 6)]
    reply = format_answer(make(LONG_ZH, sources), max_chars=200, max_sources=2)
    body, lines = split(reply)
    assert len(reply) <= 200
    assert body.endswith("。…")
    assert body.startswith("巴黎是法国的首都和最大城市[1]。")
    assert len(lines) == 2


def test_english_answer_is_not_cut_mid_word() -> None:
    reply = format_answer(make("word " * 50, []), max_chars=33, max_sources=0)
    assert reply == "word word word word word word…"


def test_tiny_budget_still_fits() -> None:
    answer = make(LONG_ZH, [src(1)])
    for max_chars in range(1, 12):
        assert len(format_answer(answer, max_chars=max_chars, max_sources=5)) <= max_chars


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        format_answer(make("x", []), max_chars=0, max_sources=1)
    with pytest.raises(ValueError):
        format_answer(make("x", []), max_chars=10, max_sources=-1)


def test_long_titles_are_shortened() -> None:
    answer = make("x[1]", [Source(title="T" * 200, url="https://example.com/")])
    _, lines = split(format_answer(answer, max_chars=1000, max_sources=1))
    assert lines[0].endswith("… - https://example.com/")
    assert len(lines[0]) < 120


def test_format_for_model_lists_every_source_with_dates() -> None:
    answer = make("Alpha[2]. Beta[1].\n\n\n\nGamma.", [src(1, date="2025-01-02"), src(2), src(3)])
    assert format_for_model(answer) == (
        "Alpha[1]. Beta[2].\n\nGamma.\n\n"
        "Sources:\n"
        "[1] Title 2 https://example.com/articles/2/page\n"
        "[2] Title 1 (2025-01-02) https://example.com/articles/1/page\n"
        "[3] Title 3 https://example.com/articles/3/page"
    )
    assert format_for_model(make("No sources[1].", [])) == "No sources."


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(format_module).items()
        if not name.startswith("_")
        and inspect.isfunction(value)
        and value.__module__ == format_module.__name__
    }
    assert public <= set(format_module.__all__)
    assert all(hasattr(format_module, name) for name in format_module.__all__)
