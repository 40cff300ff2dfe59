"""One contract for every channel, each run with its own fake peer on loopback.

A :class:`Peer` drives one platform's fake (the iLink server, the Bot API server, a OneBot
implementation, the WeCom API, a playground page): it makes a user say something, reads what the bot sent, breaks the next send,
and pushes garbage. The same tests then hold for every channel: text arrives; in a group only an
addressed message is answered; the answer is addressed back (where the platform has a way:
not the iLink API); long text is split to the platform's limit; a failed send is retried by the
outbox (not the playground: its sends cannot fail); a restart resumes without loss or duplicates (polling channels; push channels rely on the
peer's redelivery and the bot's dedupe); a bad frame is logged and survived.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
from pydantic import SecretStr

from function_calls.testing import ScriptedModel, text
from robot.bot import Bot
from robot.channels.base import Channel
from robot.channels.onebot import OneBotChannel, OneBotSettings, OneBotTestPeer
from robot.channels.telegram import TelegramChannel, TelegramSettings
from robot.channels.telegram.testing import FakeBotAPI
from robot.channels.web import WebChannel
from robot.channels.wecom import WeComChannel, WeComCrypto, WeComSettings
from robot.channels.wecom.testing import FakeWeComAPI, signed_query
from robot.channels.weixin import WeixinAccount, WeixinChannel, WeixinSettings, WeixinState
from robot.channels.weixin.testing import FakeILinkServer
from robot.config import WebSettings
from robot.message import ChatRef

Until = Callable[..., Awaitable[None]]
VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "vectors" / "onebot_v11.json").read_text("utf-8"))


@dataclass
class Out:
    """One message the peer received from the bot."""

    chat: str
    text: str
    addressed_to: str | None  # a mentioned user id or a quoted message id


class Peer(abc.ABC):
    """One platform's fake, as the contract sees it."""

    name: str
    #: The injected failure is a lost acknowledgement (the peer got the message): at least once.
    failure_loses_ack = False
    bot_name = "qunbot"

    @abc.abstractmethod
    def channel(self, tmp: Path) -> Channel: ...

    async def linked(self, channel: Channel) -> None:
        """Wait until the platform and the channel are connected (polling channels need nothing)."""
        return None

    @abc.abstractmethod
    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        """A user's message to the bot; returns its platform id (as the channel reports it)."""

    @abc.abstractmethod
    def outs(self) -> list[Out]: ...

    @abc.abstractmethod
    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef: ...

    @abc.abstractmethod
    def fail_next_send(self) -> None: ...

    @abc.abstractmethod
    async def bad_frame(self) -> None: ...


class WeixinPeer(Peer):
    name = "weixin"
    GROUP = "grp-1@chatroom"

    def __init__(self, fake: FakeILinkServer) -> None:
        self.fake = fake
        fake.add_bot("tok", "bot@im.bot")

    def channel(self, tmp: Path) -> Channel:
        WeixinState(tmp / "wx").save_account_sync(WeixinAccount(
            bot_id="bot@im.bot", bot_token=SecretStr("tok"), base_url=self.fake.url, saved_at=datetime.now(UTC)))
        return WeixinChannel(WeixinSettings(enabled=True, state_dir=tmp / "wx", max_text_len=300,
                                            retry_delay_s=0.05, backoff_max_s=0.1))

    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        # No @ in this API: in a group the bot is addressed by its name in front.
        said = f"{self.bot_name} {words}" if at_bot else words
        return str(self.fake.inject("tok", user, text=said, group_id=self.GROUP if group else None)["message_id"])

    def outs(self) -> list[Out]:
        return [Out(s.to_user_id, s.text, None) for s in self.fake.sent]

    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef:
        return ChatRef(platform="weixin", chat_id=self.GROUP if group else user, kind="group" if group else "private")

    def fail_next_send(self) -> None:
        self.fake.fail_sends.append(502)

    async def bad_frame(self) -> None:
        self.fake.inject("tok", "1001", text="x")["item_list"] = "garbage"


class TelegramPeer(Peer):
    name = "telegram"
    GROUP: ClassVar[dict[str, Any]] = {"id": -1001, "type": "supergroup", "title": "g"}

    def __init__(self, fake: FakeBotAPI) -> None:
        self.fake = fake

    def channel(self, tmp: Path) -> Channel:
        return TelegramChannel(TelegramSettings(enabled=True, token=self.fake.token, api_base=self.fake.url,
                                                poll_timeout_s=1, state_dir=tmp / "tg", retry_delay_s=0.05))

    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        chat = self.GROUP if group else {"id": int(user), "type": "private"}
        said, entities = words, None
        if at_bot:
            said = f"@{self.fake.bot['username']} {words}"
            entities = [{"type": "mention", "offset": 0, "length": len(str(self.fake.bot["username"])) + 1}]
        update = self.fake.message(chat, int(user), said, entities=entities)
        return f"{chat['id']}:{update['message']['message_id']}"

    def outs(self) -> list[Out]:
        return [Out(str(s.chat_id), s.text, f"{s.chat_id}:{s.reply_to}" if s.reply_to else None)
                for s in self.fake.sent]

    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef:
        return ChatRef(platform="telegram", chat_id=str(self.GROUP["id"]) if group else user,
                       kind="group" if group else "private")

    def fail_next_send(self) -> None:
        self.fake.fail_sends.append(502)

    async def bad_frame(self) -> None:
        self.fake.push({"message": {"message_id": 1, "chat": {"type": "private"}}})


