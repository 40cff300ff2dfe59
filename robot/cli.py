"""The ``qunbot`` command: run, chat, tools, init, doctor, backup, pending, copy-db, login."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from function_calls import Tool, ToolDefinitionError, Toolset
from robot import maintenance
from robot.bot import Bot
from robot.channels.base import Channel, ChannelError
from robot.config import ConfigError, Settings
from robot.config_file import load_plugins, load_settings
from robot.doctor import doctor
from robot.plugin import Plugin, PluginError, load_plugin
from robot.redact import redact_url
from robot.runtime import tune_gc
from robot.secret_key import SecretKeyMismatch
from robot.snapshots import SnapshotError
from robot.storage import SQLiteDatabase
from robot.storage.lockfile import sole_process
from robot.template import render_template

__all__ = ["builtin_template", "main"]

log = logging.getLogger("qunbot")


def _version() -> str:
    try:
        return metadata.version("qunbot")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _common() -> argparse.ArgumentParser:
    """Options every subcommand accepts too (``qunbot run --config x.toml``).

    Defaults are suppressed here so that an option given before the subcommand is not reset
    by the subcommand's parser.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", default=argparse.SUPPRESS,
                        help="path to qunbot.toml (default: $QUNBOT_CONFIG or ./qunbot.toml)")
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log verbosity (default: INFO; `doctor` shows WARNING and above)")
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="qunbot", description="A typed, guarded group-chat bot.",
                                     parents=[common])
    parser.add_argument("--version", action="version", version=f"qunbot {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", parents=[common], help="start every enabled channel (default: the web playground)",
                   description="Start every enabled channel (none configured: the web playground).")
    chat = sub.add_parser("chat", parents=[common], help="chat with the bot in this terminal",
                          description="Chat with the bot in this terminal (a private chat, or --group).")
    chat.add_argument("--group", action="store_true", help="simulate a group ('name: text' switches speaker)")
    chat.add_argument("--user", default="me", help="your user id in the console chat")
    tools = sub.add_parser("tools", parents=[common], help="list the loaded tools",
                           description="List the loaded tools with their commands and flags.")
    tools.add_argument("--json", action="store_true", help="print the OpenAI tool definitions as JSON")
    tools.add_argument("--strict", action="store_true", help="with --json (needed): the strict-mode variant")
    init = sub.add_parser("init", parents=[common], help="write a commented qunbot.toml",
                          description="Write a commented qunbot.toml with every key and its default.")
    init.add_argument("--path", default=None, help="where to write it ('-' for stdout; default: --config, "
                      "$QUNBOT_CONFIG, ./qunbot.toml)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    sub.add_parser("doctor", parents=[common], help="check the config, the LLM endpoint and each channel",
                   description="Check the config, the plugins, the LLM endpoint and each channel's port.")
    maintenance.add_parsers(sub, common)  # backup, pending, copy-db, adopt-secret
    login = sub.add_parser("login", parents=[common], help="log a bot account in by QR code (personal WeChat)")
    login.add_argument("platform", choices=["weixin"], help="weixin: personal WeChat (iLink bot API)")
    return parser


def _plugin_sections(plugins: Sequence[Plugin[object]]) -> list[tuple[str, type[BaseModel]]]:
    return [(p.name, p.settings_model) for p in plugins if p.settings_model is not None]


async def _serve(bot: Bot, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    # SIGHUP too: the terminal of `qunbot chat` closed (it ended the bot at once, its replies not flushed)
    for sig in (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    bot.db.when_outdated(lambda _: stop.set())  # another process upgraded the schema: stop, as asked to
    with contextlib.ExitStack() as held:
        if isinstance(bot.db, SQLiteDatabase) and bot.db.path != ":memory:":
            held.enter_context(sole_process(Path(bot.db.path)))  # one bot process per SQLite file
        starting, halted = asyncio.ensure_future(bot.start()), asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, halted}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # a signal while starting: a start about to finish finishes, then stops;
            await asyncio.wait({starting}, timeout=2)  # a stuck one (a database that never answers) is
        if not starting.done():  # cut short, not waited out (bot.start() stops what it had started)
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return
        halted.cancel()
        starting.result()
        tune_gc()  # a long-running process: see robot.runtime
        for channel in bot.channels.values():
            where = channel.location()
            log.info("channel %s ready%s", channel.platform, f" at {redact_url(where)}" if where else "")
        try:
            await stop.wait()
        finally:
            log.info("shutting down: flushing the outbox")
            await bot.stop()
    if bot.db.outdated:  # for the service manager to restart it, on the new version once installed
        raise SystemExit(f"error: stopped: {bot.db.outdated}")


async def _run(settings: Settings, channels: list[Channel] | None = None) -> None:
    stop = asyncio.Event()
    bot = Bot(settings, channels=channels)
    if bot.model is None:
        log.warning("no LLM configured ([llm] model/base_url/api_key): the bot answers /commands only")
    await _serve(bot, stop)


def _log_to_file(path: Path) -> None:
    """The console is the chat: log lines go to a file instead of between the messages."""
    # Made before the database would make the folder 0700 (`qunbot chat` as the first command): as private.
    with contextlib.suppress(FileExistsError):  # the owner's own folder keeps its mode
        path.parent.mkdir(parents=True, mode=0o700)
        path.parent.chmod(0o700)  # mkdir's mode is cut by the umask
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # what the chat says is logged
    if path.stat().st_mode & 0o077:  # (made 0644 by an older qunbot)
        path.chmod(0o600)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stderr, sys.stdout):
            root.removeHandler(handler)
    file = logging.FileHandler(path, encoding="utf-8")
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file)


