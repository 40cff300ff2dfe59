"""DESIGN.md's package rules, checked: plugins use only function_calls and robot's public names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import robot

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("reminders", "search", "summary", "memory", "tiers")


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
    return found


@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugins_import_no_other_plugin_and_only_public_robot_names(plugin: str) -> None:
    problems = []
    for path in sorted((ROOT / plugin).rglob("*.py")):
        for line, module, names in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}"
            if top in PLUGINS and top != plugin:
                problems.append(f"{where} imports another plugin: {module}")
            if top == "robot" and module not in ("robot", "robot.testing"):
                problems.append(f"{where} imports a private robot module: {module} (use `from robot import ...`)")
            if module == "robot":
                problems.extend(f"{where} imports robot.{n}, which is not in robot.__all__"
                                for n in names if n not in robot.__all__)
    assert problems == []


def test_function_calls_does_not_depend_on_the_bot() -> None:
    for path in sorted((ROOT / "function_calls").rglob("*.py")):
        for line, module, _ in _imports(path):
            assert module.split(".")[0] not in ("robot", *PLUGINS), f"{path}:{line} imports {module}"


def test_source_files_stay_readable() -> None:
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in ROOT.glob("[!.]*/**/*.py")
            if "tests" not in p.parts and ".venv" not in p.parts
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > 400]
    assert long == []
