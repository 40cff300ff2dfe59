"""Every process sharing a database has the same ``secret.key``: one started with another key (or
none) refuses to start and says which file to copy, instead of voiding the runs others paused for
an approval and sealing logins they cannot open. ``qunbot adopt-secret`` replaces the key on purpose."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from function_calls.testing import ScriptedModel
from robot import Bot
from robot.cli import main
from robot.config import Settings
from robot.secret_key import SecretKeyMismatch
from robot.storage import SQLITE_FILE
from robot.testing import MemoryChannel
from tests.robot.conftest import BotFactory


def _fingerprint_rows(data_dir: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(data_dir / SQLITE_FILE) as conn:
        return conn.execute("SELECT * FROM install_secret").fetchall()


async def test_on_sqlite_a_replaced_or_deleted_key_refuses_to_start_and_the_old_one_works_again(
        make_bot: BotFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    bot, _ = await make_bot(data_dir=data)
    await bot.stop()
    original = (data / "secret.key").read_bytes()
    fingerprint = _fingerprint_rows(data)
    assert len(fingerprint) == 1

    (data / "secret.key").write_bytes(bytes(32))  # replaced
    replaced, _ = await make_bot(data_dir=data, start=False)
    with pytest.raises(SecretKeyMismatch) as wrong:
        await replaced.start()
    message = str(wrong.value)
    assert str(data / "secret.key") in message and "Copy secret.key" in message and "adopt-secret" in message
    assert original.hex() not in message and original.hex()[:16] not in message
    assert not replaced.started  # stopped again: nothing left running

    (data / "secret.key").unlink()  # deleted: not made again, so the owner copies the real one back
    deleted, _ = await make_bot(data_dir=data, start=False)
    with pytest.raises(SecretKeyMismatch, match="does not exist"):
        await deleted.start()
    assert not (data / "secret.key").exists()

    (data / "secret.key").write_bytes(original)
    again, _ = await make_bot(data_dir=data)
    assert again.started and _fingerprint_rows(data) == fingerprint


async def test_on_postgresql_a_second_process_with_its_own_key_refuses_until_the_key_is_copied(
        make_bot: BotFactory, pg_url: str, tmp_path: Path) -> None:
    storage = {"url": pg_url, "pool_size": 2}
    first, _ = await make_bot(data_dir=tmp_path / "a", storage=storage)
    second, _ = await make_bot(data_dir=tmp_path / "b", storage=storage, start=False, own_key=True)
    with pytest.raises(SecretKeyMismatch, match=r"b/secret\.key does not exist"):
        await second.start()  # not copied: none is made, which would be the wrong one
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "secret.key").write_bytes(os.urandom(32))  # a key of its own
    third, _ = await make_bot(data_dir=tmp_path / "b", storage=storage, start=False, own_key=True)
    with pytest.raises(SecretKeyMismatch, match=r"b/secret\.key is not the secret\.key the database .* was first used"):
        await third.start()
    shutil.copy2(tmp_path / "a" / "secret.key", tmp_path / "b" / "secret.key")
    fourth, _ = await make_bot(data_dir=tmp_path / "b", storage=storage)
    assert first.started and fourth.started


def _config(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "qunbot.toml"
    path.write_text(f'[bot]\ndata_dir = "{data}"\n', encoding="utf-8")
    return path


def test_adopt_secret_makes_a_new_key_the_databases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    cfg = str(_config(tmp_path, data))
    asyncio.run(_start_and_stop(data))
    before = _fingerprint_rows(data)
    (data / "secret.key").unlink()  # lost
    assert main(["-c", cfg, "run"]) == 2  # `qunbot run` says why, in one line
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err and "Traceback" not in err

    assert main(["-c", cfg, "adopt-secret"]) == 0
    assert "is now the database's secret.key" in capsys.readouterr().out
    after = _fingerprint_rows(data)
    assert (data / "secret.key").exists() and len(after) == 1 and after != before
    asyncio.run(_start_and_stop(data))  # with the new key


async def _start_and_stop(data: Path) -> None:
    bot = Bot(Settings(bot={"data_dir": data}), model=ScriptedModel([]), channels=[MemoryChannel()])
    await bot.start()
    await bot.stop()


async def test_adopt_secret_refuses_while_a_process_runs_on_the_database(
        make_bot: BotFactory, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running, _ = await make_bot(data_dir=tmp_path / "a", storage={"url": pg_url, "pool_size": 2})
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'[bot]\ndata_dir = "{tmp_path / "b"}"\n[storage]\nurl = "{pg_url}"\n', encoding="utf-8")
    assert await _in_thread(["-c", str(cfg), "adopt-secret"]) == 2
    err = capsys.readouterr().err
    assert "stop every process" in err and running.leases.leases.holder in err
    await running.stop()
    assert await _in_thread(["-c", str(cfg), "adopt-secret"]) == 0  # a stopped process's lease is released
    assert (tmp_path / "b" / "secret.key").read_bytes() != (tmp_path / "a" / "secret.key").read_bytes()


async def _in_thread(argv: list[str]) -> int:
    """``qunbot <argv>`` (it runs its own event loop: not on this one)."""
    return await asyncio.to_thread(main, argv)
