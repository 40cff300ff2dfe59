"""The channels' small state files (robot.channels.files)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from robot.channels.files import write_private


def test_concurrent_writers_of_one_file_never_trip_over_each_others_temp_file(tmp_path: Path) -> None:
    """Two copies of one webhook update spool to the same name at once: both must succeed."""
    path = tmp_path / "spool" / "41.json"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        for i in range(30):
            try:
                write_private(path, {"update_id": 41, "n": n, "i": i}, sync=i % 10 == 0)
            except BaseException as exc:  # (collected: a thread's exception would be lost)
                errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text("utf-8"))["update_id"] == 41
    assert [p.name for p in path.parent.iterdir()] == ["41.json"]  # no temp file left behind
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
