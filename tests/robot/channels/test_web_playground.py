"""The web playground in a real headless Chromium, with the real openai SDK against the fake server."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from function_calls import OpenAIChatModel
from function_calls.testing import Call, FakeOpenAIServer, Fault, Reply
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


LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


async def test_commands_in_the_trace_refresh_the_panel_at_phone_width_in_the_chats_zone(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    """A newcomer on a phone: /remind and /unremind show in the trace, the panel follows, times are the chat's."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="test", stream=True)
    bot = Bot(Settings(bot={"data_dir": tmp_path, "timezone": "Asia/Shanghai", "plugins": ["reminders"]}),
              model=model, channels=[WebChannel(WebSettings(enabled=True, port=0))])
    await bot.start()
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    try:
        async with playwright.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
            try:
                # The browser is in Berlin; the chat is in Shanghai, where the bot's times are.
                context = await browser.new_context(viewport={"width": 390, "height": 844},
                                                    timezone_id="Europe/Berlin")
                page = await context.new_page()
                errors: list[str] = []
                failed: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
                await page.goto(channel.url)
                await page.wait_for_selector("#status[data-state=open]", timeout=5000)

                favicon = await page.request.get(channel.url + "favicon.ico")
                assert favicon.status == 200 and favicon.headers["content-type"].startswith("image/svg+xml")

                # Usable at 390 px: the conversation gets most of the screen and nothing overflows sideways.
                box = await page.locator("#messages").bounding_box()
                assert box is not None and box["height"] >= 400, box
                assert await page.evaluate("document.documentElement.scrollWidth") <= 390

                await page.click("[data-member=u-xiaoming]")
                before = datetime.now(UTC)
                await page.fill("#input", "/remind daily 08:00 喝水")
                await page.press("#input", "Enter")
                reply = page.locator(".msg.bot .bubble")
                await reply.wait_for(timeout=5000)
                after = datetime.now(UTC) + timedelta(seconds=1)
                shanghai = {t.astimezone(ZoneInfo("Asia/Shanghai")).strftime("%H:%M") for t in (before, after)}
                shown = await page.locator(".msg.self .time").inner_text()
                assert shown in shanghai, (shown, shanghai)

                tool = page.locator("#trace .tool")
                await tool.wait_for(timeout=5000)
                assert await tool.locator(".tool-name").inner_text() == "/remind (reminder_set)"
                assert "daily 08:00 喝水" in await tool.locator("pre").first.inner_text()
                await page.wait_for_selector("#trace .badge.ok >> text=command", timeout=5000)

                panel = page.locator("[data-panel=reminders]")
                await panel.locator("text=喝水").wait_for(timeout=5000)
                labels = await panel.locator(".k").all_inner_texts()
                assert {"编号", "时间", "内容"} <= set(labels) and not {"id", "owner", "schedule", "mode"} & set(labels)
                number = (await panel.locator("li div").first.locator(".v").inner_text()).lstrip("#")

                await page.fill("#input", f"/unremind {number}")
                await page.press("#input", "Enter")
                await panel.locator("text=（空）").wait_for(timeout=5000)
                assert await page.locator("#trace .tool .tool-name").first.inner_text() == "/unremind (reminder_delete)"

                server.script(Fault(503), Reply("你好，我在。"))  # the model retries once
                await page.fill("#input", "@qunbot 你好")
                await page.press("#input", "Enter")
                retry = page.locator("#trace .retry")
                await retry.wait_for(timeout=10000)
                assert re.fullmatch(r"↻ 重试：.+（\d+\.\d s 后）", await retry.inner_text()), await retry.inner_text()
                await page.locator(".msg.bot .bubble >> text=你好，我在。").wait_for(timeout=10000)
                assert errors == [] and failed == []
                await page.screenshot(path="/tmp/playground-phone.png", full_page=True)
            finally:
                await browser.close()
    finally:
        await bot.stop()


async def test_the_conversation_comes_back_from_the_store_after_a_restart(tmp_path: Path) -> None:
    settings = Settings(bot={"data_dir": tmp_path, "plugins": []})
    port = 0
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            first = Bot(settings, channels=[WebChannel(WebSettings(enabled=True, port=port))])
            await first.start()
            try:
                channel = first.channels["web"]
                assert isinstance(channel, WebChannel)
                port = channel.port
                await page.goto(channel.url)
                await page.wait_for_selector("#status[data-state=open]", timeout=5000)
                await page.click("[data-member=u-aqiang]")
                await page.fill("#input", "今天谁值班？")
                await page.press("#input", "Enter")
                await page.fill("#input", "@qunbot 你好")
                await page.press("#input", "Enter")
                await page.locator(".msg.bot").wait_for(timeout=5000)  # no model: the bot says how to add one
                await page.click("#tab-private")
                await page.fill("#input", "私聊一句")
                await page.press("#input", "Enter")
                await page.locator(".msg.bot").wait_for(timeout=5000)
            finally:
                await first.stop()

            second = Bot(settings, channels=[WebChannel(WebSettings(enabled=True, port=port))])
            await second.start()
            try:
                await page.reload()
                await page.wait_for_selector("#status[data-state=open]", timeout=5000)
                messages = page.locator("#messages .msg")
                await page.click("#tab-group")
                await page.locator("#messages >> text=今天谁值班？").wait_for(timeout=5000)
                texts = await page.locator("#messages .msg .text").all_inner_texts()
                assert texts[:2] == ["今天谁值班？", "你好"] and "我还没有接入大模型" in texts[2]
                assert await messages.count() == 3
                await page.click("#tab-private")
                await page.locator("#messages >> text=私聊一句").wait_for(timeout=5000)
                assert await messages.count() == 2
            finally:
                await second.stop()
        finally:
            await browser.close()


async def test_a_long_paste_stays_whole_and_one_over_the_limit_is_held_with_a_notice(bot: Bot) -> None:
    """The box cut a 7,000-character paste to 4,000 without a word; the limit is the bot's own
    ([limits] max_message_chars, 8000), told by the server: over it the text stays, unsent, with a notice."""
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    article = "".join(f"第{i:04d}段。" for i in range(1000))  # 7,000 characters
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(channel.url)
            await page.wait_for_selector("#status[data-state=open]", timeout=5000)
            await page.focus("#input")
            await page.keyboard.insert_text(article + "多" * 2000)
            await page.press("#input", "Enter")
            await page.locator("#notice", has_text="太长：9000/8000").wait_for(timeout=5000)
            assert len(await page.input_value("#input")) == 9000 and await page.locator(".msg.self").count() == 0
            await page.fill("#input", "")
            await page.keyboard.insert_text(article)
            await page.press("#input", "Enter")
            sent = page.locator(".msg.self .text")
            await sent.wait_for(timeout=5000)
            assert await sent.inner_text() == article and await page.input_value("#input") == ""
        finally:
            await browser.close()
