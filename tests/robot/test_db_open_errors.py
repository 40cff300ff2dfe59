"""A database that cannot be opened stops `qunbot run` with one line naming the file and the cause."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from robot.bot import Bot
from robot.cli import main
from robot.config import Settings
from robot.testing import MemoryChannel


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\ndata_dir = "{tmp_path / "data"}"\n', encoding="utf-8")
    (tmp_path / "data").mkdir()
    return cfg


@pytest.mark.parametrize(("spoil", "cause"), [
    (lambda p: p.mkdir(), "unable to open database file"),  # a directory where the file should be
    (lambda p: p.write_bytes(b"not a database, just some text " * 40), "file is not a database"),
])
def test_an_unusable_database_prints_one_line_with_path_and_cause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: object, cause: str) -> None:
    cfg = _config(tmp_path)
    db = tmp_path / "data" / "qunbot.sqlite3"
    spoil(db)  # type: ignore[operator]
    assert main(["-c", str(cfg), "run"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == [f"error: cannot start: cannot open the database {db}: {cause}"]


def _damage_leases(db: Path) -> None:
    """Junk over the leases table's root page (a bad sector): the file opens; the first write fails."""
    conn = sqlite3.connect(db)
    page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'leases'").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    raw[(page - 1) * size:page * size] = bytes([0x0d]) + bytes(range(256)) * (size // 256 - 1) + bytes(255)
    db.write_bytes(bytes(raw))


@pytest.mark.parametrize(("spoil", "said"), [
    ("read-only", "cannot open the database {db}: attempt to write a readonly database"),
    ("damaged", "cannot use the database {db}: database disk image is malformed"),
])
def test_a_database_that_opens_but_cannot_be_written_prints_one_line_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, spoil: str,
        said: str) -> None:
    """A read-only file, a damaged page: SQLite opened them, and the first write ended `run` in a traceback."""
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text(encoding="utf-8") + "plugins = []\n", encoding="utf-8")
    db = tmp_path / "data" / "qunbot.sqlite3"
    asyncio.run(_used(tmp_path / "data"))
    if spoil == "damaged":
        _damage_leases(db)
    else:
        db.chmod(0o400)
        connect = sqlite3.connect  # (permissions do not stop root, who may run the tests: SQLite is told)

        def read_only(path: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
            if Path(path) == db:
                return connect(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
            return connect(path, *args, **kwargs)

        monkeypatch.setattr(sqlite3, "connect", read_only)
    assert main(["-c", str(cfg), "run"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: cannot start: " + said.format(db=db)], err


async def _used(data: Path) -> None:
    """The database as a bot without plugins leaves it after its first run."""
    bot = Bot(Settings(bot={"data_dir": data, "plugins": []}), channels=[MemoryChannel()])
    await bot.start()
    await bot.stop()
