"""``qunbot doctor`` on storage: the engine (password redacted), the live processes and their
accounts, and the outbox rows waiting for an account no process holds; on both engines."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
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


async def _used_database(data: Path, plugins: list[str]) -> Settings:
    """Settings whose SQLite database a bot with ``plugins`` has started on and stopped."""
    settings = Settings(bot={"data_dir": data, "plugins": plugins})
    bot = Bot(settings, channels=[MemoryChannel()])
    await bot.start()
    await bot.stop()
    return settings


def _damage(db: Path, table: str) -> None:
    """Overwrite ``table``'s root page with junk SQLite reads as a leaf page (a bad sector, a torn copy)."""
    conn = sqlite3.connect(db)
    page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    raw[(page - 1) * size:page * size] = bytes([0x0d]) + bytes(range(256)) * (size // 256 - 1) + bytes(255)
    db.write_bytes(bytes(raw))


@pytest.mark.parametrize(("component", "plugins"), [("outbox", []), ("reminders", ["reminders"])])
async def test_doctor_fails_a_database_whose_schema_is_newer_than_this_qunbot(
        tmp_path: Path, component: str, plugins: list[str]) -> None:
    """`qunbot run` refuses it ("newer than this qunbot knows"); the doctor said "ok storage"."""
    settings = await _used_database(tmp_path / "data", plugins)
    db = tmp_path / "data" / "qunbot.sqlite3"
    with sqlite3.connect(db) as conn:
        known = conn.execute("SELECT version FROM schema_version WHERE component = ?", [component]).fetchone()[0]
        conn.execute("UPDATE schema_version SET version = 99 WHERE component = ?", [component])
    check = (await storage_checks(settings))[0]
    assert check == Check(False, "storage", f"SQLite {db}: {component!r} is at schema version 99, newer than this "
                                            f"qunbot knows ({known}): upgrade qunbot (or restore a backup)")


async def test_doctor_fails_a_database_this_user_cannot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = await _used_database(tmp_path / "data", [])
    db = tmp_path / "data" / "qunbot.sqlite3"
    db.chmod(0o400)
    if os.geteuid() == 0:  # (permissions do not stop root, who may run the tests)
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (Path(p) == db and mode & os.W_OK)
                            and access(p, mode, **kw))
    check = (await storage_checks(settings))[0]
    assert not check.ok and check.what == "storage"
    assert check.detail == f"SQLite {db}: this user cannot write {db}: `qunbot run` as this user cannot start on it"


async def test_doctor_fails_a_database_with_a_damaged_page(tmp_path: Path) -> None:
    settings = await _used_database(tmp_path / "data", [])
    db = tmp_path / "data" / "qunbot.sqlite3"
    _damage(db, "history")
    check = (await storage_checks(settings))[0]
    assert not check.ok and check.what == "storage"
    assert check.detail.startswith(f"SQLite {db}: damaged (PRAGMA quick_check: ")


async def test_doctor_reads_a_database_another_program_is_writing_without_waiting_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner's sqlite3 shell mid-UPDATE: the doctor waited 30 s per read, then said FAIL "database is locked"."""
    settings = await _used_database(tmp_path / "data", [])
    monkeypatch.setattr(SQLiteDatabase, "busy_timeout_s", 0.5)  # stands for the 30 s wait
    other = sqlite3.connect(tmp_path / "data" / "qunbot.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        checks = await storage_checks(settings)
        assert time.monotonic() - began < 2
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert checks[0] == Check(True, "storage", f"SQLite {tmp_path / 'data' / 'qunbot.sqlite3'}")


async def test_doctor_lists_the_messages_given_up_without_waiting_for_another_programs_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The list of replies given up (doctor's last lines) opened the database for writing: 30 s more."""
    from robot.maintenance import undelivered

    settings = await _used_database(tmp_path / "data", [])
    db = SQLiteDatabase(tmp_path / "data" / "qunbot.sqlite3")
    outbox = Outbox(db)
    await db.open()
    await outbox.enqueue(row("k1", "onebot", "1"))
    await db.run(lambda tx: tx.execute("UPDATE outbox SET status = 'failed', error = 'refused', sent_at = created_at"))
    await db.close()
    monkeypatch.setattr(SQLiteDatabase, "busy_timeout_s", 0.5)  # stands for the 30 s wait
    other = sqlite3.connect(tmp_path / "data" / "qunbot.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        given_up = await undelivered(settings)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert given_up == [{"chat": "onebot:group:g", "error": "refused"}]


async def test_doctor_leaves_a_read_only_database_file_as_it_found_it(tmp_path: Path) -> None:
    """Opening it made a file the owner had made read-only 0600 (writable again) behind their back."""
    settings = await _used_database(tmp_path / "data", [])
    db = tmp_path / "data" / "qunbot.sqlite3"
    db.chmod(0o444)
    before = db.stat()
    await storage_checks(settings)
    after = db.stat()
    assert (oct(after.st_mode), after.st_mtime_ns) == (oct(before.st_mode), before.st_mtime_ns)


async def test_doctor_creates_nothing_in_an_empty_postgresql_database(pg_url: str) -> None:
    """It created the schema_version table (a write, which a login that may only read is refused)."""
    import psycopg

    (check, *_) = await storage_checks(Settings(storage={"url": pg_url}))
    assert check.ok, check
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT table_name FROM information_schema.tables "
                            "WHERE table_schema = 'public'").fetchall() == []
