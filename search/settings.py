"""Settings for the ``search`` plugin (Perplexity web search)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from robot import check_url

__all__ = [
    "AGENT_SONAR_MODELS",
    "CHAT_MODELS",
    "DEEP_RESEARCH",
    "EFFORTS",
    "MAX_TIMEOUT_S",
    "Effort",
    "Recency",
    "SearchSettings",
]

Recency = Literal["hour", "day", "week", "month", "year"]
"""How recent the pages a search uses must be (Perplexity's ``search_recency_filter``)."""
Effort = Literal["fast", "low", "medium"]
"""Agent API effort levels offered here (``high``/``xhigh`` are long research runs: not offered)."""
EFFORTS: frozenset[str] = frozenset({"fast", "low", "medium"})

CHAT_MODELS = frozenset({"sonar", "sonar-pro", "sonar-reasoning-pro"})
"""Models Sonar chat completions (``POST /chat/completions``) take, as Perplexity's docs list them."""
AGENT_SONAR_MODELS = frozenset({"sonar"})
"""Sonar models the Agent API takes (as ``perplexity/<name>``); the docs list only ``perplexity/sonar``."""
DEEP_RESEARCH = frozenset({
    "sonar-deep-research", "perplexity/sonar-deep-research", "deep-research", "advanced-deep-research",
})
"""Names of long-running research modes: minutes per answer, more than a chat reply can wait."""
MAX_TIMEOUT_S = 600.0
"""The largest ``timeout_s``: the tools' own timeouts, fixed when they are defined, leave room for it."""
_OLD_PRESETS = frozenset({"fast-search", "pro-search"})
_PROVIDER_MODEL = re.compile(r"^[a-z0-9][a-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.:@-]*$")
_LANGUAGE = re.compile(r"^[a-z]{2}$")
_DOMAIN = re.compile(r"^-?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")


class SearchSettings(BaseModel):
    """How the search plugin reaches Perplexity and how much it shows.

    ``endpoint``: ``"agent"`` is the Agent API (``POST /v1/responses``), ``"chat"`` the classic
    Sonar chat completions (``POST /chat/completions``); ``"auto"`` tries the Agent API first and falls
    back to chat completions when the agent endpoint refuses the request (403/422, or a 400 that
    does not concern the model: for that search only) or cannot serve it (404/405/501, or a 400
    about the model: remembered, later searches go to chat completions; if chat completions then
    answers 404/410, the Agent API is tried again).

    ``model`` is mapped per endpoint as Perplexity's docs list the models:

    * a Sonar name: chat completions take ``sonar``, ``sonar-pro`` and ``sonar-reasoning-pro``; the
      Agent API only ``sonar`` (sent as ``perplexity/sonar``). With ``"auto"``, a Sonar model the
      Agent API does not list goes straight to chat completions; with ``"agent"`` it is refused here.
    * a third-party ``provider/model`` id (``openai/gpt-5.1``): Agent API only, searching through its
      ``web_search`` tool; chat completions (``"auto"`` fallback) then use ``sonar``.

    ``effort`` (``fast``, ``low``, ``medium``) picks a Perplexity-managed Agent API configuration
    instead of a model; chat completions then use ``model``. The deprecated ``preset`` is never
    sent. Deep research (``sonar-deep-research``, effort ``high``/``xhigh``) runs for minutes, more
    than a chat reply waits, so it is no search model: it is the separate ``deep_research`` tool,
    run in background mode (``research_per_user_day``, off by default).

    Filters apply to every search on both endpoints (on the Agent API through
    ``tools=[{"type": "web_search", "filters": ...}]``): ``search_recency_filter``,
    ``search_domain_filter`` (up to 20 domains; ``-example.com`` excludes one),
    ``language_preference`` (ISO 639-1, e.g. ``"zh"``) and ``max_output_tokens``.
    """

    model_config = ConfigDict(extra="forbid")

    api_key: SecretStr | None = Field(default=None, description="Perplexity API key; None disables search")
    base_url: str = Field(default="https://api.perplexity.ai", description="API root, without /v1")
    endpoint: Literal["auto", "agent", "chat"] = "auto"
    model: str = Field(default="sonar", min_length=1)
    effort: Effort | None = Field(default=None, description="Agent API effort level instead of a model")
    search_recency_filter: Recency | None = Field(default=None, description="only pages this recent")
    search_domain_filter: list[str] = Field(default_factory=list, max_length=20,
                                            description="domains to search (\"-domain\" to exclude)")
    language_preference: str | None = Field(default=None, description="ISO 639-1 answer language, e.g. zh")
    max_output_tokens: int | None = Field(default=None, ge=16, le=16_000, description="longest answer, in tokens")
    timeout_s: float = Field(default=30, gt=0, le=MAX_TIMEOUT_S,
                             description="per-request timeout in seconds; a search (a fallback or a retry "
                             "included) gives up after twice this")
    max_answer_chars: int = Field(
        default=1500, ge=50, description="longest reply shown in chat, sources included"
    )
    max_sources: int = Field(default=5, ge=0, le=20)
    user_rate_per_hour: int = Field(default=20, ge=0,
                                    description="searches one user may have per hour, timed-out and unusable ones "
                                                "too (billed); 0 turns search off")
    chat_rate_per_hour: int = Field(default=60, ge=0,
                                    description="searches one chat (a forum group: all its topics) may have per "
                                                "hour, timed-out and unusable ones too (billed); 0 turns search off")
    bot_rate_per_hour: int = Field(default=200, ge=0,
                                   description="searches the whole bot may have per hour, timed-out and unusable "
                                               "ones too (billed; this caps the bill); 0 turns search off")
    research_per_user_day: int = Field(
        default=0, ge=0, le=100,
        description="deep research runs (sonar-deep-research in background mode, minutes and about a dollar "
                    "each) one user may start per day; 0: deep research is not offered")
    research_poll_s: float = Field(default=20, gt=0, le=600, description="seconds between polls of a running "
                                                                           "deep research")
    research_timeout_min: float = Field(default=60, gt=0, le=1440,
                                        description="a deep research not done after this long is given up")
    research_max_chars: int = Field(default=4000, ge=200, description="longest deep-research report sent to chat")

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: object) -> object:
        # An empty QUNBOT_ variable should mean "not configured", not "send an empty bearer token".
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, SecretStr) and not value.get_secret_value().strip():
            return None
        # A key with a trailing newline or \r (a Windows .env) failed as "could not reach Perplexity".
        return value.strip() if isinstance(value, str) else SecretStr(value.get_secret_value().strip()) \
            if isinstance(value, SecretStr) else value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return check_url(value) or value  # (a port that is no number failed at the first search, in a traceback)

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        value = value.strip()
        if value in DEEP_RESEARCH:
            raise ValueError(f"{value!r} is deep research, which runs for minutes: not offered for chat search")
        if value in _OLD_PRESETS:
            raise ValueError(f"{value!r} is a deprecated Agent API preset; set effort = \"fast\"/\"low\"/\"medium\"")
        name = value.removeprefix("perplexity/")
        if name in CHAT_MODELS:
            return name
        if "/" in value and _PROVIDER_MODEL.match(value) and not value.startswith("perplexity/"):
            return value
        raise ValueError(f"unknown model {value!r}: use one of {sorted(CHAT_MODELS)} or a provider/model id "
                         "the Agent API lists (e.g. openai/gpt-5.1)")

    @field_validator("language_preference")
    @classmethod
    def _check_language(cls, value: str | None) -> str | None:
        if value is not None and not _LANGUAGE.match(value.strip().lower()):
            raise ValueError("language_preference must be an ISO 639-1 code such as \"zh\" or \"en\"")
        return None if value is None else value.strip().lower()

    @field_validator("search_domain_filter")
    @classmethod
    def _check_domains(cls, value: list[str]) -> list[str]:
        cleaned = [d.strip().lower() for d in value if d.strip()]
        bad = [d for d in cleaned if not _DOMAIN.match(d)]
        if bad:
            raise ValueError(f"not a domain name: {', '.join(bad)} (write example.com, or -example.com to exclude)")
        return cleaned

    @model_validator(mode="after")
    def _model_fits_endpoint(self) -> SearchSettings:
        if self.endpoint == "agent" and self.effort is None and "/" not in self.model \
                and self.model not in AGENT_SONAR_MODELS:
            raise ValueError(f"the Agent API does not offer {self.model!r} (only perplexity/sonar among Sonar "
                             "models): use endpoint = \"chat\" or \"auto\", model = \"sonar\", or an effort level")
        if self.endpoint == "chat" and "/" in self.model:
            raise ValueError(f"{self.model!r} is an Agent API model; chat completions take {sorted(CHAT_MODELS)}")
        return self

    def chat_model(self) -> str:
        """The model name chat completions get: ``model`` when it is a Sonar name, else ``sonar``."""
        return self.model if self.model in CHAT_MODELS else "sonar"

    def agent_serves(self) -> bool:
        """Whether the Agent API can serve these settings (effort, ``perplexity/sonar`` or a provider model)."""
        return self.effort is not None or "/" in self.model or self.model in AGENT_SONAR_MODELS
