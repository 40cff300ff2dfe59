"""Embeddings through the real openai SDK against a local /v1/embeddings server; fusion; fallback."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import memory.service as service_module
import memory.tools
from function_calls.testing import ScriptedModel, text
from memory.service import fuse
from memory.testing import FakeEmbeddingServer, HashingModel
from memory.vectors import VectorIndex, to_blob
from tests.memory.conftest import ask, running

CONCEPTS = {"allergic": "ALLERGY", "allergy": "ALLERGY", "过敏": "ALLERGY", "peanut": "PEANUT",
            "peanuts": "PEANUT", "花生": "PEANUT"}


def settings(server: FakeEmbeddingServer) -> dict[str, object]:
    return {"embedding_model": "fake-embed", "embedding_base_url": server.base_url, "embedding_api_key": "k"}


async def test_a_paraphrase_in_another_language_is_found_only_with_embeddings(tmp_path: Path) -> None:
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path / "a", memory=settings(server)) as (bot, ch):
        await ask(ch, "/remember I am allergic to peanuts")
        await ask(ch, "/remember 周会改到周四")
        assert "allergic to peanuts" in await ask(ch, "/recall 花生过敏")
        blob = await bot.db.run(lambda db: db.execute("SELECT vector FROM memories WHERE id = 1").fetchone()[0])
        vec = np.frombuffer(blob, dtype=np.float32)
        assert vec.shape == (256,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
        assert server.requests[0]["model"] == "fake-embed"
    async with running(tmp_path / "b") as (_, ch):
        await ask(ch, "/remember I am allergic to peanuts")
        assert "没有找到" in await ask(ch, "/recall 花生过敏")


async def test_a_failing_embedding_endpoint_falls_back_to_lexical(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path, memory=settings(server)) as (bot, ch):
        server.fail = True
        assert "记住了" in await ask(ch, "/remember 我对花生过敏")
        assert "花生过敏" in await ask(ch, "/recall 过敏")
        stored = await bot.db.run(lambda db: db.execute("SELECT vector FROM memories").fetchone()[0])
        assert stored is None
    assert "lexical" in caplog.text and "花生" not in caplog.text


@pytest.fixture
def short_tool_timeouts() -> Iterator[None]:
    """The tools' 30 s timeouts as 1 s (the test's embedding timeout is scaled down alike)."""
    tools = (memory.tools.remember, memory.tools.recall)
    before = [t.timeout_s for t in tools]
    for t in tools:
        object.__setattr__(t, "timeout_s", 1.0)  # a frozen Tool: what the real 30 s stands for
    yield
    for t, timeout in zip(tools, before, strict=True):
        object.__setattr__(t, "timeout_s", timeout)


@pytest.mark.usefixtures("short_tool_timeouts")
async def test_an_endpoint_that_hangs_leaves_the_memory_for_lexical_recall(tmp_path: Path) -> None:
    """Each embedding (the SDK's retry included) gives up after embedding_timeout_s, inside the tools' timeout:
    a hung endpoint timed /remember out with nothing kept, and /recall with nothing found."""
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path, memory={**settings(server), "embedding_timeout_s": 0.6}) as (bot, ch):
        server.delay_s = 30
        assert "记住了" in await ask(ch, "/remember 我对花生过敏")
        assert await bot.db.run(lambda db: db.execute("SELECT count(*) FROM memories").fetchone()[0]) == 1
        assert "花生过敏" in await ask(ch, "/recall 过敏")


@pytest.mark.parametrize("garbage", [["0.1", "x"], [[0.1, 0.2], [0.3]], []])
async def test_an_endpoint_answering_garbage_keeps_the_memory_for_lexical_recall(tmp_path: Path, garbage: object) -> None:
    """A 200 whose vectors are no list of numbers: /remember failed ("执行失败了") and kept nothing."""
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path, memory=settings(server)) as (_, ch):
        server.garbage = garbage
        assert "记住了" in await ask(ch, "/remember 我对花生过敏")
        assert "花生过敏" in await ask(ch, "/recall 过敏")


async def test_vector_matches_respect_privacy(tmp_path: Path) -> None:
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path, memory=settings(server)) as (_, ch):
        await ask(ch, "/remember I am allergic to peanuts", user="u1")
        assert "没有找到" in await ask(ch, "/recall 花生过敏", user="u2")
        assert "没有找到" in await ask(ch, "/recall 花生过敏", user="u1", chat=ch.chat("g2"))


def test_reciprocal_rank_fusion() -> None:
    assert fuse([1, 2, 3], [3, 4]) == [3, 1, 2, 4]  # 3 is in both lists
    assert fuse([], [5, 6]) == [5, 6]
    assert fuse([7, 8], []) == [7, 8]


def test_the_vector_index_discards_deleted_and_ignores_a_stale_load() -> None:
    index = VectorIndex()
    a, b = to_blob([1.0, 0.0]), to_blob([0.8, 0.6])
    index.load("c", [(1, "group", "u", a), (2, "user", "u", b), (3, "user", "v", a)])
    assert index.search("c", "u", a, 5, 0.1) == [1, 2]  # 3 is v's own
    index.discard("c", [1])
    assert index.search("c", "u", a, 5, 0.1) == [2]
    stamp = index.stamp("c")
    index.drop("c")  # a write happened while a reader was loading
    index.load("c", [(1, "group", "u", a)], stamp)
    assert not index.loaded("c")


async def test_a_slow_embedding_endpoint_does_not_hold_up_the_answer(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "AUTO_EMBED_S", 0.2)
    model = ScriptedModel(lambda r: text("嗯"))
    async with FakeEmbeddingServer(HashingModel(concepts=CONCEPTS)) as server, \
            running(tmp_path, model=model, memory=settings(server)) as (_, ch):
        await ask(ch, "/remember 我对花生过敏")
        server.delay_s = 3.0
        started = time.monotonic()
        await ask(ch, "我对什么过敏", at_bot=True)
        assert time.monotonic() - started < 2.0
        assert "花生" in str(model.requests[0].messages[-2]["content"])  # the lexical context is still there
