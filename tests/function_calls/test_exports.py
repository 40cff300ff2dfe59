"""Exports are complete: every public module lists its public names in ``__all__`` (httpx style)."""

import importlib
import inspect
import pkgutil
import types

import pytest

import function_calls

MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(function_calls.__path__, "function_calls.")
    if not name.rsplit(".", 1)[-1].startswith("_")
)
PACKAGES = ["function_calls", "function_calls.testing"]


def test_every_public_module_is_covered() -> None:
    assert {"function_calls.loop", "function_calls.tool", "function_calls.testing.server"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES + PACKAGES)
def test_all_names_exist_are_unique_and_sorted(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert all(hasattr(module, n) for n in exported), [n for n in exported if not hasattr(module, n)]
    assert len(set(exported)) == len(exported)
    assert exported == sorted(exported)


@pytest.mark.parametrize("name", MODULES)
def test_public_classes_and_functions_defined_in_a_module_are_exported(name: str) -> None:
    module = importlib.import_module(name)
    defined = {
        n for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == name
    }
    assert defined - set(module.__all__) == set()


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_in_a_package_init_is_exported(name: str) -> None:
    package = importlib.import_module(name)
    public = {
        n for n, obj in vars(package).items()
        if not n.startswith("_") and not isinstance(obj, types.ModuleType)
    }
    assert set(package.__all__) == public

