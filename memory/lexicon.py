"""Lexical recall on PostgreSQL: the same terms and the same BM25 ranking as SQLite's FTS5.

PostgreSQL has no FTS5, and its own text search (parsers, ``ts_rank``) splits and ranks
differently. So the terms are computed here as for SQLite (:mod:`memory.terms`: CJK bigrams and
words, or trigrams) and stored verbatim, with their positions, in a ``tsvector`` column of
``memories`` under a GIN index: no parser, no dictionary, no extension. A search matches any
of the question's terms (``@@``, through the index) and ranks the visible matches by FTS5's BM25
(k1 = 1.2, b = 0.75, IDF floored at 1e-6), with the document frequencies counted through the
same index and the corpus size and total length kept in one ``memory_lexicon`` row, updated in
the transaction that adds or deletes a memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

from memory.terms import index_terms, query_terms, text_trigrams, trigram_terms
from robot import Tx

__all__ = ["POSTGRES_V1", "added", "doc_terms", "removed", "search", "sync", "tsquery", "tsvector"]

Lexical = Literal["bigram", "trigram"]

POSTGRES_V1 = """
    CREATE INDEX IF NOT EXISTS memories_terms ON memories USING gin (terms);
    CREATE TABLE IF NOT EXISTS memory_lexicon (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        lexical TEXT NOT NULL,
        docs BIGINT NOT NULL,
        terms BIGINT NOT NULL
    );
    INSERT INTO memory_lexicon (id, lexical, docs, terms) VALUES (1, '', 0, 0) ON CONFLICT (id) DO NOTHING
"""
"""What PostgreSQL adds to the ``memory`` schema's step 1 (memory.store): the terms' GIN index and the
corpus figures BM25 needs."""

_MAX_POSITION = 16383  # PostgreSQL's largest tsvector position
_MAX_LEXEME = 2046  # and longest lexeme, in bytes

# BM25 as FTS5 computes it. ``tf``: each question term's count in every memory that has any
# (one pass through the GIN index, whatever the chat: the IDF is the whole corpus's, as in FTS5);
# ``w``: each term's IDF from its document frequency; then the visible memories are scored.
# MATERIALIZED: each part runs once, not again for every candidate.
_SEARCH = """
WITH s AS MATERIALIZED (SELECT docs::float8 AS n, GREATEST(terms::float8 / GREATEST(docs, 1), 1e-9) AS avgdl
                        FROM memory_lexicon WHERE id = 1),
     tf AS MATERIALIZED (SELECT m.id, m.chat, m.kind, m.user_id, m.n_terms, u.lexeme, cardinality(u.positions) AS f
                         FROM memories m CROSS JOIN LATERAL unnest(m.terms) AS u
                         WHERE m.terms @@ ?::tsquery AND u.lexeme = ANY(?::text[])),
     w AS MATERIALIZED (SELECT tf.lexeme, GREATEST(ln((s.n - count(*) + 0.5) / (count(*) + 0.5)), 1e-6) AS idf
                        FROM tf, s GROUP BY tf.lexeme, s.n)
SELECT tf.id FROM tf JOIN w ON w.lexeme = tf.lexeme, s
WHERE tf.chat = ? AND (tf.kind = 'group' OR tf.user_id = ?)
GROUP BY tf.id
ORDER BY sum(w.idf * tf.f * 2.2 / (tf.f + 1.2 * (0.25 + 0.75 * tf.n_terms / s.avgdl))) DESC, tf.id DESC
LIMIT ?
"""


def _fit(term: str) -> str:
    """A term as a lexeme (at most 2,046 bytes): a longer one becomes its head and a hash of the whole,
    so it still matches itself and only itself."""
    if len(term.encode()) <= _MAX_LEXEME:
        return term
    head = term.encode()[:_MAX_LEXEME - 20].decode(errors="ignore")
    return f"{head}#{hashlib.blake2b(term.encode(), digest_size=8).hexdigest()}"


def _quote(term: str) -> str:
    """A lexeme as tsvector/tsquery input reads it verbatim."""
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def doc_terms(text: str, lexical: Lexical) -> list[str]:
    """The tokens FTS5 would index for ``text``, in order (duplicates kept: they are the tf), as lexemes."""
    return [_fit(t) for t in (index_terms(text).split() if lexical == "bigram" else text_trigrams(text))]


def tsvector(terms: Sequence[str]) -> str:
    """``'term':1,4 'other':2`` (input text for a ``tsvector``; positions give each term's count)."""
    positions: dict[str, list[int]] = {}
    for i, term in enumerate(terms, start=1):
        positions.setdefault(term, []).append(min(i, _MAX_POSITION))
    return " ".join(f"{_quote(t)}:{','.join(map(str, sorted(set(p))))}" for t, p in positions.items())


def tsquery(terms: Sequence[str]) -> str:
    """Any of ``terms`` (input text for a ``tsquery``)."""
    return " | ".join(_quote(t) for t in terms)


def added(db: Tx, n_terms: int) -> None:
    """Count a new memory into the corpus figures (in the transaction that inserted it)."""
    db.execute("UPDATE memory_lexicon SET docs = docs + 1, terms = terms + ? WHERE id = 1", [n_terms])


def removed(db: Tx, n_terms: int) -> None:
    """Count a deleted memory out of the corpus figures (its terms went with its row)."""
    db.execute("UPDATE memory_lexicon SET docs = docs - 1, terms = terms - ? WHERE id = 1", [n_terms])


def search(db: Tx, chat: str, user_id: str, query: str, limit: int, lexical: Lexical) -> list[int]:
    """Ids of visible matches, best BM25 first (as FTS5 ranks them)."""
    terms = [_fit(t) for t in (query_terms(query) if lexical == "bigram" else trigram_terms(query))]
    if not terms:
        return []
    rows = db.execute(_SEARCH, [tsquery(terms), terms, chat, user_id, limit]).fetchall()
    return [int(r[0]) for r in rows]


def sync(db: Tx, lexical: Lexical) -> None:
    """Re-index every memory if the index holds the other kind of terms (or was never filled)."""
    row = db.execute("SELECT lexical FROM memory_lexicon WHERE id = 1 FOR UPDATE").fetchone()
    if row is not None and row[0] == lexical:
        return
    for mid, text in db.execute("SELECT id, text FROM memories").fetchall():
        terms = doc_terms(text, lexical)
        db.execute("UPDATE memories SET terms = ?::tsvector, n_terms = ? WHERE id = ?",
                   [tsvector(terms), len(terms), mid])
    db.execute("INSERT INTO memory_lexicon (id, lexical, docs, terms) SELECT 1, ?, count(*), COALESCE(sum(n_terms), 0)"
               " FROM memories ON CONFLICT (id) DO UPDATE SET lexical = excluded.lexical, docs = excluded.docs,"
               " terms = excluded.terms", [lexical])
