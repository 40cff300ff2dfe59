"""What a tool handler receives besides its arguments, and what it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, Literal, TypeVar
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field

from function_calls.model import Usage

__all__ = ["Allowance", "Caller", "ToolContext", "ToolResult"]

D = TypeVar("D")


class Caller(BaseModel):
    """Who is asking and where: always taken from the platform, never from model arguments."""

    model_config = ConfigDict(frozen=True)

    platform: str = "local"
    user_id: str = "user"
    user_name: str = ""
    chat_id: str = "local"
    chat_kind: Literal["group", "private"] = "private"
    #: A bot admin, or the owner/an admin of this group (``group_admin`` tools check it).
    is_admin: bool = False
    #: A configured bot admin (``[bot] admins``): what ``admin_only`` tools require.
    bot_admin: bool = False
    addressed: bool = True
    #: The platform id of the message being answered ("" for scheduled runs).
    message_id: str = ""
    #: The bot account that received the message or owns the chat ("" when the platform has one).
    account: str = ""
    #: The sender is an anonymous group member: their id is not an account that can own things.
    anonymous: bool = False

    @property
    def qualified_user(self) -> str:
        return f"{self.platform}:{self.user_id}"

    @property
    def group_admin(self) -> bool:
        """A bot admin, or the owner/an admin of the group this call comes from (never in private)."""
        return self.bot_admin or (self.is_admin and self.chat_kind == "group")


@dataclass
class Allowance:
    """What the calling run may still let its tools spend, shared by the calls of one turn: a tool that
    spends model tokens (a tier's sub-run) takes its cap from it before it starts, and gives back what it
    did not use. Each of the turn's ``calls`` may take an even part at most: calls run at once can neither
    each take all of it nor leave nothing to the others (two plans asked for at once both run)."""

    left: int
    calls: int = 1

    def __post_init__(self) -> None:
        self._each = self.left // max(1, self.calls)

    def take(self, tokens: int) -> int:
        """Up to ``tokens`` of what is left, within a call's part (0 when nothing is), now taken."""
        got = max(0, min(tokens, self.left, self._each))
        self.left -= got
        return got

    def give_back(self, tokens: int) -> None:
        """Return what a tool took and did not spend."""
        self.left += max(0, tokens)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ToolContext(Generic[D]):
    """Per-call context. ``deps`` is whatever the tool's plugin set up (typed by the plugin)."""

    deps: D
    caller: Caller = field(default_factory=Caller)
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    run_id: str = ""
    tool_call_id: str = ""
    clock: Callable[[], datetime] = _utcnow
    #: "model" when the LLM called the tool, "command" for a /command typed by a person,
    #: "scheduled" for a command its owner stored to run later (a reminder in command mode).
    via: Literal["model", "command", "scheduled"] = "model"
    #: What the run that called it has left for its tools (None: no run's cap binds it, a /command).
    allowance: Allowance | None = None

    def now(self) -> datetime:
        """The current instant, aware UTC (a test clock when one is injected)."""
        return self.clock()

    def local_now(self) -> datetime:
        """The current instant in the chat's zone."""
        return self.clock().astimezone(self.zone)


class ToolResult(BaseModel):
    """A tool's outcome.

    ``content`` goes to the model. ``user_messages`` go to the person directly. ``continue_``
    says whether the model must see the result: an action tool whose ``user_messages`` already
    answer (``continue_=False``) ends the run without another model call.
    """

    model_config = ConfigDict(frozen=True)

    content: str
    user_messages: tuple[str, ...] = ()
    continue_: bool = Field(default=True, serialization_alias="continue")
    is_error: bool = False
    data: dict[str, object] | None = None
    #: Model tokens the tool itself spent (a summary's map-reduce): added to the run's usage and budget.
    usage: Usage | None = None

    @classmethod
    def reply(cls, text: str, *, content: str | None = None, data: dict[str, object] | None = None,
              usage: Usage | None = None) -> ToolResult:
        """An action result that answers the user itself: no further model turn is needed."""
        return cls(content=content or text, user_messages=(text,), continue_=False, data=data, usage=usage)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A failure the model should see and may correct."""
        return cls(content=message, is_error=True)
