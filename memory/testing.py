"""A local OpenAI-compatible ``/v1/embeddings`` server with a deterministic model, for tests and the bench.

:class:`HashingModel` embeds a text as a signed feature-hashing of its CJK character bigrams and
lowercase words, after mapping each through ``concepts`` (synonyms and translations to one
concept name: ``{"过敏": "ALLERGY", "allergic": "ALLERGY"}``). It is a stand-in for a real
model: similar texts get similar vectors, and the concept table plays the part of what a model
learned about paraphrases. The server answers ``encoding_format`` ``float`` and ``base64``
(the ``openai`` SDK asks for base64), records requests, fails on demand (``fail = True``) and
answers late on demand (``delay_s``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from aiohttp import web

from function_calls.testing import LoopbackServer

__all__ = ["FakeEmbeddingServer", "HashingModel"]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+|[^\W_]+", re.UNICODE)


class HashingModel:
    """Deterministic text -> unit vector of ``dim`` float32s."""

    def __init__(self, dim: int = 256, concepts: Mapping[str, str] | None = None) -> None:
        self.dim = dim
        self.concepts = dict(concepts or {})

    def features(self, text: str) -> list[str]:
        out: list[str] = []
        lowered = text.lower()
        for phrase, concept in self.concepts.items():  # multi-character synonyms, as a model would see them
            if phrase in lowered:
                out.extend([concept] * 2)
        for run in _CJK.findall(lowered):
            if "\u3400" <= run[0] <= "\ufaff":
                out.extend(run[i:i + 2] for i in range(len(run) - 1))
            else:
                out.append(self.concepts.get(run, run))
        return out

    def embed(self, text: str) -> list[float]:
        vec = np.zeros(self.dim, dtype=np.float64)
        for feature in self.features(text):
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            slot = int.from_bytes(digest[:4], "little") % self.dim
            vec[slot] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return [float(x) for x in (vec / norm if norm else vec)]


class FakeEmbeddingServer(LoopbackServer):
    """``POST /v1/embeddings`` answered by a :class:`HashingModel`."""

    def __init__(self, model: HashingModel | None = None) -> None:
        super().__init__()
        self.model = model or HashingModel()
        self.requests: list[dict[str, Any]] = []
        self.fail = False
        self.delay_s = 0.0
        #: Sent as every vector instead of the model's (a broken endpoint: ``["0.1", "x"]``), when set.
        self.garbage: Any = None

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self._embeddings)

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            return web.json_response({"error": {"message": "embedding backend down", "type": "server_error"}},
                                     status=500)
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return web.json_response({"error": {"message": "input must be a string or a list of strings"}},
                                     status=400)
        data: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            vec = self.model.embed(text)
            value: Any = vec if self.garbage is None else self.garbage
            if body.get("encoding_format") == "base64" and self.garbage is None:
                value = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(t) for t in texts)
        return web.json_response({"object": "list", "data": data, "model": body.get("model", "fake-embed"),
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
