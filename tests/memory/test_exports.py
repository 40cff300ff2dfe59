"""Every module of the memory plugin declares ``__all__``, and what it declares exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import memory

MODULES = ["memory", *(i.name for i in pkgutil.walk_packages(memory.__path__, "memory."))]


def test_all_modules_found() -> None:
    assert {"memory.service", "memory.store", "memory.strength", "memory.terms", "memory.tools",
            "memory.vectors", "memory.testing", "memory.settings"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list | tuple), f"{name} has no __all__"
    assert [n for n in exported if not hasattr(module, n)] == []
