"""The playground's 待批准 panel in a real headless Chromium: approve and deny buttons go through the bot's checks."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from function_calls import OpenAIChatModel, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import Call, FakeOpenAIServer, Reply
from robot.bot import Bot
from robot.channels.web import WebChannel
from robot.config import Settings, WebSettings
from robot.plugin import Plugin

playwright = pytest.importorskip("playwright.async_api")
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
RUNS: list[int] = []


class TransferArgs(BaseModel):
    amount: int = Field(ge=0)


@tool_function(confirm="admin")
async def transfer(ctx: ToolContext[object], args: TransferArgs) -> ToolResult:
    """Move money (an admin must approve)."""
    RUNS.append(args.amount)
    return ToolResult(content=f"transferred {args.amount}")


@tool_function(confirm="requester")
async def wipe(ctx: ToolContext[object]) -> ToolResult:
    """Delete my notes (I confirm myself)."""
    RUNS.append(-1)
    return ToolResult(content=f"wiped the notes of {ctx.caller.user_id}")


def responder(body: dict[str, Any]) -> Reply:
    """The model: asks for the transfer the user named (or the wipe), then reports what the tool (or the
    approver) said."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"结果：{last['content']}")
    if "wipe" in str(last["content"]):
        return Reply(tool_calls=[Call("wipe", {})])
    amount = re.search(r"\d+", str(last["content"]))
    return Reply(tool_calls=[Call("transfer", {"amount": int(amount.group()) if amount else 1})])


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    RUNS.clear()
    async with FakeOpenAIServer(responder) as server:
        model = OpenAIChatModel(model="fake-model", base_url=server.base_url, api_key="sk-test-secret", stream=True)
        b = Bot(Settings(bot={"data_dir": tmp_path, "admins": ["web:admin"]}), model=model,
                channels=[WebChannel(WebSettings(enabled=True, port=0))],
                plugins=[Plugin("risky", Toolset("risky", [transfer, wipe]))])
        await b.start()
        try:
            yield b
        finally:
            await b.stop()


