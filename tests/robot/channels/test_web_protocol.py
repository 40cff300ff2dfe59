"""The web playground's WebSocket protocol, driven by a plain aiohttp client against a real Bot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from function_calls import ModelRequest, ModelResponse
from function_calls.testing import ScriptedModel, call, text
from robot.bot import Bot
from robot.channels.web import WebChannel
from robot.config import Settings, WebSettings
from robot.message import ChatRef, OutgoingMessage
from robot.plugin import Plugin

A = {"id": "u-aqiang", "name": "阿强"}
B = {"id": "u-xiaoming", "name": "小明"}
C = {"id": "u-alice", "name": "Alice"}
GROUP = ChatRef(platform="web", chat_id="playground", kind="group")
Frame = dict[str, Any]


async def notes_panel(chat: ChatRef) -> list[dict[str, str]]:
    return [{"chat": chat.key, "note": "water the plants"}]


def answer(request: ModelRequest) -> ModelResponse:
    """Weather questions call the tool, then summarise it; anything else gets a greeting."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return text("上海今天晴，25°C。")
    return call("weather", {"city": "上海"}) if "天气" in str(last["content"]) else text("你好 Alice！")


@pytest.fixture
async def bot(tmp_path: Path, demo_plugin: Callable[..., Plugin[None]]) -> AsyncIterator[Bot]:
    """A bot with conftest's ``weather`` tool and a "notes" side panel."""
    model = ScriptedModel(answer)
    channel = WebChannel(WebSettings(enabled=True, port=0), bot_name="qunbot")
    b = Bot(Settings(bot={"data_dir": tmp_path}), model=model, channels=[channel],
            plugins=[demo_plugin(notes=notes_panel)])
    await b.start()
    yield b
    await b.stop()


def web(bot: Bot) -> WebChannel:
    channel = bot.channels["web"]
    assert isinstance(channel, WebChannel)
    return channel


async def connect(http: aiohttp.ClientSession, bot: Bot) -> tuple[aiohttp.ClientWebSocketResponse, Frame]:
    """Open a page socket; returns it and its history frame (after checking the welcome)."""
    ws = await http.ws_connect(web(bot).url + "ws")
    welcome = await ws.receive_json(timeout=5)
    assert welcome["type"] == "welcome" and welcome["bot_name"] == "qunbot" and welcome["group_id"] == "playground"
    assert {"id": "u-alice", "name": "Alice"} in welcome["members"]
    history = await ws.receive_json(timeout=5)
    assert history["type"] == "history"
    return ws, history


async def until(ws: aiohttp.ClientWebSocketResponse, match: Callable[[Frame], bool],
                seen: list[Frame] | None = None) -> Frame:
    """Read frames (collecting them into ``seen``) until one matches."""
    async with asyncio.timeout(5):
        while True:
            frame: Frame = await ws.receive_json()
            if seen is not None:
                seen.append(frame)
            if match(frame):
                return frame


def send(kind: str, user: dict[str, str], words: str) -> Frame:
    return {"type": "send", "kind": kind, "user": user, "text": words}


async def test_group_answers_only_who_mentioned_the_bot(bot: Bot, http: aiohttp.ClientSession) -> None:
    page1, _ = await connect(http, bot)
    page2, _ = await connect(http, bot)
    await page1.send_json(send("group", B, "大家好，中午吃什么？"))
    b_echo = await until(page1, lambda f: f["type"] == "message")
    await page1.send_json(send("group", A, "@QunBot 上海天气怎么样"))
    frames: list[Frame] = []
    reply = await until(page1, lambda f: f["type"] == "reply", frames)

    a_echo = next(f for f in frames if f["type"] == "message")
    assert a_echo["sender"] == A and a_echo["mentions_bot"] is True and a_echo["chat"] == {"kind": "group", "id": "playground"}
    assert b_echo["sender"] == B and b_echo["mentions_bot"] is False
    assert reply["chat"] == {"kind": "group", "id": "playground"}
    assert reply["mention"] == [A] and reply["reply_to"] == a_echo["id"]
    assert reply["text"] == "上海今天晴，25°C。"
    assert "".join(f["delta"] for f in frames if f["type"] == "delta" and f["run_id"] == a_echo["id"]) == reply["text"]
    tools = [f["event"] for f in frames if f["type"] == "trace" and f["event"]["type"] == "tool"]
    assert [(t["name"], t["message_id"], t["is_error"]) for t in tools] == [("weather", a_echo["id"], False)]
    assert isinstance(tools[0]["duration_ms"], float) and "sunny" in tools[0]["result"]
    end = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["type"] == "run_end")
    assert end["stop"] == "completed" and end["model_calls"] == 2

    # The model saw the question without the "@qunbot", and only A's message reached it.
    model = bot.model
    assert isinstance(model, ScriptedModel) and len(model.requests) == 2
    asked = str(model.requests[0].messages[-1]["content"])
    assert asked == "上海天气怎么样"
    recent = await bot.history.recent(GROUP, 10)
    assert b_echo["id"] in {h.message_id for h in recent}  # handled (recorded) ...
    assert all(r["reply_to"] != b_echo["id"] for r in await bot.outbox.rows())  # ... and not answered

    # The other page saw both people's messages and the reply, and got the chat's side panels after the run.
    seen2: list[Frame] = []
    await until(page2, lambda f: {"reply", "panels"} <= {g["type"] for g in seen2}, seen2)
    assert [f["sender"]["name"] for f in seen2 if f["type"] == "message"] == ["小明", "阿强"]
    panels = next(f for f in seen2 if f["type"] == "panels")
    assert panels["panels"] == [{"name": "notes", "rows": [{"chat": "web:group:playground", "note": "water the plants"}]},
                                {"name": "待批准", "rows": []}]  # the bot's own panel: nothing waits