async def _chat(settings: Settings, group: bool, user: str) -> None:
    from robot.channels.console import ConsoleChannel

    log_file = settings.bot.data_dir / "console.log"
    _log_to_file(log_file)
    print(f"(logs: {log_file})")
    stop = asyncio.Event()
    console = ConsoleChannel(bot_name=settings.bot.name, group=group, user=user,
                             on_eof=lambda: stop.set())
    bot = Bot(settings, channels=[console])
    console.park = bot.parked.park  # a line still unanswered as the bot stops: answered at the next start
    await _serve(bot, stop)


_FLAGS = (("@", "in a group, runs only when the message @-mentions the bot (or starts with its name)"),
          ("admin", "only the bot's admins ([bot] admins) may run it"),
          ("group-admin", "a group's owner/admins (in that group) and the bot's admins may run it"),
          ("confirm", "waits for an approval (/approve CODE) before it runs"))


def _describe(tool: Tool) -> list[str]:
    flags = [f for f, on in (("@", tool.require_at), ("admin", tool.admin_only), ("group-admin", tool.group_admin),
                             ("confirm", tool.confirm)) if on]
    head = tool.name + "".join(f"  /{a}" for a in tool.aliases) + (f"  ({', '.join(flags)})" if flags else "")
    lines = [head]
    for paragraph in tool.description.split("\n\n"):
        lines += textwrap.wrap(" ".join(paragraph.split()), width=96, initial_indent="    ",
                               subsequent_indent="    ", break_long_words=False) or [""]
    if tool.examples:
        lines.append("    e.g. " + " | ".join(tool.examples))
    return lines


def _tools(settings: Settings, as_json: bool, strict: bool) -> int:
    if strict and not as_json:  # (accepted, and it did nothing)
        print("error: --strict needs --json", file=sys.stderr)
        return 2
    merged = Toolset("bot")  # as the bot merges them: a tool two plugins offer is an error, not listed twice
    for plugin in load_plugins(settings):
        merged = merged.merge(plugin.tools)
    tools = list(merged)
    if as_json:
        print(json.dumps([t.definition(strict=strict) for t in tools], ensure_ascii=False, indent=2))
    else:
        for tool in tools:
            print("\n".join(_describe(tool)))
        used = {f for t in tools for f, on in (("@", t.require_at), ("admin", t.admin_only),
                                                ("group-admin", t.group_admin), ("confirm", t.confirm)) if on}
        legend = [f"  ({flag}) {meaning}" for flag, meaning in _FLAGS if flag in used]
        print("\nEvery tool is also a command that needs no model: /<name>, or the /alias shown "
              "(/help in a chat lists them)"
              + ("\n" + "\n".join(legend) if legend else ""))
    sys.stdout.flush()  # inside main's try: a closed pipe (`| head`) is handled there, not at exit
    return 0


def builtin_template() -> str:
    """The commented config with the built-in plugins' tables (README's reference is this text)."""
    return render_template(_plugin_sections([load_plugin(n) for n in ("reminders", "search", "summary", "memory", "tiers")]))


