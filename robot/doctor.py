"""``qunbot doctor``: the config, the plugins, the storage, the model endpoints and the channels'
ports, checked one by one; each problem is one line and the rest is still checked."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from pathlib import Path

from function_calls.provider_errors import translate_error
from robot import maintenance
from robot.bot import Bot
from robot.channels.telegram.settings import TelegramSettings
from robot.config import ConfigError, Settings
from robot.config_file import check_plugin_settings, load_plugins
from robot.doctor_storage import reading, weixin_logins
from robot.plugin import PluginError
from robot.redact import redact_text, redact_url
from robot.storage import Engine

__all__ = ["doctor"]


async def _switched_off(settings: Settings) -> tuple[dict[str, str], dict[str, int]]:
    """Plugins whose tools are off (say, search without an API key), set up against a scratch database; and
    each component's schema version this qunbot knows, which that set-up registered (the storage check's)."""
    with tempfile.TemporaryDirectory(prefix="qunbot-doctor-") as scratch:
        # Its data dir too is the scratch one: it wrote a new secret.key into the real one when none was there
        # (then misreported as "not the key the database was first used with"), in a folder made 0755.
        local = settings.model_copy(update={"bot": settings.bot.model_copy(update={"data_dir": Path(scratch)})})
        bot = Bot(local, channels=[], database=str(Path(scratch) / "doctor.sqlite3"))
        await bot.start()
        try:
            blocked = bot.unavailable_tools()
            return {p.name: blocked[p.tools.names()[0]] for p in bot.plugins
                    if p.tools.names() and p.tools.names()[0] in blocked}, bot.db.schemas()
        finally:
            await bot.stop(flush_timeout_s=0)


async def _telegram(settings: TelegramSettings) -> tuple[bool, str, str]:
    """``getMe`` with the bot's token, as the channel asks it at start (the token is never shown)."""
    import aiohttp

    from robot.channels.telegram import TelegramApi, TelegramError

    token = settings.token.get_secret_value()
    async with aiohttp.ClientSession() as session:
        try:
            me = await TelegramApi(session, settings.api_base, token, timeout_s=10).call("getMe")
        except TelegramError as exc:  # (its text never holds the URL, so never the token: replaced all the same)
            return False, "channel telegram", str(exc).replace(token, "***") if token else str(exc)
        except Exception as exc:  # a malformed api_base: the report goes on
            return False, "channel telegram", f"cannot reach {redact_url(settings.api_base)}: {type(exc).__name__}"
    name = me.get("username") if isinstance(me, dict) else None
    return True, "channel telegram", f"@{name or '?'} answers at {redact_url(settings.api_base)}"


async def _weixin(settings: Settings, stored: set[str] | str) -> tuple[bool, str, str]:
    """Whom ``qunbot run`` would serve on personal WeChat: it starts with no account, and only logs it.
    ``stored``: the accounts logged in in the database, or why they could not be read."""
    from robot.channels.weixin import WeixinState

    cfg, what = settings.channels.weixin, "channel weixin"
    root = cfg.state_dir or settings.bot.data_dir / "weixin"
    # Files an older qunbot left are imported at the next start: they count as logged in
    logged = {a.bot_id for a in await asyncio.to_thread(WeixinState(root).load_accounts_sync)}
    if isinstance(stored, str):
        return False, what, f"cannot read the logins from the database ({stored})"
    logged |= stored
    missing = sorted(set(cfg.accounts) - logged)
    if missing:
        return False, what, (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not logged in "
                             f"(logged in: {', '.join(sorted(logged)) or 'none'}): run `qunbot login weixin`")
    if not logged:
        return False, what, "no account is logged in: run `qunbot login weixin`"
    return True, what, f"serves {', '.join(sorted(set(cfg.accounts) or logged))}"


async def _logins(db: Engine | None, found: bool) -> set[str] | str:
    """The Weixin accounts logged in in ``db`` (None: no database yet if ``found``, else one that cannot be
    read), or why they cannot be read (no text: it may quote a DSN)."""
    if db is None:
        return set() if found else "the storage line says why"
    try:
        return await weixin_logins(db)
    except Exception as exc:
        return type(exc).__name__