async def test_private_chat_replies_without_mention(bot: Bot, http: aiohttp.ClientSession) -> None:
    page, _ = await connect(http, bot)
    await page.send_json(send("private", C, "你好"))
    echo = await until(page, lambda f: f["type"] == "message")
    reply = await until(page, lambda f: f["type"] == "reply")
    assert echo["chat"] == reply["chat"] == {"kind": "private", "id": "u-alice"}
    assert reply["text"] == "你好 Alice！" and reply["mention"] == [] and reply["reply_to"] == echo["id"]
    await page.send_json({"type": "panels", "chat": {"kind": "private", "id": "u-alice"}})
    panels = await until(page, lambda f: f["type"] == "panels")
    assert panels["panels"][0]["rows"][0]["chat"] == "web:private:u-alice"


@pytest.mark.parametrize("raw", [
    "not json",
    "[1, 2]",
    '{"type": "shout"}',
    '{"type": "send", "kind": "group", "user": {"id": "u-a"}, "text": "hi"}',
    '{"type": "send", "kind": "group", "user": {"id": "bad id!", "name": "x"}, "text": "hi"}',
    '{"type": "send", "kind": "guild", "user": {"id": "u-a", "name": "x"}, "text": "hi"}',
    '{"type": "send", "kind": "group", "user": {"id": "u-a", "name": "x"}, "text": "   "}',
    "[" * 50000,
    '{"type": "ping", "x": ' + "9" * 4301 + "}",  # past Python's digits limit: a ValueError, not JSONDecodeError
])
async def test_bad_frames_get_an_error_and_the_socket_survives(bot: Bot, http: aiohttp.ClientSession,
                                                               raw: str) -> None:
    page, _ = await connect(http, bot)
    await page.send_str(raw)
    error = await page.receive_json(timeout=5)
    assert error["type"] == "error" and error["error"]
    await page.send_bytes(b"\x00\x01")
    assert (await page.receive_json(timeout=5))["type"] == "error"
    await page.send_json({"type": "ping"})
    assert await page.receive_json(timeout=5) == {"type": "pong"}
    assert web(bot).pages == 1


async def test_a_frame_with_half_an_emoji_reaches_the_pages_and_the_ones_after_it_too(
        bot: Bot, http: aiohttp.ClientSession) -> None:
    """A reply cut mid-emoji (a lone surrogate) could not go out as UTF-8: every page went deaf,
    and so did each new one, as the frame stayed in the transcript."""
    channel = web(bot)
    page, _ = await connect(http, bot)
    await channel.trace(GROUP, {"type": "tool", "name": "search", "result": "半个表情 \ud83d"})  # a cut snippet
    await channel.send(OutgoingMessage(key="r2", chat=GROUP, text="之后的回复"))
    trace = await until(page, lambda f: f["type"] == "trace")
    assert trace["event"]["result"] == "半个表情 \ud83d"  # (escaped on the wire: JSON carries it)
    assert (await until(page, lambda f: f["type"] == "reply"))["text"] == "之后的回复"
    _, history = await connect(http, bot)  # a new page gets the transcript, that frame too
    assert [f["type"] for f in history["frames"]][-2:] == ["trace", "reply"]


async def test_an_at_inside_a_word_or_an_address_does_not_mention_the_bot(bot: Bot, http: aiohttp.ClientSession) -> None:
    page, _ = await connect(http, bot)
    for words in ("写信给 bob@qunbot.io 吧", "@qunbotfan 你好"):
        await page.send_json(send("group", B, words))
        echo = await until(page, lambda f: f["type"] == "message")
        assert echo["mentions_bot"] is False and echo["text"] == words
    for words in ("你好@qunbot，在吗", "@QunBot在吗"):
        await page.send_json(send("group", B, words))
        assert (await until(page, lambda f: f["type"] == "message"))["mentions_bot"] is True


