"""The WeCom AI bot (智能机器人) channel: JSON callbacks and passive stream replies."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from robot.channels.base import SendFailed, SendRejected
from robot.channels.wecom import WeComAIBotChannel, WeComSettings, create_channel
from robot.channels.wecom import aibot as aibot_module
from robot.channels.wecom import callback as callback_module
from robot.channels.wecom.testing import FakeWeComAPI, signed_query
from robot.message import ChatRef, Message, OutgoingMessage
from robot.text_parts import split_text

VECTORS = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "wecom_callback.json").read_text(encoding="utf-8")
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeWeComAPI]:
    async with FakeWeComAPI() as api:
        yield api


@pytest.fixture(autouse=True)
def _quick_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    """No WeCom polls here: a stop waits only a moment for answers left in bubbles (they go by response_url)."""
    monkeypatch.setattr(aibot_module, "_COLLECT", 0.05)


@pytest.fixture
async def bot(
    fake: FakeWeComAPI,
    running: Callable[[WeComAIBotChannel], AbstractAsyncContextManager[WeComAIBotChannel]],
) -> AsyncIterator[WeComAIBotChannel]:
    """An AI-bot channel posting into ``inbox`` (conftest), talking to the fake API."""
    settings = WeComSettings(
        enabled=True,
        mode="aibot",
        port=0,
        token=SecretStr(VECTORS["token"]),
        encoding_aes_key=SecretStr(VECTORS["encoding_aes_key"]),
        bot_name="RobotA",
        api_base=fake.base_url,
    )
    channel = create_channel(settings)
    assert isinstance(channel, WeComAIBotChannel)
    async with running(channel):
        yield channel


class _Clock:
    """The channel's monotonic clock, moved by hand (stream ages, the settle before a bubble ends)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(bot: WeComAIBotChannel, monkeypatch: pytest.MonkeyPatch) -> _Clock:
    moved = _Clock()
    monkeypatch.setattr(bot, "_now", moved)
    return moved


async def _callback(
    http: aiohttp.ClientSession, bot: WeComAIBotChannel, payload: dict[str, Any]
) -> dict[str, Any] | None:
    """POST an encrypted callback; return the decrypted reply (None for an empty reply)."""
    encrypt = bot.crypto.encrypt(json.dumps(payload, ensure_ascii=False))
    params = signed_query(bot.crypto, encrypt, nonce="n7")
    async with http.post(bot.url, params=params, json={"encrypt": encrypt}) as resp:
        assert resp.status == 200
        text = await resp.text()
    if not text:
        return None
    envelope = json.loads(text)
    assert envelope["nonce"] == "n7"
    plain = bot.crypto.decrypt(
        envelope["msgsignature"], envelope["timestamp"], envelope["nonce"], envelope["encrypt"]
    )
    reply: dict[str, Any] = json.loads(plain)
    return reply


def _text(msgid: str, content: str, *, group: bool = True, response_url: str = "") -> dict[str, Any]:
    payload: dict[str, Any] = {
        "msgid": msgid,
        "aibotid": "AIBOTID",
        "chattype": "group" if group else "single",
        "from": {"userid": "alice"},
        "msgtype": "text",
        "text": {"content": content},
    }
    if group:
        payload["chatid"] = "CHAT1"
    if response_url:
        payload["response_url"] = response_url
    return payload


def _refresh(stream_id: str) -> dict[str, Any]:
    return {
        "msgid": "refresh",
        "aibotid": "AIBOTID",
        "chatid": "CHAT1",
        "chattype": "group",
        "from": {"userid": "alice"},
        "msgtype": "stream",
        "stream": {"id": stream_id},
    }


