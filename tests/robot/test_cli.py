"""The ``qunbot`` command, called in-process (and as a real process where signals, stdio or the exit matter:
each forked by a Python whose third-party imports are done, tests/warm_python.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from function_calls.testing import FakeOpenAIServer, Reply
from robot.channels.telegram.testing import FakeBotAPI
from robot.cli import _log_to_file, main
from robot.config import ConfigError
from robot.config_file import load_settings
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.plugin import Plugin, PluginError, load_plugin
from robot.store import Database
from tests import warm_python
from tests.robot.conftest import console_ready

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
    assert line.startswith("weather  /w  (admin)\n    Weather for a city.")


def test_tools_merges_plugins_as_the_bot_does(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two plugins offering /weather: the bot refuses to start, and `qunbot tools` listed both.
    (plugin_dir / "qb_cli_twin.py").write_text(PLUGIN_SOURCE.replace('"clikit"', '"twin"'), encoding="utf-8")
    path = config(plugin_dir)
    path.write_text(path.read_text(encoding="utf-8").replace('plugins = ["qb_cli_plugin"]',
                                                             'plugins = ["qb_cli_plugin", "qb_cli_twin"]'),
                    encoding="utf-8")
    try:
        assert main(["-c", str(path), "tools"]) == 2
    finally:
        sys.modules.pop("qb_cli_twin", None)
    out, err = capsys.readouterr()
    assert "weather" in err and "'twin'" in err and out.count("weather") <= 1


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


def test_init_writes_where_run_will_look_and_never_leaves_half_a_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`-c conf/bot.toml init` wrote ./qunbot.toml (run kept saying "run qunbot init"); a full disk during
    `init --force` left a stub in place of the owner's config."""
    import robot.cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    assert main(["init", "-c", "conf/bot.toml"]) == 0
    assert (tmp_path / "conf" / "bot.toml").is_file() and not (tmp_path / "qunbot.toml").exists()
    monkeypatch.setenv("QUNBOT_CONFIG", str(tmp_path / "conf" / "env.toml"))
    assert main(["init"]) == 0 and (tmp_path / "conf" / "env.toml").is_file()
    mine = tmp_path / "conf" / "bot.toml"
    mine.write_text('[llm]\napi_key = "sk-mine"\n', encoding="utf-8")

    def full_disk(text: str, token: str | None = None) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(robot.cli, "_with_onebot_token", full_disk)
    assert main(["init", "--path", str(mine), "--force"]) == 2
    assert "No space left" in capsys.readouterr().err
    assert mine.read_text(encoding="utf-8") == '[llm]\napi_key = "sk-mine"\n' and not list(mine.parent.glob("*.partial"))


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
    for name in ("reminders", "search", "summary", "memory", "tiers"):
        model = load_plugin(name).settings_model
        if model is not None:
            assert f"[{name}]" in target.read_text(encoding="utf-8")
            settings.section(name, model)  # the template's values validate


def test_tools_json_with_the_builtin_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no qunbot.toml: the defaults load the four built-in plugins
    assert main(["tools", "--json"]) == 0
    names = [d["function"]["name"] for d in json.loads(capsys.readouterr().out)]
    assert names == [t.name for n in ("reminders", "search", "summary", "memory", "tiers") for t in load_plugin(n).tools]
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


