"""``ask_user``: the model asks the person a question and its run pauses until the answer.

The pause itself is the bot's (:mod:`robot.approvals`): the tool is declared ``confirm="input"``,
so the run stops before it; when the asker answers (or the timeout passes) the run resumes and
the tool returns the answer, or "用户暂未回复".
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from function_calls import ToolContext, ToolResult, tool_function

__all__ = ["GRANT", "NO_REPLY", "AskUserArgs", "Grant", "Questions", "ask_user"]

#: What ``ask_user`` gives the model when the user did not answer in time.
NO_REPLY = "用户暂未回复"


class AskUserArgs(BaseModel):
    tip: str = Field(description="the question to show the user", min_length=1, max_length=500)
    timeout_s: int = Field(300, ge=10, le=3600, description="how long to wait for the answer, in seconds")


@dataclass(frozen=True)
class Grant:
    """What a resumed run may do: a verdict per pending call (its id, tool and arguments, used once:
    a later call that an id-less provider or a reused id names alike is asked about anew), and the
    user's answer (input)."""

    verdicts: dict[tuple[str, str, str], bool | str] = field(default_factory=dict)
    answer: str | None = None


GRANT: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("qunbot_grant", default=None)


@tool_function(confirm="input", sequential=True, timeout_s=10)
async def ask_user(ctx: ToolContext[object], args: AskUserArgs) -> ToolResult:
    """向用户提问并等待回答 (ask the user for input and wait). Use when you cannot go on without the user's answer."""
    grant = GRANT.get()
    answer = grant.answer if grant is not None else None
    return ToolResult(content=answer if answer else NO_REPLY)


class Questions:
    """Questions asked from inside a running tool (the ``plan`` tier), answered in this process.

    A paused chat run is a snapshot that survives restarts (:mod:`robot.approvals`); a plan runs in
    this process anyway, so its ``ask_user`` simply waits here for the asker's next message in the
    chat, which the pipeline hands to :meth:`answer` before anything else sees it.
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], asyncio.Future[str]] = {}

    def answer(self, chat_key: str, qualified_user: str, text: str) -> bool:
        """Give ``text`` to a question this person was asked in this chat; False when none waits."""
        future = self._waiting.get((chat_key, qualified_user))
        if future is None or future.done():
            return False
        future.set_result(text)
        return True

    async def ask(self, chat_key: str, qualified_user: str, timeout_s: float) -> str:
        """Wait for the person's next message in the chat; :data:`NO_REPLY` after ``timeout_s``.

        The caller posts the question first; a second question to the same person replaces the first.
        """
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        key = (chat_key, qualified_user)
        previous = self._waiting.get(key)
        if previous is not None and not previous.done():
            previous.set_result(NO_REPLY)
        self._waiting[key] = future
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return NO_REPLY
        finally:
            if self._waiting.get(key) is future:
                del self._waiting[key]