class OneBotPeer(Peer):
    name, failure_loses_ack = "onebot", True
    GROUP = 123456

    def __init__(self, peer: OneBotTestPeer) -> None:
        self.peer = peer
        self.next_id = 5000

    def channel(self, tmp: Path) -> Channel:
        return OneBotChannel(OneBotSettings(enabled=True, port=0, action_timeout_s=0.5), bot_name=self.bot_name)

    async def linked(self, channel: Channel) -> None:
        assert isinstance(channel, OneBotChannel)
        await self.peer.connect(channel.url)
        await asyncio.wait_for(channel.wait_connected(), 5)

    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        self.next_id += 1
        segments = [{"type": "text", "data": {"text": words}}]
        if at_bot:
            segments.insert(0, {"type": "at", "data": {"qq": self.peer.self_id}})
        base = VECTORS["events"]["group_message_plain" if group else "private_message"]
        await self.peer.send_event(base, message_id=self.next_id, user_id=int(user), message=segments,
                                   raw_message=words, sender={"user_id": int(user), "nickname": "u"},
                                   time=int(time.time()))  # as a live peer does: the sample's 2024 stamp is past retention
        return str(self.next_id)

    def outs(self) -> list[Out]:
        found = []
        for frame in self.peer.actions:
            if frame.get("action") not in ("send_group_msg", "send_private_msg"):
                continue
            params = frame["params"]
            segs = params["message"]
            words = "".join(s["data"]["text"] for s in segs if s["type"] == "text").strip()
            target = next((str(s["data"].get("qq") or s["data"].get("id")) for s in segs
                           if s["type"] in ("at", "reply")), None)
            found.append(Out(str(params.get("group_id") or params.get("user_id")), words, target))
        return found

    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef:
        return ChatRef(platform="onebot", chat_id=str(self.GROUP) if group else user,
                       kind="group" if group else "private")

    def fail_next_send(self) -> None:
        self.peer.ignore_next_action()  # no answer in time: unavailable, retried

    async def bad_frame(self) -> None:
        await self.peer.send_raw("{not json")


class WebPeer(Peer):
    name = "web"

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.frames: list[dict[str, Any]] = []
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.reader: asyncio.Task[None] | None = None

    def channel(self, tmp: Path) -> Channel:
        return WebChannel(WebSettings(enabled=True, port=0), bot_name=self.bot_name)

    async def linked(self, channel: Channel) -> None:
        assert isinstance(channel, WebChannel)
        self.ws = await self.http.ws_connect(channel.url + "ws")
        self.reader = asyncio.create_task(self._read(self.ws))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.frames.append(json.loads(msg.data))

    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        assert self.ws is not None
        before = len([f for f in self.frames if f["type"] == "message"])
        await self.ws.send_json({"type": "send", "kind": "group" if group else "private",
                                 "user": {"id": user, "name": f"u{user}"},
                                 "text": f"@{self.bot_name} {words}" if at_bot else words})
        async with asyncio.timeout(5):  # the playground echoes the message with the id it gave it
            while len(echoes := [f for f in self.frames if f["type"] == "message"]) <= before:
                await asyncio.sleep(0.01)
        return str(echoes[-1]["id"])

    def outs(self) -> list[Out]:
        return [Out(f["chat"]["id"], f["text"], (f["mention"][0]["id"] if f["mention"] else f.get("reply_to")))
                for f in self.frames if f["type"] == "reply"]

    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef:
        return ChatRef(platform="web", chat_id="playground" if group else user, kind="group" if group else "private")

    def fail_next_send(self) -> None:
        raise NotImplementedError("a send to connected pages cannot fail")

    async def bad_frame(self) -> None:
        assert self.ws is not None
        await self.ws.send_str("{not json")


WECOM: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "vectors" / "wecom_callback.json").read_text("utf-8"))


