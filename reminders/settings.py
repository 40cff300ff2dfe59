"""Settings of the reminders plugin: the ``[reminders]`` table (``QUNBOT_REMINDERS__KEY`` overrides)."""

from __future__ import annotations

import json
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ReminderSettings"]


class ReminderSettings(BaseModel):
    """Limits, the late-delivery window and the tools a scheduled prompt may use."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    grace_hours: float = Field(
        6.0, ge=0, description="a reminder due while the bot was down still fires this late; older ones are "
        "reported as missed"
    )
    max_per_user: int = Field(50, ge=1, description="active reminders one person may have (all chats)")
    max_per_chat: int = Field(200, ge=1, description="active reminders one chat may hold")
    max_content: int = Field(500, ge=1, le=500, description="longest reminder text or prompt, in characters")
    create_per_10min: int = Field(10, ge=1, description="reminders one person may create per 10 minutes")
    prompt_tools: list[str] = Field(
        default_factory=lambda: ["perplexity_search"], description="tools a scheduled prompt may call"
    )
    zones: dict[str, str] = Field(
        default_factory=dict,
        description='per-chat IANA zone, keyed by chat key, e.g. {"onebot:group:123" = "Europe/Berlin"}; '
        "other chats use the bot's timezone",
    )

    @field_validator("prompt_tools", "zones", mode="before")
    @classmethod
    def _json_from_env(cls, value: object) -> object:
        # Environment overrides arrive as text: QUNBOT_REMINDERS__PROMPT_TOOLS='["a", "b"]'.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("expected JSON, e.g. [\"perplexity_search\"] or {\"chat\": \"Asia/Shanghai\"}") from None
        return value

    @field_validator("zones")
    @classmethod
    def _check_zones(cls, value: dict[str, str]) -> dict[str, str]:
        for chat, zone in value.items():
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"zone {zone!r} for chat {chat!r} is not an IANA time zone") from None
        return value
