"""``qunbot login weixin`` against the fake iLink server, and the text conversions."""

from __future__ import annotations

import io
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot.channels.weixin import LoginFailed, WeixinSettings, WeixinState, flatten_markdown, login
from robot.channels.weixin.api import WeixinMessage
from robot.channels.weixin.convert import to_message
from robot.channels.weixin.testing import FakeILinkServer
from robot.cli import main


def cfg(fake: FakeILinkServer) -> WeixinSettings:
    return WeixinSettings(api_base=fake.url)


async def test_login_draws_the_qr_code_and_stores_the_account_privately(tmp_path: Path) -> None:
    async with FakeILinkServer() as fake:
        host = fake.url.split("://", 1)[1]
        fake.qr_script = [{"status": "wait"}, {"status": "scaned"}, {"status": "expired"},
                          {"status": "scaned_but_redirect", "redirect_host": host},
                          {"status": "confirmed", "bot_token": "secret-token", "ilink_bot_id": "abc@im.bot",
                           "baseurl": "https://ilinkai.weixin.qq.com", "ilink_user_id": "owner@im.wechat"}]
        out = io.StringIO()
        state = WeixinState(tmp_path / "wx")
        account = await login(cfg(fake), state, out=out, poll_interval_s=0)
    assert fake.errors == [] and fake.qrcodes_issued == 2  # the expired code was replaced
    assert account is not None and account.bot_id == "abc@im.bot"
    shown = out.getvalue()
    assert "█" in shown or "▀" in shown  # a QR code drawn with block characters
    assert "https://liteapp.weixin.qq.com/q/qr-2" in shown and "secret-token" not in shown
    (stored,) = state.load_accounts_sync()
    assert (stored.bot_token.get_secret_value(), stored.user_id, stored.base_url) == (
        "secret-token", "owner@im.wechat", "https://ilinkai.weixin.qq.com")
    path = tmp_path / "wx" / "accounts" / "abc@im.bot.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_a_second_login_sends_known_tokens_and_adds_an_account(tmp_path: Path) -> None:
    state = WeixinState(tmp_path / "wx")
    async with FakeILinkServer() as fake:
        for n in (1, 2):
            fake.qr_script = [{"status": "confirmed", "bot_token": f"t{n}", "ilink_bot_id": f"b{n}@im.bot",
                               "baseurl": fake.url}]
            await login(cfg(fake), state, out=io.StringIO(), poll_interval_s=0)
    assert [a.bot_id for a in state.load_accounts_sync()] == ["b1@im.bot", "b2@im.bot"]


async def test_a_pairing_number_is_asked_for_and_sent(tmp_path: Path) -> None:
    asked: list[str] = []

    async def ask(prompt: str) -> str:
        asked.append(prompt)
        return "42"

    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "need_verifycode"}, {"status": "scaned"},
                          {"status": "confirmed", "bot_token": "t", "ilink_bot_id": "b@im.bot", "baseurl": fake.url}]
        await login(cfg(fake), WeixinState(tmp_path), out=io.StringIO(), ask_code=ask, poll_interval_s=0)
    assert len(asked) == 1


async def test_the_deadline_holds_while_the_pairing_number_is_awaited(tmp_path: Path) -> None:
    """Nobody typed the number (the page was closed): the login waited for ever, past its deadline."""
    import asyncio

    async def never(prompt: str) -> str:
        await asyncio.Event().wait()
        return ""

    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "need_verifycode"}]
        with pytest.raises(LoginFailed, match="登录超时"):
            async with asyncio.timeout(5):
                await login(cfg(fake), WeixinState(tmp_path), out=io.StringIO(), ask_code=never, timeout_s=0.3,
                            poll_interval_s=0)


async def test_a_playground_login_stuck_on_the_pairing_number_ends_and_the_next_start_shows_a_new_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import functools

    import aiohttp
    from aiohttp import web

    from robot.channels.weixin import web_login

    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "need_verifycode"}]
        monkeypatch.setattr(web_login, "login", functools.partial(login, timeout_s=0.3, poll_interval_s=0.02))
        runner = web.AppRunner(web_login.login_app(cfg(fake), WeixinState(tmp_path)))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        try:
            async with aiohttp.ClientSession() as http:
                await http.post(url + "start")
                status: dict[str, Any] = {}
                async with asyncio.timeout(5):
                    while status.get("state") != "done":
                        await asyncio.sleep(0.05)
                        status = await (await http.get(url + "status")).json()
                assert "登录超时" in status["message"] and not status["needs_code"]
                again = await (await http.post(url + "start")).json()
                async with asyncio.timeout(5):  # (the new login asks for its code in a task of its own)
                    while fake.qrcodes_issued < 2:
                        await asyncio.sleep(0.02)
        finally:
            await runner.cleanup()
    assert again["state"] == "running" and fake.qrcodes_issued == 2


