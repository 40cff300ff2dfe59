"""The WeCom app channel over loopback: callback server + a fake WeCom API."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from robot.channels.base import ChannelUnavailable, SendFailed, SendRejected
from robot.channels.wecom import WeComChannel, WeComSettings, create_channel
from robot.channels.wecom.testing import FakeWeComAPI, signed_query
from robot.message import ChatRef, Message, OutgoingMessage

VECTORS = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "wecom_callback.json").read_text(encoding="utf-8")
)


def _settings(api_base: str, **extra: Any) -> WeComSettings:
    return WeComSettings(
        enabled=True,
        mode="app",
        port=0,
        token=SecretStr(VECTORS["token"]),
        encoding_aes_key=SecretStr(VECTORS["encoding_aes_key"]),
        corp_id=VECTORS["receive_id"],
        corp_secret=SecretStr("secret"),
        agent_id=1000002,
        api_base=api_base,
        **extra,
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeWeComAPI]:
    async with FakeWeComAPI(corp_id=VECTORS["receive_id"], corp_secret="secret") as api:
        yield api


@pytest.fixture
async def channel(
    fake: FakeWeComAPI, running: Callable[[WeComChannel], AbstractAsyncContextManager[WeComChannel]]
) -> AsyncIterator[WeComChannel]:
    """An app channel posting into ``inbox`` (conftest), talking to the fake API."""
    async with running(WeComChannel(_settings(fake.base_url))) as ch:
        yield ch


def _text_xml(user: str, content: str, msg_id: str, created: int = 1700000000) -> str:
    return (
        f"<xml><ToUserName><![CDATA[{VECTORS['receive_id']}]]></ToUserName>"
        f"<FromUserName><![CDATA[{user}]]></FromUserName><CreateTime>{created}</CreateTime>"
        f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{content}]]></Content>"
        f"<MsgId>{msg_id}</MsgId><AgentID>1000002</AgentID></xml>"
    )


async def _post_message(
    http: aiohttp.ClientSession, channel: WeComChannel, inner_xml: str
) -> tuple[int, str]:
    encrypt = channel.crypto.encrypt(inner_xml)
    body = f"<xml><ToUserName><![CDATA[x]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
    async with http.post(channel.url, params=signed_query(channel.crypto, encrypt), data=body) as resp:
        return resp.status, await resp.text()


async def test_url_verification_with_official_vector(
    channel: WeComChannel, http: aiohttp.ClientSession
) -> None:
    v = VECTORS["verify_url"]
    channel.clock = lambda: float(v["timestamp"])  # replaying the 2016 vector at its own time
    params = {k: v[k] for k in ("msg_signature", "timestamp", "nonce", "echostr")}
    async with http.get(channel.url, params=params) as resp:
        assert resp.status == 200
        assert await resp.text() == v["expected_plaintext"]
    async with http.get(channel.url, params={**params, "msg_signature": "f" * 40}) as resp:
        assert resp.status == 403
    async with http.get(channel.url, params={"echostr": "x"}) as resp:
        assert resp.status == 400


async def test_official_message_vector_is_delivered(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    v = VECTORS["decrypt_message"]
    channel.clock = lambda: float(v["timestamp"])
    params = {k: v[k] for k in ("msg_signature", "timestamp", "nonce")}
    async with http.post(channel.url, params=params, data=v["post_body"].encode()) as resp:
        assert resp.status == 200
        assert await resp.text() == "success"
    msg = await asyncio.wait_for(inbox.get(), 5)
    assert msg.chat == ChatRef(platform="wecom", chat_id="ChenJiaShun", kind="private")
    assert msg.sender.user_id == "ChenJiaShun"
    assert msg.text == "你好"
    assert msg.message_id == "1456453720"
    assert msg.timestamp == datetime.fromtimestamp(1476422779, tz=UTC)
    assert msg.qualified_sender == "wecom:ChenJiaShun"


async def test_bad_signature_is_403_and_not_delivered(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    v = VECTORS["decrypt_message"]
    channel.clock = lambda: float(v["timestamp"])
    params = {"msg_signature": "0" * 40, "timestamp": v["timestamp"], "nonce": v["nonce"]}
    async with http.post(channel.url, params=params, data=v["post_body"].encode()) as resp:
        assert resp.status == 403
    channel.clock = time.time
    status, _ = await _post_message(http, channel, _text_xml("bob", "after", "2"))
    assert status == 200
    assert (await asyncio.wait_for(inbox.get(), 5)).text == "after"


@pytest.mark.parametrize("timestamp", ["1" + "0" * 400, "9" * 5000, "1e9", ""])
async def test_an_absurd_timestamp_is_a_clear_400_on_both_methods(
    channel: WeComChannel, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, timestamp: str
) -> None:
    params = {"msg_signature": "0" * 40, "timestamp": timestamp, "nonce": "n", "echostr": "x"}
    async with http.get(channel.url, params=params) as resp:
        assert resp.status == 400
    async with http.post(channel.url, params=params, data=b"<xml><Encrypt>x</Encrypt></xml>") as resp:
        assert resp.status == 400
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


async def test_duplicate_msgid_delivered_once(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    for _ in range(2):
        assert (await _post_message(http, channel, _text_xml("amy", "hello", "777")))[0] == 200
    assert (await _post_message(http, channel, _text_xml("amy", "second", "778")))[0] == 200
    first = await asyncio.wait_for(inbox.get(), 5)
    second = await asyncio.wait_for(inbox.get(), 5)
    assert [first.message_id, second.message_id] == ["777", "778"]


async def test_a_message_arriving_while_the_bot_stops_is_left_to_wecoms_retry(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    """It was answered "success", then turned away by the stopping bot: lost, as WeCom never sent it again."""
    channel.stop_taking()
    status, text = await _post_message(http, channel, _text_xml("amy", "during the restart", "901"))
    assert status == 503 and text != "success"
    channel.taking = True  # taken when it comes again (not deduped as seen)
    assert await _post_message(http, channel, _text_xml("amy", "during the restart", "901")) == (200, "success")
    assert (await asyncio.wait_for(inbox.get(), 5)).message_id == "901"
    assert inbox.empty()


async def test_garbage_bodies_get_400_and_server_keeps_serving(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    crypto = channel.crypto
    garbage: list[tuple[dict[str, str], bytes]] = [
        (signed_query(crypto, ""), b"\x00\xff not xml"),
        (signed_query(crypto, "x"), b"<xml><Encrypt>x</Encrypt>"),
        (signed_query(crypto, "&a;"), b'<!DOCTYPE x [<!ENTITY a "b">]><xml><Encrypt>&a;</Encrypt></xml>'),
        ({}, b"<xml><Encrypt>abc</Encrypt></xml>"),
        # Correctly signed, but the ciphertext is not valid.
        (signed_query(crypto, "bm90IHJlYWw="), b"<xml><Encrypt>bm90IHJlYWw=</Encrypt></xml>"),
    ]
    for params, body in garbage:
        async with http.post(channel.url, params=params, data=body) as resp:
            assert resp.status == 400, body
    # Decrypts fine but the inner XML is not a message.
    assert (await _post_message(http, channel, "<xml><MsgType>text"))[0] == 400
    # Events and non-text messages are acknowledged and not delivered.
    status, text = await _post_message(http, channel, "<xml><MsgType>event</MsgType></xml>")
    assert (status, text) == (200, "success")
    assert (await _post_message(http, channel, _text_xml("kim", "still up", "9")))[0] == 200
    assert (await asyncio.wait_for(inbox.get(), 5)).text == "still up"


@pytest.mark.parametrize(
    ("body", "text"),
    [  # the shapes of document/path/90239 (消息格式)
        ("<MsgType><![CDATA[image]]></MsgType><PicUrl><![CDATA[http://x/p.jpg]]></PicUrl>"
         "<MediaId><![CDATA[m1]]></MediaId>", "[图片]"),
        ("<MsgType><![CDATA[voice]]></MsgType><MediaId><![CDATA[m2]]></MediaId><Format><![CDATA[amr]]></Format>",
         "[语音]"),
        ("<MsgType><![CDATA[voice]]></MsgType><MediaId><![CDATA[m2]]></MediaId><Format><![CDATA[amr]]></Format>"
         "<Recognition><![CDATA[明天上午十点开会]]></Recognition>", "[语音] 明天上午十点开会"),
        ("<MsgType><![CDATA[video]]></MsgType><MediaId><![CDATA[m3]]></MediaId>"
         "<ThumbMediaId><![CDATA[t]]></ThumbMediaId>", "[视频]"),
        ("<MsgType><![CDATA[location]]></MsgType><Location_X>23.134521</Location_X><Location_Y>113.358803</Location_Y>"
         "<Scale>20</Scale><Label><![CDATA[广州市天河区]]></Label><AppType><![CDATA[wxwork]]></AppType>",
         "[位置: 广州市天河区]"),
        ("<MsgType><![CDATA[location]]></MsgType><Location_X>23.13</Location_X><Location_Y>113.26</Location_Y>",
         "[位置: 23.13, 113.26]"),
        ("<MsgType><![CDATA[link]]></MsgType><Title><![CDATA[周报\n第 3 周]]></Title><Description><![CDATA[d]]>"
         "</Description><Url><![CDATA[https://example.com/r]]></Url><PicUrl><![CDATA[http://x/p]]></PicUrl>",
         "[链接: 周报 第 3 周 https://example.com/r]"),
    ],
)
async def test_a_picture_voice_location_or_link_reaches_the_bot_as_a_placeholder(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], body: str, text: str
) -> None:
    xml = (f"<xml><ToUserName><![CDATA[{VECTORS['receive_id']}]]></ToUserName><FromUserName><![CDATA[alice]]>"
           f"</FromUserName><CreateTime>1700000000</CreateTime>{body}<MsgId>7001</MsgId><AgentID>1000002</AgentID></xml>")
    assert await _post_message(http, channel, xml) == (200, "success")
    msg = await asyncio.wait_for(inbox.get(), 5)
    assert (msg.text, msg.message_id, msg.sender.user_id) == (text, "7001", "alice")


async def test_a_text_mentioning_a_declaration_is_delivered(
    channel: WeComChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    """A pasted HTML page is a user's text in CDATA, not a DTD: delivered, not a 400 on every WeCom retry."""
    text = "这个页面为什么白屏？<!DOCTYPE html><html><body></body></html>"
    assert await _post_message(http, channel, _text_xml("alice", text, "8100")) == (200, "success")
    assert (await asyncio.wait_for(inbox.get(), 5)).text == text


