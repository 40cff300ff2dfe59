"""Settings of the reminders plugin: the ``[reminders]`` table (``QUNBOT_REMINDERS__KEY`` overrides)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ReminderSettings"]


class ReminderSettings(BaseModel):
    """Limits, the late-delivery window and what scheduled prompts may use.

    Per-chat time zones live in the bot core (``[bot] zones``), not here.
    """

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
        default_factory=lambda: ["perplexity_search"],
        description="tools a scheduled prompt may call, by name or /command (e.g. search); an unknown one stops the "
        "start"
    )
    durable_writes: bool = Field(
        True, description="sync a new or deleted reminder to disk (SQLite synchronous=FULL) before confirming it, "
        "so a power loss cannot undo what the user was told; false saves a few ms per /remind (see "
        "bench/bench_durability.py)"
    )
    command_tools: list[str] = Field(
        default_factory=lambda: ["summary"],
        description="commands a reminder in command mode may run at its time, as typed or by tool name (e.g. "
        "summary: a daily digest); an unknown one stops the start"
    )
    prompt_concurrency: int = Field(
        8, ge=1, description="scheduled prompts that may run the model at the same time; the rest wait their turn"
    )
    merge_chat: bool = Field(
        True, description="true: a group's on-time reminders of different people due together share one message "
        "mentioning each of them (a same-second burst needs far fewer sends; /forget me by any of them removes it "
        "from the history); false: only one person's reminders due together share a message"
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_zones(cls, data: object) -> object:
        # Older configs set per-chat zones here; say where they went instead of "extra inputs".
        if isinstance(data, dict) and "zones" in data:
            raise ValueError("zones moved to the [bot] table: set [bot] zones instead of [reminders] zones")
        return data

    @field_validator("prompt_tools", "command_tools", mode="before")
    @classmethod
    def _json_from_env(cls, value: object) -> object:
        # Environment overrides arrive as text: QUNBOT_REMINDERS__PROMPT_TOOLS='["a", "b"]'.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("expected a JSON list, e.g. [\"perplexity_search\"]") from None
        return value
