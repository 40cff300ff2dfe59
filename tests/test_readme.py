"""The README cannot drift: its config reference, plugin example, commands, tool examples and limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from robot.cli import builtin_template
from robot.config_file import load_settings
from tests import warm_python

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


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


# --- every command the README shows is run (issue 10) -------------------------------------------

_SUBCOMMANDS = ("run", "chat", "tools", "init", "doctor", "backup", "pending", "copy-db", "adopt-secret")
README_DB = "postgresql://qunbot:PASSWORD@db.internal:5432/qunbot"  # Scale out's database: a throwaway one here
#: Commands the README shows that a test cannot run, each with the reason. A new command in the
#: README must be run by test_every_qunbot_command_in_the_readme_runs or listed here.
NOT_RUN = {
    "python3 -m venv .venv": "the suite already runs inside the venv it made",
    ".venv/bin/pip install -e .": "installs from the network; .ci/run does it",
    ".venv/bin/pip install .": "installs from the network; .ci/run does it",
    "bash .ci/run": "is how this suite is run",
    "export OPENAI_API_KEY=sk-...": "a real key",
    "export QUNBOT_LLM__MODEL=gpt-4o-mini": "a real model (the env override itself: tests/robot/test_config.py)",
    "useradd --system --home-dir /srv/qunbot --shell /usr/sbin/nologin qunbot": "root on the host",
    "git clone https://github.com/<you>/qunbot /srv/qunbot": "the network",
    "cd /srv/qunbot": "the sandbox maps /srv/qunbot",
    "chown -R qunbot:qunbot /srv/qunbot": "root on the host",
    "cp deploy/qunbot.service /etc/systemd/system/": "root; the unit is checked by test_systemd_unit_*",
    "systemctl daemon-reload": "root and a running systemd",
    "qunbot login weixin": "a phone scans the QR; the login runs against the fake iLink server in "
                           "tests/robot/channels/weixin/test_weixin_login.py",
    "systemctl enable --now qunbot": "root and a running systemd (its ExecStart is run below)",
    "docker compose -f deploy/compose.yaml up -d": "a Docker daemon (the image's CMD is run below)",
    "createuser --pwprompt qunbot": "the owner's PostgreSQL server (tests/scale runs three `qunbot run` "
                                    "processes on a throwaway cluster)",
    "createdb --owner qunbot qunbot": "the owner's PostgreSQL server (see above)",
    ".venv/bin/pip install '.[postgresql]'": "installs from the network; .ci/run installs the extra with .[test]",
}


def _fenced(lang: str) -> list[str]:
    return [str(b) for b in re.findall(rf"```{lang}\n(.*?)```", README, re.S)]


def _segments() -> list[str]:
    """Shell commands in README's bash blocks and inline `qunbot ...` spans, in document order."""
    found: list[tuple[int, str]] = []
    for match in re.finditer(r"```bash\n(.*?)```", README, re.S):
        for line in match.group(1).replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            found += [(match.start(), part.strip()) for part in line.split("&&") if part.strip()]
    prose = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), README, flags=re.S)
    found += [(m.start(), m.group(1)) for m in re.finditer(r"`(qunbot [^`]+)`", prose)]
    return [segment for _, segment in sorted(found, key=lambda item: item[0])]


def _qunbot_argv(segment: str) -> list[str] | None:
    """The qunbot arguments of a command line (after sudo, a venv path or `docker compose run`)."""
    tokens = shlex.split(segment)
    for i in range(len(tokens) - 1, -1, -1):
        word = tokens[i]
        follows = tokens[i + 1] if i + 1 < len(tokens) else ""
        if (word == "qunbot" or word.endswith("/bin/qunbot")) and (
                follows in _SUBCOMMANDS or follows in ("--version", "--help", "--config", "-c", "COMMAND")):
            return tokens[i + 1:]
    return None


def _expand(argv: list[str]) -> list[list[str]]:
    """Placeholders of the prose: [--json] both ways, FILE a file, COMMAND every subcommand."""
    if "[--json]" in argv:
        at = argv.index("[--json]")
        return _expand(argv[:at] + argv[at + 1:]) + _expand([*argv[:at], "--json", *argv[at + 1:]])
    if "COMMAND" in argv:
        at = argv.index("COMMAND")
        return [v for c in _SUBCOMMANDS for v in _expand([*argv[:at], c, *argv[at + 1:]])]
    return [["backups/readme.sqlite3" if a == "FILE" else a for a in argv]]


