"""Background (async) chat completions in the fake Perplexity server (private: used by ``search.testing``).

``POST /async/chat/completions`` (the ``perplexityai`` SDK's path; ``/v1/async/sonar`` is the
docs' newer twin) takes ``{"request": <chat completions body>, "idempotency_key"?}``, validated
with the SDK's ``AsyncApiChatCompletionsRequestInput``; the same key returns the same job. ``GET
.../{id}`` answers ``CREATED``, then ``IN_PROGRESS`` for a scripted number of polls, then
``COMPLETED`` with a chat-completion ``response`` (or ``FAILED`` with ``error_message``). Every
body sent is checked against the SDK's ``AsyncApiChatCompletionsResponseOutput`` first.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from perplexity.generated import api as sdk_api
from pydantic import ValidationError

from search._fakecheck import check_chat, error, validate

__all__ = ["ResearchJobs"]


@dataclass
class _Job:
    id: str
    request: dict[str, Any]
    created_at: int
    polls: int = 0


class ResearchJobs:
    """The fake's background jobs; ``polls`` GETs answer ``IN_PROGRESS`` before the result."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Job] = {}
        self.by_key: dict[str, str] = {}
        self.polls = 2
        self.failure: str | None = None

    def submit(self, body: dict[str, Any]) -> web.Response:
        unknown = sorted(set(body) - set(sdk_api.AsyncApiChatCompletionsRequestInput.model_fields))
        if unknown:
            return error(400, f"unknown parameter(s): {', '.join(unknown)}")
        try:
            sdk_api.AsyncApiChatCompletionsRequestInput.model_validate(body)
        except ValidationError as exc:
            detail = [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()]
            return web.json_response({"detail": detail}, status=422)
        request = body["request"]
        invalid = validate(request, "chat") if isinstance(request, dict) else error(400, "request must be an object")
        if invalid is not None:
            return invalid
        problem = check_chat(request)
        if problem:
            return error(400, problem)
        key = body.get("idempotency_key")
        if isinstance(key, str) and key in self.by_key:
            return self._send(self.jobs[self.by_key[key]], None)
        job = _Job(str(uuid.uuid4()), request, int(time.time()))
        self.jobs[job.id] = job
        if isinstance(key, str):
            self.by_key[key] = job.id
        return self._send(job, None)

    def poll(self, job_id: str, completion: Callable[[dict[str, Any]], dict[str, Any]]) -> web.Response:
        job = self.jobs.get(job_id)
        if job is None:
            return error(404, f"async request {job_id} not found")
        job.polls += 1
        return self._send(job, completion)

    def _send(self, job: _Job, completion: Callable[[dict[str, Any]], dict[str, Any]] | None) -> web.Response:
        body: dict[str, Any] = {"id": job.id, "model": job.request["model"], "created_at": job.created_at,
                                "status": "CREATED", "started_at": None, "completed_at": None, "failed_at": None,
                                "response": None, "error_message": None}
        if completion is not None:
            now = int(time.time())
            body["started_at"] = job.created_at
            if job.polls <= self.polls:
                body["status"] = "IN_PROGRESS"
            elif self.failure is not None:
                body.update(status="FAILED", failed_at=now, error_message=self.failure)
            else:
                body.update(status="COMPLETED", completed_at=now, response=completion(job.request))
        sdk_api.AsyncApiChatCompletionsResponseOutput.model_validate(body)  # the fake never sends a wrong shape
        return web.json_response(body)
