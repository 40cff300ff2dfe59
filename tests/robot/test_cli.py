"""The ``qunbot`` command, called in-process (and ``qunbot run`` once as a real process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from function_calls.testing import FakeOpenAIServer
from robot.cli import main
from robot.config import load_settings
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.plugin import Plugin, PluginError, load_plugin
from robot.store import Database

PLUGIN_MODULE = "qb_cli_plugin"
PLUGIN_SOURCE = '''
from pydantic import BaseModel, Field
from function_calls import ToolContext, ToolResult, Toolset, tool_function
from robot.plugin import Plugin


class WeatherArgs(BaseModel):
    city: str = Field(description="city name")
    days: int = Field(1, ge=1, le=7, description="how many days")


@tool_function(aliases=["w"], admin_only=True)
async def weather(ctx: ToolContext[object], args: WeatherArgs) -> ToolResult:
    """Weather for a city."""
    return ToolResult.reply(f"sunny in {args.city}")


class CliKitSettings(BaseModel):
    greeting: str = Field("hi", description="how to greet")


plugin = Plugin("clikit", Toolset("clikit", [weather]), settings_model=CliKitSettings)
'''
SECRET = "sk-cli-SECRET-77"


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A plugin module on sys.path, as a user's own plugin would be."""
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN_MODULE, raising=False)
    yield tmp_path
    sys.modules.pop(PLUGIN_MODULE, None)


def config(dir_: Path, extra: str = "") -> Path:
    path = dir_ / "qunbot.toml"
    path.write_text(f'[bot]\nplugins = ["{PLUGIN_MODULE}"]\ndata_dir = "{dir_ / "data"}"\n{extra}', encoding="utf-8")
    return path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("qunbot ")


@pytest.mark.parametrize(("argv", "complaint"), [
    (["--bogus"], "unrecognized arguments"),
    (["tools", "--jsn"], "unrecognized arguments"),
    (["--log-level", "LOUD", "tools"], "invalid choice"),
    (["fly"], "invalid choice"),
])
def test_bad_flags_exit_2_with_a_message(capsys: pytest.CaptureFixture[str], argv: list[str], complaint: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


def test_tools_json_prints_every_loaded_tool(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(config(plugin_dir)), "tools", "--json"]) == 0
    (definition,) = json.loads(capsys.readouterr().out)
    function = definition["function"]
    assert definition["type"] == "function" and function["name"] == "weather"
    assert function["description"] == "Weather for a city."
    assert function["parameters"]["required"] == ["city"] and "strict" not in function
    assert main(["--config", str(config(plugin_dir)), "tools", "--json", "--strict"]) == 0
    (strict,) = json.loads(capsys.readouterr().out)
    assert strict["function"]["strict"] is True


