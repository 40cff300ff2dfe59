"""Optional embeddings: an OpenAI-compatible ``/embeddings`` client and a numpy index per chat.

Vectors are stored normalised, as float32 blobs in ``memories.vector``; the index keeps each
chat's matrix in memory (loaded on first use, dropped when the chat's memories change) and
ranks by cosine similarity.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import openai

from robot import Engine, Tx

__all__ = ["CHANNEL", "EmbeddingClient", "EmbeddingError", "VectorIndex", "from_blob", "to_blob"]

log = logging.getLogger(__name__)
Vector = npt.NDArray[np.float32]
CHANNEL = "memory"
"""Notifications of a chat's memories changing: ``"<origin> <chat key>"``."""


class EmbeddingError(Exception):
    """The embedding endpoint failed; recall falls back to lexical search."""


def to_blob(vector: Sequence[float] | Vector) -> bytes:
    """Normalised float32 bytes."""
    arr = np.asarray(vector, dtype=np.float32)
    if arr.ndim != 1 or not arr.size:
        raise ValueError(f"a vector is one list of numbers, not shape {arr.shape}")
    norm = float(np.linalg.norm(arr))
    return (arr / norm if norm > 0 else arr).astype(np.float32).tobytes()


def from_blob(blob: bytes) -> Vector:
    return np.frombuffer(blob, dtype=np.float32)


class EmbeddingClient:
    """``POST {base_url}/embeddings`` through the ``openai`` SDK."""

    def __init__(self, model: str, base_url: str | None, api_key: str | None, timeout_s: float = 15) -> None:
        self.model = model
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s,
                                          max_retries=1)

    async def embed(self, texts: Sequence[str]) -> list[bytes]:
        """One normalised float32 blob per text, in order."""
        try:
            resp = await self._client.embeddings.create(model=self.model, input=list(texts))
        except Exception as exc:  # the SDK's tree, transport errors: the caller falls back
            raise EmbeddingError(type(exc).__name__) from None
        try:  # an answer that is not one list of numbers per text: lexical recall, the memory kept
            ordered = sorted(resp.data, key=lambda d: d.index)
            blobs = [to_blob(d.embedding) for d in ordered]
        except (TypeError, ValueError, AttributeError) as exc:
            raise EmbeddingError(f"the vectors could not be read ({type(exc).__name__})") from None
        if len(blobs) != len(texts):
            raise EmbeddingError(f"asked for {len(texts)} vectors, got {len(blobs)}")
        return blobs

    async def aclose(self) -> None:
        await self._client.close()


@dataclass
class _ChatMatrix:
    ids: npt.NDArray[np.int64]
    group: npt.NDArray[np.bool_]
    users: npt.NDArray[np.object_]
    matrix: npt.NDArray[np.float32]


class VectorIndex:
    """Per-chat matrices of normalised vectors; ``load`` rows, ``search`` by cosine.

    Each process keeps its own: a write announces the chat (:meth:`announce`), and every other process
    following the database (:meth:`follow`) drops its copy of that chat's matrix.
    """

    def __init__(self) -> None:
        self._chats: dict[str, _ChatMatrix] = {}
        self._stamps: dict[str, int] = {}
        self._epoch = 0  # part of every stamp: drop_all changes them all
        self.origin = uuid.uuid4().hex  # this index's own announcements need no reload

    def follow(self, db: Engine) -> None:
        """Drop a chat's matrix when another process announces a change to it, and every matrix when
        such announcements may have been missed (the database's notifications were cut for a while)."""
        db.subscribe(CHANNEL, self._heard)
        db.after_gap(self.drop_all)

    def _heard(self, payload: str) -> None:
        origin, _, chat = payload.partition(" ")
        if origin != self.origin:
            self.drop(chat)

    def announce(self, db: Tx, chats: Iterable[str]) -> None:
        """Tell the other processes (after ``db`` commits) that these chats' memories changed."""
        for chat in sorted(set(chats)):
            db.notify(CHANNEL, f"{self.origin} {chat}")

    def stamp(self, chat: str) -> int:
        """Changes whenever the chat's vectors change; pass it to :meth:`load`."""
        return (self._epoch << 32) + self._stamps.get(chat, 0)

    def loaded(self, chat: str) -> bool:
        return chat in self._chats

    def load(self, chat: str, rows: Sequence[tuple[int, str, str, bytes]], stamp: int | None = None) -> None:
        """Cache the chat's matrix, unless its vectors changed since ``stamp`` (a read racing a write)."""
        if stamp is not None and stamp != self.stamp(chat):
            return
        dims = {len(r[3]) for r in rows}
        if len(dims) > 1:  # a model change: keep the vectors of the newest width only
            width = len(rows[-1][3])
            rows = [r for r in rows if len(r[3]) == width]
        matrix = (np.stack([from_blob(r[3]) for r in rows]) if rows else np.zeros((0, 0), dtype=np.float32))
        self._chats[chat] = _ChatMatrix(
            ids=np.array([r[0] for r in rows], dtype=np.int64),
            group=np.array([r[1] == "group" for r in rows], dtype=np.bool_),
            users=np.array([r[2] for r in rows], dtype=np.object_),
            matrix=matrix.astype(np.float32))

    def drop(self, chat: str) -> None:
        """Forget the chat's matrix (new vectors): the next search reloads it."""
        self._stamps[chat] = self._stamps.get(chat, 0) + 1
        self._chats.pop(chat, None)

    def drop_all(self) -> None:
        """Forget every chat's matrix; a load already under way (any chat's) is not cached either."""
        self._epoch += 1
        self._chats.clear()

    def discard(self, chat: str, ids: Sequence[int]) -> None:
        """Take deleted memories out of the chat's matrix without reloading it."""
        m = self._chats.get(chat)
        if m is not None and len(ids) and len(m.ids):
            gone = np.isin(m.ids, np.asarray(list(ids), dtype=np.int64))
            if gone.any():
                keep = ~gone
                self._chats[chat] = _ChatMatrix(m.ids[keep], m.group[keep], m.users[keep], m.matrix[keep])

    def search(self, chat: str, user_id: str, query: bytes, limit: int, min_similarity: float) -> list[int]:
        """Visible ids, most similar first, at least ``min_similarity``."""
        m = self._chats.get(chat)
        q = from_blob(query)
        if m is None or not len(m.ids) or m.matrix.shape[1] != q.shape[0]:
            return []
        sims = m.matrix @ q
        ok = (m.group | (m.users == user_id)) & (sims >= min_similarity)
        idx = np.flatnonzero(ok)
        if not len(idx):
            return []
        top = idx[np.argsort(-sims[idx], kind="stable")[:limit]]
        return [int(m.ids[i]) for i in top]