async def test_codes_that_keep_expiring_end_the_login_with_a_clear_error(tmp_path: Path) -> None:
    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "expired"}] * 3
        with pytest.raises(LoginFailed, match="多次失效"):
            await login(cfg(fake), WeixinState(tmp_path), out=io.StringIO(), poll_interval_s=0)
    assert WeixinState(tmp_path).load_accounts_sync() == []


async def test_an_already_bound_bot_is_reported_not_stored(tmp_path: Path) -> None:
    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "binded_redirect"}]
        out = io.StringIO()
        assert await login(cfg(fake), WeixinState(tmp_path), out=out, poll_interval_s=0) is None
    assert "无需重复" in out.getvalue()


def test_the_cli_reports_an_unreachable_server_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUNBOT_CHANNELS__WEIXIN__API_BASE", "http://127.0.0.1:9")
    monkeypatch.setenv("QUNBOT_BOT__DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["login", "weixin"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: weixin login:") and "Traceback" not in err


@pytest.mark.parametrize(("markdown", "plain"), [
    ("# 标题\n\n**粗体** 和 *斜体* 和 `代码`", "标题\n\n粗体 和 斜体 和 代码"),
    ("- 一\n- 二\n  * 三", "• 一\n• 二\n  • 三"),
    ("[文档](https://example.com) 与 https://x.cn", "文档 (https://example.com) 与 https://x.cn"),
    ("```python\nprint(1)\n```", "print(1)"),
    ("> 引用\n\n---\n~~删除~~", "引用\n\n删除"),
    ("2*3*4 = 24, snake_case_name", "2*3*4 = 24, snake_case_name"),
])
def test_markdown_is_flattened_to_plain_text(markdown: str, plain: str) -> None:
    assert flatten_markdown(markdown) == plain


def test_urls_reach_wechat_whole() -> None:
    # Emphasis read inside a cited source's URL: "#object.__init__" became "#object.init", "/_static_/" "/static/".
    sources = ("[1] https://docs.python.org/3/reference/datamodel.html#object.__init__\n"
               "[2] https://github.com/python/cpython/blob/main/Lib/json/__init__.py\n"
               "[3] **https://example.com/docs/_static_/guide.html**\n"
               "[4] [https://a.example/c_d_](https://a.example/c_d_) · [说明](https://b.example/__x__)")
    assert flatten_markdown(sources) == (
        "[1] https://docs.python.org/3/reference/datamodel.html#object.__init__\n"
        "[2] https://github.com/python/cpython/blob/main/Lib/json/__init__.py\n"
        "[3] https://example.com/docs/_static_/guide.html\n"
        "[4] https://a.example/c_d_ · 说明 (https://b.example/__x__)")
    # Code right after a URL (no space between, as in Chinese): the URL's hold swallowed the code's mark.
    assert flatten_markdown("文档见https://docs.python.org/3/，例如`__init__`方法。https://e.example/`x`") == (
        "文档见https://docs.python.org/3/，例如__init__方法。https://e.example/x")


def test_code_passes_through_verbatim() -> None:
    """Code is copied by the user: its contents are never flattened (only the fence lines and backticks go)."""
    code = ('# 初始化\nclass Config:\n    def __init__(self, **kwargs):\n        self.__dict__.update(kwargs)\n'
            '\n\n\nif __name__ == "__main__":\n    print(handlers[0](cfg))  # [x](y) *em* ~~s~~')
    yaml = "steps:\n- run: make\n> not a quote\n---"
    answer = f"用这个类：\n\n```python\n{code}\n```\n\n~~~yaml\n{yaml}\n~~~\n\n**注意** `__init__` 和 `` a_`b`_c ``。"
    assert flatten_markdown(answer) == f"用这个类：\n\n{code}\n\n{yaml}\n\n注意 __init__ 和 a_`b`_c。"
    assert flatten_markdown("```\n    indented\n```") == "    indented"
    # A fence is closed only by one as long (or longer); an unclosed one runs to the end.
    assert flatten_markdown("说明\n````md\n```\n**x**\n") == "说明\n\n```\n**x**"


_fence_free = st.text().filter(lambda s: not any(line.lstrip(" \t")[:3] in ("```", "~~~") for line in s.split("\n")))


