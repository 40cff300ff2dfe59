"""Loading and setting up plugins: a broken or clashing plugin is one line naming it, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from function_calls import Toolset
from robot.bot import Bot
from robot.cli import main
from robot.config import Settings
from robot.plugin import Plugin, PluginError, load_plugin


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
    from function_calls import ToolDefinitionError, tool_function

    @tool_function(aliases=["Help"])
    async def assist() -> str:
        """Helps."""
        return "ok"

    with pytest.raises(ToolDefinitionError, match="/Help is a built-in command"):
        Bot(Settings(bot={"data_dir": tmp_path}), plugins=[Plugin("x", Toolset("x", [assist]))])
