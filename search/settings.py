"""Settings for the ``search`` plugin (Perplexity web search)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["SearchSettings"]


class SearchSettings(BaseModel):
    """How the search plugin reaches Perplexity and how much it shows.

    ``endpoint``: ``"agent"`` is the Agent API (``POST /v1/responses``), ``"chat"`` the classic
    Sonar chat completions (``POST /chat/completions``); ``"auto"`` tries the Agent API first and falls
    back to chat completions when the agent endpoint refuses the request (400/403/422: for that
    search only) or is missing (404/405/501: remembered, later searches go to chat completions; if
    chat completions then answers 404/410, the Agent API is tried again).

    ``model``: a Sonar model (``"sonar"``, ``"sonar-pro"``; sent to the Agent API as
    ``"perplexity/<name>"``), an Agent API ``provider/model`` id, or an Agent API preset
    (``"fast-search"``, ``"pro-search"``, ...; chat completions then use ``"sonar"``).
    """

    model_config = ConfigDict(extra="forbid")

    api_key: SecretStr | None = Field(default=None, description="Perplexity API key; None disables search")
    base_url: str = Field(default="https://api.perplexity.ai", description="API root, without /v1")
    endpoint: Literal["auto", "agent", "chat"] = "auto"
    model: str = Field(default="sonar", min_length=1)
    timeout_s: float = Field(default=30, gt=0, le=600, description="per-request timeout in seconds")
    max_answer_chars: int = Field(
        default=1500, ge=50, description="longest reply shown in chat, sources included"
    )
    max_sources: int = Field(default=5, ge=0, le=20)
    user_rate_per_hour: int = Field(default=20, ge=0,
                                    description="answered searches one user may have per hour; 0 turns search off")
    chat_rate_per_hour: int = Field(default=60, ge=0,
                                    description="answered searches one chat may have per hour; 0 turns search off")
    bot_rate_per_hour: int = Field(default=200, ge=0,
                                   description="answered searches the whole bot may have per hour (caps the bill); "
                                   "0 turns search off")

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: object) -> object:
        # An empty QUNBOT_ variable should mean "not configured", not "send an empty bearer token".
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, SecretStr) and not value.get_secret_value().strip():
            return None
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return value