def _unit_exec_start() -> list[str]:
    unit = (ROOT / "deploy" / "qunbot.service").read_text(encoding="utf-8")
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def _docker_cmd() -> tuple[list[str], dict[str, str]]:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    env_block = re.search(r"^ENV (.*?)(?:\n(?!\s)|\Z)", dockerfile, re.M | re.S).group(1)  # type: ignore[union-attr]
    env = dict(re.findall(r"(\w+)=(\S+)", env_block))
    return cmd, env


# One child process runs every command through the real entry point, one after another (a
# process per command would cost seconds each). `run` is stopped by the SIGTERM a user's service
# manager sends, once its web port answers.
_DRIVER = """
import contextlib, io, json, os, signal, socket, sys, threading, time
from robot.cli import main

def stop_when_serving(port):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                return
        time.sleep(0.05)

results = []
for argv, env in json.loads(sys.argv[1]):
    os.environ.update(env)
    sys.stdin = io.StringIO("")  # chat: end of input at once
    if argv[:1] == ["run"] and "--help" not in argv:
        threading.Thread(target=stop_when_serving, args=(int(os.environ["QUNBOT_CHANNELS__WEB__PORT"]),),
                         daemon=True).start()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code or 0
    for key in env:
        os.environ.pop(key, None)
    results.append([argv, code])
print("RESULTS " + json.dumps(results, ensure_ascii=False))
"""


async def _run_qunbot(commands: list[tuple[list[str], dict[str, str]]], cwd: Path,
                      env: dict[str, str]) -> tuple[list[tuple[list[str], int]], str]:
    proc = await warm_python.create_subprocess_exec(  # forked by a Python with its third-party imports done
        sys.executable, "-c", _DRIVER, json.dumps(commands), cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(120):
            out = (await proc.communicate())[0].decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    found = re.search(r"^RESULTS (.*)$", out, re.M)
    assert found, out
    return [(argv, code) for argv, code in json.loads(found.group(1))], out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_every_qunbot_command_in_the_readme_runs(tmp_path: Path, pg_url: str) -> None:
    """Each command the README shows, in its order, in a sandbox where /srv/qunbot is a temp folder
    (and the owner's PostgreSQL database is a throwaway one)."""
    work, srv = tmp_path / "work", tmp_path / "srv" / "qunbot"
    work.mkdir()
    srv.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUNBOT_", "OPENAI_", "PERPLEXITY_"))}
    env["QUNBOT_CHANNELS__WEB__PORT"] = str(_free_port())  # 8765 may be taken on a shared machine

    commands: list[tuple[list[str], dict[str, str]]] = []
    unknown = []
    for segment in _segments():
        argv = _qunbot_argv(segment)
        if argv is None:
            if segment not in NOT_RUN:
                unknown.append(segment)
            continue
        commands += [(v, {}) for v in _expand(argv)]
    assert unknown == [], "README shows commands no test runs: run them here or list them in NOT_RUN"
    exec_start = _unit_exec_start()
    assert exec_start[0] == "/srv/qunbot/.venv/bin/qunbot"  # where README's systemd steps install it
    commands.append((exec_start[1:], {}))
    docker_cmd, docker_env = _docker_cmd()
    assert docker_cmd[0] == "qunbot"
    commands.append((docker_cmd[1:], docker_env))

    ran: set[tuple[str, ...]] = set()
    plan = []
    for argv, extra in commands:
        argv = [pg_url if a == README_DB else a.replace("/srv/qunbot", str(srv)) for a in argv]
        if tuple(argv) in ran and not extra:
            continue  # shown twice, run once (a second `init` would refuse to overwrite, as it should)
        ran.add(tuple(argv))
        plan.append((argv, {k: v.replace("/srv/qunbot", str(srv)) for k, v in extra.items()}))
    results, out = await _run_qunbot(plan, work, env)
    assert [argv for argv, _ in results] == [argv for argv, _ in plan]
    failed = [(" ".join(argv), code) for argv, code in results if code != 0]
    assert failed == [] and "Traceback" not in out, out
    shown = {a[0] if a else "" for a in ran}
    assert set(_SUBCOMMANDS) <= shown | {"--version"} and (work / "backups" / "qunbot.sqlite3").is_file()
    assert (srv / "qunbot.toml").is_file() and (srv / "data" / "qunbot.sqlite3").is_file()


def test_systemd_unit_is_valid(tmp_path: Path) -> None:
    """systemd-analyze verify, with ExecStart pointed at a stand-in executable (the real path is /srv)."""
    binary = tmp_path / "srv" / "qunbot" / ".venv" / "bin" / "qunbot"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    unit = tmp_path / "qunbot.service"
    unit.write_text((ROOT / "deploy" / "qunbot.service").read_text(encoding="utf-8")
                    .replace("/srv/qunbot", str(tmp_path / "srv" / "qunbot")), encoding="utf-8")
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (done.stderr + done.stdout).splitlines() if "qunbot.service" in line]
    assert done.returncode == 0 and problems == [], done.stderr


