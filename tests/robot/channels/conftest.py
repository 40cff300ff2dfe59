"""Shared seams for the channel tests: an inbox, a running channel, an HTTP client, a demo plugin.

The bot-level fixtures (``make_bot``, ``plugin``, ``until``) come from ``tests/robot/conftest.py``;
nothing here reuses their names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

import aiohttp
import pytest
from pydantic import BaseModel

from function_calls import ToolContext, ToolResult, Toolset, tool_function
from robot.bot import Bot
from robot.channels.base import Channel, PanelProvider
from robot.message import Message
from robot.plugin import Plugin

C = TypeVar("C", bound=Channel)


@pytest.fixture
def inbox() -> asyncio.Queue[Message]:
    """Where a channel started by ``running`` delivers what it receives."""
    return asyncio.Queue()


@pytest.fixture
def running(inbox: asyncio.Queue[Message]) -> Callable[[C], AbstractAsyncContextManager[C]]:
    """``async with running(channel) as ch:``: bound to ``inbox``, started, and stopped on the way out."""

    @asynccontextmanager
    async def run(channel: C) -> AsyncIterator[C]:
        channel.bind(inbox.put)
        await channel.start()
        try:
            yield channel
        finally:
            await channel.stop()

    return run


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp client for talking to a channel's loopback server."""
    async with aiohttp.ClientSession() as session:
        yield session


class WeatherArgs(BaseModel):
    city: str


@tool_function
async def weather(ctx: ToolContext[object], args: WeatherArgs) -> ToolResult:
    """Today's weather for a city."""
    return ToolResult(content=f"{args.city}: sunny, 25°C")


@pytest.fixture
def demo_plugin() -> Callable[..., Plugin[None]]:
    """``demo_plugin(name=panel, ...)``: the ``weather`` tool, plus web side panels added at setup."""

    def make(**panels: PanelProvider) -> Plugin[None]:
        async def setup(bot: Bot) -> None:
            bot.panels.update(panels)

        return Plugin("demo", Toolset("demo", [weather]), setup=setup)

    return make
