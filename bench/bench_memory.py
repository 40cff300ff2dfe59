"""Memory recall: recall@5 (lexical, embeddings, fused), latency at 10k and 100k memories, size on disk,
for SQLite and PostgreSQL side by side.

Run: ``.venv/bin/python bench/bench_memory.py [--quick]`` (``--quick``: 10k only). PostgreSQL is a
throwaway local server (``robot.storage.pgtesting.PgCluster``: Debian's binaries, fsync off, loopback
TCP); without its binaries the bench says so and measures SQLite only. With jieba
installed (``pip install jieba``; not a dependency) it also measures lexical search over jieba
words, the segmenter the design note suggests, against the bigrams the plugin uses. The recall set (``bench/memory_set.py``)
has 540 memories and 240 questions (Chinese and English; direct questions, paraphrases and
keywords), one right memory each. Embeddings come from ``memory.testing.FakeEmbeddingServer``
through the real ``openai`` SDK: a deterministic hashing model with a small concept table, so
the embedding figures show the plumbing and the fusion, not what a real model would reach.

recall@5 is measured without the strength rules (ranking only): applying them would delete
the memories that rank below the top 5 while the bench runs. Latency: ``MemoryService.rank``
(the ranking a recall does) and ``recall`` (ranking plus the strength transaction), all
memories in one chat visible to the asker (the worst case), through the engine as the bot uses it
(SQLite's writer thread; PostgreSQL's pool). "same top 5" counts the questions whose PostgreSQL
lexical top 5 equals SQLite's (both rank by BM25: see ``memory.lexicon``).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_set import CONCEPTS, Question, build, filler

from function_calls import Caller
from memory import EmbeddingClient, MemoryService, MemorySettings
from memory.testing import FakeEmbeddingServer, HashingModel
from memory.vectors import to_blob
from robot import Engine
from robot.storage import SQLiteDatabase
from robot.storage.pgtesting import PgCluster, server_binaries
from robot.storage.postgres import PostgresDatabase

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ME = Caller(platform="bench", user_id="u1", chat_id="g1", chat_kind="group")
CHAT = "bench:group:g1"


class Place:
    """Where a bench database lives: a file in ``tmp`` (SQLite) or a new database on the cluster."""

    def __init__(self, kind: str, tmp: Path, cluster: PgCluster | None) -> None:
        self.kind, self.tmp, self.cluster = kind, tmp, cluster

    def engine(self, name: str) -> Engine:
        if self.kind == "sqlite":
            return SQLiteDatabase(self.tmp / f"{name}.sqlite3")
        assert self.cluster is not None
        return PostgresDatabase(self.cluster.create_database(name.replace("-", "_")))


async def open_service(db: Engine, lexical: str, embedder: EmbeddingClient | None,
                       candidates: int = 30) -> MemoryService:
    settings = MemorySettings(lexical=lexical, candidates=candidates)  # type: ignore[arg-type]
    service = MemoryService(db, settings, clock=lambda: NOW, embedder=embedder)
    await db.open()
    await service.prepare()
    return service


async def load(db: Engine, service: MemoryService, texts: list[str], model: HashingModel | None) -> list[int]:
    vectors = [to_blob(model.embed(t)) if model else None for t in texts]
    ids: list[int] = []
    for start in range(0, len(texts), 2000):  # one transaction per 2,000 rows, as a busy bot would commit
        def work(sdb: Any, start: int = start) -> list[int]:
            return [service.store.insert(sdb, chat=CHAT, kind="group", user_id="u1", user_name="", text=t, now=NOW,
                                         vector=v)
                    for t, v in zip(texts[start:start + 2000], vectors[start:start + 2000], strict=True)]

        ids += await db.transaction(work)
    service.index.drop(CHAT)
    return ids


async def ranks(service: MemoryService, questions: list[Question], mode: str,
                embedder: EmbeddingClient | None) -> list[list[int]]:
    out: list[list[int]] = []
    for q in questions:
        if mode == "lexical":
            got = await service.db.run(lambda db, t=q.text: service.store.lexical_search(db, CHAT, "u1", t, 30))
        elif mode == "embeddings":
            assert embedder is not None
            vec = (await embedder.embed([q.text]))[0]
            if not service.index.loaded(CHAT):
                service.index.load(CHAT, await service.db.run(lambda db: service.store.vectors(db, CHAT)))
            got = service.index.search(CHAT, "u1", vec, 30, service.settings.min_similarity)
        else:
            got = await service.rank(ME, q.text)
        out.append(got)
    return out


def jieba_ranks(facts: list[str], questions: list[Question]) -> list[list[int]] | None:
    """Lexical search over jieba words (``cut_for_search``), for comparison; None without jieba."""
    try:
        import jieba  # type: ignore[import-untyped]
    except ImportError:
        return None
    import logging
    import sqlite3

    jieba.setLogLevel(logging.WARNING)
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(terms, tokenize = 'unicode61')")

    def words(text: str) -> list[str]:
        return [w.lower() for w in jieba.cut_for_search(text) if w.strip() and (w.isalnum())]

    for i, fact in enumerate(facts, start=1):
        conn.execute("INSERT INTO t (rowid, terms) VALUES (?, ?)", [i, " ".join(words(fact))])
    out: list[list[int]] = []
    for q in questions:
        terms = [w for w in dict.fromkeys(words(q.text)) if w not in STOP]
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in terms)
        rows = conn.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT 30", [match]).fetchall() \
            if match else []
        out.append([int(r[0]) for r in rows])
    return out


STOP = frozenset({
    "的", "了", "吗", "呢", "吧", "啊", "是", "我", "你", "他", "她", "什么", "谁", "哪", "a", "an", "the", "is", "are",
    "what", "who", "which", "when", "where", "how", "do", "does", "to", "of", "in", "on", "at", "for",
})


def recall_at(found: list[list[int]], questions: list[Question], answer: dict[tuple[str, str], int],
              k: int = 5) -> dict[str, float]:
    hits: dict[str, list[bool]] = defaultdict(list)
    for got, q in zip(found, questions, strict=True):
        ok = answer[q.key] in got[:k]
        for group in ("all", q.form, q.lang):
            hits[group].append(ok)
    return {g: sum(v) / len(v) for g, v in hits.items()}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def size_mb(db: Engine) -> float:
    """The memory tables and their indexes, after a checkpoint (SQLite: the file and its WAL)."""
    if isinstance(db, SQLiteDatabase):
        await db.run_raw(lambda sdb: sdb.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        path = Path(db.path)
        return sum(f.stat().st_size for f in path.parent.glob(path.name + "*")) / 1e6
    return float(await db.run(lambda tx: tx.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relkind = 'r'"
        " AND c.relname LIKE 'memor%'").fetchone()[0])) / 1e6


async def recall_rows(place: Place, facts: list[Any], questions: list[Question], model: HashingModel,
                      embedder: EmbeddingClient) -> tuple[list[tuple[str, dict[str, float]]], list[list[int]]]:
    """recall@5 rows for one engine, and its bigram lexical rankings (to compare engines)."""
    rows: list[tuple[str, dict[str, float]]] = []
    bigram: list[list[int]] = []
    for lexical in ("trigram", "bigram"):
        db = place.engine(f"recall-{lexical}")
        service = await open_service(db, lexical, embedder)
        ids = await load(db, service, [f.text for f in facts], model)
        answer = {f.key: i for f, i in zip(facts, ids, strict=True)}
        found = await ranks(service, questions, "lexical", None)
        rows.append((f"lexical ({lexical})", recall_at(found, questions, answer)))
        if lexical == "bigram":
            bigram = [[ids.index(i) for i in got] for got in found]  # by fact position: ids differ per engine
            if place.kind == "sqlite":
                segmented = jieba_ranks([f.text for f in facts], questions)
                if segmented is None:
                    print("(jieba not installed: `pip install jieba` to compare a segmenter)")
                else:  # jieba's rowids are 1..n in fact order, like the store's ids here
                    rows.append(("lexical (jieba words)", recall_at(segmented, questions, answer)))
            rows.append(("embeddings (fake model)", recall_at(
                await ranks(service, questions, "embeddings", embedder), questions, answer)))
            rows.append(("fused (bigram + embeddings)", recall_at(
                await ranks(service, questions, "fused", embedder), questions, answer)))
        await db.close()
    return rows, bigram


async def latency(place: Place, total: int, mode: str, facts: list[Any], questions: list[Question],
                  model: HashingModel, embedder: EmbeddingClient) -> str:
    db = place.engine(f"{mode}-{total}")
    service = await open_service(db, "bigram", embedder if mode == "fused" else None)
    texts = [f.text for f in facts] + filler(total - len(facts))
    t0 = time.perf_counter()
    await load(db, service, texts, model if mode == "fused" else None)
    load_s = time.perf_counter() - t0
    await service.rank(ME, "warm up")  # first use loads the chat's vector matrix
    sample = questions[:100]
    rank_ms: list[float] = []
    for q in sample:
        t0 = time.perf_counter()
        await service.rank(ME, q.text)
        rank_ms.append((time.perf_counter() - t0) * 1000)
    recall_ms: list[float] = []
    for q in sample[:50]:
        t0 = time.perf_counter()
        await service.recall(ME, q.text)
        recall_ms.append((time.perf_counter() - t0) * 1000)
    line = (f"{place.kind:<11}{total:>8}  {mode:<9} {statistics.median(rank_ms):>9.1f} {pct(rank_ms, 0.99):>9.1f}"
            f" {statistics.median(recall_ms):>11.1f} {pct(recall_ms, 0.99):>11.1f} {await size_mb(db):>8.1f}"
            f" {total / load_s:>8.0f}")
    await db.close()
    return line


async def main(quick: bool) -> None:
    facts, questions = build()
    model = HashingModel(concepts=CONCEPTS)
    print(f"recall set: {len(facts)} memories, {len(questions)} questions "
          f"({sum(q.lang == 'zh' for q in questions)} Chinese, {sum(q.lang == 'en' for q in questions)} English; "
          f"{sum(q.form == 'ask' for q in questions)} direct, {sum(q.form == 'paraphrase' for q in questions)} "
          f"paraphrases, {sum(q.form == 'keywords' for q in questions)} keywords)")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(PgCluster()) if server_binaries() is not None else None
        if cluster is None:
            print("(PostgreSQL server binaries not found: SQLite only)")
        places = [Place("sqlite", tmp, None)] + ([Place("postgresql", tmp, cluster)] if cluster else [])
        async with FakeEmbeddingServer(model) as server:
            embedder = EmbeddingClient("fake-embed", server.base_url, "k")
            table: list[tuple[str, dict[str, float]]] = []
            bigrams: list[list[list[int]]] = []
            for place in places:
                rows, bigram = await recall_rows(place, facts, questions, model, embedder)
                table += [(f"{place.kind[:6]} {name}", r) for name, r in rows]
                bigrams.append(bigram)
            print(f"\n{'recall@5':<35}" + "".join(f"{h:>9}" for h in ("all", "direct", "paraphr", "keywords",
                                                                       "zh", "en")))
            for name, r in table:
                print(f"{name:<35}" + "".join(f"{r.get(g, 0):>9.2f}" for g in
                                              ("all", "ask", "paraphrase", "keywords", "zh", "en")))
            if len(bigrams) == 2:
                same = sum(a[:5] == b[:5] for a, b in zip(*bigrams, strict=True))
                print(f"same lexical (bigram) top 5 on both engines: {same}/{len(questions)} questions")
            print("\nlatency (ms), size and load rate, all memories in one chat:")
            print("engine     memories  mode       rank p50  rank p99  recall p50  recall p99  size MB   rows/s")
            for total in (10_000,) if quick else (10_000, 100_000):
                for mode in ("lexical", "fused"):
                    for place in places:
                        print(await latency(place, total, mode, facts, questions, model, embedder), flush=True)
            await embedder.aclose()


if __name__ == "__main__":
    asyncio.run(main("--quick" in sys.argv))
