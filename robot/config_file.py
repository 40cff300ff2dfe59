"""Reading the configuration: the file (``--config``, ``QUNBOT_CONFIG``, ``./qunbot.toml``) and
the environment into :class:`~robot.config.Settings`, and the check of its top-level tables."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from robot.config import ConfigError, Settings, _explain
from robot.plugin import Plugin, load_plugin

__all__ = ["check_config", "check_plugin_settings", "check_tables", "load_plugins", "load_settings"]


def _find_config(path: str | Path | None) -> Path | None:
    if path is not None:
        return Path(path)
    env = os.environ.get("QUNBOT_CONFIG")
    if env:
        return Path(env)
    default = Path("qunbot.toml")
    return default if default.is_file() else None


def _anchored(path: Path, env_key: str, file: Path | None) -> Path:
    """``path`` with ``~`` expanded, and relative to the config file's folder when written there: started
    from another folder, a cwd-relative path would silently open an empty database (or spool)."""
    try:
        path = path.expanduser()
    except RuntimeError:  # "~nobody/data": no such user
        raise ConfigError(f"{file or 'environment'}: {str(path)!r}: no home folder for {path.parts[0]!r}") from None
    if file is not None and not path.is_absolute() and not any(k.upper() == env_key for k in os.environ):
        path = file.resolve().parent / path
    return path


def load_settings(path: str | Path | None = None) -> tuple[Settings, Path | None]:
    """Read the config (``--config``, ``QUNBOT_CONFIG``, ``./qunbot.toml``, or defaults)."""
    file = _find_config(path)
    data: dict[str, Any] = {}
    if file is not None:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist (run `qunbot init` to write one)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: cannot read: {exc}") from None
    try:
        settings = Settings(**data)
    except SettingsError as exc:  # a list or table in QUNBOT_... is JSON: '["onebot:1"]', not onebot:1
        table = re.search(r'field "(\w+)"', str(exc))
        named = sorted(k for k in os.environ if table and k.upper().startswith(f"QUNBOT_{table[1].upper()}__"))
        raise ConfigError(f"environment: cannot read {', '.join(named) or 'a QUNBOT_ variable'}: a list or table "
                          "is written as JSON, e.g. QUNBOT_BOT__ADMINS='[\"onebot:10001\"]'") from None
    except ValidationError as exc:
        overrides = sorted(k for k in os.environ if k.startswith("QUNBOT_") and "__" in k)
        source = f"{file or 'defaults'}" + (f" with {', '.join(overrides)} set" if overrides else "")
        raise ConfigError(f"{source}: " + _explain(exc)) from None
    llm, fallback = settings.llm, {}
    if (llm.api_key is None or not llm.api_key.get_secret_value()) and os.environ.get("OPENAI_API_KEY"):
        fallback["api_key"] = os.environ["OPENAI_API_KEY"]
    if llm.base_url is None and os.environ.get("OPENAI_BASE_URL"):
        fallback["base_url"] = os.environ["OPENAI_BASE_URL"]
    if fallback:  # checked as the table's own values are (a copy skipped it: "Invalid port: 'Pa55'", a traceback)
        try:
            llm = type(llm).model_validate({**llm.model_dump(exclude=set(fallback)), **fallback})
        except ValidationError as exc:
            names = {"api_key": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL"}
            raise ConfigError("environment: " + "; ".join(
                f"{names.get(str(e['loc'][0]), e['loc'][0])}: {str(e['msg']).removeprefix('Value error, ')}"
                for e in exc.errors())) from None
    settings = settings.model_copy(update={"llm": llm})
    data_dir = _anchored(settings.bot.data_dir, "QUNBOT_BOT__DATA_DIR", file)
    if data_dir != settings.bot.data_dir:
        settings = settings.model_copy(update={"bot": settings.bot.model_copy(update={"data_dir": data_dir})})
    channels = settings.channels
    for name in ("telegram", "weixin"):  # their state (a webhook's spool, a login) must be found again too
        section = getattr(channels, name)
        if section.state_dir is not None:
            anchored = _anchored(section.state_dir, f"QUNBOT_CHANNELS__{name.upper()}__STATE_DIR", file)
            channels = channels.model_copy(update={name: section.model_copy(update={"state_dir": anchored})})
    settings = settings.model_copy(update={"channels": channels})
    for name, value in (settings.model_extra or {}).items():
        if not isinstance(value, dict):
            raise ConfigError(f"{file or 'environment'}: unknown key {name!r} (tables: bot, llm, limits, gate, "
                              "history, channels, or a plugin's table)")
    return settings, file


#: The built-in plugins' tables are known even when the plugin is not loaded: ``qunbot init``
#: writes them, and taking a plugin out of ``[bot] plugins`` must not make its table an error.
_BUILTIN_TABLES = ("reminders", "search", "summary", "memory", "tiers")


def check_tables(settings: Settings, plugins: Iterable[str]) -> None:
    """Refuse a top-level table that is neither a core table nor a loaded plugin's (a typo, say ``[lmm]``),
    in the file or in a ``QUNBOT_<TABLE>__<KEY>`` variable (``QUNBOT_LMM__MODEL`` was ignored)."""
    known = list(dict.fromkeys([*Settings.model_fields, *_BUILTIN_TABLES, *plugins]))
    for key in os.environ:
        table = key[len("QUNBOT_"):].split("__", 1)[0].lower() if key.upper().startswith("QUNBOT_") else ""
        if "__" in key and table and table not in known:
            close = difflib.get_close_matches(table, known, n=1, cutoff=0.6)
            raise ConfigError(f"environment: {key} names no table" + (f": did you mean [{close[0]}]?" if close else
                              f" (tables: {', '.join(known)})"))
    for name in settings.model_extra or {}:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean [{close[0]}]?" if close else f"known tables: {', '.join(known)}"
        raise ConfigError(f"unknown table [{name}]: {hint} (a plugin's table is read only when the plugin is "
                          "listed in [bot] plugins)")


def check_plugin_settings(settings: Settings, plugins: Iterable[Plugin[Any]]) -> None:
    """Each plugin's ``[name]`` table against its ``settings_model``: a bad value or a misspelt key is a
    :class:`ConfigError` naming it, rather than surfacing later."""
    for plugin in plugins:
        if plugin.settings_model is not None:
            settings.section(plugin.name, plugin.settings_model)


def check_config(settings: Settings, plugins: Iterable[Plugin[Any]]) -> None:
    """:func:`check_tables`, then :func:`check_plugin_settings` (the start: ``qunbot doctor`` does the same)."""
    plugins = list(plugins)
    check_tables(settings, [p.name for p in plugins])
    check_plugin_settings(settings, plugins)


def load_plugins(settings: Settings) -> list[Plugin[object]]:
    """The plugins ``[bot] plugins`` names, loaded, and the config's tables checked against them."""
    plugins = [load_plugin(name) for name in settings.bot.plugins]
    check_tables(settings, [p.name for p in plugins])
    return plugins
