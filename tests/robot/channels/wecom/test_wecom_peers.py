"""WeCom callbacks an attacker could send: replays, unsigned XML bombs, UTF-16 DTDs, deep JSON, and
ciphertexts made for another receive_id. Real HTTP on loopback, the official vector's keys."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from robot.channels.wecom import WeComAIBotChannel, WeComChannel, WeComCrypto, WeComSettings
from robot.channels.wecom.crypto import MalformedBody, parse_xml
from robot.channels.wecom.testing import signed_query
from robot.message import Message

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "wecom_callback.json").read_text(encoding="utf-8")
)
BOMB = (
    '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
    '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><xml><Content>&b;</Content></xml>'
)


def settings(mode: str, **extra: Any) -> WeComSettings:
    fields: dict[str, Any] = {
        "enabled": True, "mode": mode, "port": 0, "token": SecretStr(VECTORS["token"]),
        "encoding_aes_key": SecretStr(VECTORS["encoding_aes_key"]), "api_base": "http://127.0.0.1:9",
    }
    if mode == "app":
        fields.update(corp_id=VECTORS["receive_id"], corp_secret=SecretStr("secret"), agent_id=1000002)
    return WeComSettings(**{**fields, **extra})


@pytest.fixture
async def app(running: Callable[[WeComChannel], AbstractAsyncContextManager[WeComChannel]],
              ) -> AsyncIterator[WeComChannel]:
    async with running(WeComChannel(settings("app"))) as ch:
        yield ch


@pytest.fixture
async def aibot(running: Callable[[WeComAIBotChannel], AbstractAsyncContextManager[WeComAIBotChannel]],
                ) -> AsyncIterator[WeComAIBotChannel]:
    async with running(WeComAIBotChannel(settings("aibot", bot_name="RobotA"))) as ch:
        yield ch


def app_text(content: str, msg_id: str) -> str:
    return (f"<xml><ToUserName><![CDATA[{VECTORS['receive_id']}]]></ToUserName>"
            f"<FromUserName><![CDATA[amy]]></FromUserName><CreateTime>{int(time.time())}</CreateTime>"
            f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{content}]]></Content>"
            f"<MsgId>{msg_id}</MsgId><AgentID>1000002</AgentID></xml>")


def envelope(encrypt: str) -> bytes:
    return f"<xml><ToUserName><![CDATA[x]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>".encode()


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- replays -------------------------------------------------------------------------------------


async def test_a_callback_older_than_five_minutes_is_refused(
    app: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    encrypt = app.crypto.encrypt(app_text("你好", "501"))
    old = str(int(time.time()) - 301)
    async with http.post(app.url, params=signed_query(app.crypto, encrypt, timestamp=old),
                         data=envelope(encrypt)) as resp:
        assert resp.status == 403
    future = str(int(time.time()) + 301)
    async with http.post(app.url, params=signed_query(app.crypto, encrypt, timestamp=future),
                         data=envelope(encrypt)) as resp:
        assert resp.status == 403
    echo = app.crypto.encrypt("echo")
    async with http.get(app.url, params={**signed_query(app.crypto, echo, timestamp=old), "echostr": echo}) as resp:
        assert resp.status == 403
    recent = str(int(time.time()) - 200)
    async with http.post(app.url, params=signed_query(app.crypto, encrypt, timestamp=recent),
                         data=envelope(encrypt)) as resp:
        assert resp.status == 200
    assert (await asyncio.wait_for(inbox.get(), 5)).text == "你好"
    assert inbox.empty()


async def test_the_window_is_configurable(
    running: Callable[[WeComChannel], AbstractAsyncContextManager[WeComChannel]], http: aiohttp.ClientSession
) -> None:
    async with running(WeComChannel(settings("app", timestamp_window_s=60))) as ch:
        encrypt = ch.crypto.encrypt(app_text("hi", "502"))
        stamp = str(int(time.time()) - 120)
        async with http.post(ch.url, params=signed_query(ch.crypto, encrypt, timestamp=stamp),
                             data=envelope(encrypt)) as resp:
            assert resp.status == 403


# -- XML -----------------------------------------------------------------------------------------


async def test_an_unsigned_xml_bomb_is_refused_by_signature_before_any_parse(
    app: WeComChannel, http: aiohttp.ClientSession
) -> None:
    body = (b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
            b"<xml><Encrypt>&b;</Encrypt></xml>")
    params = {"msg_signature": "0" * 40, "timestamp": str(int(time.time())), "nonce": "1"}
    async with http.post(app.url, params=params, data=body) as resp:
        assert resp.status == 403  # bad signature: the XML was never parsed


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_dtd_is_refused_in_utf16_too(encoding: str) -> None:
    with pytest.raises(MalformedBody):
        parse_xml(BOMB.encode(encoding))
    with pytest.raises(MalformedBody):
        parse_xml(BOMB.replace("UTF-16", "UTF-8"))
    assert parse_xml('<?xml version="1.0" encoding="UTF-16"?><xml><a>1</a></xml>'.encode(encoding)).findtext("a") == "1"


# -- the AI bot ----------------------------------------------------------------------------------


async def test_deeply_nested_json_is_a_400_without_a_traceback(
    aibot: WeComAIBotChannel, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deep = "[" * 100000
    async with http.post(aibot.url, params=signed_query(aibot.crypto, "x"), data=deep.encode()) as resp:
        assert resp.status == 400
        assert "Traceback" not in await resp.text()
    inner = aibot.crypto.encrypt(deep)  # correctly signed and encrypted, but nested to death inside
    async with http.post(aibot.url, params=signed_query(aibot.crypto, inner), json={"encrypt": inner}) as resp:
        assert resp.status == 400
    assert errors(caplog) == []


async def test_the_ai_bot_checks_the_receive_id_like_wecoms_json_sdk(
    aibot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    # Encrypted with the same key but for an app (receive_id = the corp id): not meant for the AI bot.
    other = WeComCrypto(VECTORS["token"], VECTORS["encoding_aes_key"], VECTORS["receive_id"])
    payload = {"msgid": "m1", "aibotid": "A", "chattype": "single", "from": {"userid": "eve"},
               "msgtype": "text", "text": {"content": "hi"}}
    encrypt = other.encrypt(json.dumps(payload))
    async with http.post(aibot.url, params=signed_query(aibot.crypto, encrypt), json={"encrypt": encrypt}) as resp:
        assert resp.status == 400
    own = aibot.crypto.encrypt(json.dumps({**payload, "msgid": "m2"}))
    async with http.post(aibot.url, params=signed_query(aibot.crypto, own), json={"encrypt": own}) as resp:
        assert resp.status == 200
    assert (await asyncio.wait_for(inbox.get(), 5)).message_id == "m2"
    assert inbox.empty()
