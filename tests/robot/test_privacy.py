"""Leak nothing: /forget me leaves no copy, files are private, URLs printed carry no token."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

import reminders
from function_calls import (
    ModelRequest,
    ModelResponse,
    Toolset,
    tokens,
)
from function_calls.testing import ScriptedModel, call, text
from robot import ForgetRequest, Forgetter, history
from robot.cli import main
from robot.message import ChatRef
from robot.plugin import Plugin
from robot.redact import redact_url
from tests.robot.conftest import admin_transfer

from .conftest import TEST_TOOLS

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")
G2 = ChatRef(platform="memory", chat_id="g2", kind="group")
DM = ChatRef(platform="memory", chat_id="u1", kind="private")
SECRET = "PHONE-13812345678"
SECRET_ZH = "我的住址是幸福路八号"


def echo(request: ModelRequest) -> ModelResponse:
    return text(f"re: {request.messages[-1]['content']}")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def in_memory(bot: Any) -> str:
    """What the process keeps between messages to build the model's context (windows, formatted
    turns, token counts keyed by their text)."""
    return repr(history._windows) + repr(bot.router._shown) + repr(list(tokens._counted))


def on_disk(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in data_dir.iterdir() if p.name.startswith("qunbot.sqlite3"))


async def test_forget_me_leaves_no_copy_in_the_database_file_or_the_wal(make_bot: Any, tmp_path: Path,
                                                                        until: Any) -> None:
    data = tmp_path / "data"
    bot, ch = await make_bot(ScriptedModel(echo), data_dir=data,
                             plugins=[Plugin("testkit", TEST_TOOLS), reminders.plugin])
    await ch.inject(f"记一下 {SECRET} {SECRET_ZH}", at_bot=True)  # the bot's reply quotes it
    await ch.inject("/remind daily 08:00 给 " + SECRET + " 打电话")
    await ch.inject("别人的话 keep-me", user="u2")
    await ch.inject(f"另一个群 {SECRET}-elsewhere", chat=G2)
    await ch.inject("刚才说了什么？", user="u2", at_bot=True)  # the model's context now shows the secret
    await ch.wait_sent(3)
    assert SECRET_ZH in in_memory(bot)  # kept for the next message's context: the test can see it

    async def delivered() -> bool:
        return await bot.outbox.pending() == 0

    await until(delivered)  # delivered: the outbox row keeps no text
    rows = await bot.outbox.rows("sent")
    assert rows and all(r["text"] == "" and r["receipt"] for r in rows)
    assert SECRET.encode() in on_disk(data)  # recorded (history, reminder): the test can see it

    await ch.inject("/forget me")
    sent = await ch.wait_sent(4)
    assert sent[-1].text == "已删除你在本群的记录：3 条消息、2 条机器人回复、1 个提醒（已取消）。"
    assert SECRET_ZH not in in_memory(bot)  # nor in what the process keeps for the next message
    raw = on_disk(data)
    assert SECRET.encode() + b" " not in raw and SECRET_ZH.encode() not in raw  # nothing of g1 left
    assert f"{SECRET}-elsewhere".encode() in raw and b"keep-me" in raw  # another chat, another person
    assert (data / "qunbot.sqlite3-wal").exists()  # the WAL was read too (it holds only what came after)
    assert next(e.text for e in await bot.history.recent(G1)) == "别人的话 keep-me"


async def test_forget_me_all_in_private_covers_every_chat_and_is_refused_in_a_group(make_bot: Any) -> None:
    bot, ch = await make_bot(None)
    seen: list[ForgetRequest] = []

    async def spy(request: ForgetRequest) -> int:
        seen.append(request)
        return 0

    bot.forgetters.append(Forgetter("spy", "条", spy))
    await bot.send(ChatRef(platform="memory", chat_id="g9", kind="group"), "⏰ 提醒", key="r", mention=["u1"])
    await ch.wait_sent(1)
    for chat in (G1, G2):
        await ch.inject(f"秘密 in {chat.chat_id}", chat=chat)
    await ch.inject("/n 私聊里的秘密", chat=DM)  # a command: answered without an LLM
    await ch.inject("other person", user="u2")
    await ch.inject("/forget me all")  # in a group: would tell the group what it did elsewhere
    refused = (await ch.wait_sent(3))[-1]
    assert "请在私聊中发送" in refused.text
    assert len(await bot.history.recent(G2)) == 1
    await ch.inject("/forget me all", chat=DM)
    done = (await ch.wait_sent(4))[-1]
    assert done.text.startswith("已删除你在所有聊天的记录：") and "5 条消息" in done.text
    texts = [e.text for c in (G1, G2, DM) for e in await bot.history.recent(c) if not e.from_bot]
    assert texts == ["other person"]
    [request] = seen
    assert request.everywhere and request.covers("memory:group:g42") and not request.covers("other:group:g1")
    assert {c.chat_id for c in request.chats} == {"g1", "g2", "g9", "u1"}  # every chat holding a trace of them


async def test_the_model_cannot_forget_anyone(make_bot: Any) -> None:
    model = ScriptedModel([call("forget", {"target": "me"}), text("ok")])
    bot, ch = await make_bot(model)
    await ch.inject("keep this", user="u1")
    await ch.inject("please forget me", at_bot=True)
    await ch.wait_sent(1)
    assert "forget" not in {t["function"]["name"] for t in model.requests[0].tools}  # never offered
    assert len(await bot.history.recent(G1)) >= 2


async def test_plugins_take_part_in_forget_me(make_bot: Any) -> None:
    seen: list[ForgetRequest] = []

    async def forget_memories(request: ForgetRequest) -> int:
        seen.append(request)
        return 4

    bot, ch = await make_bot(None)
    bot.forgetters.append(Forgetter("memory", "条记忆", forget_memories))
    await ch.inject("/forget me")
    (sent,) = await ch.wait_sent(1)
    assert seen == [ForgetRequest("memory", "u1", (G1,))]
    assert "4 条记忆" in sent.text


async def test_a_failing_plugin_part_is_reported_not_claimed(make_bot: Any) -> None:
    async def broken(request: ForgetRequest) -> int:
        raise RuntimeError("store down")

    bot, ch = await make_bot(None)
    bot.forgetters.append(Forgetter("memory", "条记忆", broken))
    await ch.inject("/forget me")
    (sent,) = await ch.wait_sent(1)
    assert "删除时出错了" in sent.text and "已删除" not in sent.text


# --- files and secrets ----------------------------------------------------------------------------

async def test_the_data_dir_and_database_files_are_private(make_bot: Any, tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    _bot, ch = await make_bot(None, data_dir=data)
    await ch.inject("hello")
    assert mode(data) == 0o700
    files = [p for p in data.iterdir() if p.name.startswith("qunbot.sqlite3")]
    assert {p.name for p in files} >= {"qunbot.sqlite3", "qunbot.sqlite3-wal", "qunbot.sqlite3-shm"}
    assert all(mode(p) == 0o600 for p in files), {p.name: oct(mode(p)) for p in files}


def test_init_writes_the_config_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "qunbot.toml"
    assert main(["init", "--path", str(target)]) == 0
    assert mode(target) == 0o600
    target.chmod(0o644)
    assert main(["init", "--path", str(target), "--force"]) == 0
    assert mode(target) == 0o600


@pytest.mark.parametrize(("url", "shown"), [
    ("ws://127.0.0.1:3001/?access_token=s3cret", "ws://127.0.0.1:3001/?access_token=***"),
    ("wss://h/ws?a=1&Token=s3cret&b=2", "wss://h/ws?a=1&Token=***&b=2"),
    ("https://user:s3cret@h/x", "https://user:***@h/x"),
    ("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=s3cret", "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=***"),
    ("ws://127.0.0.1:8080/onebot/v11/ws", "ws://127.0.0.1:8080/onebot/v11/ws"),
    # a generated password with an unencoded "/": urlsplit ended the authority there, and it showed whole
    ("postgresql://bot:Xy7/S3cret+q@127.0.0.1:1/qunbot", "postgresql://bot:***@127.0.0.1:1/qunbot"),
])
def test_urls_are_shown_without_their_tokens(url: str, shown: str) -> None:
    from robot.storage.postgres import redact_dsn

    assert redact_url(url) == shown
    if url.startswith("postgresql"):
        assert redact_dsn(url) == shown and "S3cret" not in redact_dsn(f"cannot connect to {url}: bad", url)


def test_doctor_does_not_print_the_onebot_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "q.toml"
    cfg.write_text(f'[bot]\ndata_dir = "{tmp_path}"\nplugins = []\n[channels.onebot]\nenabled = true\n'
                   f'mode = "forward"\nurl = "ws://127.0.0.1:{port}/?access_token=s3cret-tok"\n', encoding="utf-8")
    main(["--config", str(cfg), "doctor"])
    out = capsys.readouterr().out
    assert "channel onebot" in out and "access_token=***" in out and "s3cret-tok" not in out


# --- retention: the core [history] table, applied to the outbox too -------------------------------

async def test_history_retention_is_core_config_and_applies_to_the_outbox(make_bot: Any) -> None:
    from datetime import timedelta

    bot, ch = await make_bot(None, history={"max_messages": 10, "retention_days": 2})
    assert bot.history.max_messages == 10 and bot.history.max_age == timedelta(days=2)
    for i in range(15):
        await ch.inject(f"/n 消息{i}")  # each answered: 15 outbox rows in g1
    await ch.wait_sent(15)
    await bot.outbox.flush()
    await bot.history.apply_retention(bot.clock())
    assert len(await bot.history.recent(G1, 100)) == 10  # per chat: the newest 10
    removed = await bot.outbox.prune(bot.clock(), keep=timedelta(days=2), max_rows=10)
    assert removed == 5 and len(await bot.outbox.rows()) == 10
    assert await bot.outbox.prune(bot.clock() + timedelta(days=3), keep=timedelta(days=2)) == 10


async def test_bot_messages_addressed_to_the_person_go_too(make_bot: Any) -> None:
    bot, ch = await make_bot(None)
    await bot.send(G1, f"⏰ 提醒：{SECRET}", key="rem:1", mention=["u1"])  # how a reminder fires in a group
    await bot.send(G1, "⏰ 提醒：别人的", key="rem:2", mention=["u2"])
    await ch.wait_sent(2)
    await ch.inject("/forget me")
    await ch.wait_sent(3)
    texts = [e.text for e in await bot.history.recent(G1)]
    assert not any(SECRET in t for t in texts) and "⏰ 提醒：别人的" in texts


async def test_an_existing_history_table_gains_the_reply_columns(tmp_path: Path) -> None:
    import sqlite3

    from robot.history import HistoryStore
    from robot.store import Database

    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, chat TEXT NOT NULL, user_id TEXT NOT NULL, "
                     "name TEXT NOT NULL, text TEXT NOT NULL, ts TEXT NOT NULL, from_bot INTEGER NOT NULL DEFAULT 0, "
                     "message_id TEXT)")
    db = Database(path)
    HistoryStore(db)
    await db.open()
    columns = await db.run(lambda d: [r[1] for r in d.execute("PRAGMA table_info(history)").fetchall()])
    await db.close()
    assert {"reply_to", "to_user"} <= set(columns)


def test_no_token_survives_redaction() -> None:
    from urllib.parse import quote

    from hypothesis import given
    from hypothesis import strategies as st

    @given(token=st.text(min_size=1, max_size=40), key=st.sampled_from(["access_token", "Token", "KEY", "secret", "api-key", "X-Api-Key",
                                                                     "access-token", "client_secret", "refresh_token"]))
    def check(token: str, key: str) -> None:
        url = f"ws://127.0.0.1:3001/onebot?x=1&{key}={quote(token, safe='')}"
        assert redact_url(url) == f"ws://127.0.0.1:3001/onebot?x=1&{key}=***"

    check()


async def test_forget_me_all_cancels_the_persons_reminders_everywhere(make_bot: Any) -> None:
    bot, ch = await make_bot(None, plugins=[reminders.plugin])
    await ch.inject("/remind daily 08:00 喝水", chat=G2)
    await ch.inject("/remind daily 09:00 吃药", chat=DM)
    await ch.inject("/remind daily 10:00 别人的", user="u2", chat=G2)
    await ch.wait_sent(3)
    deps = bot.deps_for(reminders.reminder_set)
    await ch.inject("/forget me all", chat=DM)
    done = (await ch.wait_sent(4))[-1]
    assert "2 个提醒（已取消）" in done.text
    assert await deps.store.for_owner("memory:u1") == []
    assert [r.content for r in await deps.store.for_owner("memory:u2")] == ["别人的"]
    gone = await bot.db.run(lambda db: db.execute("SELECT count(*) FROM reminders WHERE content = '吃药'").fetchone()[0])
    assert gone == 0  # the row and its text, not just a status


async def test_forget_me_in_one_process_empties_the_caches_of_another_on_the_same_database(
        make_bot: Any, tmp_path: Path, pg_url: str) -> None:
    """Two processes on one PostgreSQL: the one that answered in the chat keeps its formatted turns
    for the next message; a /forget me handled by the other empties that cache too."""
    from robot.storage.postgres import PostgresDatabase

    _, a_ch = await make_bot(ScriptedModel(echo), data_dir=tmp_path / "a", storage={"url": pg_url})
    b, b_ch = await make_bot(ScriptedModel(echo), data_dir=tmp_path / "b", storage={"url": pg_url})
    assert isinstance(b.db, PostgresDatabase)
    await b_ch.inject(f"记一下 {SECRET}", at_bot=True)
    await b_ch.inject("刚才说了什么？", user="u2", at_bot=True)  # b's model context now shows the secret
    async with asyncio.timeout(10):
        while SECRET not in repr(b.router._shown):
            await asyncio.sleep(0.02)
    await a_ch.inject("/forget me", message_id="forget-1")
    async with asyncio.timeout(10):
        while SECRET in repr(b.router._shown):
            await asyncio.sleep(0.02)
    assert [e.text for e in await b.history.recent(G1) if not e.from_bot] == ["刚才说了什么？"]


async def test_forget_me_all_across_hundreds_of_chats_works_on_postgresql(make_bot: Any, tmp_path: Path,
                                                                          pg_url: str) -> None:
    # The notice to the other processes names the chats; PostgreSQL refuses a notice over 8000 bytes,
    # which would have failed the whole deletion: past that it says "every chat".
    from robot import privacy

    bot, ch = await make_bot(None, data_dir=tmp_path / "a", storage={"url": pg_url})
    heard: list[str] = []
    bot.db.subscribe(privacy.FORGOTTEN, heard.append)
    chats = tuple(ChatRef(platform="memory", chat_id=f"group-with-a-long-id-{i:04d}", kind="group") for i in range(400))
    await ch.inject(f"秘密 {SECRET}", chat=chats[-1])
    report = await privacy.forget_everything(bot, ForgetRequest(platform="memory", user_id="u1", chats=chats,
                                                                everywhere=True))
    assert report.counts[0] == ("条消息", 1)
    async with asyncio.timeout(10):
        while not heard:
            await asyncio.sleep(0.02)
    assert heard == ["*"]


async def test_a_reply_still_waiting_to_go_out_never_goes_after_forget_me(make_bot: Any, until: Any) -> None:
    # The platform was down: the bot's reply quoting them waited in the outbox, and went out once it was
    # back, after "/forget me" had told them their messages were gone.
    bot, ch = await make_bot(ScriptedModel(echo))
    ch.down = True
    await ch.inject(f"记一下 {SECRET}", at_bot=True)
    await ch.inject(f"私聊里 {SECRET_ZH}", chat=ch.chat("u1", kind="private"))

    async def waiting() -> int:
        return len(await bot.outbox.rows("pending"))

    assert await waiting() == 2  # (inject returns once the message was answered: its reply is queued)
    await ch.inject("/forget me all", chat=ch.chat("u1", kind="private"))
    ch.down = False
    await until(lambda: any("已删除" in m.text or "删除" in m.text for m in ch.sent))
    await bot.outbox.flush()
    assert not [m.text for m in ch.sent if SECRET in m.text or SECRET_ZH in m.text]


TRANSFERRED: list[int] = []
transfer = admin_transfer(TRANSFERRED)


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
async def test_forget_me_takes_their_words_out_of_another_members_paused_run(make_bot: Any, tmp_path: Path,
                                                                             request: pytest.FixtureRequest,
                                                                             storage: str) -> None:
    """u1's transfer waits for an admin, its frozen conversation quoting u2 (and the bot's reply to them):
    u2's /forget me takes both out of it; approved, the run goes on without them."""
    TRANSFERRED.clear()

    def script(req: ModelRequest) -> ModelResponse:
        if "转" in str(req.messages[-1].get("content")):
            return call("transfer", {"amount": 42})
        return text("完成") if req.messages[-1]["role"] == "tool" else echo(req)

    sections: dict[str, Any] = {"storage": {"url": request.getfixturevalue("pg_url")}} if storage != "sqlite" else {}
    model = ScriptedModel(script)
    bot, ch = await make_bot(model, plugins=[Plugin("risky", Toolset("risky", [transfer]))], data_dir=tmp_path / "d",
                             bot={"admins": ["memory:9"]}, **sections)
    await ch.inject(f"记一下 {SECRET}", at_bot=True, user="u2")  # the bot's reply quotes it
    await ch.inject("转 42 块", at_bot=True, user="u1")
    ask = next(m.text for m in await ch.wait_sent(3) if m.mention == ("u1",))
    code = ask.split("/approve ")[1][:5]

    def states(db: Any) -> list[str]:
        return [str(r[0]) for r in db.execute("SELECT state FROM snapshots").fetchall()]

    assert SECRET in "".join(await bot.db.run(states))  # frozen with the run: the test can see it
    await ch.inject("/forget me", user="u2")
    await ch.wait_sent(4)
    assert SECRET not in "".join(await bot.db.run(states))
    asked = len(model.requests)
    await ch.inject("/approve " + code, user="9")
    await bot.approvals.idle()
    await ch.wait_sent(6)
    assert TRANSFERRED == [42] and "完成" in [m.text for m in ch.sent]  # signed anew: it resumed
    assert not any(SECRET in str(m.get("content")) for r in model.requests[asked:] for m in r.messages)
    assert SECRET not in "".join(await bot.db.run(states))