async def test_doctor_checks_the_tier_endpoints_too(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """[llm.think] on a dead port and [llm.plan] naming a model its endpoint lacks: both reported, no secret."""
    async with FakeOpenAIServer() as server:
        cfg = config(plugin_dir, f'[llm]\nmodel = "fake-model"\nbase_url = "{server.base_url}"\napi_key = "{SECRET}"\n'
                                 f'[llm.think]\nmodel = "fake-model"\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\n'
                                 f'api_key = "{SECRET}-think"\n[llm.plan]\nmodel = "planner-9"\n')
        assert await asyncio.to_thread(main, ["--config", str(cfg), "doctor"]) == 1
        out = capsys.readouterr().out
    assert "ok  llm:" in out and "FAIL llm.think" in out and "2 problem(s)" in out
    assert "FAIL llm.plan" in out and "planner-9" in out  # on [llm]'s endpoint, which has no such model
    assert SECRET not in out


async def test_doctor_never_prints_a_providers_error_body_that_echoes_the_key(
        plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Some providers echo the Authorization header in their 401 body: doctor printed it."""
    from aiohttp import web

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": f"Invalid key. You sent: {request.headers['Authorization']}",
                                            "code": "invalid_api_key"}}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        cfg = config(plugin_dir, f'[llm]\nmodel = "m"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                                 f'api_key = "{SECRET}"\n[llm.think]\nmodel = "t"\n')
        assert await asyncio.to_thread(main, ["--config", str(cfg), "doctor"]) == 1
        out = capsys.readouterr()
    finally:
        await runner.cleanup()
    assert "FAIL llm" in out.out and "HTTP 401 (invalid_api_key)" in out.out and "FAIL llm.think" in out.out
    assert SECRET not in out.out + out.err


@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])  # (its terminal closed)
async def test_run_serves_until_sigterm_then_exits_cleanly(plugin_dir: Path, stop_with: signal.Signals) -> None:
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
    proc = await warm_python.create_subprocess_exec(
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
        proc.send_signal(stop_with)
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
    proc = await warm_python.create_subprocess_exec(
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


# --- options, help, start-up errors (issue 10: a new user's first hour) -----------------------

def test_options_are_accepted_after_the_subcommand_too(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(config(plugin_dir))
    assert main(["tools", "--config", cfg, "--json"]) == 0
    assert [d["function"]["name"] for d in json.loads(capsys.readouterr().out)] == ["weather"]
    assert main(["tools", "-c", cfg, "--log-level", "WARNING"]) == 0
    assert capsys.readouterr().out.startswith("weather")
    assert main(["--config", cfg, "tools", "--log-level", "ERROR"]) == 0  # before and after mix
    assert capsys.readouterr().out.startswith("weather")


@pytest.mark.parametrize("command", ["run", "chat", "tools", "init", "doctor", "backup"])
def test_every_subcommand_has_help_listing_the_common_options(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: qunbot {command}") and "--config" in out and "--log-level" in out


def taken_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_busy_web_port_is_one_line_and_doctor_sees_it(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with taken_port() as taken:
        port = taken.getsockname()[1]
        cfg = config(plugin_dir, f"[channels.web]\nport = {port}\n")  # `enabled` unset: on, as nothing else is
        assert main(["--config", str(cfg), "run"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("error: cannot start: web playground cannot listen on") and str(port) in err
        assert main(["--config", str(cfg), "doctor"]) == 1
        out = capsys.readouterr().out
        assert f"FAIL channel web: cannot listen on 127.0.0.1:{port}" in out and "1 problem(s)" in out


def test_plugins_beside_the_config_file_import_without_pythonpath(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "mybot"
    project.mkdir()
    (project / "qb_beside_plugin.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    cfg = project / "qunbot.toml"
    cfg.write_text('[bot]\nplugins = ["qb_beside_plugin"]\n', encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() extends it; undone after the test
    monkeypatch.delitem(sys.modules, "qb_beside_plugin", raising=False)
    try:
        assert main(["tools", "--config", str(cfg)]) == 0
        assert capsys.readouterr().out.startswith("weather  /w  (admin)")
    finally:
        sys.modules.pop("qb_beside_plugin", None)


@pytest.mark.parametrize(("table", "suggestion"), [("lmm", "llm"), ("reminder", "reminders"), ("limit", "limits"),
                                                   ("clikt", "clikit")])
def test_a_misspelled_table_stops_start_up_naming_the_closest_one(
        plugin_dir: Path, capsys: pytest.CaptureFixture[str], table: str, suggestion: str) -> None:
    cfg = config(plugin_dir, f'[{table}]\nmodel = "gpt-4o-mini"\n')
    for command in ("run", "tools"):
        assert main(["--config", str(cfg), command]) == 2
        err = capsys.readouterr().err
        assert f"unknown table [{table}]" in err and f"did you mean [{suggestion}]?" in err
    assert not (plugin_dir / "data").exists()  # stopped before opening anything


def test_builtin_tables_stay_valid_when_their_plugin_is_taken_out(
        plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(plugin_dir, '[search]\napi_key = "pplx-x"\n[reminders]\nmax_per_user = 5\n')  # as `init` writes
    assert main(["--config", str(cfg), "tools"]) == 0


def test_a_relative_data_dir_is_taken_from_the_config_files_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "mybot"
    project.mkdir()
    cfg = project / "qunbot.toml"
    cfg.write_text('[bot]\ndata_dir = "state"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert load_settings(cfg)[0].bot.data_dir == project / "state"
    assert load_settings("mybot/qunbot.toml")[0].bot.data_dir == project / "state"
    cfg.write_text("[bot]\n", encoding="utf-8")
    assert load_settings(cfg)[0].bot.data_dir == project / "data"  # the default too
    monkeypatch.setenv("QUNBOT_BOT__DATA_DIR", "from-env")  # a variable is read where the shell is
    assert load_settings(cfg)[0].bot.data_dir == Path("from-env")


def test_a_home_folder_or_plugin_name_that_cannot_be_read_is_a_one_line_error(tmp_path: Path) -> None:
    # Both ended `qunbot` in a traceback (RuntimeError, TypeError).
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text('[bot]\ndata_dir = "~no_such_user_qunbot/data"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="no home folder"):
        load_settings(cfg)
    with pytest.raises(PluginError, match="cannot import"):
        load_plugin("..myplugin")


def test_channel_state_dirs_are_taken_from_the_config_files_folder_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Telegram webhook's spool written from one folder was not found by a restart from another:
    # Telegram had its 200 and never sends the update again.
    project = tmp_path / "mybot"
    project.mkdir()
    cfg = project / "qunbot.toml"
    cfg.write_text('[channels.telegram]\nstate_dir = "tg-state"\n[channels.weixin]\nstate_dir = "~/wx-state"\n',
                   encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for cwd in (tmp_path, project):
        monkeypatch.chdir(cwd)
        channels = load_settings(cfg)[0].channels
        assert channels.telegram.state_dir == project / "tg-state"
        assert channels.weixin.state_dir == tmp_path / "home" / "wx-state"


def test_tools_shows_whole_descriptions_and_explains_the_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name in ("reminders", "search", "summary"):
        for tool in load_plugin(name).tools:
            assert " ".join(tool.description.split()) in flat, tool.name  # never cut mid-sentence
    assert "reminder_set  /remind  (@)" in out
    assert "(@) in a group, runs only when the message @-mentions the bot" in out


def test_tools_json_into_head_exits_quietly(tmp_path: Path) -> None:
    """`qunbot tools --json | head -n 2` (with pipefail): head leaves after two lines, qunbot says nothing, exits 0."""
    import subprocess
    import tempfile

    read, write = os.pipe()
    with tempfile.TemporaryFile() as err:  # the pipeline's stderr
        try:
            head = subprocess.Popen(["head", "-n", "2"], stdin=read, stdout=subprocess.PIPE, stderr=err, text=True)
            proc = warm_python.popen([sys.executable, "-m", "robot.cli", "tools", "--json"], cwd=tmp_path,
                                     stdout=write, stderr=err.fileno())
        finally:
            os.close(read)
            os.close(write)
        out, _ = head.communicate(timeout=60)
        code = proc.wait(timeout=60)
        err.seek(0)
        stderr = err.read().decode()
    assert out == '[\n  {\n'
    assert stderr == "" and code == 0 and head.returncode == 0


async def test_doctor_says_search_is_off_and_prints_no_http_log_lines(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    async with FakeOpenAIServer() as server:
        cfg = tmp_path / "qunbot.toml"
        cfg.write_text(f'[llm]\nmodel = "fake-model"\nbase_url = "{server.base_url}"\napi_key = "{SECRET}"\n'
                       f'[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
        proc = await warm_python.create_subprocess_exec(
            sys.executable, "-m", "robot.cli", "doctor", "--config", str(cfg), cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        async with asyncio.timeout(60):
            out = (await proc.communicate())[0].decode()
    assert proc.returncode == 0, out
    assert "off search: 联网搜索未启用" in out and "PERPLEXITY_API_KEY" in out
    assert "ok  llm" in out and "HTTP Request" not in out and " INFO " not in out and SECRET not in out
    assert out.rstrip().endswith("all good")


async def test_backup_copies_the_database_while_it_is_open(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "mybot"
    cfg = project / "qunbot.toml"
    project.mkdir()
    cfg.write_text('[bot]\ndata_dir = "data"\n', encoding="utf-8")
    db = Database(project / "data" / "qunbot.sqlite3")
    outbox = Outbox(db)
    HistoryStore(db)
    await db.open()
    try:
        chat = ChatRef(platform="onebot", chat_id="1", kind="group")
        await outbox.enqueue(OutgoingMessage(key="k1", chat=chat, text="保存我"))
        monkeypatch.chdir(tmp_path)  # another folder: data_dir still resolves beside the config
        target = tmp_path / "backups" / "qunbot.sqlite3"
        assert await asyncio.to_thread(main, ["backup", str(target), "--config", str(cfg)]) == 0  # bot still open
        assert f"to {target}" in capsys.readouterr().out
        assert target.stat().st_mode & 0o777 == 0o600  # the history, readable by its owner only
        assert await asyncio.to_thread(main, ["backup", str(target), "--config", str(cfg)]) == 2
        assert "exists" in capsys.readouterr().err
        # --force onto the live file swapped the database under the bot (its WAL behind): corrupt
        live = project / "data" / "qunbot.sqlite3"
        assert await asyncio.to_thread(main, ["backup", str(live), "--force", "--config", str(cfg)]) == 2
        assert "is the database itself" in capsys.readouterr().err
        assert await asyncio.to_thread(main, ["backup", str(tmp_path), "--force", "--config", str(cfg)]) == 2
        assert "is a directory" in capsys.readouterr().err and not list(tmp_path.glob("*.partial"))
        await outbox.enqueue(OutgoingMessage(key="k2", chat=chat, text="还能写"))  # the live one is intact
    finally:
        await db.close()
    copy = Database(target)
    copied = Outbox(copy)
    HistoryStore(copy)
    await copy.open()
    try:
        assert [(r["key"], r["text"]) for r in await copied.rows()] == [("k1", "保存我")]
    finally:
        await copy.close()
    assert not list(target.parent.glob("*.partial"))


def test_init_into_a_missing_folder_and_a_damaged_key_file_are_one_line_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--path", str(tmp_path / "nodir" / "q.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "No such file or directory" in err and "Traceback" not in err
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "secret.key").write_bytes(b"short")  # cut off by a full disk, say
    assert main(["tools", "--config", str(cfg)]) == 0  # no database, no key: nothing to refuse
    assert main(["chat", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "secret.key is damaged" in err and len(err.strip().splitlines()) == 1


def test_backup_without_a_database_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text("[bot]\n", encoding="utf-8")
    assert main(["backup", str(tmp_path / "b.sqlite3"), "-c", str(cfg)]) == 2
    assert f"no database at {tmp_path / 'data' / 'qunbot.sqlite3'}" in capsys.readouterr().err


async def test_a_model_url_with_credentials_never_reaches_the_log(tmp_path: Path) -> None:
    """openai 3 sends through httpx2, which logs each request's URL at INFO: a key in base_url went with
    it. Not even at DEBUG (the most a user can ask for)."""
    level = "DEBUG"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    async with FakeOpenAIServer() as server:
        server.script(Reply("你好呀"))
        url = server.base_url.replace("http://", "http://user:URLPASS@")
        (tmp_path / "qunbot.toml").write_text(f'[llm]\nmodel = "fake-model"\nbase_url = "{url}"\n'
                                              f'api_key = "{SECRET}"\n', encoding="utf-8")
        proc = await warm_python.create_subprocess_exec(
            sys.executable, "-m", "robot.cli", "chat", "--log-level", level, cwd=tmp_path, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(60):
            out, err = await proc.communicate("你好\n".encode())
    logged = (tmp_path / "data" / "console.log").read_text("utf-8") + out.decode() + err.decode()
    assert proc.returncode == 0 and "你好呀" in out.decode(), logged
    assert "URLPASS" not in logged and SECRET not in logged


async def test_chat_group_keeps_logs_off_the_screen_and_the_bots_name_addresses_it(tmp_path: Path) -> None:
    """The README's `qunbot chat --group`, typed into: members talk, then `qunbot: /summary`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    proc = await warm_python.create_subprocess_exec(
        sys.executable, "-m", "robot.cli", "chat", "--group", cwd=tmp_path, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    lines = "小明: 今晚七点开会\n阿强: 收到，我带投影仪\n小明: 记得带电脑\nqunbot: /summary\n"
    async with asyncio.timeout(60):
        out, err = await proc.communicate(lines.encode())
    shown = out.decode()
    assert proc.returncode == 0, (shown, err.decode())
    assert " INFO " not in shown and err.decode() == ""
    log_file = tmp_path / "data" / "console.log"
    assert f"(logs: {Path('data') / 'console.log'})" in shown and "qunbot started" in log_file.read_text("utf-8")
    replies = [line for line in shown.splitlines() if line.startswith("qunbot ▸")]
    assert len(replies) == 1 and "@小明" in replies[0]  # the last speaker asked; the members only talked
    assert "阿强" in shown.split("qunbot ▸", 1)[1] and "没有 /" not in shown


def test_chat_as_the_first_command_keeps_the_data_dir_and_its_log_private(tmp_path: Path) -> None:
    """`qunbot chat` made the data dir 0755 for good (its log went in first, before the database would
    make it 0700) and console.log 0644, readable by every local user."""
    root = logging.getLogger()
    handlers, umask = list(root.handlers), os.umask(0o022)  # the usual umask
    try:
        _log_to_file(tmp_path / "data" / "console.log")
        (tmp_path / "old").mkdir(mode=0o755)
        (tmp_path / "old" / "console.log").write_text("an older qunbot's log\n", encoding="utf-8")
        _log_to_file(tmp_path / "old" / "console.log")
    finally:
        os.umask(umask)
        for handler in set(root.handlers) - set(handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in sorted(tmp_path.rglob("*"))}
    assert modes == {"data": 0o700, "data/console.log": 0o600, "old": 0o755, "old/console.log": 0o600}


def test_doctor_reports_a_plugin_whose_setup_fails_and_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "qb_broken_setup.py").write_text(PLUGIN_SOURCE.replace(
        'plugin = Plugin("clikit", Toolset("clikit", [weather]), settings_model=CliKitSettings)',
        'async def setup(bot):\n    raise RuntimeError("no database driver")\n\n\n'
        'plugin = Plugin("broken", Toolset("broken", [weather]), setup=setup)'), encoding="utf-8")
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = ["qb_broken_setup"]\n[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "qb_broken_setup", raising=False)
    try:
        assert main(["doctor", "--config", str(cfg)]) == 1
    finally:
        sys.modules.pop("qb_broken_setup", None)
    out = capsys.readouterr().out
    assert "FAIL plugins: plugin 'broken': setup failed: RuntimeError: no database driver" in out
    assert "ok  llm" in out and "ok  channel web" in out and "1 problem(s)" in out


def test_a_file_beside_the_config_does_not_shadow_a_builtin_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary.py").write_text("raise RuntimeError('a notes file, not the plugin')\n", encoding="utf-8")
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text('[bot]\nplugins = ["summary"]\n', encoding="utf-8")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "summary", raising=False)  # imported afresh, as in a new process
    assert main(["tools", "--config", str(cfg)]) == 0
    assert capsys.readouterr().out.startswith("summary")