async def test_send_caches_token_and_refreshes_after_expiry(
    channel: WeComChannel, fake: FakeWeComAPI
) -> None:
    chat = ChatRef(platform="wecom", chat_id="ChenJiaShun", kind="private")
    r1 = await channel.send(OutgoingMessage(key="k1", chat=chat, text="one"))
    await channel.send(OutgoingMessage(key="k2", chat=chat, text="two"))
    assert len(fake.calls_to("/cgi-bin/gettoken")) == 1
    sends = fake.calls_to("/cgi-bin/message/send")
    assert [c.body for c in sends] == [
        {"touser": "ChenJiaShun", "msgtype": "text", "agentid": 1000002, "text": {"content": "one"}},
        {"touser": "ChenJiaShun", "msgtype": "text", "agentid": 1000002, "text": {"content": "two"}},
    ]
    assert sends[0].query["access_token"] == sends[1].query["access_token"]
    assert r1.platform_message_id

    first_token = sends[0].query["access_token"]
    fake.fail_sends.append(42001)
    await channel.send(OutgoingMessage(key="k3", chat=chat, text="three"))
    assert len(fake.calls_to("/cgi-bin/gettoken")) == 2
    last = fake.calls_to("/cgi-bin/message/send")[-1]
    assert last.body is not None and last.body["text"] == {"content": "three"}
    assert last.query["access_token"] != first_token


