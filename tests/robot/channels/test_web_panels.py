"""The 待批准 panel's rows (what each chat may see) and the playground's panel buttons and approver identities."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel

from function_calls import ModelRequest, ModelResponse, ToolContext, ToolResult, Toolset, tool_function
from function_calls.testing import ScriptedModel, call, text
from robot.approvals_panel import PANEL, PendingPanel
from robot.bot import Bot
from robot.channels.base import PanelProvider
from robot.channels.web import WebChannel
from robot.channels.web.panels import members, panel_frame, split_row
from robot.config import Settings, WebSettings
from robot.message import ChatRef
from robot.plugin import Plugin


class TransferArgs(BaseModel):
    amount: int


@tool_function(confirm="admin")
async def transfer(ctx: ToolContext[object], args: TransferArgs) -> ToolResult:
    """Move money (an admin must approve)."""
    return ToolResult(content=f"transferred {args.amount}")


@tool_function(confirm="requester", aliases=["wipe"])
async def wipe(ctx: ToolContext[object]) -> ToolResult:
    """Delete my notes (I confirm myself)."""
    return ToolResult.reply("wiped")


def model() -> ScriptedModel:
    def script(req: ModelRequest) -> ModelResponse:
        asked = str(req.messages[-1].get("content"))
        if req.messages[-1]["role"] == "tool":
            return text("好了")
        if "问" in asked:
            return call("ask_user", {"tip": "几点开会？", "timeout_s": 60})
        return call("transfer", {"amount": 42})

    return ScriptedModel(script)


async def started(make_bot: Any) -> tuple[Any, Any, PendingPanel]:
    bot, ch = await make_bot(model(), plugins=[Plugin("risky", Toolset("risky", [transfer, wipe]))],
                             bot={"admins": ["memory:9", "onebot:10001"]},
                             approvals={"approvers": ["memory:boss", "memory:9"]})
    panel = bot.panels[PANEL]
    assert isinstance(panel, PendingPanel)
    return bot, ch, panel


async def test_a_chat_sees_its_own_requests_and_an_approver_sees_them_privately(make_bot: Any) -> None:
    bot, ch, panel = await started(make_bot)
    assert panel.approvers("memory") == ["9", "boss"] and panel.approvers("onebot") == ["10001"]
    await ch.inject("转 42 块", at_bot=True, user="u1", name="小明")
    await ch.wait_sent(2)
    [row] = await panel(ch.chat("g1"))
    code = row["码"]
    assert row == {"码": code, "等待": "管理员批准", "内容": "transfer(amount=42)", "发起人": "小明",
                   "到期": row["到期"], "/批准": f"/approve {code}", "/拒绝": f"/deny {code}", "@": "9 boss"}
    assert row["到期"].endswith("（还剩 30 分钟）")
    # Another group and a non-approver's private chat see nothing; an approver's private chat sees where it waits.
    assert await panel(ch.chat("g2")) == []
    assert await panel(ch.chat("u1", "private")) == []
    [mine] = await panel(ch.chat("9", "private"))
    assert mine["码"] == code and mine["发起人"] == "小明（群聊 g1）"
    # Once decided it leaves the panel.
    await ch.inject(f"/deny {code}", user="9")
    await bot.approvals.idle()
    assert await panel(ch.chat("g1")) == [] and await panel(ch.chat("9", "private")) == []


async def test_questions_have_no_buttons_and_an_edited_row_says_so(make_bot: Any) -> None:
    bot, ch, panel = await started(make_bot)
    await ch.inject("问我开会时间", at_bot=True, user="u1", name="小明")
    await ch.wait_sent(1)
    [row] = await panel(ch.chat("g1"))
    assert row["等待"] == "发起人回答" and row["内容"] == "几点开会？"
    assert not [k for k in row if k.startswith(("/", "@"))]  # an answer is typed, not approved
    await bot.db.run(lambda db: db.execute("UPDATE snapshots SET tip = '改过的问题'"))
    [row] = await panel(ch.chat("g1"))
    assert row["内容"] == "（记录校验失败：批准会被拒绝）"


async def test_a_request_its_requester_confirms_names_the_requester_as_who_may_press(make_bot: Any) -> None:
    _bot, ch, panel = await started(make_bot)
    await ch.inject("/wipe", user="u1", name="小明")
    await ch.wait_sent(1)
    [row] = await panel(ch.chat("g1"))
    assert row["等待"] == "发起人确认" and row["@"] == "u1" and "/批准" in row  # not the approvers 9 and boss


def test_buttons_are_only_commands() -> None:
    fields, buttons = split_row({"码": "ABCDE", "/批准": "/approve ABCDE", "/打开": "https://evil.example", "/": "/x",
                                 "@": "admin"})
    assert fields == {"码": "ABCDE"}
    assert buttons == [{"label": "批准", "text": "/approve ABCDE"}]


async def test_panel_frame_carries_buttons_per_row_and_survives_a_failing_panel() -> None:
    async def broken(chat: ChatRef) -> list[dict[str, str]]:
        raise RuntimeError("boom")

    async def codes(chat: ChatRef) -> list[dict[str, str]]:
        return [{"码": "AAAAA", "/批准": "/approve AAAAA", "@": "admin boss"}, {"码": "note"}]

    chat = ChatRef(platform="web", chat_id="playground", kind="group")
    frame = await panel_frame({"broken": broken, PANEL: codes}, chat)
    assert frame["panels"] == [
        {"name": "broken", "rows": [], "error": "could not load this panel"},
        {"name": PANEL, "rows": [{"码": "AAAAA"}, {"码": "note"}],
         "actions": [[{"label": "批准", "text": "/approve AAAAA"}], []], "actors": [["admin", "boss"], None]},
    ]


class Approvers:
    def __init__(self, ids: list[str] | Exception) -> None:
        self.ids = ids

    async def __call__(self, chat: ChatRef) -> list[dict[str, str]]:
        return []

    def approvers(self, platform: str) -> list[str]:
        if isinstance(self.ids, Exception):
            raise self.ids
        return self.ids


@pytest.mark.parametrize(("ids", "expected"), [
    (["admin", "u-alice", "bad id!", "admin"], [("u-xiaoming", False), ("u-alice", True), ("admin", True)]),
    (RuntimeError("config unreadable"), [("u-xiaoming", False), ("u-alice", False)]),  # nobody, not everybody
])
def test_members_mark_the_platforms_approvers(ids: list[str] | Exception, expected: list[tuple[str, bool]]) -> None:
    providers: dict[str, PanelProvider] = {"p": Approvers(ids)}
    out = members(providers, "web", [("u-xiaoming", "小明"), ("u-alice", "Alice")])
    assert [(m["id"], m.get("approver", False)) for m in out] == expected


async def test_an_open_page_sees_a_request_appear_and_expire(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """No reload: the panel follows the pause, and the expiry (which no run_end announces)."""
    now = [datetime(2026, 11, 23, 4, 0, tzinfo=UTC)]
    channel = WebChannel(WebSettings(enabled=True, port=0))
    bot = Bot(Settings(bot={"data_dir": tmp_path, "admins": ["web:admin"]}), model=model(), channels=[channel],
              plugins=[Plugin("risky", Toolset("risky", [transfer]))], clock=lambda: now[0])
    await bot.start()
    try:
        ws = await http.ws_connect(channel.url + "ws")
        welcome = await ws.receive_json(timeout=5)
        assert {"id": "admin", "name": "admin", "approver": True} in welcome["members"]
        await ws.send_json({"type": "panels", "chat": {"kind": "group", "id": "playground"}})

        async def pending_rows() -> list[dict[str, str]]:
            async with asyncio.timeout(5):
                while True:
                    frame = await ws.receive_json()
                    if frame["type"] == "panels" and frame["chat"]["id"] == "playground":
                        [panel] = [p for p in frame["panels"] if p["name"] == PANEL]
                        return list(panel["rows"])

        assert await pending_rows() == []
        await ws.send_json({"type": "send", "kind": "group", "user": {"id": "u-aqiang", "name": "阿强"},
                            "text": "@qunbot 转 42 块"})
        while not (rows := await pending_rows()):
            pass
        assert rows[0]["内容"] == "transfer(amount=42)" and rows[0]["到期"] == "12:30（还剩 30 分钟）"  # Shanghai
        now[0] += timedelta(minutes=31)
        await bot.approvals.expire_due()
        while await pending_rows():
            pass
        await bot.approvals.idle()
        await ws.close()
    finally:
        await bot.stop()