async def test_group_text_starts_stream_and_is_delivered(
    bot: WeComAIBotChannel,
    http: aiohttp.ClientSession,
    inbox: asyncio.Queue[Message],
    fake: FakeWeComAPI,
    clock: _Clock,
) -> None:
    first = await _callback(http, bot, _text("m1", "@RobotA hello robot", response_url=fake.response_url))
    assert first is not None and first["msgtype"] == "stream"
    assert first["stream"]["finish"] is False and first["stream"]["content"] == ""
    stream_id = first["stream"]["id"]
    assert stream_id

    msg = await asyncio.wait_for(inbox.get(), 5)
    assert msg.chat == ChatRef(platform="wecom", chat_id="CHAT1", kind="group")
    assert msg.sender.user_id == "alice"
    assert msg.text == "hello robot"
    assert msg.mentions_bot is True
    assert msg.message_id == "m1"
    assert msg.raw is not None and "response_url" not in msg.raw

    pending = await _callback(http, bot, _refresh(stream_id))
    assert pending is not None and pending["stream"] == {"id": stream_id, "finish": False, "content": ""}

    await bot.stream_delta(msg.chat, "m1", "thinking")  # run_id: the message it answers
    partial = await _callback(http, bot, _refresh(stream_id))
    assert partial is not None and partial["stream"]["content"] == "thinking"

    receipt = await bot.send(OutgoingMessage(key="r1", chat=msg.chat, text="hi there", reply_to="m1"))
    assert receipt.platform_message_id == stream_id
    clock.now += 2  # the bubble ends once no further part followed for a moment
    done = await _callback(http, bot, _refresh(stream_id))
    assert done is not None and done["stream"] == {"id": stream_id, "finish": True, "content": "hi there"}


async def test_second_reply_uses_response_url_once(
    bot: WeComAIBotChannel,
    http: aiohttp.ClientSession,
    inbox: asyncio.Queue[Message],
    fake: FakeWeComAPI,
) -> None:
    await _callback(http, bot, _text("m2", "@RobotA remind me", response_url=fake.response_url))
    msg = await asyncio.wait_for(inbox.get(), 5)
    await bot.send(OutgoingMessage(key="a", chat=msg.chat, text="first", reply_to="m2"))  # its bubble
    await bot.send(OutgoingMessage(key="b", chat=msg.chat, text="**later**"))  # a reminder: the response_url
    calls = fake.calls_to("/cgi-bin/aibot/response")
    assert [c.body for c in calls] == [{"msgtype": "markdown", "markdown": {"content": "**later**"}}]
    with pytest.raises(SendRejected):
        await bot.send(OutgoingMessage(key="c", chat=msg.chat, text="third"))


async def _ask(http: aiohttp.ClientSession, bot: WeComAIBotChannel, inbox: asyncio.Queue[Message],
               msgid: str, response_url: str = "") -> tuple[str, Message]:
    """Ask once in the group: the new bubble's stream id and the delivered message."""
    opened = await _callback(http, bot, _text(msgid, "@RobotA a question", response_url=response_url))
    assert opened is not None
    return opened["stream"]["id"], await asyncio.wait_for(inbox.get(), 5)


async def test_every_part_of_a_long_answer_reaches_the_asker(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI,
    clock: _Clock,
) -> None:
    """The outbox sends a long answer in parts (max_text_len), one send each: part 1 ended the bubble, part 2
    spent the response_url, part 3 was refused: 10,198 of 15,000 characters reached the asker."""
    stream_id, msg = await _ask(http, bot, inbox, "m5", fake.response_url)
    answer = "".join(f"line {i:05d} of the report\n" for i in range(600))
    parts = split_text(answer, bot.capabilities.max_text_len)
    assert len(parts) == 3
    for i, part in enumerate(parts):
        receipt = await bot.send(OutgoingMessage(key=f"long#{i}", chat=msg.chat, text=part, reply_to="m5"))
        assert receipt.platform_message_id == stream_id
        if i == 0:  # WeCom polls between two parts: the bubble must not end under the next one
            between = await _callback(http, bot, _refresh(stream_id))
            assert between is not None and between["stream"]["finish"] is False
    clock.now += 2
    done = await _callback(http, bot, _refresh(stream_id))
    assert done is not None and done["stream"] == {"id": stream_id, "finish": True, "content": "\n\n".join(parts)}
    assert fake.calls_to("/cgi-bin/aibot/response") == []  # still unused: a reminder can go through it


