"""The playground's personal-WeChat login page: the same QR login as ``qunbot login weixin``, in a browser.

Mounted by the web playground at ``/weixin/`` when both channels are configured and the
playground listens on loopback only (binding a WeChat account is an owner's act: a playground
reachable by others does not offer it). ``POST start`` begins a login and returns the QR code as
SVG; ``GET status`` reports progress; ``POST code`` answers WeChat's pairing-number question.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from typing import Any, TextIO

import segno
from aiohttp import web

from robot.channels.weixin.api import WeixinError
from robot.channels.weixin.login import login
from robot.channels.weixin.settings import WeixinSettings
from robot.channels.weixin.state import WeixinState

__all__ = ["login_app"]

log = logging.getLogger(__name__)

# The playground's Content-Security-Policy allows scripts from 'self' only: no inline script.
_PAGE = """<!doctype html><html lang="zh"><head><meta charset="utf-8"><title>登录个人微信</title>
</head><body><h1>连接个人微信</h1><button id="go">获取二维码</button><div id="qr"></div><p id="say"></p>
<form id="pair" hidden><input id="num" placeholder="手机上显示的数字"><button>提交</button></form>
<script src="login.js"></script></body></html>"""
_SCRIPT = """const $ = (id) => document.getElementById(id);
async function poll() {
  const s = await (await fetch("status")).json();
  $("say").textContent = s.message; $("pair").hidden = !s.needs_code;
  $("qr").innerHTML = s.svg;
  if (s.state === "running") setTimeout(poll, 1000);
}
$("go").onclick = async () => { await fetch("start", {method: "POST"}); poll(); };
$("pair").onsubmit = async (e) => { e.preventDefault();
  await fetch("code", {method: "POST", body: $("num").value}); $("num").value = ""; };
"""


class _Login:
    """One login at a time, its progress kept for the page to poll."""

    def __init__(self, settings: WeixinSettings, state: WeixinState) -> None:
        self.settings, self.state = settings, state
        self.task: asyncio.Task[None] | None = None
        self.svg = ""
        self.out = io.StringIO()
        self.result = ""
        self.codes: asyncio.Queue[str] = asyncio.Queue()
        self.needs_code = False

    def show(self, link: str, out: TextIO) -> None:
        self.svg = segno.make(link, error="l").svg_inline(scale=4)
        out.write("请用手机微信扫描二维码。\n")

    async def ask(self, prompt: str) -> str:
        self.out.write(prompt + "\n")
        self.needs_code = True
        try:
            return await self.codes.get()
        finally:
            self.needs_code = False

    async def run(self) -> None:
        try:
            account = await login(self.settings, self.state, out=self.out, ask_code=self.ask, show_qr=self.show)
        except WeixinError as exc:
            self.result = f"登录失败：{exc}"
        except Exception:
            log.exception("weixin: playground login failed")
            self.result = "登录失败，详情见日志。"
        else:
            self.result = (f"登录成功：{account.bot_id}。几秒后开始收发消息。" if account is not None
                           else "这个微信已经连接过本机的 qunbot。")
        finally:
            self.svg = ""

    def status(self) -> dict[str, Any]:
        running = self.task is not None and not self.task.done()
        lines = [line for line in self.out.getvalue().splitlines() if line.strip()]
        return {"state": "running" if running else ("done" if self.result else "idle"), "svg": self.svg,
                "message": self.result or (lines[-1] if lines else ""), "needs_code": self.needs_code}


def login_app(settings: WeixinSettings, state: WeixinState) -> web.Application:
    """The sub-application the web playground mounts at ``/weixin/``."""
    current = _Login(settings, state)
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=_PAGE, content_type="text/html")

    async def script(request: web.Request) -> web.Response:
        return web.Response(text=_SCRIPT, content_type="text/javascript")

    async def start(request: web.Request) -> web.Response:
        nonlocal current
        if current.task is None or current.task.done():
            current = _Login(settings, state)
            current.task = asyncio.create_task(current.run(), name="weixin-playground-login")
        return web.json_response(current.status())

    async def status(request: web.Request) -> web.Response:
        return web.json_response(current.status())

    async def code(request: web.Request) -> web.Response:
        text = (await request.text()).strip()[:16]
        if not text.isdigit():
            return web.json_response({"error": "请输入手机上显示的数字"}, status=400)
        current.codes.put_nowait(text)
        return web.json_response(current.status())

    async def cleanup(app: web.Application) -> None:
        if current.task is not None:
            current.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await current.task

    app.router.add_get("/", page)
    app.router.add_get("/login.js", script)
    app.router.add_post("/start", start)
    app.router.add_get("/status", status)
    app.router.add_post("/code", code)
    app.on_cleanup.append(cleanup)
    return app