def test_tools_lists_names_aliases_and_flags(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-c", str(config(plugin_dir)), "tools"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("weather") and "[/w]" in line and "(admin)" in line


def test_a_bad_config_or_plugin_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[bot]\ntimezone = 'Nowhere/Land'\n", encoding="utf-8")
    assert main(["--config", str(bad), "tools"]) == 2
    assert "bot.timezone" in capsys.readouterr().err
    missing = tmp_path / "missing.toml"
    missing.write_text('[bot]\nplugins = ["no_such_plugin_module"]\n', encoding="utf-8")
    assert main(["--config", str(missing), "tools"]) == 2
    assert "no_such_plugin_module" in capsys.readouterr().err


def test_run_reports_a_taken_port_in_one_line(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = config(plugin_dir, f"[channels.onebot]\nenabled = true\nport = {port}\n")
        assert main(["--config", str(cfg), "run"]) == 1
    err = capsys.readouterr().err
    assert "error: cannot start" in err and "Traceback" not in err


def test_init_writes_a_loadable_template_and_refuses_to_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "conf" / "qunbot.toml"
    target.parent.mkdir()
    assert main(["init", "--path", str(target)]) == 0
    written = target.read_text(encoding="utf-8")
    settings, source = load_settings(target)
    assert source == target and settings.bot.name == "qunbot" and "[llm]" in written
    target.write_text(written + "\n# my edits\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["init", "--path", str(target)]) == 2
    assert "exists" in capsys.readouterr().err and target.read_text(encoding="utf-8").endswith("# my edits\n")
    assert main(["init", "--path", str(target), "--force"]) == 0

    def without_token(text: str) -> str:
        return re.sub(r'(?m)^access_token = ".*"', "", text)

    assert without_token(target.read_text(encoding="utf-8")) == without_token(written)


def test_init_writes_a_random_onebot_token(tmp_path: Path) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    assert main(["init", "--path", str(first)]) == 0 and main(["init", "--path", str(second)]) == 0
    tokens = [load_settings(p)[0].channels.onebot.token for p in (first, second)]
    assert all(t is not None and len(t) >= 32 for t in tokens) and tokens[0] != tokens[1]
    assert "# access_token = ..." not in first.read_text(encoding="utf-8").split("[channels.onebot]")[1].split("\n[")[0]


def test_init_still_writes_the_core_template_when_a_plugin_is_broken(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = load_plugin

    def flaky(name: str) -> Plugin[Any]:
        if name == "search":
            raise PluginError("plugin 'search': cannot import module 'search': boom")
        return real(name)

    monkeypatch.setattr("robot.cli.load_plugin", flaky)
    target = tmp_path / "qunbot.toml"
    assert main(["init", "--path", str(target)]) == 0
    assert "[search]" in capsys.readouterr().err
    assert load_settings(target)[0].bot.name == "qunbot"


def test_init_template_carries_the_builtin_plugins_tables(tmp_path: Path) -> None:
    target = tmp_path / "qunbot.toml"
    assert main(["init", "--path", str(target)]) == 0
    settings, _ = load_settings(target)
    for name in ("reminders", "search", "summary"):
        model = load_plugin(name).settings_model
        if model is not None:
            assert f"[{name}]" in target.read_text(encoding="utf-8")
            settings.section(name, model)  # the template's values validate


def test_tools_json_with_the_builtin_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no qunbot.toml: the defaults load reminders, search and summary
    assert main(["tools", "--json"]) == 0
    names = [d["function"]["name"] for d in json.loads(capsys.readouterr().out)]
    assert names == [t.name for n in ("reminders", "search", "summary") for t in load_plugin(n).tools]
    assert len(names) == len(set(names)) > 0


def test_doctor_reports_an_unreachable_llm(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(plugin_dir, f'[llm]\nmodel = "fake-model"\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\n'
                             f'api_key = "{SECRET}"\n')
    assert main(["--config", str(cfg), "doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL llm" in out and "ok  plugins: clikit (1 tools)" in out and "1 problem(s)" in out
    assert SECRET not in out


async def test_doctor_passes_against_a_working_endpoint(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with FakeOpenAIServer() as server:
        good = config(plugin_dir, f'[llm]\nmodel = "fake-model"\nbase_url = "{server.base_url}"\napi_key = "{SECRET}"\n')
        assert await asyncio.to_thread(main, ["--config", str(good), "doctor"]) == 0
        out = capsys.readouterr().out
        assert "ok  llm" in out and "all good" in out
        wrong = plugin_dir / "wrong.toml"
        wrong.write_text(good.read_text(encoding="utf-8").replace('"fake-model"', '"gpt-9"'), encoding="utf-8")
        assert await asyncio.to_thread(main, ["--config", str(wrong), "doctor"]) == 1
        assert "gpt-9" in capsys.readouterr().out
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


async def test_run_serves_until_sigterm_then_exits_cleanly(plugin_dir: Path) -> None:
    cfg = config(plugin_dir, "[channels.console]\nenabled = true\n")
    db = Database(plugin_dir / "data" / "qunbot.sqlite3")
    outbox = Outbox(db)
    HistoryStore(db)
    await db.open()
    console_chat = ChatRef(platform="console", chat_id="me", kind="private")
    await outbox.enqueue(OutgoingMessage(key="left-over", chat=console_chat, text="a reply left from before"),
                         OutgoingMessage(key="no-channel", chat=ChatRef(platform="onebot", chat_id="1", kind="group"),
                                         text="for a channel that is not enabled"))
    await db.close()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "robot.cli", "--config", str(cfg), "run", cwd=plugin_dir, env=env,
        stdin=asyncio.subprocess.PIPE,  # left open: a console read is pending when the signal comes
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        seen = b""
        async with asyncio.timeout(20):
            while b"a reply left from before" not in seen:
                chunk = await proc.stdout.read(4096)
                assert chunk, "qunbot run exited early"
                seen += chunk
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            code = await proc.wait()
        assert code == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    db = Database(plugin_dir / "data" / "qunbot.sqlite3")
    outbox = Outbox(db)
    await db.open()
    status = {str(r["key"]): r["status"] for r in await outbox.rows()}
    await db.close()
    assert status == {"left-over": "sent", "no-channel": "pending"}  # flushed, and kept for its channel


async def test_quickstart_run_with_no_config_serves_the_playground_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The README's first command: no qunbot.toml, no LLM -> the web playground, SQLite under ./data."""
    import socket

    import aiohttp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    env["QUNBOT_CHANNELS__WEB__PORT"] = str(port)  # the default 8765 may be taken on a shared machine
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "robot.cli", "run", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        page = ""
        async with asyncio.timeout(20), aiohttp.ClientSession() as session:
            while not page:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/") as resp:
                        assert resp.status == 200
                        page = await resp.text()
                except aiohttp.ClientConnectorError:
                    assert proc.returncode is None, "qunbot run exited early"
                    await asyncio.sleep(0.1)
        assert "qunbot" in page
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            code = await proc.wait()
        assert proc.stdout is not None
        log = (await proc.stdout.read()).decode()
        assert code == 0, log
        assert "Traceback" not in log and f"channel web ready at http://127.0.0.1:{port}/" in log
        assert (tmp_path / "data" / "qunbot.sqlite3").is_file()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
