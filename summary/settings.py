"""Settings of the ``summary`` plugin: the ``[summary]`` table of ``qunbot.toml``.

How long chat history is kept is the core's ``[history]`` table (``retention_days``,
``max_messages``), not this one::

    [summary]
    max_request_tokens = 3000      # no single model call's prompt is larger
    max_chunks = 400               # at most this many map calls; beyond it the newest chunks are covered (and said so)

Environment overrides: ``QUNBOT_SUMMARY__MAX_CHUNKS=8`` and so on.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from robot import ChatRef, chat_key

__all__ = ["PROMPT_ALLOWANCE", "SummarySettings"]


def _prompt_key(text: str) -> str:
    """A ``[summary] prompts`` key: a chat key names one chat; ``platform:id`` any chat of that id (as it
    always did). A key no chat can have is refused, not ignored."""
    platform, kind, chat = chat_key(text).split(":", 2)
    return f"{platform}:{kind}:{chat}" if text.strip().startswith(f"{platform}:{kind}:") else f"{platform}:{chat}"

# Room the map/reduce instructions need besides the chat text (see mapreduce.py).
PROMPT_ALLOWANCE = 400


class SummarySettings(BaseModel):
    """How much a summary may cost and how long history is kept."""

    model_config = ConfigDict(extra="forbid")

    max_request_tokens: int = Field(3000, ge=800, le=1_000_000,
                                    description="largest prompt of any one model call, instructions included")
    max_chunks: int = Field(400, ge=1, le=4096,
                            description="most map calls per summary; beyond it the newest chunks are summarised and the reply says which period is left out")
    chunk_output_tokens: int = Field(300, ge=50, description="longest partial summary of one chunk")
    summary_output_tokens: int = Field(800, ge=100, description="longest final summary")
    max_message_tokens: int = Field(400, ge=20, description="a longer single message is cut with …")
    concurrency: int = Field(4, ge=1, le=32, description="map calls in flight at once")
    default_hours: float = Field(24, gt=0, le=168, description="window when there is no earlier summary")
    max_fetch: int = Field(20_000, ge=100, description="most messages read from history for one summary")
    salient_count: int = Field(5, ge=0, le=20, description="other salient messages (话题) quoted by the extractive summary")
    fact_count: int = Field(12, ge=0, le=50, description="decisions and action items listed by the extractive summary")
    link_count: int = Field(8, ge=0, le=50, description="links listed (whole) by the extractive summary")
    top_members: int = Field(5, ge=1, le=20, description="most active members listed by the extractive summary")
    user_cooldown_s: float = Field(60, ge=0, description="seconds between one member's AI summaries in a chat "
                                   "(a forum group's topics together; 0: none)")
    prompt: str = Field("", max_length=500, description="the owner's extra instructions for every AI summary (style, persona)")
    prompts: dict[str, str] = Field(default_factory=dict,
                                    description='per chat, "<platform>:<chat id>" (a group or a person of that id; '
                                    'or one chat: "<platform>:group:<id>", "<platform>:private:<id>") = instructions; '
                                    'overrides prompt there (a group\'s, in its forum topics too)')

    def prompt_for(self, chat: ChatRef) -> str:
        """The owner's instructions for ``chat``: its own ``prompts`` entry (by chat key, then ``platform:id``),
        else its group's (a forum topic's: what is set for a group holds in its topics), else ``prompt``."""
        return next((self.prompts[n] for n in chat.setting_names if n in self.prompts), self.prompt)

    @field_validator("prompts")
    @classmethod
    def _short_prompts(cls, value: dict[str, str]) -> dict[str, str]:
        long = [k for k, v in value.items() if len(v) > 500]
        if long:
            raise ValueError(f"prompts longer than 500 characters: {', '.join(long)}")
        return {_prompt_key(k): v for k, v in value.items()}

    @model_validator(mode="after")
    def _reduce_can_progress(self) -> SummarySettings:
        # A reduce request must hold at least two partial summaries, or merging never converges.
        if 2 * self.chunk_output_tokens + PROMPT_ALLOWANCE > self.max_request_tokens:
            raise ValueError(
                f"chunk_output_tokens ({self.chunk_output_tokens}) is too large for max_request_tokens "
                f"({self.max_request_tokens}): need 2 * chunk_output_tokens + {PROMPT_ALLOWANCE} <= max_request_tokens"
            )
        return self