async def doctor(settings: Settings, source: Path | None) -> int:
    """Print one line per check (``ok``, ``FAIL`` or ``off``) and a verdict; 1 when anything failed."""
    problems = 0

    def report(ok: bool, what: str, detail: str = "") -> None:
        nonlocal problems
        problems += 0 if ok else 1
        print(f"{'ok ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""))

    report(True, "config", str(source) if source else "built-in defaults (no qunbot.toml)")
    schemas: dict[str, int] | None = None  # (the plugins failing: the storage check sets up its own)
    try:
        plugins = load_plugins(settings)
        check_plugin_settings(settings, plugins)
        report(True, "plugins", ", ".join(f"{p.name} ({len(p.tools)} tools)" for p in plugins))
        off, schemas = await _switched_off(settings)
        for name, reason in off.items():
            print(f"off {name}: {reason}")
    except (PluginError, ConfigError) as exc:
        report(False, "plugins", str(exc))
    except Exception as exc:  # a plugin's settings or deps failed: the report goes on with the next check
        report(False, "plugins", f"failed: {type(exc).__name__}: {redact_text(str(exc))[:200]}")
    stored: set[str] | str = set()  # the Weixin logins in the database
    async with reading(settings, known=schemas) as (checks, db):  # opened once, for every check that reads it
        for check in checks:
            report(*check)
        # (no database, or one that cannot be read: the storage line above has said so; the other checks go on)
        failed = await maintenance.undelivered(settings, db=db) if db is not None else []
        if settings.channels.weixin.enabled:
            stored = await _logins(db, checks[0].ok)
    if failed:
        newest = failed[0]
        report(False, "outbox", f"{len(failed)} message(s) could not be delivered in the last 7 days; newest to "
               f"{newest['chat']}: {newest['error']}")
    llm = settings.llm
    if not llm.configured:
        report(True, "llm", "not configured: commands only")
    # Each tier falls back to [llm]'s endpoint and key, as the tiers plugin does.
    for what, tier in (("llm", llm if llm.configured else None), ("llm.think", llm.think), ("llm.plan", llm.plan)):
        if tier is None:
            continue
        import openai

        url, key = tier.base_url or llm.base_url, tier.api_key or llm.api_key
        client = openai.AsyncOpenAI(base_url=url, api_key=key.get_secret_value() if key else "not-needed",
                                    timeout=10, max_retries=0)
        try:
            names = [m.id for m in (await client.models.list()).data]
            known = tier.model in names if names else True
            report(known, what, f"{redact_url(url) if url else 'default endpoint'} answers"
                   + ("" if known else f", but model {tier.model!r} is not among {names[:5]}"))
        except Exception as exc:  # the status and the error code, never the body (a provider may echo the key)
            report(False, what, f"{redact_url(url) if url else 'default endpoint'}: {translate_error(exc)}")
        finally:
            await client.close()
    ch = settings.channels
    # Mirrors build_channels: with nothing else enabled, `qunbot run` opens the playground.
    web_on = ch.web.enabled or not (ch.onebot.enabled or ch.wecom.enabled or ch.wecom.webhook_key is not None
                                    or ch.console.enabled or ch.weixin.enabled or ch.telegram.enabled)
    for name, enabled, host, port in (("web", web_on, ch.web.host, ch.web.port),
                                      ("onebot", ch.onebot.enabled and ch.onebot.mode == "reverse",
                                       ch.onebot.host, ch.onebot.port),
                                      ("wecom", ch.wecom.enabled, ch.wecom.host, ch.wecom.port),
                                      ("telegram", ch.telegram.enabled and ch.telegram.mode == "webhook",
                                       ch.telegram.host, ch.telegram.port)):
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
    if ch.telegram.enabled:
        report(*await _telegram(ch.telegram))
    if ch.weixin.enabled:
        report(*await _weixin(settings, stored))
    print("all good" if not problems else f"{problems} problem(s)")
    return 1 if problems else 0
