"""The ``qunbot`` command: run, chat, tools, init, doctor, pending."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from robot.bot import Bot
from robot.channels.base import Channel, ChannelError
from robot.config import ConfigError, Settings, load_settings
from robot.plugin import Plugin, PluginError, load_plugin
from robot.redact import redact_url
from robot.template import render_template

__all__ = ["builtin_template", "main"]

log = logging.getLogger("qunbot")


def _version() -> str:
    try:
        return metadata.version("qunbot")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qunbot", description="A typed, guarded group-chat bot.")
    parser.add_argument("--version", action="version", version=f"qunbot {_version()}")
    parser.add_argument("--config", "-c", help="path to qunbot.toml (default: $QUNBOT_CONFIG or ./qunbot.toml)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", help="start every enabled channel (default: the web playground)")
    chat = sub.add_parser("chat", help="chat with the bot in this terminal")
    chat.add_argument("--group", action="store_true", help="simulate a group ('name: text' switches speaker)")
    chat.add_argument("--user", default="me", help="your user id in the console chat")
    tools = sub.add_parser("tools", help="list the loaded tools")
    tools.add_argument("--json", action="store_true", help="print the OpenAI tool definitions as JSON")
    tools.add_argument("--strict", action="store_true", help="with --json: the strict-mode variant")
    init = sub.add_parser("init", help="write a commented qunbot.toml")
    init.add_argument("--path", default="qunbot.toml", help="where to write it ('-' for stdout)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    sub.add_parser("doctor", help="check the config, the LLM endpoint and each channel")
    pending = sub.add_parser("pending", help="list runs waiting for an approval or an answer")
    pending.add_argument("--all", action="store_true", help="every snapshot, not only the pending ones")
    login = sub.add_parser("login", help="log a bot account in by QR code (personal WeChat)")
    login.add_argument("platform", choices=["weixin"], help="weixin: personal WeChat (iLink bot API)")
    return parser


def _plugins(settings: Settings) -> list[Plugin[object]]:
    return [load_plugin(name) for name in settings.bot.plugins]


def _plugin_sections(plugins: Sequence[Plugin[object]]) -> list[tuple[str, type[BaseModel]]]:
    return [(p.name, p.settings_model) for p in plugins if p.settings_model is not None]


async def _serve(bot: Bot, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await bot.start()
    for channel in bot.channels.values():
        where = channel.location()
        log.info("channel %s ready%s", channel.platform, f" at {redact_url(where)}" if where else "")
    try:
        await stop.wait()
    finally:
        log.info("shutting down: flushing the outbox")
        await bot.stop()


async def _run(settings: Settings, channels: list[Channel] | None = None) -> None:
    stop = asyncio.Event()
    bot = Bot(settings, channels=channels)
    if bot.model is None:
        log.warning("no LLM configured ([llm] model/base_url/api_key): the bot answers /commands only")
    await _serve(bot, stop)


async def _chat(settings: Settings, group: bool, user: str) -> None:
    from robot.channels.console import ConsoleChannel

    stop = asyncio.Event()
    console = ConsoleChannel(bot_name=settings.bot.name, group=group, user=user,
                             on_eof=lambda: stop.set())
    await _serve(Bot(settings, channels=[console]), stop)


def _tools(settings: Settings, as_json: bool, strict: bool) -> int:
    plugins = _plugins(settings)
    tools = [t for p in plugins for t in p.tools]
    if as_json:
        print(json.dumps([t.definition(strict=strict) for t in tools], ensure_ascii=False, indent=2))
        return 0
    for tool in tools:
        flags = [f for f, on in (("admin", tool.admin_only), ("group-admin", tool.group_admin), ("@", tool.require_at), ("confirm", tool.confirm)) if on]
        aliases = ", ".join("/" + a for a in tool.aliases)
        print(f"{tool.name:<18} {tool.description.splitlines()[0]}"
              + (f"  [{aliases}]" if aliases else "") + (f"  ({', '.join(flags)})" if flags else ""))
    return 0


def builtin_template() -> str:
    """The commented config with the built-in plugins' tables (README's reference is this text)."""
    return render_template(_plugin_sections([load_plugin(n) for n in ("reminders", "search", "summary")]))


def _init(path: str, force: bool) -> int:
    if path == "-":
        sys.stdout.write(builtin_template())
        return 0
    target = Path(path)
    if target.exists() and not force:
        print(f"error: {target} exists; use --force to overwrite", file=sys.stderr)
        return 2
    plugins: list[Plugin[object]] = []
    for name in ("reminders", "search", "summary"):
        try:
            plugins.append(load_plugin(name))
        except PluginError as exc:  # a broken plugin must not stop `init` writing the core config
            print(f"note: no [{name}] table in the template: {exc}", file=sys.stderr)
    # It holds API keys and tokens: the owner's eyes only, from the first byte written.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(_with_onebot_token(render_template(_plugin_sections(plugins))))
    target.chmod(0o600)  # --force over an existing, looser file
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


async def _doctor(settings: Settings, source: Path | None) -> int:
    problems = 0

    def report(ok: bool, what: str, detail: str = "") -> None:
        nonlocal problems
        problems += 0 if ok else 1
        print(f"{'ok ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""))

    report(True, "config", str(source) if source else "built-in defaults (no qunbot.toml)")
    try:
        plugins = _plugins(settings)
        for plugin in plugins:
            if plugin.settings_model is not None:
                settings.section(plugin.name, plugin.settings_model)
        report(True, "plugins", ", ".join(f"{p.name} ({len(p.tools)} tools)" for p in plugins))
    except (PluginError, ConfigError) as exc:
        report(False, "plugins", str(exc))
    llm = settings.llm
    if not llm.configured:
        report(True, "llm", "not configured: commands only")
    else:
        import openai

        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key.get_secret_value() if llm.api_key
                                    else "not-needed", timeout=10, max_retries=0)
        try:
            models = await client.models.list()
            names = [m.id for m in models.data]
            known = llm.model in names if names else True
            report(known, "llm", f"{redact_url(llm.base_url) if llm.base_url else 'default endpoint'} answers"
                   + ("" if known else f", but model {llm.model!r} is not among {names[:5]}"))
        except Exception as exc:
            report(False, "llm", f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            await client.close()
    ch = settings.channels
    for name, enabled, host, port in (("web", ch.web.enabled, ch.web.host, ch.web.port),
                                      ("onebot", ch.onebot.enabled and ch.onebot.mode == "reverse",
                                       ch.onebot.host, ch.onebot.port),
                                      ("wecom", ch.wecom.enabled, ch.wecom.host, ch.wecom.port)):
        if not enabled:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
                report(True, f"channel {name}", f"{host}:{port} is free to listen on")
            except OSError as exc:
                report(False, f"channel {name}", f"cannot listen on {host}:{port}: {exc.strerror}")
    if ch.onebot.enabled and ch.onebot.mode == "forward" and ch.onebot.url:
        import aiohttp

        try:
            async with aiohttp.ClientSession() as session, session.ws_connect(ch.onebot.url, timeout=aiohttp.ClientWSTimeout(ws_close=5)):
                report(True, "channel onebot", f"connected to {redact_url(ch.onebot.url)}")
        except Exception as exc:
            report(False, "channel onebot", f"cannot connect to {redact_url(ch.onebot.url)}: {type(exc).__name__}")
    print("all good" if not problems else f"{problems} problem(s)")
    return 1 if problems else 0


async def _pending(settings: Settings, everything: bool) -> int:
    from robot.snapshots import SnapshotStore
    from robot.store import Database

    path = settings.bot.data_dir / "qunbot.sqlite3"
    if not path.exists():
        print(f"no database at {path}: nothing is waiting")
        return 0
    db = Database(path)
    store = SnapshotStore(db)
    try:
        await db.open()
        rows = await store.with_status(None if everything else "pending")
    finally:
        await db.close()
    if not rows:
        print("nothing is waiting")
    for row in rows:
        who = "answer" if row["kind"] == "input" else f"{row['approver']} approval"
        print(f"{row['code']}  {row['status']:<11} {who:<18} {row['requester']} in {row['chat']}  "
              f"expires {row['expires_at'][:16].replace('T', ' ')} UTC")
    return 0


async def _login_weixin(settings: Settings) -> int:
    from robot.channels.weixin import LoginFailed, WeixinError, WeixinState, login

    cfg = settings.channels.weixin
    try:
        await login(cfg, WeixinState(cfg.state_dir or settings.bot.data_dir / "weixin"))
    except (LoginFailed, WeixinError) as exc:
        print(f"error: weixin login: {exc}", file=sys.stderr)
        return 1
    if not cfg.enabled:
        print("提示：在 qunbot.toml 的 [channels.weixin] 中设置 enabled = true，然后运行 qunbot run。")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qunbot`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = args.command or "run"
    if command == "init":
        return _init(args.path, args.force)
    try:
        settings, source = load_settings(args.config)
        if command == "tools":
            return _tools(settings, args.json, args.strict)
        if command == "doctor":
            return asyncio.run(_doctor(settings, source))
        if command == "pending":
            return asyncio.run(_pending(settings, args.all))
        if command == "login":
            return asyncio.run(_login_weixin(settings))
        if command == "chat":
            asyncio.run(_chat(settings, args.group, args.user))
        else:
            asyncio.run(_run(settings))
    except (ConfigError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ChannelError) as exc:  # a port taken, a token refused: a line, not a traceback
        print(f"error: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
