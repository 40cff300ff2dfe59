"""The web playground in a real headless Chromium, with the real openai SDK against the fake server."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from function_calls import OpenAIChatModel
from function_calls.testing import Call, FakeOpenAIServer, Reply
from robot.bot import Bot
from robot.channels.web import WebChannel
from robot.config import Settings, WebSettings
from robot.message import ChatRef
from robot.plugin import Plugin

playwright = pytest.importorskip("playwright.async_api")
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")

ANSWER = "上海今天晴，最高 25°C，适合出门散步。"


async def reminders_panel(chat: ChatRef) -> list[dict[str, str]]:
    return [{"时间": "明天 09:00", "内容": "带伞"}] if chat.kind == "group" else []


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as s:
        yield s


@pytest.fixture
async def bot(
    tmp_path: Path, server: FakeOpenAIServer, demo_plugin: Callable[..., Plugin[None]]
) -> AsyncIterator[Bot]:
    """A bot with conftest's ``weather`` tool and a "reminders" side panel for group chats."""
    model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test", stream=True)
    b = Bot(Settings(bot={"data_dir": tmp_path}), model=model,
            channels=[WebChannel(WebSettings(enabled=True, port=0))],
            plugins=[demo_plugin(reminders=reminders_panel)])
    await b.start()
    yield b
    await b.stop()


async def test_group_chat_in_a_real_browser(bot: Bot, server: FakeOpenAIServer) -> None:
    server.script(
        Reply(tool_calls=[Call("weather", {"city": "上海"})]),
        Reply(ANSWER, chunk_size=2, chunk_delay=0.05),  # slow enough to watch the text grow
        Reply("你好 Alice，有什么可以帮你？"),
    )
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM),
                                          args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(channel.url)
            await page.wait_for_selector("#status[data-state=open]", timeout=5000)
            messages = page.locator("#messages")

            # 小明 chats without addressing the bot (and tries some HTML).
            await page.click("[data-member=u-xiaoming]")
            await page.fill("#input", "大家好 <b>中午</b>吃什么？")
            await page.press("#input", "Enter")
            await page.wait_for_selector("#messages .msg.self >> text=中午", timeout=5000)
            assert await messages.locator("b").count() == 0  # shown as text, not markup

            # 阿强 @-mentions the bot.
            await page.click("[data-member=u-aqiang]")
            await page.fill("#input", "@qunbot 上海天气怎么样？")
            await page.click("#send")

            streaming = page.locator(".msg.bot.streaming .text")
            await streaming.wait_for(timeout=5000)
            partial = await streaming.inner_text()
            assert partial and ANSWER.startswith(partial)
            final = page.locator(".msg.bot:not(.streaming) .bubble")
            await final.wait_for(timeout=5000)
            assert await page.locator(".msg.streaming").count() == 0  # the final message replaced the stream
            assert await final.count() == 1
            bubble = await final.inner_text()
            assert bubble.startswith("@阿强") and ANSWER in bubble

            # Only 阿强's message reached the model: one tool turn plus one answer.
            assert len(server.requests) == 2
            assert server.requests[0].messages[-1]["content"] == "上海天气怎么样？"

            tool = page.locator("#trace .tool")
            await tool.wait_for(timeout=5000)
            assert await tool.locator(".tool-name").inner_text() == "weather"
            assert re.fullmatch(r"\d+\.\d ms", await tool.locator(".dur").inner_text())
            assert "上海" in await tool.locator("pre").first.inner_text()
            await page.wait_for_selector("#trace .badge.ok >> text=completed", timeout=5000)
            await page.wait_for_selector("[data-panel=reminders] >> text=带伞", timeout=5000)

            # Private mode: Alice's own chat with the bot; no @ needed, no mention in the reply.
            await page.click("[data-member=u-alice]")
            await page.click("#tab-private")
            assert await messages.locator(".msg").count() == 0
            await page.fill("#input", "你好")
            await page.press("#input", "Enter")
            private = page.locator(".msg.bot:not(.streaming) .bubble")
            await private.wait_for(timeout=5000)
            assert await private.inner_text() == "你好 Alice，有什么可以帮你？"
            assert await page.locator("[data-panel=reminders] >> text=（空）").count() == 1

            # Back to the group: the conversation is still there.
            await page.click("[data-member=u-aqiang]")
            await page.click("#tab-group")
            await final.wait_for(timeout=5000)
            assert await messages.locator(".msg").count() == 3
            await page.screenshot(path="/tmp/playground.png")
            assert errors == []
        finally:
            await browser.close()