async def test_a_second_bot_process_on_the_same_sqlite_file_is_refused_until_the_first_is_gone(
        plugin_dir: Path) -> None:
    """Started twice by mistake (a systemd unit and a terminal), two processes would poll the same
    accounts and send replies twice: the second one says who runs and exits; once the first is
    killed (no clean stop, no stale lock left), a new one starts."""
    cfg = config(plugin_dir, "[channels.console]\nenabled = true\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}

    async def start(command: str = "run") -> warm_python.AsyncWarmProcess:
        return await warm_python.create_subprocess_exec(
            sys.executable, "-m", "robot.cli", "--config", str(cfg), command, cwd=plugin_dir, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    first = await start()
    procs = [first]
    try:
        await console_ready(first)
        for command in ("run", "chat"):
            second = await start(command)
            procs.append(second)
            async with asyncio.timeout(20):
                _, err = await second.communicate()
            assert second.returncode == 1, err.decode()[-2000:]
            text = err.decode()
            assert f"another qunbot process (pid {first.pid}) runs on" in text and "Traceback" not in text
        first.kill()  # SIGKILL: the kernel drops its lock
        await first.wait()
        third = await start()
        procs.append(third)
        await console_ready(third)
        third.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            assert await third.wait() == 0
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def test_doctor_does_not_check_the_playground_port_when_telegram_alone_is_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = tmp_path / "qunbot.toml"
        cfg.write_text(f'[bot]\nplugins = []\n[channels.telegram]\nenabled = true\ntoken = "1:x"\n'
                       f'api_base = "http://127.0.0.1:{closed_port()}"\n'
                       f'[channels.web]\nport = {taken.getsockname()[1]}\n', encoding="utf-8")
        main(["doctor", "--config", str(cfg)])
    finally:
        taken.close()
    assert "channel web" not in capsys.readouterr().out  # `qunbot run` would not open it


def test_login_takes_its_options_after_the_command_too(tmp_path: Path) -> None:
    from robot.cli import _parser

    args = _parser().parse_args(["login", "weixin", "--config", str(tmp_path / "q.toml")])
    assert (args.platform, args.config) == ("weixin", str(tmp_path / "q.toml"))


def test_doctor_leaves_the_data_dir_as_it_found_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its scratch bot wrote a fresh secret.key into the real data dir (later misread as the wrong key)."""
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    main(["doctor", "--config", str(cfg)])
    capsys.readouterr()
    assert not (tmp_path / "data" / "secret.key").exists()


@pytest.mark.parametrize("command", [["pending"], ["adopt-secret"], ["copy-db", "--to", "postgresql://u@127.0.0.1:1/x"]])
def test_a_damaged_database_is_one_line_for_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """pending, adopt-secret and copy-db ended in a traceback (closing reconnected, and raised over the error)."""
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    (tmp_path / "data").mkdir(mode=0o700)
    (tmp_path / "data" / "qunbot.sqlite3").write_bytes(os.urandom(8192))
    assert main([*command, "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "file is not a database" in err and len(err.strip().splitlines()) == 1


def test_doctor_goes_on_past_a_database_it_cannot_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[storage]\nurl = "mysql://db/qunbot"\n[channels.web]\nport = {closed_port()}\n',
                   encoding="utf-8")
    assert main(["doctor", "--config", str(cfg)]) == 1
    captured = capsys.readouterr()
    assert "FAIL storage" in captured.out and "ok  llm" in captured.out and "ok  channel web" in captured.out
    assert captured.out.rstrip().endswith("1 problem(s)") and "cannot start" not in captured.err


def test_doctor_at_debug_logs_no_password_of_a_database_it_cannot_open(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """psycopg quotes a bad escape in the password: the printed line was masked, its DEBUG traceback not."""
    import logging

    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[storage]\nurl = "postgresql://bot:S3CRET%zzPW@127.0.0.1:1/q"\n'
                   f'[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    with caplog.at_level(logging.DEBUG):
        assert main(["doctor", "--config", str(cfg)]) == 1
    captured = capsys.readouterr()
    assert "FAIL storage" in captured.out
    assert "S3CRET" not in captured.out + captured.err + caplog.text + "".join(
        logging.Formatter().format(r) for r in caplog.records)


async def test_ctrl_c_while_a_database_does_not_answer_stops_at_once(tmp_path: Path) -> None:
    """A PostgreSQL address that accepts and never answers: Ctrl-C ends `qunbot run` now, as it does
    once running (exit 0), not when the connection times out with "cannot start"."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[storage]\nurl = "postgresql://q:pw@127.0.0.1:{port}/q"\n'
                   f'[channels.web]\nport = {closed_port()}\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    proc = await asyncio.create_subprocess_exec(  # a fresh interpreter: forked warm, it missed 7 s twice under load
        sys.executable, "-m", "robot.cli", "run", "--config", str(cfg), cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(20):
            while not held:  # it is connecting
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(7):  # 2 s for a start about to finish; the connection waits 10 s and more
            code = await proc.wait()
        err = await proc.stderr.read()  # type: ignore[union-attr]
        assert code == 0 and b"cannot start" not in err and b"Traceback" not in err, err.decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        server.close()


async def test_doctor_checks_the_telegram_token_and_the_webhook_port(
        plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with FakeBotAPI("42:real-token") as fake:
        good = config(plugin_dir, f'[channels.telegram]\nenabled = true\ntoken = "42:real-token"\n'
                                  f'api_base = "{fake.url}"\n')
        assert await asyncio.to_thread(main, ["--config", str(good), "doctor"]) == 0
        out = capsys.readouterr().out
        assert "ok  channel telegram: @qun_test_bot" in out and "real-token" not in out
        with taken_port() as taken:
            port = taken.getsockname()[1]
            bad = config(plugin_dir, f'[channels.telegram]\nenabled = true\ntoken = "42:wrong-token"\n'
                                     f'api_base = "{fake.url}"\nmode = "webhook"\nwebhook_secret = "s3cret"\n'
                                     f'port = {port}\n')
            assert await asyncio.to_thread(main, ["--config", str(bad), "doctor"]) == 1
        out = capsys.readouterr().out
    assert "FAIL channel telegram: getMe: 401 Unauthorized" in out
    assert f"FAIL channel telegram: cannot listen on 127.0.0.1:{port}" in out and "2 problem(s)" in out
    assert "wrong-token" not in out


async def _waiting_database(data: Path) -> Path:
    """A database as a bot leaves it, with one run waiting for an admin's approval (code ABCD2345)."""
    from robot.snapshots import SnapshotStore

    db = Database(data / "qunbot.sqlite3")
    SnapshotStore(db)
    await db.open()
    try:
        await db.run(lambda tx: tx.execute(
            "INSERT INTO snapshots (id, code, kind, approver, status, requester, chat, caller, state, origin, "
            "created_at, expires_at, mac) VALUES ('s1', 'ABCD2345', 'approval', 'admin', 'pending', 'memory:u1', "
            "'memory:group:g1', '{}', '{}', '{}', '2026-01-01T00:00:00.000000Z', '2999-01-01T00:00:00.000000Z', "
            "'x')"))
    finally:
        await db.close()
    return data / "qunbot.sqlite3"


def _as_it_stands(path: Path) -> tuple[int, int, list[tuple[str, int]], list[str]]:
    """The file's mode and mtime, its schema versions and the snapshots table's columns."""
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        versions = conn.execute("SELECT component, version FROM schema_version ORDER BY component").fetchall()
        columns = [str(c[1]) for c in conn.execute("PRAGMA table_info(snapshots)")]
    st = path.stat()
    return st.st_mode, st.st_mtime_ns, versions, columns


async def test_pending_reads_a_read_only_database_as_it_stands_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It opened the database for writing: a file made read-only came back 0600 (writable), and the schema
    of a running older bot's database was upgraded under it."""
    path = await _waiting_database(tmp_path / "data")
    path.chmod(0o444)
    before = _as_it_stands(path)
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\ndata_dir = "{tmp_path / "data"}"\n', encoding="utf-8")
    assert await asyncio.to_thread(main, ["pending", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "ABCD2345" in out and "admin approval" in out and "memory:u1 in memory:group:g1" in out
    assert _as_it_stands(path) == before
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


@pytest.mark.parametrize(("version", "says"), [
    (1, "older than this qunbot's (3): start the bot once (`qunbot run`) to upgrade it"),
    (99, "newer than this qunbot knows (3): upgrade qunbot")])
async def test_pending_on_a_schema_other_than_this_qunbots_says_so_in_one_line_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, says: str) -> None:
    """An older schema was upgraded (a running older bot then faced a schema newer than its code)."""
    path = await _waiting_database(tmp_path / "data")
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        if version < 3:  # as an older qunbot left it: no runner, no ran
            conn.execute("ALTER TABLE snapshots DROP COLUMN ran")
            conn.execute("ALTER TABLE snapshots DROP COLUMN runner")
        conn.execute("UPDATE schema_version SET version = ? WHERE component = 'snapshots'", [version])
    before = _as_it_stands(path)
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\ndata_dir = "{tmp_path / "data"}"\n', encoding="utf-8")
    assert await asyncio.to_thread(main, ["pending", "--config", str(cfg)]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    assert f"'snapshots' at schema version {version}, {says}" in captured.err, captured.err
    assert "ABCD2345" not in captured.out and _as_it_stands(path) == before


async def test_pending_does_not_wait_for_another_programs_writer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner's sqlite3 shell mid-UPDATE (or a bot's long write): pending waited 30 s, then "database is locked"."""
    from robot.storage import SQLiteDatabase

    path = await _waiting_database(tmp_path / "data")
    monkeypatch.setattr(SQLiteDatabase, "busy_timeout_s", 0.5)  # stands for the 30 s wait
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\ndata_dir = "{tmp_path / "data"}"\n', encoding="utf-8")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        assert await asyncio.to_thread(main, ["pending", "--config", str(cfg)]) == 0
        assert time.monotonic() - began < 2
        other.execute("ROLLBACK")
    assert "ABCD2345" in capsys.readouterr().out


async def test_pending_on_postgresql_needs_no_write_and_upgrades_no_older_schema(
        pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A login that may only read was refused (pending created and upgraded tables at open), and a shared
    database's older schema was upgraded under the processes still running the older qunbot."""
    import uuid

    import psycopg

    from robot.snapshots import SnapshotStore
    from robot.storage.postgres import PostgresDatabase

    db = PostgresDatabase(pg_url, max_size=1)
    SnapshotStore(db)
    await db.open()
    await db.run(lambda tx: tx.execute(
        "INSERT INTO snapshots (id, code, kind, approver, status, requester, chat, caller, state, origin, created_at, "
        "expires_at, mac) VALUES ('s1', 'ABCD2345', 'input', 'requester', 'pending', 'memory:u1', 'memory:group:g1', "
        "'{}', '{}', '{}', '2026-01-01T00:00:00.000000Z', '2999-01-01T00:00:00.000000Z', 'x')"))
    await db.close()
    reader = "qb_reader_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {reader} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}")
    cfg = tmp_path / "qunbot.toml"

    def pending(url: str) -> int:
        cfg.write_text(f'[bot]\nplugins = []\ndata_dir = "{tmp_path / "data"}"\n[storage]\nurl = "{url}"\n',
                       encoding="utf-8")
        return main(["pending", "--config", str(cfg)])

    try:
        assert await asyncio.to_thread(pending, pg_url.replace("postgres@", f"{reader}@")) == 0
        assert "ABCD2345" in capsys.readouterr().out
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {reader}")
            conn.execute(f"DROP ROLE {reader}")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE snapshots DROP COLUMN ran, DROP COLUMN runner")
        conn.execute("UPDATE schema_version SET version = 1 WHERE component = 'snapshots'")
    assert await asyncio.to_thread(pending, pg_url) == 2
    assert "older than this qunbot's (3)" in capsys.readouterr().err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM schema_version WHERE component = 'snapshots'").fetchone() == (1,)
