"""The playground's WeChat login page in a real headless Chromium (its CSP allows no inline script)."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot.bot import build_channels
from robot.channels.web import WebChannel
from robot.channels.weixin import WeixinState
from robot.channels.weixin.testing import FakeILinkServer
from robot.config import Settings

playwright = pytest.importorskip("playwright.async_api")
CHROMIUM = Path("/usr/bin/chromium")


async def test_scanning_the_playgrounds_qr_code_logs_the_account_in(tmp_path: Path) -> None:
    assert CHROMIUM.exists(), ".ci/run installs Debian's chromium"
    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "wait"}, {"status": "need_verifycode"}, {"status": "scaned"},
                          {"status": "confirmed", "bot_token": "t", "ilink_bot_id": "pg@im.bot", "baseurl": fake.url}]
        settings = Settings(bot={"data_dir": tmp_path}, channels={
            "web": {"enabled": True, "port": 0}, "weixin": {"enabled": True, "api_base": fake.url}})
        (playground,) = [c for c in build_channels(settings) if isinstance(c, WebChannel)]
        await playground.start()
        try:
            async with playwright.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM),
                                                  args=["--no-sandbox", "--disable-gpu"])
                try:
                    page = await browser.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
                    await page.goto(playground.url + "weixin/")
                    await page.click("#go")
                    await page.wait_for_selector("#qr svg", timeout=10_000)  # the QR code is shown
                    await page.wait_for_selector("#pair:not([hidden])", timeout=10_000)
                    await page.fill("#num", "42")
                    await page.click("#pair button")
                    await page.locator("#say", has_text="登录成功").wait_for(timeout=15_000)
                    assert await page.locator("#qr svg").count() == 0
                    assert errors == []
                finally:
                    await browser.close()
        finally:
            await playground.stop()
    assert [a.bot_id for a in WeixinState(tmp_path / "weixin").load_accounts_sync()] == ["pg@im.bot"]