@settings(max_examples=40, deadline=None)
@given(_fence_free, _fence_free, _fence_free, st.sampled_from(["```", "~~~~", "```python"]))
def test_any_text_inside_a_fenced_block_comes_out_verbatim(before: str, code: str, after: str, fence: str) -> None:
    closing = fence.rstrip("python")
    flat = flatten_markdown(f"{before}\n{fence}\n{code}\n{closing}\n{after}")
    assert code in flat


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["message_id", "from_user_id", "group_id", "item_list", "message_type",
                                        "create_time_ms", "context_token", "seq"]), _json, max_size=8))
def test_any_message_shape_converts_or_is_refused_cleanly(raw: dict[str, Any]) -> None:
    from pydantic import ValidationError

    try:
        msg = WeixinMessage.model_validate(raw)
    except ValidationError:
        return
    message = to_message("bot@im.bot", msg)
    if message is not None:
        assert message.chat.account == "bot@im.bot" and message.sender.user_id


async def test_the_playground_shows_the_qr_code_and_logs_in(tmp_path: Path) -> None:
    import asyncio

    import aiohttp

    from robot.bot import build_channels
    from robot.channels.web import WebChannel
    from robot.config import Settings

    async with FakeILinkServer() as fake:
        fake.qr_script = [{"status": "wait"}, {"status": "need_verifycode"},
                          {"status": "confirmed", "bot_token": "t", "ilink_bot_id": "web@im.bot", "baseurl": fake.url}]
        settings = Settings(bot={"data_dir": tmp_path}, channels={
            "web": {"enabled": True, "port": 0}, "weixin": {"enabled": True, "api_base": fake.url}})
        (playground,) = [c for c in build_channels(settings) if isinstance(c, WebChannel)]
        await playground.start()
        try:
            async with aiohttp.ClientSession() as http:
                base = playground.url + "weixin/"
                async with http.get(base) as resp:
                    assert resp.status == 200 and "获取二维码" in await resp.text()
                async with http.post(base + "start") as resp:
                    assert resp.status == 200
                status: dict[str, Any] = {}
                for _ in range(200):
                    async with http.get(base + "status") as resp:
                        status = await resp.json()
                    if status["needs_code"]:
                        break
                    await asyncio.sleep(0.05)
                assert status["needs_code"] and "<svg" in status["svg"]
                async with http.post(base + "code", data="abc") as resp:
                    assert resp.status == 400
                async with http.post(base + "code", data="42") as resp:
                    assert resp.status == 200
                for _ in range(200):
                    async with http.get(base + "status") as resp:
                        status = await resp.json()
                    if status["state"] == "done":
                        break
                    await asyncio.sleep(0.05)
        finally:
            await playground.stop()
    assert "web@im.bot" in status["message"] and status["svg"] == ""
    assert [a.bot_id for a in WeixinState(tmp_path / "weixin").load_accounts_sync()] == ["web@im.bot"]


def test_a_playground_open_to_others_offers_no_wechat_login(tmp_path: Path) -> None:
    from robot.bot import build_channels
    from robot.channels.web import WebChannel
    from robot.config import Settings

    settings = Settings(bot={"data_dir": tmp_path}, channels={
        "web": {"enabled": True, "host": "0.0.0.0", "port": 0}, "weixin": {"enabled": True}})
    (playground,) = [c for c in build_channels(settings) if isinstance(c, WebChannel)]
    assert playground._mounts == []


async def test_another_sites_page_cannot_start_a_login_or_answer_its_pairing_question(tmp_path: Path) -> None:
    import aiohttp

    from robot.bot import build_channels
    from robot.channels.web import WebChannel
    from robot.config import Settings

    async with FakeILinkServer() as fake:
        settings = Settings(bot={"data_dir": tmp_path}, channels={
            "web": {"enabled": True, "port": 0}, "weixin": {"enabled": True, "api_base": fake.url}})
        (playground,) = [c for c in build_channels(settings) if isinstance(c, WebChannel)]
        await playground.start()
        try:
            async with aiohttp.ClientSession() as http:
                base = playground.url + "weixin/"
                evil = {"Origin": "http://evil.example"}  # what a browser sends for a form/fetch from that site
                async with http.post(base + "start", headers=evil) as resp:
                    assert resp.status == 403
                async with http.post(base + "code", data="42", headers=evil) as resp:
                    assert resp.status == 403
                async with http.get(base + "status") as resp:
                    assert (await resp.json())["state"] == "idle"
                same = {"Origin": playground.url.rstrip("/")}  # the page itself still works
                async with http.post(base + "start", headers=same) as resp:
                    assert resp.status == 200 and (await resp.json())["state"] == "running"
        finally:
            await playground.stop()