class WeComPeer(Peer):
    """The self-built app: private chats only, encrypted XML callbacks in, ``message/send`` out."""

    name = "wecom"

    def __init__(self, api: FakeWeComAPI, http: aiohttp.ClientSession) -> None:
        self.api, self.http = api, http
        self.url = ""
        self.crypto: WeComCrypto | None = None
        self.next_id = 7000
        self.refused: set[int] = set()

    def channel(self, tmp: Path) -> Channel:
        return WeComChannel(WeComSettings(
            enabled=True, mode="app", port=0, token=SecretStr(WECOM["token"]),
            encoding_aes_key=SecretStr(WECOM["encoding_aes_key"]), corp_id=WECOM["receive_id"],
            corp_secret=SecretStr("secret"), agent_id=1000002, api_base=self.api.base_url))

    async def linked(self, channel: Channel) -> None:
        assert isinstance(channel, WeComChannel)
        self.url, self.crypto = channel.url, channel.crypto

    async def _post(self, body: str, encrypt: str) -> None:
        assert self.crypto is not None
        async with self.http.post(self.url, params=signed_query(self.crypto, encrypt), data=body) as resp:
            await resp.read()

    async def say(self, words: str, *, user: str = "1001", group: bool = False, at_bot: bool = False) -> str:
        assert self.crypto is not None and not group
        self.next_id += 1
        inner = (f"<xml><ToUserName><![CDATA[{WECOM['receive_id']}]]></ToUserName>"
                 f"<FromUserName><![CDATA[{user}]]></FromUserName><CreateTime>{int(time.time())}</CreateTime>"
                 f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{words}]]></Content>"
                 f"<MsgId>{self.next_id}</MsgId><AgentID>1000002</AgentID></xml>")
        encrypt = self.crypto.encrypt(inner)
        await self._post(f"<xml><ToUserName><![CDATA[x]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>",
                         encrypt)
        return str(self.next_id)

    def outs(self) -> list[Out]:
        calls = self.api.calls_to("/cgi-bin/message/send")
        return [Out(str(c.body["touser"]), str(c.body["text"]["content"]), None)
                for i, c in enumerate(calls) if c.body and i not in self.refused]

    def chat(self, *, user: str = "1001", group: bool = False) -> ChatRef:
        return ChatRef(platform="wecom", chat_id=user, kind="private")

    def fail_next_send(self) -> None:
        self.refused.add(len(self.api.calls_to("/cgi-bin/message/send")))  # the next call is refused
        self.api.fail_sends.append(-1)  # "system busy": retryable

    async def bad_frame(self) -> None:
        assert self.crypto is not None
        await self._post("<xml><Encrypt><![CDATA[not-base64!!]]></Encrypt></xml>", "not-base64!!")


@dataclass
class Rig:
    peer: Peer
    bot: Bot
    make: Callable[..., Awaitable[tuple[Bot, Any]]]
    tmp: Path

    async def restart(self) -> None:
        await self.bot.stop()
        self.bot, channel = await self.make(ScriptedModel(lambda r: text("好的")), channel=self.peer.channel(self.tmp),
                                            data_dir=self.tmp, bot={"name": self.peer.bot_name})
        await self.peer.linked(channel)

    async def recorded(self, chat: ChatRef) -> list[str]:
        return [r.text for r in await self.bot.history.recent(chat, 100) if not r.from_bot]


ALL = ["weixin", "telegram", "onebot", "wecom", "web"]
POLLING = ["weixin", "telegram"]  # they resume from a saved cursor
GROUPS = ["weixin", "telegram", "onebot", "web"]  # the WeCom app has private chats only
ADDRESSING = ["telegram", "onebot", "web"]  # the iLink API has no mention or quote for bots
FALLIBLE = ["weixin", "telegram", "onebot", "wecom"]  # the playground's send to its pages cannot fail
every = pytest.mark.parametrize("rig", ALL, indirect=True)


@pytest.fixture
async def rig(request: pytest.FixtureRequest, tmp_path: Path, make_bot: Any) -> AsyncIterator[Rig]:
    async with AsyncExitStack() as stack:
        peer: Peer
        if request.param == "weixin":
            peer = WeixinPeer(await stack.enter_async_context(FakeILinkServer(hold_s=0.2)))
        elif request.param == "telegram":
            peer = TelegramPeer(await stack.enter_async_context(FakeBotAPI()))
        elif request.param == "onebot":
            peer = OneBotPeer(await stack.enter_async_context(OneBotTestPeer(self_id=10001)))
        elif request.param == "wecom":
            api = await stack.enter_async_context(FakeWeComAPI(corp_id=WECOM["receive_id"], corp_secret="secret"))
            peer = WeComPeer(api, await stack.enter_async_context(aiohttp.ClientSession()))
        else:
            peer = WebPeer(await stack.enter_async_context(aiohttp.ClientSession()))
        bot, channel = await make_bot(ScriptedModel(lambda r: text("好的")), channel=peer.channel(tmp_path),
                                      data_dir=tmp_path, bot={"name": peer.bot_name})
        await peer.linked(channel)
        yield Rig(peer, bot, make_bot, tmp_path)
        await bot.stop()
        if isinstance(peer, WebPeer) and peer.ws is not None:
            await peer.ws.close()


