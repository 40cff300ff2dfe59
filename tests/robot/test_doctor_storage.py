"""``qunbot doctor`` on storage: the engine (password redacted), the live processes and their
accounts, and the outbox rows waiting for an account no process holds; on both engines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from robot.bot import Bot
from robot.channels.console import ConsoleChannel
from robot.channels.onebot import OneBotChannel
from robot.channels.telegram import TelegramChannel
from robot.channels.web import WebChannel
from robot.channels.wecom import WeComCallbackChannel, WeComWebhookChannel
from robot.channels.weixin import WeixinChannel
from robot.cli import main
from robot.config import Settings
from robot.doctor_storage import Check, storage_checks
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.outbox_store import LEASED_PLATFORMS, ONE_PROCESS_PLATFORMS
from robot.storage import Engine, SQLiteDatabase
from robot.storage.leases import Leases
from robot.storage.postgres import PostgresDatabase
from robot.testing import MemoryChannel

HOLDER = "host-a:4242:abcd1234"


def row(key: str, platform: str, account: str) -> OutgoingMessage:
    return OutgoingMessage(key=key, chat=ChatRef(platform=platform, chat_id="g", kind="group", account=account),
                           text=key)


async def test_doctor_shows_the_engine_the_processes_and_the_rows_no_process_can_send(
        engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    HistoryStore(engine)
    outbox = Outbox(engine)
    leases = Leases(engine, ttl_s=600, holder=HOLDER)
    await engine.open()
    try:
        assert await leases.acquire(f"process:{HOLDER}") and await leases.acquire("account:telegram:111")
        assert await leases.acquire("channel:web")
        await outbox.enqueue(row("held", "telegram", "111"), row("orphan1", "telegram", "222"),
                             row("orphan2", "telegram", "222"), row("unnamed", "onebot", ""),
                             row("web", "web", ""), row("wecom1", "wecom", ""), row("wecom2", "wecom", ""))
    finally:
        await engine.close()
    if isinstance(engine, SQLiteDatabase):
        storage, shown = "", f"SQLite {engine.where}"
    else:
        storage, shown = f'[storage]\nurl = "{engine.url}"\n', "PostgreSQL postgresql://"
    config = tmp_path / "qunbot.toml"
    config.write_text(f'[bot]\ndata_dir = "{tmp_path}"\n{storage}', encoding="utf-8")
    await asyncio.to_thread(main, ["--config", str(config), "doctor"])
    report = capsys.readouterr().out
    assert f"ok  storage: {shown}" in report
    assert "ok  processes: 1 running" in report
    assert f"ok  process {HOLDER}: holds telegram:111, channel:web" in report
    assert "FAIL outbox: 2 message(s) for telegram wait for account 222, which no running process holds" in report
    assert "FAIL outbox: 1 message(s) for onebot wait for its default account" in report
    # WeCom's callback runs in one process at a time: its rows wait for whichever process runs it.
    assert "FAIL outbox: 2 message(s) for wecom wait for the channel, which no running process runs" in report
    assert "account 111" not in report and "for web" not in report  # held: account and channel
    if not isinstance(engine, SQLiteDatabase):  # the machines' clocks against the database's
        assert "ok  clock: this machine's clock is 0.0" in report


@pytest.mark.parametrize(("url", "secrets"), [
    ("postgresql://qun:s3cret-pw@127.0.0.1:1/qunbot", ["s3cret-pw"]),
    ("postgresql://qun:Pa@ssW0rd@127.0.0.1:1/qunbot", ["Pa@ssW0rd", "ssW0rd"]),  # libpq: host 'ssW0rd@...'
    ("postgresql://qun:S3cret%ZZpw@127.0.0.1:1/qunbot", ["S3cret", "ZZpw"]),  # libpq quotes a bad escape
    ("postgresql://qun@127.0.0.1:1/qunbot?password=p4ssw0rd", ["p4ssw0rd"]),
])
async def test_doctor_never_shows_the_database_password(url: str, secrets: list[str]) -> None:
    (check,) = await storage_checks(Settings(storage={"url": url}))
    assert not check.ok and check.what == "storage"
    assert not [s for s in secrets if s in check.detail], check.detail
    assert "127.0.0.1" in check.detail or "***" in check.detail


async def test_doctor_on_a_database_no_process_has_used(tmp_path: Path) -> None:
    (check,) = await storage_checks(Settings(bot={"data_dir": tmp_path}))
    assert check.ok and "not created yet" in check.detail


async def test_doctor_on_a_data_dir_that_is_a_file_or_a_key_it_cannot_read_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data dir that is a file read "ok (not created yet)" though `run` fails; an unreadable secret.key
    (root's, after a deploy's copy) stopped the report with a traceback's name under "plugins"."""
    (tmp_path / "data").write_text("oops", encoding="utf-8")
    (check,) = await storage_checks(Settings(bot={"data_dir": tmp_path / "data"}))
    assert not check.ok and "not a directory" in check.detail
    import robot.doctor_storage
    from robot.doctor_storage import _key_check

    def root_owned(path: Path) -> bytes:  # (permissions do not stop root, who may run the tests)
        raise PermissionError(13, "Permission denied", str(path))

    (tmp_path / "secret.key").write_bytes(b"x" * 32)
    monkeypatch.setattr(robot.doctor_storage, "load_secret", root_owned)
    key = await _key_check(tmp_path / "secret.key", "fingerprint")
    assert not key.ok and "cannot read it" in key.detail


def test_the_doctor_knows_which_channels_hold_account_leases_and_which_run_in_one_process() -> None:
    channels = (OneBotChannel, TelegramChannel, WeixinChannel, WebChannel, ConsoleChannel, WeComCallbackChannel,
                WeComWebhookChannel)
    assert {c.platform for c in channels if c.account_leases} == set(LEASED_PLATFORMS)
    assert {c.platform for c in channels if c.one_process} == set(ONE_PROCESS_PLATFORMS)


async def test_doctor_says_whether_this_data_dirs_secret_key_is_the_databases(
        engine: Engine, tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = {"url": engine.url} if isinstance(engine, PostgresDatabase) else {}
    settings = Settings(bot={"data_dir": data}, storage=storage)
    bot = Bot(settings, channels=[MemoryChannel()])
    await bot.start()
    await bot.stop()

    def key_line(checks: list[Check]) -> Check:
        (line,) = [c for c in checks if c.what == "secret.key"]
        return line

    assert key_line(await storage_checks(settings)) == Check(True, "secret.key", f"{data / 'secret.key'}: the database's")
    original = (data / "secret.key").read_bytes()
    (data / "secret.key").write_bytes(bytes(32))
    replaced = key_line(await storage_checks(settings))
    assert not replaced.ok and "not the key the database was first used with" in replaced.detail
    (data / "secret.key").unlink()
    missing = key_line(await storage_checks(settings))
    assert not missing.ok and "does not exist" in missing.detail
    assert not (data / "secret.key").exists()  # the doctor writes nothing
    assert original.hex() not in replaced.detail + missing.detail