async def test_a_part_the_bubble_cannot_take_goes_through_the_response_url(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI,
    clock: _Clock,
) -> None:
    """A bubble holds 20,480 bytes: the part past it goes on as a message of its own, and the bubble ends above
    it; with that spent too, the next part fails, saying why."""
    stream_id, msg = await _ask(http, bot, inbox, "m6", fake.response_url)
    parts = ["汉" * bot.capabilities.max_text_len, "字" * 100, "词" * 100]  # 15,360 bytes, then 300 each
    await bot.send(OutgoingMessage(key="cjk#0", chat=msg.chat, text=parts[0], reply_to="m6"))
    clock.now += 2
    seen = await _callback(http, bot, _refresh(stream_id))  # WeCom saw it end: nothing more shows in it
    assert seen is not None and seen["stream"]["finish"] is True
    await bot.send(OutgoingMessage(key="cjk#1", chat=msg.chat, text=parts[1], reply_to="m6"))
    assert [c.body for c in fake.calls_to("/cgi-bin/aibot/response")] == [
        {"msgtype": "markdown", "markdown": {"content": parts[1]}}]
    with pytest.raises(SendRejected, match="response_url"):
        await bot.send(OutgoingMessage(key="cjk#2", chat=msg.chat, text=parts[2], reply_to="m6"))

    stream_id, msg = await _ask(http, bot, inbox, "m7", fake.response_url)
    await bot.send(OutgoingMessage(key="big#0", chat=msg.chat, text=parts[0], reply_to="m7"))
    await bot.send(OutgoingMessage(key="big#1", chat=msg.chat, text=parts[0], reply_to="m7"))  # no room left
    full = await _callback(http, bot, _refresh(stream_id))  # ended at once: the rest is below it
    assert full is not None and full["stream"] == {"id": stream_id, "finish": True, "content": parts[0]}
    assert len(fake.calls_to("/cgi-bin/aibot/response")) == 2
    with pytest.raises(SendRejected, match="full"):
        await bot.send(OutgoingMessage(key="big#2", chat=msg.chat, text="tail", reply_to="m7"))


async def test_a_response_url_that_failed_for_now_serves_the_retry(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI
) -> None:
    """It was dropped before the POST: after a 503 the outbox's retry found none and the reminder was lost."""
    _, msg = await _ask(http, bot, inbox, "m8", fake.response_url)
    await bot.send(OutgoingMessage(key="answer", chat=msg.chat, text="hello", reply_to="m8"))
    reminder = OutgoingMessage(key="rem", chat=msg.chat, text="提醒：开会")
    fake.fail_responses.append(503)
    with pytest.raises(SendFailed):
        await bot.send(reminder)
    await bot.send(reminder)  # the outbox's retry
    assert len(fake.calls_to("/cgi-bin/aibot/response")) == 2
    with pytest.raises(SendRejected):  # spent now
        await bot.send(OutgoingMessage(key="rem2", chat=msg.chat, text="again"))


async def test_two_sends_racing_for_one_response_url_post_once(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI
) -> None:
    _, msg = await _ask(http, bot, inbox, "m9", fake.response_url)
    await bot.send(OutgoingMessage(key="answer", chat=msg.chat, text="hello", reply_to="m9"))
    one, two = (OutgoingMessage(key=k, chat=msg.chat, text=k) for k in ("one", "two"))
    results = await asyncio.gather(bot.send(one), bot.send(two), return_exceptions=True)
    assert not isinstance(results[0], BaseException)
    assert isinstance(results[1], SendFailed)  # retried: the first could still have failed for now
    assert len(fake.calls_to("/cgi-bin/aibot/response")) == 1
    with pytest.raises(SendRejected):
        await bot.send(two)


