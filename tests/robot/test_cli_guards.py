"""The ``qunbot`` command refusing what would harm the install: backups over the bot's own files,
``init`` onto a folder or a special file, flags that do nothing, and a doctor that passes a WeChat
channel with no account to serve (all called in-process)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from robot.channels.state_store import ChannelState
from robot.channels.weixin import WeixinAccount, WeixinState
from robot.cli import main
from robot.store import Database


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(folder: Path, extra: str = "") -> Path:
    cfg = folder / "qunbot.toml"
    cfg.write_text(f'[bot]\nplugins = []\n[channels.web]\nport = {closed_port()}\n{extra}', encoding="utf-8")
    return cfg


async def _bot_files(folder: Path) -> Path:
    """A data_dir as a bot leaves it: the database, its secret.key and the lock of a running process."""
    data = folder / "data"
    db = Database(data / "qunbot.sqlite3")
    ChannelState(db, data / "secret.key")
    await db.open()
    await db.close()
    (data / "secret.key").write_bytes(os.urandom(32))
    (data / "qunbot.sqlite3.lock").write_text("pid 1\n", encoding="utf-8")
    (data / "console.log").write_text("log\n", encoding="utf-8")
    return data


@pytest.mark.parametrize("name", ["secret.key", "qunbot.sqlite3.lock", "console.log", "fresh.sqlite3"])
async def test_backup_refuses_a_target_among_the_bots_own_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """--force over secret.key made it an SQLite file (the next start refused); over the lock, a second bot ran."""
    data = await _bot_files(tmp_path)
    cfg = _config(tmp_path)
    target = data / name
    before = target.read_bytes() if target.exists() else None
    assert await asyncio.to_thread(main, ["backup", str(target), "--force", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert ("data_dir" in err or "the database itself" in err) and len(err.strip().splitlines()) == 1
    assert (target.read_bytes() if target.exists() else None) == before
    assert not list(data.glob("*.partial"))


async def test_backup_refuses_an_existing_target_that_is_not_a_regular_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await _bot_files(tmp_path)
    cfg = _config(tmp_path)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert await asyncio.to_thread(main, ["backup", str(pipe), "--force", "--config", str(cfg)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert await asyncio.to_thread(main, ["backup", str(tmp_path / "b.sqlite3"), "--config", str(cfg)]) == 0


@pytest.mark.parametrize("path", [".", "conf", "newdir/"])
def test_init_refuses_a_folder_even_with_force(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], path: str) -> None:
    """`init --path . --force` was a traceback; `--path newdir/` wrote a file named newdir."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    assert main(["init", "--path", path, "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "qunbot.toml" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"] and not list((tmp_path / "conf").iterdir())


def test_init_force_never_replaces_a_file_that_is_not_a_regular_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert main(["init", "--path", str(pipe), "--force"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and not list(tmp_path.glob("*.partial"))


def test_tools_strict_without_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "--strict", "--config", str(_config(tmp_path))]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == "error: --strict needs --json" and not out


async def _log_in_to_database(data: Path, bot_id: str) -> None:
    """What `qunbot login weixin` stores: the account sealed in the database."""
    db = Database(data / "qunbot.sqlite3")
    state = WeixinState(data / "weixin")
    state.attach(ChannelState(db, data / "secret.key"))
    await db.open()
    try:
        await state.save_account(WeixinAccount(bot_id=bot_id, bot_token=SecretStr("tok"), base_url="http://x"))
    finally:
        await db.close()


WEIXIN = "[channels.weixin]\nenabled = true\n"


async def test_doctor_fails_a_weixin_channel_with_no_account_logged_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "all good", and `qunbot run` then served nobody."""
    cfg = _config(tmp_path, WEIXIN)
    assert await asyncio.to_thread(main, ["doctor", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "FAIL channel weixin: no account is logged in: run `qunbot login weixin`" in out
    assert not (tmp_path / "data" / "secret.key").exists()  # read as it stands, nothing written


async def test_doctor_fails_a_configured_weixin_account_that_is_not_logged_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await _log_in_to_database(tmp_path / "data", "real@im.bot")
    cfg = _config(tmp_path, WEIXIN + 'accounts = ["typo@im.bot"]\n')
    assert await asyncio.to_thread(main, ["doctor", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "FAIL channel weixin: typo@im.bot is not logged in (logged in: real@im.bot): run `qunbot login " \
           "weixin`" in out


async def test_doctor_passes_weixin_accounts_logged_in_in_the_database_or_left_in_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    await _log_in_to_database(data, "real@im.bot")
    WeixinState(data / "weixin").save_account_sync(  # an older qunbot's file: imported at the next start
        WeixinAccount(bot_id="old@im.bot", bot_token=SecretStr("tok"), base_url="http://x"))
    cfg = _config(tmp_path, WEIXIN + 'accounts = ["real@im.bot", "old@im.bot"]\n')
    assert await asyncio.to_thread(main, ["doctor", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "ok  channel weixin: serves old@im.bot, real@im.bot" in out and out.rstrip().endswith("all good")


async def test_doctor_opens_the_database_once_for_all_its_checks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its Weixin check (and its list of replies given up) opened the database again, each: three
    connections (PostgreSQL: three pools and LISTEN sessions) for one report."""
    from robot.storage import SQLiteDatabase

    data = tmp_path / "data"
    await _log_in_to_database(data, "real@im.bot")
    opens: list[str] = []

    def counting(name: str) -> Callable[[SQLiteDatabase], Awaitable[None]]:
        real = getattr(SQLiteDatabase, name)

        async def counted(self: SQLiteDatabase) -> None:
            if Path(self.path) == data / "qunbot.sqlite3":  # (not the doctor's scratch databases)
                opens.append(name)
            await real(self)

        return counted

    for name in ("open", "open_to_read"):
        monkeypatch.setattr(SQLiteDatabase, name, counting(name))
    cfg = _config(tmp_path, WEIXIN + 'accounts = ["real@im.bot"]\n')
    assert await asyncio.to_thread(main, ["doctor", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "ok  channel weixin: serves real@im.bot" in out and out.rstrip().endswith("all good")
    assert opens == ["open_to_read"]
