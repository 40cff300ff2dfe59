"""Settings for the ``memory`` plugin (the ``[memory]`` table)."""

from __future__ import annotations

import logging
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from robot import check_url

__all__ = ["MemorySettings"]

log = logging.getLogger("memory")


class MemorySettings(BaseModel):
    """How memories are searched, strengthened, weakened and slept on.

    ``interval(level) = interval_hours × interval_factor^level``. A recall in the top ``top_n``
    raises the level when the memory was idle longer than its interval (always at level 0); at
    ``level_cap`` it becomes long-term. A match ranked below ``top_n`` lowers it when idle beyond
    its interval; at −1 it is deleted. ``sleep_time`` (the chat's local time) runs sleep nightly.
    Without ``embedding_model`` recall is lexical only.
    """

    model_config = ConfigDict(extra="forbid")

    top_n: int = Field(default=5, ge=1, le=20, description="memories a recall returns")
    candidates: int = Field(default=30, ge=1, le=200,
                            description="matches considered per ranking; those below top_n may decay")
    interval_hours: float = Field(default=1.0, gt=0, description="interval at level 0, in hours")
    interval_factor: float = Field(default=3.0, ge=1, description="interval growth per level")
    level_cap: int = Field(default=6, ge=1, le=30, description="level at which a memory becomes long-term")
    max_chars: int = Field(default=1500, ge=20, le=10000, description="longest memory (about 300 words)")
    max_per_scope: int = Field(default=2000, ge=1, description="memories one person (or group) may keep per chat")
    group_share: float = Field(default=0.25, gt=0, le=1, description="share of a group's max_per_scope one member's "
                               "group memories may take (so one member cannot fill it)")
    lexical: Literal["bigram", "trigram"] = Field(
        default="bigram", description="bigram: CJK bigrams + words (matches 2-character queries); trigram: SQLite's")
    auto_context: bool = Field(default=True, description="show relevant memories to the model before each run")
    auto_context_n: int = Field(default=3, ge=0, le=20)
    auto_context_tokens: int = Field(default=300, ge=0, le=4000, description="token bound of the automatic context")
    sleep_time: str = Field(default="03:30", description="nightly sleep, HH:MM in each chat's zone")
    sleep_sample: int = Field(default=20, ge=1, le=10000, description="memories sleep samples per chat")
    post_dreams: bool = Field(default=False, description="post the dream of a night's sleep to the chat")
    embedding_model: str | None = Field(default=None, description="OpenAI-compatible embedding model; None: lexical only")
    embedding_base_url: str | None = Field(default=None, description="the /v1 root of the embedding API")
    embedding_api_key: SecretStr | None = None
    embedding_timeout_s: float = Field(default=15, gt=0, le=120, description="seconds an embedding may take, retry "
                                       "included; then lexical (at most 20 is used: the tools time out at 30)")
    min_similarity: float = Field(default=0.3, ge=-1, le=1, description="cosine below which a vector is no match")

    @field_validator("embedding_timeout_s")
    @classmethod
    def _capped(cls, value: float) -> float:
        if value > 20:  # (accepted up to 120 before: an older config still starts, and is told)
            log.warning("[memory] embedding_timeout_s = %g: at most 20 s is used (the tools time out at 30)", value)
        return value

    @field_validator("sleep_time")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", value.strip())
        if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
            raise ValueError("sleep_time must be HH:MM (24-hour)")
        return f"{int(m.group(1)):02d}:{m.group(2)}"

    @field_validator("embedding_model", "embedding_base_url", "embedding_api_key", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value  # (a key's trailing \r broke its header)

    # A mistyped port ("Invalid port: 'Pa55'", a password's start) failed at the first embedding, in a traceback.
    _url = field_validator("embedding_base_url")(check_url)