async def test_admin_identity_approves_and_denies_from_the_panel(bot: Bot) -> None:
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(channel.url)
            await page.wait_for_selector("#status[data-state=open]", timeout=5000)
            # The configured approver ("web:admin") is offered as an identity and marked; the presets are not.
            admin = page.locator("[data-member=admin]")
            await admin.wait_for(timeout=5000)
            assert await admin.get_attribute("data-approver") == "1" and "可批准" in await admin.inner_text()
            assert await page.locator("[data-member=u-aqiang][data-approver]").count() == 0

            panel = page.locator('[data-panel="待批准"]')
            await panel.locator("text=（空）").wait_for(timeout=5000)
            await page.click("[data-member=u-aqiang]")
            await page.fill("#input", "@qunbot 给小明转 42 块")
            await page.press("#input", "Enter")
            ask = page.locator(".msg.bot .bubble", has_text="需要管理员批准")
            await ask.wait_for(timeout=5000)
            code = re.search(r"/approve ([A-Z2-9]{5})", await ask.inner_text())
            assert code, await ask.inner_text()

            # The run paused: the panel shows the request (code, call, who, expiry) without a reload.
            row = panel.locator("li", has_text=code.group(1))
            await row.wait_for(timeout=5000)
            shown = await row.inner_text()
            for part in ("transfer(amount=42)", "管理员批准", "阿强", "还剩 30 分钟"):
                assert part in shown, shown
            text = await panel.inner_text()
            assert "sk-test-secret" not in text and "tool_call" not in text and "给小明转" not in text  # no run state
            assert "可批准：admin（当前身份不可批准）" in shown
            await page.screenshot(path="/tmp/playground-approvals-panel.png")

            # As 阿强 (not an approver) the button is refused by the bot, with its usual message.
            await row.locator("button.action", has_text="批准").click()
            await page.locator(".msg.self .bubble", has_text=f"/approve {code.group(1)}").wait_for(timeout=5000)
            await page.locator(".msg.bot .bubble", has_text="只有管理员可以处理这个请求").wait_for(timeout=5000)
            assert RUNS == [] and await row.count() == 1

            # As admin the same button runs the tool once, the model's reply arrives, and the panel empties.
            await admin.click()
            assert "可批准：admin（当前身份可批准）" in await row.inner_text()
            await row.locator("button.action", has_text="批准").click()
            await page.locator(".msg.bot .bubble", has_text="已批准，正在执行").wait_for(timeout=5000)
            await page.locator(".msg.bot .bubble", has_text="结果：transferred 42").wait_for(timeout=5000)
            await panel.locator("text=（空）").wait_for(timeout=5000)
            assert RUNS == [42]

            # Deny, from a second page on the admin's private chat: a request paused in the group shows up there.
            other = await (await browser.new_context()).new_page()
            await other.goto(channel.url)
            await other.wait_for_selector("#status[data-state=open]", timeout=5000)
            await other.click("[data-member=admin]")
            await other.click("#tab-private")
            private = other.locator('[data-panel="待批准"]')
            await private.locator("text=（空）").wait_for(timeout=5000)
            await page.click("[data-member=u-aqiang]")
            await page.fill("#input", "@qunbot 再转 7 块")
            await page.press("#input", "Enter")
            await panel.locator("li", has_text="transfer(amount=7)").wait_for(timeout=5000)
            row = private.locator("li", has_text="transfer(amount=7)")
            await row.wait_for(timeout=5000)
            assert "阿强（群聊 playground）" in await row.inner_text()
            await row.locator("button.action", has_text="拒绝").click()
            await other.locator(".msg.bot .bubble", has_text="已拒绝").wait_for(timeout=5000)
            await private.locator("text=（空）").wait_for(timeout=5000)
            await page.locator(".msg.bot .bubble", has_text="你的请求已被拒绝").wait_for(timeout=5000)
            await page.locator(".msg.bot .bubble", has_text="结果：The approver declined").wait_for(timeout=5000)
            await panel.locator("text=（空）").wait_for(timeout=5000)
            assert RUNS == [42]
            await bot.approvals.idle()
            assert [r["status"] for r in await bot.approvals.store.with_status(None)] == ["denied", "resumed"]
            await page.screenshot(path="/tmp/playground-approvals.png")
            assert errors == []
        finally:
            await browser.close()


async def test_each_row_says_who_may_press_its_buttons(bot: Bot) -> None:
    """A request its requester confirms: the panel named the admin, and the requester 不可批准 (the opposite)."""
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(channel.url)
            await page.wait_for_selector("#status[data-state=open]", timeout=5000)
            await page.click("[data-member=u-xiaoming]")
            await page.fill("#input", "@qunbot wipe my notes")
            await page.press("#input", "Enter")
            await page.fill("#input", "@qunbot 转 42 块")
            await page.press("#input", "Enter")
            panel = page.locator('[data-panel="待批准"]')
            mine, admins = panel.locator("li", has_text="发起人确认"), panel.locator("li", has_text="管理员批准")
            await mine.wait_for(timeout=5000)
            await admins.wait_for(timeout=5000)
            assert "可批准：小明（当前身份可批准）" in await mine.inner_text()
            assert "可批准：admin（当前身份不可批准）" in await admins.inner_text()
            await page.click("[data-member=admin]")
            await panel.locator("li", has_text="可批准：小明（当前身份不可批准）").wait_for(timeout=5000)
            assert "可批准：admin（当前身份可批准）" in await admins.inner_text()
            await page.click("[data-member=u-xiaoming]")
            await mine.locator("button.action", has_text="批准").click()
            await page.locator(".msg.bot .bubble", has_text="wiped the notes of u-xiaoming").wait_for(timeout=5000)
            assert RUNS == [-1]
        finally:
            await browser.close()