async def test_send_errors_are_classified(channel: WeComChannel, fake: FakeWeComAPI) -> None:
    chat = ChatRef(platform="wecom", chat_id="u1", kind="private")
    fake.fail_sends.append(81013)  # invalid user
    with pytest.raises(SendRejected, match="81013"):
        await channel.send(OutgoingMessage(key="a", chat=chat, text="x"))
    fake.fail_sends.append(-1)  # system busy
    with pytest.raises(ChannelUnavailable):
        await channel.send(OutgoingMessage(key="b", chat=chat, text="x"))
    for code in (45009, 45033):  # per-minute limits: a flood wait of a minute, never a bounded retry
        fake.fail_sends.append(code)
        with pytest.raises(ChannelUnavailable, match=str(code)) as limited:
            await channel.send(OutgoingMessage(key=f"r{code}", chat=chat, text="x"))
        assert not isinstance(limited.value, SendFailed) and limited.value.retry_after_s == 60
    fake.fail_sends.extend([42001, 42001])  # refreshed once, then give up
    with pytest.raises(SendRejected, match="42001"):
        await channel.send(OutgoingMessage(key="c", chat=chat, text="x"))
    with pytest.raises(SendRejected):
        await channel.send(OutgoingMessage(key="d", chat=chat.model_copy(update={"kind": "group"}), text="x"))


