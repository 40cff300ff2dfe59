"""Loading and setting up plugins: a broken or clashing plugin is one line naming it, not a traceback."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from function_calls import Caller, ToolContext, Toolset, tool_function
from robot import stopping
from robot.bot import Bot
from robot.cli import main
from robot.config import ConfigError, Settings
from robot.plugin import Plugin, PluginError, load_plugin
from robot.testing import MemoryChannel


def test_two_plugins_with_one_name_are_refused(tmp_path: Path) -> None:
    # The second's setup replaced the first's deps: a tool of the first crashed on them at its first call.
    with pytest.raises(PluginError, match="two plugins are named 'search'"):
        Bot(Settings(bot={"data_dir": tmp_path}), plugins=[Plugin("search", Toolset("a", [])),
                                                            Plugin("search", Toolset("b", []))])


async def test_a_failing_setup_is_a_plugin_error_naming_the_plugin_without_the_urls_secret(tmp_path: Path) -> None:
    async def setup(bot: Bot) -> None:
        raise RuntimeError("cannot reach https://user:hunter2@api.example/v1?token=abc123")

    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[], plugins=[Plugin("weather", Toolset("w", []),
                                                                                 setup=setup)])
    with pytest.raises(PluginError) as caught:
        await bot.start()
    shown = str(caught.value)
    assert shown.startswith("plugin 'weather': setup failed: RuntimeError: cannot reach https://user:***@")
    assert "hunter2" not in shown and "abc123" not in shown and not bot.started


def test_a_plugin_module_with_a_syntax_error_is_a_plugin_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken_plugin.py").write_text("def tool(:\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="broken_plugin"):
        load_plugin("broken_plugin")
    cfg = tmp_path / "q.toml"
    cfg.write_text('[bot]\nplugins = ["broken_plugin"]\n', encoding="utf-8")
    assert main(["--config", str(cfg), "tools"]) == 2
    err = capsys.readouterr().err
    assert "broken_plugin" in err and "Traceback" not in err


def test_a_tool_named_like_a_built_in_command_in_capitals_is_refused(tmp_path: Path) -> None:
    # Names resolve whatever their case, so /Help is /help, answered first: such a tool never ran.
    from function_calls import ToolDefinitionError

    @tool_function(aliases=["Help"])
    async def assist() -> str:
        """Helps."""
        return "ok"

    with pytest.raises(ToolDefinitionError, match="/Help is a built-in command"):
        Bot(Settings(bot={"data_dir": tmp_path}), plugins=[Plugin("x", Toolset("x", [assist]))])


@tool_function
async def ping(ctx: ToolContext[object]) -> str:
    """Ping."""
    return "pong"


@tool_function
async def quota(ctx: ToolContext[object]) -> str:
    """Quota."""
    return "plenty"


async def test_a_raising_unavailable_withholds_that_plugins_tools_only_and_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # It raised out of every message (/forget me, /help, other plugins' commands: "没能处理这条消息"),
    # and out of the start's command menu (a traceback).
    def unavailable(deps: object) -> str | None:
        raise RuntimeError("cannot reach https://user:hunter2@quota.example/v1")

    async def setup(bot: Bot) -> object:
        return {}

    flaky = Plugin("flaky", Toolset("flaky", [quota]), setup=setup, unavailable=unavailable)
    ch = MemoryChannel()
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[ch],
              plugins=[Plugin("tools", Toolset("tools", [ping])), flaky])
    with caplog.at_level(logging.ERROR):
        await bot.start()
        try:
            for user, line in (("u1", "/ping"), ("u1", "/quota"), ("u1", "/help"), ("u2", "/forget me")):
                await ch.inject(line, user=user, chat=ch.chat(user, "private"))
            assert "quota" not in bot.offered_tools().names()
        finally:
            await bot.stop()
    replies = [m.text for m in ch.sent]
    assert not any("没能处理" in r for r in replies), replies
    assert len(replies) == 4 and "pong" in replies and any(r.startswith("/quota 暂不可用") for r in replies)
    assert any("/ping" in r for r in replies) and any(r.startswith("已删除") for r in replies)  # /help, /forget me
    logged = [r.getMessage() for r in caplog.records if "flaky" in r.getMessage()]
    assert len(logged) == 1 and "unavailable" in logged[0] and "hunter2" not in logged[0]


async def test_a_teardown_that_never_returns_does_not_keep_the_bot_from_stopping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "TEARDOWN_S", 0.05, raising=False)
    closed: list[str] = []

    async def setup(bot: Bot) -> object:
        return {}

    async def hang(deps: object) -> None:
        await asyncio.Event().wait()  # a client close whose server never answers

    async def close(deps: object) -> None:
        closed.append("second")

    ch = MemoryChannel()
    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[ch],
              plugins=[Plugin("hang", Toolset("h", [ping]), setup=setup, teardown=hang),
                       Plugin("next", Toolset("n", [quota]), setup=setup, teardown=close)])
    await bot.start()
    await bot.send(ch.chat(), "queued before the stop", key="k1")
    async with asyncio.timeout(5):
        await bot.stop(flush_timeout_s=1)
    assert closed == ["second"] and [m.text for m in ch.sent] == ["queued before the stop"]


class NoteSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_notes: int = 10


@pytest.mark.parametrize(("table", "named"), [({"max_notes": "lots"}, "[note] max_notes"),
                                              ({"max_notse": 3}, "max_notse")])
def test_a_plugin_table_its_settings_model_refuses_stops_the_start_naming_the_key(
        tmp_path: Path, table: dict[str, object], named: str) -> None:
    # Only `qunbot doctor` checked it: run and chat started with max_notes = "lots".
    note = Plugin("note", Toolset("note", [ping]), settings_model=NoteSettings)
    with pytest.raises(ConfigError, match=re.escape(named)):
        Bot(Settings(bot={"data_dir": tmp_path}, note=table), channels=[], plugins=[note])
    Bot(Settings(bot={"data_dir": tmp_path}, note={"max_notes": 3}), channels=[], plugins=[note])


async def test_call_tool_awaited_inside_a_setup_is_a_plugin_error_not_a_hang(tmp_path: Path) -> None:
    async def setup(bot: Bot) -> object:
        caller = Caller(platform="memory", user_id="system", chat_id="system", chat_kind="private")
        return await bot.call_tool("ping", caller, {})

    bot = Bot(Settings(bot={"data_dir": tmp_path}), channels=[MemoryChannel()],
              plugins=[Plugin("tools", Toolset("tools", [ping])), Plugin("warm", Toolset("w", [quota]), setup=setup)])
    async with asyncio.timeout(5):
        with pytest.raises(PluginError, match=r"plugin 'warm'.*call_tool.*setup"):
            await bot.start()
    assert not bot.started
