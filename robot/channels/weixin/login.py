"""``qunbot login weixin``: bind a personal-WeChat bot account by scanning a QR code.

The flow follows the reference client's ``src/auth/login-qr.ts``: ``get_bot_qrcode`` gives a code
and the link to show as a QR code; ``get_qrcode_status`` is long-polled until ``confirmed`` (then
``bot_token``, ``baseurl``, ``ilink_bot_id`` and ``ilink_user_id`` are stored, mode 0600), with
``expired`` codes refreshed up to three times, a host switch on ``scaned_but_redirect``, and the
pairing number asked for on ``need_verifycode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TextIO
from urllib.parse import urlsplit

import aiohttp
import segno
from pydantic import SecretStr

from robot.channels.weixin.api import WeixinApi, WeixinError
from robot.channels.weixin.settings import WeixinSettings
from robot.channels.weixin.state import WeixinAccount, WeixinState

__all__ = ["LoginFailed", "draw_qr", "login"]

MAX_QR_CODES = 3

AskCode = Callable[[str], Awaitable[str]]


class LoginFailed(WeixinError):
    """The QR login did not end with a bound account (expired codes, blocked, timed out)."""


def draw_qr(content: str, out: TextIO) -> None:
    """Draw ``content`` as a QR code with block characters, then the link as a fallback."""
    segno.make(content, error="l").terminal(out=out, compact=True)
    out.write(f"若二维码无法显示或扫描，请在微信中打开此链接：\n{content}\n")
    out.flush()


async def _ask_stdin(prompt: str) -> str:
    # A daemon thread reading the file descriptor, not to_thread(input): one left blocked after the
    # deadline must not keep the process from exiting (asyncio.run waits for the executor's threads,
    # and a daemon thread holding sys.stdin's lock aborts the interpreter's shutdown).
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def settle(line: bytes | None) -> None:
        if answer.done():
            return
        if line is None:
            answer.set_exception(EOFError("stdin closed"))
        else:
            answer.set_result(line.decode("utf-8", "replace").strip())

    def read() -> None:
        line = b""
        try:
            while not line.endswith(b"\n"):
                chunk = os.read(sys.stdin.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        except (OSError, ValueError):  # no usable stdin
            line = b""
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this answer
            loop.call_soon_threadsafe(settle, line or None)

    sys.stdout.write(prompt)
    sys.stdout.flush()
    threading.Thread(target=read, name="weixin-login-input", daemon=True).start()
    return await answer


async def login(settings: WeixinSettings, state: WeixinState, *, out: TextIO = sys.stdout,
                session: aiohttp.ClientSession | None = None, ask_code: AskCode = _ask_stdin,
                show_qr: Callable[[str, TextIO], None] = draw_qr,
                timeout_s: float = 480.0, poll_interval_s: float = 1.0) -> WeixinAccount | None:
    """Run the QR login; returns the stored account, or None if it was already bound.

    ``show_qr(link, out)`` presents each QR code (the terminal draws it; the playground shows an SVG).
    """
    own = session is None
    session = session or aiohttp.ClientSession()
    try:
        return await _login(settings, state, out, session, ask_code, show_qr, timeout_s, poll_interval_s)
    finally:
        if own:
            await session.close()


async def _login(settings: WeixinSettings, state: WeixinState, out: TextIO, session: aiohttp.ClientSession,
                 ask_code: AskCode, show_qr: Callable[[str, TextIO], None], timeout_s: float,
                 poll_interval_s: float) -> WeixinAccount | None:
    known = await state.load_accounts()
    local_tokens = [a.bot_token.get_secret_value() for a in reversed(known)][:10]
    start = WeixinApi(session, settings.api_base, timeout_s=settings.request_timeout)
    qr = await start.get_bot_qrcode(settings.bot_type, local_tokens)
    out.write("用手机微信扫描下面的二维码，连接 qunbot：\n")
    show_qr(qr.qrcode_img_content, out)
    poll, codes, verify, told_scanned = start, 1, None, False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            status = await poll.get_qrcode_status(qr.qrcode, verify)
        except WeixinError:
            status = None  # a network blip: the reference client keeps polling
        match status.status if status else "wait":
            case "scaned":
                verify = None
                if not told_scanned:
                    out.write("已扫码，请在手机上确认……\n")
                    told_scanned = True
            case "need_verifycode":
                prompt = "输入手机微信上显示的数字：" if verify is None else "数字不匹配，请重新输入："
                try:  # nobody may answer (the page closed): the deadline holds here too
                    verify = await asyncio.wait_for(ask_code(prompt), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    break
                continue
            case "expired" | "verify_code_blocked":
                codes += 1
                if codes > MAX_QR_CODES:
                    raise LoginFailed("二维码多次失效，登录已停止，请稍后再试。")
                out.write("二维码已失效，正在刷新……\n")
                qr = await start.get_bot_qrcode(settings.bot_type, local_tokens)
                poll, verify, told_scanned = start, None, False
                show_qr(qr.qrcode_img_content, out)
            case "scaned_but_redirect":
                if status and status.redirect_host:
                    scheme = urlsplit(settings.api_base).scheme or "https"
                    poll = WeixinApi(session, f"{scheme}://{status.redirect_host}", timeout_s=settings.request_timeout)
            case "binded_redirect":
                out.write("这个微信已经连接过本机的 qunbot，无需重复登录。\n")
                return None
            case "confirmed":
                assert status is not None
                if not status.ilink_bot_id or not status.bot_token:
                    raise LoginFailed("登录失败：服务器没有返回 ilink_bot_id 或 bot_token。")
                account = WeixinAccount(bot_id=status.ilink_bot_id, bot_token=SecretStr(status.bot_token),
                                        base_url=status.baseurl or settings.api_base,
                                        user_id=status.ilink_user_id or "", saved_at=datetime.now(UTC))
                path = await state.save_account(account)
                out.write(f"登录成功：账号 {account.bot_id} 已保存到 {path}\n")
                return account
        await asyncio.sleep(poll_interval_s)
    raise LoginFailed("登录超时，请重试。")