def _init(path: str, force: bool) -> int:
    if path == "-":
        sys.stdout.write(builtin_template())
        return 0
    target = Path(path)
    # `.` ended in a traceback, and `newdir/` (meant as a folder) wrote a file named newdir
    if path.endswith(("/", os.sep, "/.", f"{os.sep}.")) or target.name in ("", "..") or target.is_dir():
        print(f"error: {path} names a folder; name the file, e.g. {target / 'qunbot.toml'}", file=sys.stderr)
        return 2
    if target.exists() and not target.is_file():  # --force renamed the config over a device or a pipe
        print(f"error: {target} is not a regular file; name another path", file=sys.stderr)
        return 2
    if target.exists() and not force:
        print(f"error: {target} exists; use --force to overwrite", file=sys.stderr)
        return 2
    plugins: list[Plugin[object]] = []
    for name in ("reminders", "search", "summary", "memory", "tiers"):
        try:
            plugins.append(load_plugin(name))
        except PluginError as exc:  # a broken plugin must not stop `init` writing the core config
            print(f"note: no [{name}] table in the template: {exc}", file=sys.stderr)
    # It holds API keys and tokens: the owner's eyes only, from the first byte written; written beside and
    # moved in whole (a full disk left a 4 KiB stub in place of the owner's config, which then blocked a retry).
    partial = target.with_name(target.name + ".partial")
    try:
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_with_onebot_token(render_template(_plugin_sections(plugins))))
        partial.replace(target)
    except OSError as exc:  # no such folder, not writable, full
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        print(f"error: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {target}")
    print("the OneBot access_token in it is random: give NapCat/Lagrange the same token")
    return 0


def _with_onebot_token(text: str, token: str | None = None) -> str:
    """The template with a fresh random ``[channels.onebot] access_token``: safe before anyone edits it."""
    head, sep, rest = text.partition("[channels.onebot]\n")
    unset = "# access_token = ..."
    if not sep or unset not in rest.split("\n[", 1)[0]:
        return text
    value = json.dumps(token or secrets.token_urlsafe(24))
    return head + sep + rest.replace(unset, f"access_token = {value}", 1)


def _on_import_path(source: Path | None) -> None:
    """Plugins next to the config file import as they would with ``PYTHONPATH=<its folder>``."""
    if source is None:
        return
    folder = str(source.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)  # last: a stray search.py beside the config must not shadow a built-in


async def _login_weixin(settings: Settings) -> int:
    """``qunbot login weixin``: the account lands in the bot's database, where every process sees it."""
    from robot.channels.state_store import ChannelState
    from robot.channels.weixin import LoginFailed, WeixinError, WeixinState, login

    cfg = settings.channels.weixin
    db = settings.storage.engine(settings.bot.data_dir)
    state = WeixinState(cfg.state_dir or settings.bot.data_dir / "weixin")
    state.attach(sealed := ChannelState(db, settings.bot.data_dir / "secret.key"))
    await db.open()
    try:
        await sealed.check_key()  # the login is sealed with it: the key every process has
        await login(cfg, state)
    except (LoginFailed, WeixinError) as exc:
        print(f"error: weixin login: {exc}", file=sys.stderr)
        return 1
    finally:
        await db.close()
    if not cfg.enabled:
        print("提示：在 qunbot.toml 的 [channels.weixin] 中设置 enabled = true，然后运行 qunbot run。")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qunbot`` console script."""
    args = _parser().parse_args(argv)
    command = args.command or "run"
    level = getattr(args, "log_level", None) or ("WARNING" if command == "doctor" else "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):  # (openai 3 sends through httpx2) at any level:
        logging.getLogger(name).setLevel(logging.WARNING)  # each request's line holds base_url, its key too
    if command == "init":  # where `run` will look: `-c conf/bot.toml init` wrote ./qunbot.toml, and run said "init"
        where = args.path or getattr(args, "config", None) or os.environ.get("QUNBOT_CONFIG") or "qunbot.toml"
        return _init(where, args.force)
    try:
        settings, source = load_settings(getattr(args, "config", None))
        _on_import_path(source)
        if command == "tools":
            return _tools(settings, args.json, args.strict)
        if command == "doctor":
            return asyncio.run(doctor(settings, source))
        if command in maintenance.COMMANDS:
            return maintenance.run(command, settings, args)
        if command == "login":
            return asyncio.run(_login_weixin(settings))
        if command == "chat":
            asyncio.run(_chat(settings, args.group, args.user))
        else:
            asyncio.run(_run(settings))
    except BrokenPipeError:  # `qunbot tools --json | head`: the reader left; that is not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, PluginError, SecretKeyMismatch, SnapshotError, ToolDefinitionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ChannelError) as exc:  # e.g. a channel's port is taken: a line, not a traceback
        print(f"error: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
