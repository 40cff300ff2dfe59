"""Lexical terms for FTS5: words for alphabetic text, bigrams (and lone characters) for CJK.

SQLite's trigram tokenizer matches nothing shorter than three characters, and a Chinese
question ("我对什么过敏") often shares no trigram with the fact ("我对花生过敏"). So the index
holds precomputed terms instead, tokenised by ``unicode61`` as space-separated words: each
CJK run gives its characters and its bigrams ("过敏" matches), alphabetic runs give lowercase
words. The bench (``bench/bench_memory.py``) compares this with the trigram tokenizer.

Text is normalised first (:func:`normalise`): NFKC (full-width ``ＱＱ１２３`` as typed by an IME is
``QQ123``), lowercase, and Latin letters without their accents (SQLite's ``unicode61`` drops them,
PostgreSQL's stored lexemes did not: ``cafe`` found ``Café`` on one engine only). A CJK run is never
part of a word: ``ABC公司的周会`` gives ``abc`` and the bigrams of ``公司的周会``.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

__all__ = ["fts_query", "index_terms", "normalise", "query_terms", "term_set", "text_trigrams", "trigram_query",
           "trigram_terms"]

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af\U00020000-\U0003134f"
_RUN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")
# Function characters that make noisy single-character terms in questions.
_STOP_CHARS = frozenset("的了吗呢吧啊是我你他她它们在有和与就都也还么什谁哪")
_STOP_WORDS = frozenset({
    "a", "an", "the", "is", "are", "was", "were", "be", "to", "of", "in", "on", "at", "for", "and", "or", "do",
    "does", "did", "what", "who", "which", "when", "where", "how", "my", "me", "i", "you", "your", "it", "its",
    "that", "this", "with", "about",
})


@lru_cache(maxsize=4096)
def _fold(char: str) -> str:
    base = unicodedata.normalize("NFD", char)[0]
    return base if base.isascii() and base.isalpha() else char  # é -> e; not ø, й, が (SQLite keeps those)


def normalise(text: str) -> str:
    """The text as it is indexed and searched: NFKC, lowercase, Latin letters without accents."""
    lowered = unicodedata.normalize("NFKC", text).lower()
    return lowered if lowered.isascii() else "".join(map(_fold, lowered))


def _runs(text: str) -> list[str]:
    return _RUN.findall(normalise(text))


def index_terms(text: str) -> str:
    """The text as the terms the index stores (space-separated)."""
    out: list[str] = []
    for run in _runs(text):
        if _IS_CJK.match(run):
            out.extend(run)
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
        else:
            out.append(run)
    return " ".join(out)


def _pick(terms: dict[str, None], limit: int) -> list[str]:
    """At most ``limit`` terms: a quarter from the start, the rest from the end (a long message
    usually asks its question last, and sometimes first)."""
    found = list(terms)
    if len(found) <= limit:
        return found
    head = limit // 4
    return found[:head] + found[len(found) - (limit - head):]


def query_terms(text: str, limit: int = 48) -> list[str]:
    """Distinct terms of a question: CJK bigrams, lone characters only for one-character runs (see :func:`_pick`)."""
    seen: dict[str, None] = {}
    for run in _runs(text):
        if _IS_CJK.match(run):
            if len(run) == 1:
                if run not in _STOP_CHARS:
                    seen.setdefault(run)
                continue
            for i in range(len(run) - 1):
                pair = run[i:i + 2]
                if not (pair[0] in _STOP_CHARS and pair[1] in _STOP_CHARS):
                    seen.setdefault(pair)
        elif run not in _STOP_WORDS:
            seen.setdefault(run)
    return _pick(seen, limit)


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def fts_query(text: str) -> str | None:
    """An FTS5 ``MATCH`` expression (any term), or None when the text has no terms."""
    terms = query_terms(text)
    return " OR ".join(_quote(t) for t in terms) if terms else None


def trigram_terms(text: str, limit: int = 48) -> list[str]:
    """Distinct 3-character windows of the question's runs (what the trigram search looks for)."""
    grams: dict[str, None] = {}
    for run in _runs(text):
        for i in range(max(len(run) - 2, 0)):
            grams.setdefault(run[i:i + 3])
    return _pick(grams, limit)


def trigram_query(text: str, limit: int = 48) -> str | None:
    """For the trigram tokenizer: any 3-character window of the question's runs."""
    picked = trigram_terms(text, limit)
    return " OR ".join(_quote(g) for g in picked) if picked else None


def text_trigrams(text: str) -> list[str]:
    """Every 3-character window of the normalised text, spaces included (as SQLite's trigram tokenizer)."""
    lowered = normalise(text)
    return [lowered[i:i + 3] for i in range(len(lowered) - 2)]


def term_set(text: str) -> set[str]:
    """Bigrams and words of a text, to tell whether an answer used a memory."""
    out: set[str] = set()
    for run in _runs(text):
        if _IS_CJK.match(run):
            out.update([run[i:i + 2] for i in range(len(run) - 1)] if len(run) > 1 else [run])
        elif run not in _STOP_WORDS:
            out.add(run)
    return out
