"""The fake iLink server is faithful: the official client (run under Node) and ours both talk to it.

``.ci/run`` installs ``@tencent-weixin/openclaw-weixin@2.4.9`` from the npm registry into
``tests/.npm`` (gitignored); ``official_client.mjs`` drives that package's compiled ``dist/`` API
functions against the fake. The fake rejects (HTTP 400, listed in ``errors``) any request that
breaks the reference conventions, and the official client must understand every answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from robot.channels.weixin.api import SessionExpired, WeixinApi, WeixinApiError
from robot.channels.weixin.testing import FakeILinkServer

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parents[2] / ".npm" / "node_modules" / "@tencent-weixin" / "openclaw-weixin"
VERSION = "2.4.9"


async def run_official(fake: FakeILinkServer, tmp_path: Path) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (PACKAGE / "package.json").is_file():
        pytest.fail("Node and the official package are needed: run .ci/run (it installs "
                    f"@tencent-weixin/openclaw-weixin@{VERSION} into tests/.npm)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "OPENCLAW_TMP_DIR": str(tmp_path), "OPENCLAW_STATE_DIR": str(tmp_path)}
    proc = await asyncio.create_subprocess_exec(
        node, str(HERE / "official_client.mjs"), str(PACKAGE), fake.url, "tok-official", "tok-unknown",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result: dict[str, Any] = json.loads(out)
    return result


async def test_the_official_client_is_understood_by_the_fake_and_understands_it(tmp_path: Path) -> None:
    async with FakeILinkServer() as fake:
        fake.add_bot("tok-official", "official@im.bot")
        injected = fake.inject("tok-official", "alice@im.wechat", text="你好")
        fake.qr_script = [{"status": "confirmed", "bot_token": "new", "ilink_bot_id": "n@im.bot",
                           "baseurl": fake.url, "ilink_user_id": "alice@im.wechat"}]
        result = await run_official(fake, tmp_path)
    assert result["version"] == VERSION
    assert fake.errors == [], "the fake refused a request the official client made"
    # Its lossless id parsing sees our uint64 ids as the exact decimal strings.
    (msg,) = result["getUpdates"]["msgs"]
    assert msg["message_id"] == str(injected["message_id"]) and msg["context_token"] == injected["context_token"]
    assert result["afterCursor"]["msgs"] == [], "the cursor it got back moves past what it has seen"
    assert result["sendMessage"]["message_id"] == str(fake.sent[0].message_id)
    assert (fake.sent[0].text, fake.sent[0].context_token) == ("official reply", injected["context_token"])
    assert [s for _, _, s in fake.typing] == [1, 2]
    assert result["expired"]["errcode"] == -14  # what an expired session looks like to it
    assert "ret=-2" in result["forged"]  # a send with a wrong context token is an error it raises
    assert result["qrstatus"]["status"] == "confirmed" and result["qrcode"]["qrcode"] == "qr-1"


async def test_our_client_sends_the_same_shapes_as_the_official_one(tmp_path: Path) -> None:
    async with FakeILinkServer() as fake:
        fake.add_bot("tok-official", "official@im.bot")
        injected = fake.inject("tok-official", "alice@im.wechat", text="你好")
        await run_official(fake, tmp_path)
        official = {name: body for name, body in fake.requests}
        fake.requests.clear()
        async with aiohttp.ClientSession() as session:
            ours = WeixinApi(session, fake.url, "tok-official")
            await ours.notify(start=True)
            got = await ours.get_updates("", 5000)
            await ours.send_text("alice@im.wechat", "ours", context_token=injected["context_token"],
                                 client_id="ours-1")
            ticket = await ours.typing_ticket("alice@im.wechat", injected["context_token"])
            await ours.send_typing("alice@im.wechat", ticket)
            with pytest.raises(WeixinApiError, match="ret=-2"):
                await ours.send_text("alice@im.wechat", "x", context_token="forged", client_id="ours-2")
            with pytest.raises(SessionExpired):
                await WeixinApi(session, fake.url, "tok-unknown").get_updates("", 5000)
        mine = {name: body for name, body in fake.requests}
    assert fake.errors == []
    assert got.msgs[0]["message_id"] == injected["message_id"]
    for name in ("getupdates", "sendmessage", "getconfig", "sendtyping", "notifystart"):
        assert set(mine[name]) == set(official[name]), name
    assert set(mine["sendmessage"]["msg"]) <= set(official["sendmessage"]["msg"])
    assert mine["sendmessage"]["msg"]["item_list"] == [{"type": 1, "text_item": {"text": "x"}}]
