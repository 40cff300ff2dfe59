"""What the fake Perplexity server refuses (private: used by ``search.testing``).

The official SDK's request models (``perplexityai``) first, then what Perplexity's docs rule out
that the SDK's plain-string fields cannot: unknown fields, ``preset``, unlisted efforts and models.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from perplexity.generated import api as sdk_api
from pydantic import ValidationError

__all__ = ["AGENT_MODELS_DOCUMENTED", "CHAT_MODELS_DOCUMENTED", "check_agent", "check_chat", "error", "validate"]

CHAT_MODELS_DOCUMENTED = frozenset({"sonar", "sonar-pro", "sonar-reasoning-pro", "sonar-deep-research"})
"""Models Perplexity's docs list for Sonar chat completions."""
AGENT_MODELS_DOCUMENTED = frozenset({"perplexity/sonar"})
"""The only Perplexity model Perplexity's docs list for the Agent API (third-party ``provider/model`` besides)."""
_AGENT_PROVIDERS = frozenset({"openai", "anthropic", "google", "xai", "nvidia", "moonshotai"})
_EFFORTS = frozenset({"fast", "low", "medium", "high", "xhigh"})


def validate(body: dict[str, Any], endpoint: Literal["agent", "chat"]) -> web.Response | None:
    """The SDK's request model on the body: a 422 ``detail`` list (FastAPI's shape) when it fails."""
    model = sdk_api.ResponsesRequestInput if endpoint == "agent" else sdk_api.ApiChatCompletionsRequestInput
    unknown = sorted(set(body) - set(model.model_fields))
    if unknown:
        return error(400, f"unknown parameter(s): {', '.join(unknown)}")
    try:
        model.model_validate(body)
    except ValidationError as exc:
        detail = [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()]
        return web.json_response({"detail": detail}, status=422)
    return None


def check_chat(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("model"), str):
        return "model is required"
    if body["model"] not in CHAT_MODELS_DOCUMENTED:
        return f"Invalid model '{body['model']}'. Permitted models: {', '.join(sorted(CHAT_MODELS_DOCUMENTED))}"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    return None


def check_agent(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("input"), str | list) or not body["input"]:
        return "input is required"
    if "preset" in body:
        return "preset is deprecated: use effort"
    if not any(isinstance(body.get(k), str | list) for k in ("model", "models", "effort")):
        return "one of model, models or effort is required"
    if "effort" in body and str(body["effort"]).split("@")[0] not in _EFFORTS:
        return f"unknown effort '{body['effort']}'; use one of {', '.join(sorted(_EFFORTS))}"
    models = body.get("models") or ([body["model"]] if isinstance(body.get("model"), str) else [])
    for name in models:
        provider = str(name).split("/")[0]
        if name not in AGENT_MODELS_DOCUMENTED and (provider == "perplexity" or provider not in _AGENT_PROVIDERS):
            return f"model '{name}' is not supported by the Agent API"
    return None


def error(status: int, message: str) -> web.Response:
    """An error body as Perplexity sends it: ``{"error": {"message", "type", "code"}}``."""
    kind = (
        "rate_limit_exceeded"
        if status == 429
        else "server_error"
        if status >= 500
        else "invalid_request_error"
    )
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)
