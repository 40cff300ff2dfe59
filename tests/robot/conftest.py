"""Shared seams for the robot core tests: a test plugin, a bot factory and a clean environment."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
from pydantic import BaseModel, Field

from function_calls import ChatModel, Tool, ToolContext, ToolError, ToolResult, Toolset, tool_function
from robot.bot import Bot
from robot.channels.base import Channel
from robot.config import Settings
from robot.plugin import Plugin
from robot.testing import MemoryChannel

_ENV_PREFIXES = ("QUNBOT_", "OPENAI_", "PERPLEXITY_")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own QUNBOT_*/OPENAI_* variables must not change what the tests see."""
    for key in list(os.environ):
        if key.startswith(_ENV_PREFIXES):
            monkeypatch.delenv(key)


class NoteArgs(BaseModel):
    text: str = Field(description="what to note")
    times: int = Field(1, ge=1, le=5, description="how many times")


class WhoArgs(BaseModel):
    target: str = Field(description="a user id")


@tool_function(aliases=["n"], examples=["/n 买牛奶 2"])
async def note(ctx: ToolContext[object], args: NoteArgs) -> ToolResult:
    """Take a note (answers the user by itself)."""
    if args.text == "boom":
        raise ToolError("boom happened", user_message="记不下来：boom")
    return ToolResult.reply(f"noted for {ctx.caller.user_name}: {args.text} x{args.times}")


@tool_function(admin_only=True)
async def purge(ctx: ToolContext[object]) -> ToolResult:
    """Delete everything (admins only)."""
    return ToolResult.reply(f"purged by {ctx.caller.user_id}")


@tool_function(group_admin=True)
async def mute(ctx: ToolContext[object]) -> ToolResult:
    """Mute the chat (its group owner/admins, or a bot admin)."""
    return ToolResult.reply(f"muted by {ctx.caller.user_id}")


@tool_function(scope="group")
async def kick(ctx: ToolContext[object], args: WhoArgs) -> ToolResult:
    """Kick someone (groups only)."""
    return ToolResult.reply(f"kicked {args.target}")


@tool_function(scope="private")
async def whisper(ctx: ToolContext[object]) -> ToolResult:
    """Whisper (private chats only)."""
    return ToolResult.reply("psst")


@tool_function(require_at=True)
async def poke(ctx: ToolContext[object]) -> ToolResult:
    """Poke (only when the bot is addressed directly)."""
    return ToolResult.reply("poked")


TEST_TOOLS = Toolset("testkit", [note, purge, mute, kick, whisper, poke])


class Amount(BaseModel):
    amount: int = Field(ge=0)


def admin_transfer(done: list[int]) -> Tool:
    """A ``transfer`` tool an admin must approve; each run's amount goes into ``done``."""
    @tool_function(confirm="admin")
    async def transfer(ctx: ToolContext[object], args: Amount) -> ToolResult:
        """Move money (an admin must approve)."""
        done.append(args.amount)
        return ToolResult(content=f"transferred {args.amount}")
    return transfer


@pytest.fixture
def plugin() -> Plugin[Any]:
    """A plugin holding the test tools; their ``ctx.deps`` is the bot."""
    return Plugin("testkit", TEST_TOOLS)


class BotFactory(Protocol):
    async def __call__(
        self,
        model: ChatModel | None = None,
        *,
        channel: Channel | None = None,
        plugins: list[Plugin[Any]] | None = None,
        data_dir: Path | None = None,
        start: bool = True,
        own_key: bool = False,
        **sections: dict[str, Any],
    ) -> tuple[Bot, Any]: ...


@pytest.fixture
async def make_bot(tmp_path: Path, plugin: Plugin[Any]) -> AsyncIterator[BotFactory]:
    """Build (and start) a bot on a MemoryChannel; every bot is stopped at teardown.

    Rate limits are raised unless a test sets ``limits=``; the outbox retries quickly. Bots in other
    data_dirs share the first one's ``secret.key``, as every process sharing a database must (an
    owner copies it); ``own_key=True`` leaves a bot with whatever its data_dir has.
    """
    bots: list[Bot] = []

    async def make(
        model: ChatModel | None = None,
        *,
        channel: Channel | None = None,
        plugins: list[Plugin[Any]] | None = None,
        data_dir: Path | None = None,
        start: bool = True,
        own_key: bool = False,
        **sections: dict[str, Any],
    ) -> tuple[Bot, Any]:
        bot_section = {"data_dir": data_dir or tmp_path, **sections.pop("bot", {})}
        key = Path(bot_section["data_dir"]) / "secret.key"
        first = next((b.settings.bot.data_dir / "secret.key" for b in bots), None)
        if not own_key and first is not None and first.exists() and not key.exists():
            key.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(first, key)
        limits = sections.pop("limits", {"user_burst": 1000, "chat_burst": 1000})
        data: dict[str, Any] = {"bot": bot_section, "limits": limits, **sections}
        settings = Settings(**data)
        ch = channel or MemoryChannel()
        bot = Bot(settings, model=model, channels=[ch], plugins=plugins if plugins is not None else [plugin])
        bot.outbox.retry_base_s = 0.02
        bot.outbox.retry_max_s = 0.1
        bots.append(bot)
        if start:
            await bot.start()
        return bot, ch

    yield make
    for bot in bots:
        await bot.stop(flush_timeout_s=0.5)


async def console_ready(proc: asyncio.subprocess.Process, timeout: float = 20.0) -> bytes:
    """Read a ``qunbot run`` process's log (stderr) until its console channel is ready; what it said."""
    assert proc.stderr is not None
    seen = b""
    async with asyncio.timeout(timeout):
        while b"channel console ready" not in seen:
            line = await proc.stderr.readline()
            assert line, f"qunbot run exited early: {seen.decode()[-2000:]}"
            seen += line
    return seen


async def eventually(condition: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> None:
    """Poll until ``condition`` holds (a hang guard, not a timing assertion)."""
    async with asyncio.timeout(timeout):
        while True:
            value = condition()
            if not isinstance(value, bool):
                value = await value
            if value:
                return
            await asyncio.sleep(0.01)


@pytest.fixture
def until() -> Callable[..., Awaitable[None]]:
    """``await until(lambda: ...)``: poll a condition with a generous hang guard."""
    return eventually
