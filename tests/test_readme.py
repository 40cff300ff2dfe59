"""The README cannot drift: its config reference and its plugin example are checked here."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from robot.cli import builtin_template

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_config_reference_is_the_generated_template() -> None:
    block = re.search(r"<!-- config-reference:start -->\n```toml\n(.*?)```\n<!-- config-reference:end -->",
                      README, re.S)
    assert block is not None, "README lost its config reference markers"
    assert block.group(1) == builtin_template(), "regenerate it: qunbot init --path - (and paste into README)"


def _code_block(marker: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"no python block containing {marker!r} in README")


async def test_plugin_authors_example_runs_as_written() -> None:
    module = types.ModuleType("weather_plugin")
    sys.modules["weather_plugin"] = module
    try:
        exec(compile(_code_block("# weather_plugin.py"), "README:weather_plugin.py", "exec"), module.__dict__)
        test_ns: dict[str, object] = {"weather": module.weather}
        exec(compile(_code_block("async def test_weather"), "README:test_weather", "exec"), test_ns)
        await test_ns["test_weather"]()  # type: ignore[operator]
        from robot.plugin import load_plugin

        plugin = load_plugin("weather_plugin")
        assert plugin.name == "weather" and plugin.tools.names() == ["weather"]
    finally:
        sys.modules.pop("weather_plugin", None)


def test_readme_links_stay_inside_the_repository() -> None:
    root = Path(__file__).resolve().parents[1]
    for target in re.findall(r"\]\(([^)#\s]+)\)", README):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (root / target).resolve()
        assert path.is_relative_to(root), f"README links outside the repository: {target}"
        assert path.exists(), f"README links to a missing file: {target}"
