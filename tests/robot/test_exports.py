"""Every public module under ``robot/`` declares ``__all__``, and what it declares exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import tempfile

import pytest

import robot
from tests import warm_python

CORE = {"robot", "robot.bot", "robot.cli", "robot.commands", "robot.config", "robot.history", "robot.limits",
        "robot.message", "robot.outbox", "robot.pipeline", "robot.plugin", "robot.store", "robot.template",
        "robot.testing", "robot.channels", "robot.channels.base", "robot.channels.console"}


def public_modules() -> list[str]:
    names = ["robot"]
    for info in pkgutil.walk_packages(robot.__path__, "robot."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def test_the_core_modules_are_all_found() -> None:
    assert set(public_modules()) >= CORE


@pytest.mark.parametrize("name", public_modules())
def test_module_declares_all_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list | tuple), f"{name} has no __all__"
    assert [n for n in exported if not hasattr(module, n)] == []
    assert len(set(exported)) == len(exported)


@pytest.mark.parametrize("name", sorted(CORE))
def test_core_modules_export_every_public_class_and_function(name: str) -> None:
    module = importlib.import_module(name)
    defined = [n for n, obj in vars(module).items()
               if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
               and getattr(obj, "__module__", None) == name]
    assert sorted(set(defined) - set(module.__all__)) == []


def test_the_package_exports_what_plugins_need() -> None:
    expected = {"Bot", "Message", "ChatRef", "Sender", "OutgoingMessage", "Channel", "Capabilities",
                "ChannelUnavailable", "SendRejected", "SendReceipt", "Plugin", "Settings", "load_settings",
                "ConfigError", "Outbox", "HistoryStore", "HistoryEntry", "Database"}
    assert expected <= set(robot.__all__)
    from robot.bot import Bot
    from robot.message import ChatRef

    assert robot.Bot is Bot and robot.ChatRef is ChatRef
    assert "MemoryChannel" not in robot.__all__  # test seams stay in robot.testing


@pytest.mark.parametrize("first", ["robot.plugin", "robot.message"])
def test_no_import_cycle_whichever_module_comes_first(first: str) -> None:
    # A fresh process (this one imported robot long ago), forked by a Python that has imported the
    # third-party libraries only (tests/warm_python.py): robot's modules are imported in this order.
    code = f"import sys\nassert 'robot' not in sys.modules\nimport {first}\nfrom robot import Bot, Plugin, Settings\n" \
           "print(Bot.__module__)"
    with tempfile.TemporaryFile() as err:
        proc = warm_python.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err.fileno(), text=True)
        assert proc.stdout is not None
        with proc.stdout:
            out = proc.stdout.read()
        code_ = proc.wait(timeout=60)
        err.seek(0)
        assert code_ == 0, err.read().decode()
    assert out.strip() == "robot.bot"