async def test_a_message_arriving_while_the_bot_stops_is_left_to_wecoms_retry(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    bot.stop_taking()
    encrypt = bot.crypto.encrypt(json.dumps(_text("s1", "@RobotA during the restart")))
    async with http.post(bot.url, params=signed_query(bot.crypto, encrypt), json={"encrypt": encrypt}) as resp:
        assert resp.status == 503
    bot.taking = True  # taken when it comes again
    again = await _callback(http, bot, _text("s1", "@RobotA during the restart"))
    assert again is not None and (await asyncio.wait_for(inbox.get(), 5)).message_id == "s1"
    assert inbox.empty()


async def test_private_chat_and_duplicate_msgid(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    a = await _callback(http, bot, _text("p1", "hello", group=False))
    b = await _callback(http, bot, _text("p1", "hello", group=False))
    assert a is not None and b is not None and a["stream"]["id"] == b["stream"]["id"]
    await _callback(http, bot, _text("p2", "again", group=False))
    first = await asyncio.wait_for(inbox.get(), 5)
    second = await asyncio.wait_for(inbox.get(), 5)
    assert [first.message_id, second.message_id] == ["p1", "p2"]
    assert first.chat == ChatRef(platform="wecom", chat_id="alice", kind="private")
    assert first.text == "hello" and first.mentions_bot is False


async def _two_questions(http: aiohttp.ClientSession, bot: WeComAIBotChannel, inbox: asyncio.Queue[Message],
                         first: str, second: str) -> tuple[str, str, Message, Message]:
    """Ask q1 and q2 in the group: their streams' ids and the two delivered messages."""
    s1 = await _callback(http, bot, _text("q1", first))
    s2 = await _callback(http, bot, _text("q2", second))
    assert s1 is not None and s2 is not None
    m1, m2 = await asyncio.wait_for(inbox.get(), 5), await asyncio.wait_for(inbox.get(), 5)
    return s1["stream"]["id"], s2["stream"]["id"], m1, m2


async def _stream_contents(http: aiohttp.ClientSession, bot: WeComAIBotChannel, *stream_ids: str) -> list[str]:
    """What each stream's bubble shows on its next refresh."""
    shown = []
    for stream_id in stream_ids:
        refreshed = await _callback(http, bot, _refresh(stream_id))
        assert refreshed is not None
        shown.append(refreshed["stream"]["content"])
    return shown


async def test_replies_fill_streams_in_order(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    s1, s2, m1, m2 = await _two_questions(http, bot, inbox, "@RobotA one", "@RobotA two")
    await bot.send(OutgoingMessage(key="x2", chat=m2.chat, text="answer two", reply_to="q2"))
    await bot.send(OutgoingMessage(key="x1", chat=m1.chat, text="answer one", reply_to="q1"))
    assert await _stream_contents(http, bot, s1, s2) == ["answer one", "answer two"]


async def test_a_message_answering_nobody_never_takes_an_askers_bubble(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    """A reminder took the oldest open bubble (alice's); alice's answer then went into bob's, and bob's was refused."""
    s1, s2, m1, m2 = await _two_questions(http, bot, inbox, "@RobotA one", "@RobotA two")
    with pytest.raises(SendRejected):  # no response_url here: it cannot start a conversation
        await bot.send(OutgoingMessage(key="rem", chat=m1.chat, text="[reminder] standup"))
    await bot.send(OutgoingMessage(key="x1", chat=m1.chat, text="answer one", reply_to="q1"))
    await bot.send(OutgoingMessage(key="x2", chat=m2.chat, text="answer two", reply_to="q2"))
    assert await _stream_contents(http, bot, s1, s2) == ["answer one", "answer two"]


async def test_streamed_pieces_fill_the_bubble_of_the_message_they_answer(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    """Two questions in one group answered at once: each run's pieces go to its own asker's bubble."""
    s1, s2, m1, m2 = await _two_questions(http, bot, inbox, "@RobotA 2+2?", "@RobotA 法国首都？")
    await bot.stream_delta(m2.chat, "q2", "巴黎")
    await bot.stream_delta(m1.chat, "q1", "4")
    await bot.stream_delta(m1.chat, "q3", "无主的片段")  # a run with no bubble here shows in none
    assert await _stream_contents(http, bot, s1, s2) == ["4", "巴黎"]


async def test_unknown_stream_events_and_bad_input(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message]
) -> None:
    unknown = await _callback(http, bot, _refresh("nope"))
    assert unknown is not None and unknown["stream"]["finish"] is True
    event = {"msgid": "e1", "aibotid": "A", "from": {"userid": "alice"}, "msgtype": "event"}
    assert await _callback(http, bot, {**event, "event": {"eventtype": "enter_chat"}}) is None

    encrypt = bot.crypto.encrypt("{}")
    async with http.post(
        bot.url,
        params={**signed_query(bot.crypto, encrypt), "msg_signature": "0" * 40},
        json={"encrypt": encrypt},
    ) as resp:
        assert resp.status == 403
    for body in (b"not json", b'{"encrypt": 5}', b"[]"):
        async with http.post(bot.url, params=signed_query(bot.crypto, "x"), data=body) as resp:
            assert resp.status == 400
    bad_plain = bot.crypto.encrypt("not json either")
    async with http.post(
        bot.url, params=signed_query(bot.crypto, bad_plain), json={"encrypt": bad_plain}
    ) as resp:
        assert resp.status == 400
    await _callback(http, bot, _text("ok1", "@RobotA still here"))
    assert (await asyncio.wait_for(inbox.get(), 5)).text == "still here"


async def test_a_message_the_bot_leaves_unanswered_has_its_bubble_finished(
    http: aiohttp.ClientSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message rate-limited into silence (the real pipeline): its bubble does not spin until WeCom's 6 minutes."""
    from robot.bot import Bot
    from robot.config import Settings

    channel = WeComAIBotChannel(WeComSettings(
        enabled=True, mode="aibot", port=0, token=SecretStr(VECTORS["token"]),
        encoding_aes_key=SecretStr(VECTORS["encoding_aes_key"]), bot_name="RobotA"))
    clock = _Clock()
    monkeypatch.setattr(channel, "_now", clock)
    bot = Bot(Settings(bot={"data_dir": tmp_path}, limits={"user_burst": 1, "user_per_minute": 1}),
              model=None, channels=[channel], plugins=[])
    await bot.start()
    try:
        streams = []
        for i in range(3):  # answered; the rate notice; silence
            reply = await _callback(http, channel, _text(f"q{i}", f"@RobotA 问题{i}"))
            assert reply is not None
            streams.append(reply["stream"]["id"])
        await channel.finish_deliveries(10)  # every message handled: what answers there are, are queued
        for _ in range(500):
            if [r["status"] for r in await bot.outbox.rows()] == ["sent", "sent"]:
                break
            await asyncio.sleep(0.01)
        clock.now += 2  # past the settle of a finished bubble, not past the grace of a silent one
        shown = [await _callback(http, channel, _refresh(sid)) for sid in streams]
        assert [(r or {})["stream"]["finish"] for r in shown] == [True, True, False]
        clock.now += 10
        last = await _callback(http, channel, _refresh(streams[2]))
        assert last is not None and last["stream"] == {"id": streams[2], "finish": True, "content": ""}
    finally:
        await bot.stop(flush_timeout_s=0.5)


@pytest.mark.parametrize(
    ("extra", "text"),
    [  # the shapes of document/path/100719 (voice: WeCom's transcription; image and file: encrypted URLs)
        ({"msgtype": "voice", "voice": {"content": "帮我订明天上午的会议室"}}, "[语音] 帮我订明天上午的会议室"),
        ({"msgtype": "voice", "voice": {}}, "[语音]"),
        ({"msgtype": "image", "image": {"url": "https://x/enc", "aeskey": "k"}}, "[图片]"),
        ({"msgtype": "file", "file": {"url": "https://x/enc", "aeskey": "k"}}, "[文件]"),
        ({"msgtype": "mixed", "mixed": {"msg_item": [{"msgtype": "text", "text": {"content": "看这张"}},
                                                     {"msgtype": "image", "image": {"url": "https://x"}}]}},
         "看这张\n[图片]"),
    ],
)
async def test_a_private_voice_image_or_file_reaches_the_bot_as_a_placeholder(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message],
    extra: dict[str, Any], text: str,
) -> None:
    payload = {**_text("media1", "", group=False), **extra}
    del payload["text"]
    reply = await _callback(http, bot, payload)
    assert reply is not None and reply["stream"]["finish"] is False  # a bubble for the answer
    msg = await asyncio.wait_for(inbox.get(), 5)
    assert (msg.text, msg.message_id, msg.chat.kind) == (text, "media1", "private")


async def test_url_verification_uses_empty_receive_id(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession
) -> None:
    own = bot.crypto.encrypt("echo-123")
    async with http.get(bot.url, params={**signed_query(bot.crypto, own), "echostr": own}) as resp:
        assert resp.status == 200 and await resp.text() == "echo-123"


async def _unfinished_post(bot: WeComAIBotChannel) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An unsigned callback whose body never finishes: a current timestamp, one byte of 100,000."""
    reader, writer = await asyncio.open_connection("127.0.0.1", bot.port)
    writer.write(f"POST {bot.settings.path}?msg_signature={'0' * 40}&timestamp={int(time.time())}&nonce=1 HTTP/1.1\r\n"
                 "Host: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{".encode())
    await writer.drain()
    return reader, writer


async def test_a_callback_body_that_never_finishes_is_answered_408(
    bot: WeComAIBotChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(callback_module, "_BODY_DEADLINE", 0.2, raising=False)
    reader, writer = await _unfinished_post(bot)
    try:
        async with asyncio.timeout(3):
            status = await reader.readline()
    finally:
        writer.close()
    assert status.split()[1] == b"408"


async def test_an_unfinished_callback_body_does_not_hold_the_stop(bot: WeComAIBotChannel) -> None:
    """systemd (TimeoutStopSec=30) SIGKILLed a bot whose stop waited 60 s for such a request."""
    _, writer = await _unfinished_post(bot)
    await asyncio.sleep(0.1)  # the handler is reading the body now
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):
            await bot.stop()
    finally:
        writer.close()
    assert time.monotonic() - started < 2.5


async def test_an_answer_wecom_did_not_collect_before_the_stop_goes_through_the_response_url(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI
) -> None:
    """The outbox recorded it sent; after a restart WeCom's poll of the bubble would get an empty, ended one."""
    _, msg = await _ask(http, bot, inbox, "s2", fake.response_url)
    await bot.send(OutgoingMessage(key="answer", chat=msg.chat, text="the answer", reply_to="s2"))
    await bot.stop()
    calls = fake.calls_to("/cgi-bin/aibot/response")
    assert [c.body for c in calls] == [{"msgtype": "markdown", "markdown": {"content": "the answer"}}]


async def test_the_stop_lets_wecom_collect_a_filled_bubble_first(
    bot: WeComAIBotChannel, http: aiohttp.ClientSession, inbox: asyncio.Queue[Message], fake: FakeWeComAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aibot_module, "_COLLECT", 2.0)
    stream_id, msg = await _ask(http, bot, inbox, "s3", fake.response_url)
    await bot.send(OutgoingMessage(key="answer", chat=msg.chat, text="the answer", reply_to="s3"))
    stopping = asyncio.create_task(bot.stop())
    await asyncio.sleep(0.01)
    polled = await _callback(http, bot, _refresh(stream_id))  # shown finished at once: no part can follow now
    assert polled is not None and polled["stream"] == {"id": stream_id, "finish": True, "content": "the answer"}
    async with asyncio.timeout(1):  # collected: the stop waits no longer
        await stopping
    assert fake.calls_to("/cgi-bin/aibot/response") == []  # not twice