def test_docker_image_holds_every_package_and_compose_builds_it() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    copied = re.findall(r"^COPY (\S+) \./\1$", dockerfile, re.M)
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert sorted(copied) == sorted(packages)
    assert all((ROOT / c).is_dir() for c in copied) and project["project"]["readme"] in dockerfile
    compose = (ROOT / "deploy" / "compose.yaml").read_text(encoding="utf-8")
    assert "dockerfile: deploy/Dockerfile" in compose and "context: .." in compose
    overrides = dict(re.findall(r"^\s+(QUNBOT_\w+): (\S+)$", compose, re.M))
    assert overrides
    with mock_env(overrides):
        settings, _ = load_settings(None)
    assert settings.channels.onebot.host == settings.channels.wecom.host == "0.0.0.0"


@contextlib.contextmanager
def mock_env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


async def test_the_built_in_tools_command_examples_work_without_a_model(tmp_path: Path) -> None:
    from robot.bot import Bot
    from robot.config import Settings
    from robot.testing import MemoryChannel
    from search.testing import FakePerplexityServer

    rows = [line for line in _section("Built-in tools").splitlines() if line.startswith("| `")]
    examples = [cmd for row in rows for cmd in re.findall(r"`(/[^`]+)`", row.split("|")[-2])]
    assert {e.split()[0] for e in examples} >= {"/remind", "/reminders", "/unremind", "/search", "/summary", "/forget"}
    async with FakePerplexityServer(api_key="pplx-readme") as perplexity:
        perplexity.answer("上海今天晴。", [("天气", "https://weather.example/sh")])
        settings = Settings(bot={"data_dir": tmp_path}, limits={"user_per_minute": 1000, "user_burst": 1000},
                            search={"api_key": "pplx-readme", "base_url": perplexity.base_url})
        channel = MemoryChannel()
        bot = Bot(settings, channels=[channel])
        await bot.start()
        try:
            await channel.inject("大家好，今晚七点开会", user="u2")
            for n, example in enumerate(examples, start=1):
                await channel.inject(example)
                reply = (await channel.wait_sent(n, timeout=20))[-1].text
                assert not re.search(r"没有 /|失败|暂不可用|required|invalid|错误|不对", reply), (example, reply)
        finally:
            await bot.stop()


def test_limits_table_shows_the_defaults() -> None:
    from robot.config import ApprovalsSection, HistorySection, LimitsSection, LLMSection
    from robot.plugin import load_plugin

    models: dict[str, Any] = {"limits": LimitsSection, "llm": LLMSection, "history": HistorySection,
                              "approvals": ApprovalsSection}
    for name in ("reminders", "search", "summary"):
        models[name] = load_plugin(name).settings_model
    rows = [line for line in _section("Limits and budgets").splitlines() if line.startswith("| ") and "`[" in line]
    assert len(rows) >= 15
    for row in rows:
        _, _, keys_cell, default_cell, _ = row.split("|")
        table = re.search(r"\[(\w+)\]", keys_cell).group(1)  # type: ignore[union-attr]
        keys = re.findall(r"`(?:\[\w+\] )?(\w+)`", keys_cell)
        shown = [d.strip() for d in default_cell.split(",")]
        fields = models[table].model_fields
        assert shown == [str(fields[k].default) for k in keys], row


def test_a_plugins_line_in_the_readme_keeps_the_built_in_plugins() -> None:
    """Copying the README's ``plugins = [...]`` to add a plugin must not silently drop a built-in one."""
    from robot.config import Settings

    defaults = set(Settings().bot.plugins)
    lines = re.findall(r"plugins = (\[[^\]]*\])", README)
    assert lines
    for line in lines:
        assert defaults <= set(json.loads(line)), line