async def test_mentioning_the_bot_keeps_the_indentation_of_pasted_code(bot: Bot, http: aiohttp.ClientSession) -> None:
    """Cutting the @mention folded every run of spaces in the message: code reached the bot flattened."""
    code = "def f(xs):\n    for x in xs:\n        if x:  # 真\n            return x"
    page, _ = await connect(http, bot)
    await page.send_json(send("group", A, "@qunbot  为什么报错？\n" + code))
    await until(page, lambda f: f["type"] == "reply")
    await page.send_json(send("group", A, "看看   这段 @qunbot  x =   [1,   2]"))
    await until(page, lambda f: f["type"] == "reply")
    said = [h.text for h in await bot.history.recent(GROUP, 10) if h.user_id == A["id"]]
    assert said == ["为什么报错？\n" + code, "看看   这段 x =   [1,   2]"]


async def test_replies_sent_while_no_page_is_open_arrive_on_connect(bot: Bot, http: aiohttp.ClientSession) -> None:
    channel = web(bot)
    assert channel.pages == 0
    receipt = await channel.send(OutgoingMessage(key="r1", chat=GROUP, text="别忘了开会", mention=("u-alice",)))
    assert receipt.platform_message_id == "r1"
    _, history = await connect(http, bot)
    replies = [f for f in history["frames"] if f["type"] == "reply"]
    assert replies == [{"type": "reply", "chat": {"kind": "group", "id": "playground"}, "id": "r1",
                        "text": "别忘了开会", "mention": [{"id": "u-alice", "name": "Alice"}], "reply_to": None,
                        "time": replies[0]["time"], "zone": "Asia/Shanghai"}]


async def test_listening_beyond_this_machine_it_answers_to_its_addresses_not_to_a_rebound_name(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """DNS rebinding: a site the user visits points its own name at the playground; the page's Origin and
    Host then agree (attacker.example:PORT), and it could speak as the bot's admin. Names are refused
    unless listed in [web] allowed_hosts; addresses (what a LAN user types) are served."""
    channel = WebChannel(WebSettings(enabled=True, host="0.0.0.0", port=0, allowed_hosts=["Bot.Lan"]))
    b = Bot(Settings(bot={"data_dir": tmp_path}), model=ScriptedModel([text("好")]), channels=[channel])
    await b.start()
    try:
        url = f"http://127.0.0.1:{channel.port}/"
        rebound = f"attacker.example:{channel.port}"
        async with http.get(url, headers={"Host": rebound}) as resp:
            assert resp.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url + "ws", headers={"Host": rebound, "Origin": f"http://{rebound}"})
        assert refused.value.status == 403
        for host in (f"192.168.1.5:{channel.port}", f"[fe80::1]:{channel.port}", f"bot.lan:{channel.port}",
                     f"localhost:{channel.port}"):
            async with http.get(url, headers={"Host": host}) as resp:
                assert resp.status == 200, host
    finally:
        await b.stop()


async def test_page_and_assets_are_served_to_localhost_only(bot: Bot, http: aiohttp.ClientSession) -> None:
    url = web(bot).url
    async with http.get(url) as resp:
        assert resp.status == 200 and "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert '<script src="/static/app.js"' in await resp.text()
    async with http.get(url + "static/app.js") as resp:
        assert resp.status == 200 and "textContent" in await resp.text()
    async with http.get(url, headers={"Host": "evil.example:80"}) as resp:
        assert resp.status == 403
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(url + "ws", headers={"Origin": "http://evil.example"})
    assert refused.value.status == 403
    page, _ = await connect(http, bot)  # still serving
    await page.close()


async def test_a_connecting_page_gets_the_newest_frames_up_to_a_bound(bot: Bot, http: aiohttp.ClientSession) -> None:
    """Every transcript in one frame was 84 MB once filled (built on the event loop, seconds per page)."""
    channel = web(bot)
    for i in range(600):  # 15 chats' worth of long messages
        chat = ChatRef(platform="web", chat_id=f"u{i % 15}", kind="private")
        channel._publish(chat, {"type": "message", "chat": chat.key, "n": i, "text": "长" * 4000})
    ws, history = await connect(http, bot)
    frames = history["frames"]
    assert 150 < len(frames) < 300 and frames[-1]["n"] == 599  # the newest, in order, about a million characters
    assert [f["n"] for f in frames] == sorted(f["n"] for f in frames)
    for i in range(1500):  # a page naming ever new chats: what it asked for is remembered within a bound
        await channel._restore(ChatRef(platform="web", chat_id=f"x{i}", kind="private"))
    assert len(channel._restored) <= 1000
    await ws.close()