@every
async def test_text_arrives_and_is_answered(rig: Rig, until: Until) -> None:
    await rig.peer.say("你好，在吗")
    await until(lambda: bool(rig.peer.outs()))
    assert await rig.recorded(rig.peer.chat()) == ["你好，在吗"]
    assert rig.peer.outs()[0].text == "好的" and rig.peer.outs()[0].chat == rig.peer.chat().chat_id


@pytest.mark.parametrize("rig", GROUPS, indirect=True)
async def test_in_a_group_only_an_addressed_message_is_answered(rig: Rig, until: Until) -> None:
    await rig.peer.say("今晚谁去打球", group=True)
    await rig.peer.say("帮我记一下", group=True, at_bot=True)
    await until(lambda: bool(rig.peer.outs()))
    await until(lambda: rig.recorded(rig.peer.chat(group=True)))
    await asyncio.sleep(0.3)  # room for a wrong second answer
    assert len(rig.peer.outs()) == 1
    recorded = await rig.recorded(rig.peer.chat(group=True))
    assert len(recorded) == 2 and "今晚谁去打球" in recorded and any("帮我记一下" in t for t in recorded)


@pytest.mark.parametrize("rig", ADDRESSING, indirect=True)
async def test_a_group_answer_is_addressed_back_to_the_asker(rig: Rig, until: Until) -> None:
    asked = await rig.peer.say("几点了", group=True, user="2002", at_bot=True)
    await until(lambda: bool(rig.peer.outs()))
    assert rig.peer.outs()[0].addressed_to in ("2002", asked)


@every
async def test_long_text_is_split_to_the_platform_limit(rig: Rig, until: Until) -> None:
    await rig.peer.say("先打个招呼")  # platforms that need a user's message first (weixin) have one now
    await until(lambda: bool(rig.peer.outs()))
    limit = rig.bot.channels[rig.peer.name].capabilities.max_text_len
    long = "。".join(f"第{i}句，内容长一点点" for i in range(limit // 5))
    await rig.bot.send(rig.peer.chat(), long, key="contract-long")
    await until(lambda: rig.bot.outbox.pending())
    await until(lambda: _drained(rig))
    parts = [o.text for o in rig.peer.outs()[1:]]
    assert len(parts) > 1 and all(len(p) <= limit for p in parts)
    assert "".join(parts).replace("。", "") == long.replace("。", "")


async def _sent(row: Callable[[], Awaitable[dict[str, object]]]) -> bool:
    return (await row())["status"] == "sent"


async def _drained(rig: Rig) -> bool:
    return await rig.bot.outbox.pending() == 0


@pytest.mark.parametrize("rig", FALLIBLE, indirect=True)
async def test_a_failed_send_is_retried_by_the_outbox(rig: Rig, until: Until) -> None:
    await rig.peer.say("第一条")
    await until(lambda: bool(rig.peer.outs()))
    rig.peer.fail_next_send()
    await rig.bot.send(rig.peer.chat(), "稍后送达", key="contract-retry")
    await until(lambda: any(o.text == "稍后送达" for o in rig.peer.outs()))

    async def row() -> dict[str, object]:
        return next(r for r in await rig.bot.outbox.rows() if r["key"] == "contract-retry")

    await until(lambda: _sent(row))
    assert int(str((await row())["attempts"])) >= 1
    copies = [o.text for o in rig.peer.outs()].count("稍后送达")
    assert copies == 2 if rig.peer.failure_loses_ack else copies == 1


@pytest.mark.parametrize("rig", POLLING, indirect=True)
async def test_a_restart_resumes_without_loss_or_duplicates(rig: Rig, until: Until) -> None:
    await rig.peer.say("重启前")
    await until(lambda: rig.recorded(rig.peer.chat()))
    await rig.restart()
    await rig.peer.say("重启后")
    await until(lambda: len_at_least(rig, 2))
    await asyncio.sleep(0.3)
    assert sorted(await rig.recorded(rig.peer.chat())) == sorted(["重启前", "重启后"])


async def len_at_least(rig: Rig, n: int) -> bool:
    return len(await rig.recorded(rig.peer.chat())) >= n


@every
async def test_a_bad_frame_is_logged_and_survived(rig: Rig, until: Until, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="robot.channels"):
        await rig.peer.bad_frame()
        await rig.peer.say("之后的消息")
        await until(lambda: rig.recorded(rig.peer.chat()))
    assert await rig.recorded(rig.peer.chat()) == ["之后的消息"]
    assert any(r.name.startswith("robot.channels") for r in caplog.records)
