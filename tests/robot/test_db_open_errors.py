"""A database that cannot be opened stops `qunbot run` with one line naming the file and the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot.cli import main


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