async def test_a_page_opened_after_forget_me_no_longer_shows_the_message(tmp_path: Path,
                                                                          http: aiohttp.ClientSession) -> None:
    """The transcript kept for pages that connect later still held it, the database's copy gone."""
    import json

    secret = "我的身份证号是一一零一零五"
    channel = WebChannel(WebSettings(enabled=True, port=0), bot_name="qunbot")
    b = Bot(Settings(bot={"data_dir": tmp_path}), model=ScriptedModel(lambda r: text("好")), channels=[channel])
    await b.start()
    try:
        page, _ = await connect(http, b)
        await page.send_json(send("group", B, secret))
        await until(page, lambda f: f["type"] == "message")
        await page.send_json(send("group", B, "/forget me"))
        assert "已删除" in (await until(page, lambda f: f["type"] == "reply"))["text"]
        await page.close()
        later, history = await connect(http, b)
        assert secret not in json.dumps(history, ensure_ascii=False)
        await later.close()
    finally:
        await b.stop()


async def test_the_playground_and_its_wechat_login_page_serve_again_after_a_restart(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Losing and retaking the web lease stops and starts the playground: the second start re-mounted the
    login page frozen by the first ("Cannot add frozen application"), and the playground never came back."""
    from robot.bot import build_channels

    settings = Settings(bot={"data_dir": tmp_path}, channels={"web": {"enabled": True, "port": 0},
                                                             "weixin": {"enabled": True}})
    (playground,) = [c for c in build_channels(settings) if isinstance(c, WebChannel)]
    for _ in range(2):
        await playground.start()
        try:
            for path in ("", "weixin/"):
                async with http.get(playground.url + path) as resp:
                    assert resp.status == 200, path
        finally:
            await playground.stop()


async def test_two_pages_connecting_together_both_get_the_stored_messages(http: aiohttp.ClientSession) -> None:
    """After a restart two tabs reconnect at once: the second found the chats being read for the first, did not
    wait, and showed them empty for good."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from robot.history import HistoryEntry

    release, reads = asyncio.Event(), []

    async def history(chat: ChatRef, limit: int) -> list[HistoryEntry]:
        reads.append(chat.key)
        await release.wait()  # both pages connect while the store answers
        return [HistoryEntry(chat=chat.key, message_id=f"m-{chat.chat_id}", user_id="u-alice", name="Alice",
                             text=f"stored in {chat.chat_id}", at=datetime(2025, 1, 1, tzinfo=UTC))]

    channel = WebChannel(WebSettings(enabled=True, port=0), bot_name="qunbot")
    channel.attach_chats(history, lambda chat: ZoneInfo("UTC"))
    await channel.start()
    try:
        first = asyncio.ensure_future(http.ws_connect(channel.url + "ws"))
        second = asyncio.ensure_future(http.ws_connect(channel.url + "ws"))
        pages = await asyncio.gather(first, second)
        await asyncio.sleep(0.1)  # both handshakes done, the first read waiting on the store
        release.set()
        for page in pages:
            assert (await page.receive_json(timeout=5))["type"] == "welcome"
            shown = {f["text"] for f in (await page.receive_json(timeout=5))["frames"]}
            assert shown == {f"stored in {chat}" for chat in ("playground", "u-xiaoming", "u-aqiang", "u-alice")}
            await page.close()
        assert sorted(reads) == sorted(set(reads))  # each chat read once
    finally:
        await channel.stop()


async def test_the_page_is_told_the_bots_message_limit_and_a_longer_text_is_refused(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """One number: [limits] max_message_chars (the page holds a longer text with a notice; the server refuses it)."""
    from robot.config import LimitsSection

    assert WebChannel(WebSettings()).max_text == LimitsSection().max_message_chars == 8000
    channel = WebChannel(WebSettings(enabled=True, port=0), bot_name="qunbot", max_message_chars=300)
    bot = Bot(Settings(bot={"data_dir": tmp_path}, limits={"max_message_chars": 300}), model=None, channels=[channel])
    await bot.start()
    try:
        page, _ = await connect(http, bot)
        await page.close()
        page = await http.ws_connect(channel.url + "ws")
        assert (await page.receive_json(timeout=5))["max_text_len"] == 300
        await page.send_json(send("private", A, "长" * 301))
        error = await until(page, lambda f: f["type"] == "error")
        assert "301" in error["error"] and "300" in error["error"]
        await page.send_json(send("private", A, "长" * 300))
        assert (await until(page, lambda f: f["type"] == "message"))["text"] == "长" * 300
    finally:
        await bot.stop()


def test_the_playground_takes_the_bots_message_limit_from_the_settings() -> None:
    from robot.bot import build_channels
    from robot.channels.web import WebChannel
    from robot.config import Settings

    built = build_channels(Settings(limits={"max_message_chars": 500}))
    web = next(c for c in built if isinstance(c, WebChannel))
    assert web.max_text == 500