async def test_long_text_is_split_at_2048_bytes(channel: WeComChannel, fake: FakeWeComAPI) -> None:
    chat = ChatRef(platform="wecom", chat_id="u1", kind="private")
    text = "汉" * 1000  # 3000 bytes
    await channel.send(OutgoingMessage(key="long", chat=chat, text=text))
    pieces = [c.body["text"]["content"] for c in fake.calls_to("/cgi-bin/message/send") if c.body]
    assert "".join(pieces) == text and len(pieces) == 2
    assert all(len(p.encode()) <= 2048 for p in pieces)


async def _refused(channel: WeComChannel, error: type[Exception]) -> str:
    """Send one private message that must fail with ``error``; the error's text. Stops the channel."""
    try:
        with pytest.raises(error) as info:
            await channel.send(
                OutgoingMessage(
                    key="k", chat=ChatRef(platform="wecom", chat_id="u", kind="private"), text="x"
                )
            )
        return str(info.value)
    finally:
        await channel.stop()


async def test_unreachable_api_is_unavailable_and_hides_secrets() -> None:
    gone = FakeWeComAPI(corp_id=VECTORS["receive_id"], corp_secret="secret")
    await gone.start()
    base = gone.base_url
    await gone.stop()
    channel = create_channel(_settings(base))
    assert isinstance(channel, WeComChannel)
    assert "secret" not in await _refused(channel, ChannelUnavailable)


async def test_bad_corp_secret_is_rejected(fake: FakeWeComAPI) -> None:
    settings = _settings(fake.base_url).model_copy(update={"corp_secret": SecretStr("wrong-secret")})
    assert "wrong-secret" not in await _refused(WeComChannel(settings), SendRejected)


async def test_logs_never_contain_secrets(
    channel: WeComChannel,
    fake: FakeWeComAPI,
    http: aiohttp.ClientSession,
    inbox: asyncio.Queue[Message],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    chat = ChatRef(platform="wecom", chat_id="u1", kind="private")
    await channel.send(OutgoingMessage(key="a", chat=chat, text="x"))
    fake.fail_sends.append(42001)
    await channel.send(OutgoingMessage(key="b", chat=chat, text="y"))
    await _post_message(http, channel, _text_xml("u1", "hi", "55"))
    await asyncio.wait_for(inbox.get(), 5)
    params = {"msg_signature": "0", "timestamp": "1", "nonce": "2"}
    body = VECTORS["decrypt_message"]["post_body"].encode()
    async with http.post(channel.url, params=params, data=body) as resp:
        assert resp.status == 403
    tokens = {c.query["access_token"] for c in fake.calls_to("/cgi-bin/message/send")}
    assert caplog.records  # something was logged
    for secret in (*tokens, "secret", VECTORS["encoding_aes_key"], VECTORS["token"]):
        assert secret not in caplog.text
