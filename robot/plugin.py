"""Plugins: a module that defines tools, and optionally a :class:`Plugin` describing their setup.

A plugin module either defines ``plugin = Plugin(...)`` (tools plus a ``setup`` that builds the
typed dependencies its tools receive as ``ctx.deps``), or just module-level tools, whose
``ctx.deps`` is then the :class:`robot.Bot`. Loading is explicit, by module name, from config.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from function_calls import Toolset, collect_tools
from robot.commands import CommandSyntax
from robot.config import ConfigError
from robot.message import ChatRef
from robot.redact import redact_text

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["Plugin", "PluginError", "distinct", "load_plugin", "not_in_setup", "set_up", "withheld"]

D = TypeVar("D")
log = logging.getLogger(__name__)
#: Why a plugin's tools are withheld when its own ``unavailable`` check fails.
CHECK_FAILED = "插件自检出错"
#: The task running a plugin's setup, and the plugin (a task the setup starts inherits this, but is another task).
_SETTING_UP: ContextVar[tuple[asyncio.Task[Any] | None, str] | None] = ContextVar("qunbot_setting_up", default=None)


class PluginError(Exception):
    """A plugin module could not be loaded or set up."""


@dataclass
class Plugin(Generic[D]):
    """A named toolset with its lifecycle.

    ``setup(bot)`` returns the deps the tools get; ``teardown(deps)`` runs at shutdown;
    ``unavailable(deps)`` returns a reason when the tools cannot work now (say, no API key),
    or a ``{tool name: reason}`` mapping for some of them: those are then not offered to the
    model, and their commands explain the reason.
    """

    name: str
    tools: Toolset
    setup: Callable[[Bot], Awaitable[D]] | None = None
    teardown: Callable[[D], Awaitable[None]] | None = None
    unavailable: Callable[[D], str | Mapping[str, str] | None] | None = None
    #: The plugin's ``[name]`` config table, for ``qunbot init`` and the config reference.
    settings_model: type[BaseModel] | None = None
    #: ``chat_moved(deps, old, new)``: the platform gave a chat a new id; move the plugin's rows.
    chat_moved: Callable[[D, ChatRef, ChatRef], Awaitable[None]] | None = None
    #: Tools (by name) whose ``/command`` has its own syntax rather than fields in order.
    commands: dict[str, CommandSyntax] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [name for name in self.commands if name not in self.tools]
        if unknown:
            raise PluginError(f"plugin {self.name!r}: command syntax for {unknown[0]!r}, which is not one of its tools")


_BUILTIN = {"reminders": "reminders", "search": "search", "summary": "summary", "memory": "memory", "tiers": "tiers"}
#: Where ``robot`` and the built-in plugins are installed, side by side.
_HOME = str(Path(__file__).resolve().parent.parent)


def _import(module_name: str) -> Any:
    if module_name not in _BUILTIN.values() or module_name in sys.modules:
        return importlib.import_module(module_name)
    # Looked up where qunbot is installed first: an editable install's finder comes after every
    # sys.path entry, so a stray summary.py beside the config (on the path) would shadow the plugin.
    sys.path.insert(0, _HOME)
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(_HOME)


def load_plugin(name: str) -> Plugin[Any]:
    """Import a plugin module by name (``reminders`` or a dotted path) and describe it."""
    module_name = _BUILTIN.get(name, name)
    try:
        module = _import(module_name)
    except (ImportError, SyntaxError, TypeError, ValueError) as exc:  # ("..mine": TypeError; "": a ValueError)
        raise PluginError(f"plugin {name!r}: cannot import module {module_name!r}: {exc}") from exc
    declared = getattr(module, "plugin", None)
    if isinstance(declared, Plugin):
        return declared
    tools = collect_tools(module)
    if not len(tools):
        raise PluginError(f"plugin {name!r}: module {module_name!r} defines no tools and no `plugin`")
    return Plugin(name=name, tools=tools)


def distinct(plugins: list[Plugin[Any]]) -> list[Plugin[Any]]:
    """``plugins``, unless two share a name: their deps and tables would be one plugin's (the second's setup
    replaced the first's deps, and a tool of the first crashed on them)."""
    seen: dict[str, Plugin[Any]] = {}
    for plugin in plugins:
        if plugin.name in seen:
            raise PluginError(f"two plugins are named {plugin.name!r}: give each its own Plugin(name=...)")
        seen[plugin.name] = plugin
    return plugins


async def set_up(plugin: Plugin[Any], bot: Bot) -> Any:
    """``plugin``'s deps from its ``setup``; a failure is a :class:`PluginError` naming the plugin (a
    line for the owner, not a traceback ending in some library's frame)."""
    assert plugin.setup is not None
    token = _SETTING_UP.set((asyncio.current_task(), plugin.name))
    try:
        return await plugin.setup(bot)
    except (PluginError, ConfigError, asyncio.CancelledError):  # (a setting of its table: named already)
        raise
    except Exception as exc:
        raise PluginError(f"plugin {plugin.name!r}: setup failed: {type(exc).__name__}: {redact_text(str(exc))[:200]}") from exc
    finally:
        _SETTING_UP.reset(token)


def not_in_setup(what: str) -> None:
    """Raise :class:`PluginError` if a plugin's ``setup`` is awaiting ``what`` itself: ``what`` waits until
    every plugin is set up, that one included, so the start would hang for ever."""
    held = _SETTING_UP.get()
    if held is not None and held[0] is asyncio.current_task():
        raise PluginError(f"plugin {held[1]!r}: {what} awaited inside its setup would wait for ever for the plugins "
                          "to be set up; call it later, or from a task the setup starts")


def withheld(plugins: Iterable[Plugin[Any]], deps: Mapping[str, Any], failing: set[str]) -> dict[str, str]:
    """``{tool name: reason}`` for the tools the set-up ``plugins``' ``unavailable`` withhold now. A check that
    raises withholds all its plugin's tools (fail closed) rather than every message failing; it is logged
    once until it works again (``failing``: the plugins whose check is failing, kept by the caller)."""
    out: dict[str, str] = {}
    for plugin in plugins:
        if plugin.unavailable is None or plugin.name not in deps:
            continue
        try:
            reason = plugin.unavailable(deps[plugin.name])
            if isinstance(reason, str):
                off = {t.name: reason for t in plugin.tools} if reason else {}
            else:
                off = {t.name: str(reason[t.name]) for t in plugin.tools if reason and reason.get(t.name)}
        except Exception as exc:
            if plugin.name not in failing:  # (asked at every message: once per streak, not a log flood)
                log.error("plugin %s: unavailable() failed: %s: %s; its tools are withheld until it works",
                          plugin.name, type(exc).__name__, redact_text(str(exc))[:200])
            failing.add(plugin.name)
            off = {t.name: CHECK_FAILED for t in plugin.tools}
        else:
            if plugin.name in failing:
                failing.discard(plugin.name)
                log.info("plugin %s: unavailable() works again", plugin.name)
        out.update(off)
    return out
