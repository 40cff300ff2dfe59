"""The Telegram channel's files: private JSON state and the webhook spool.

Everything is written 0600 through a temporary file and a rename. A spooled webhook update is
fsync'ed, since the 200 that follows tells Telegram it never needs to send the update again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["read_spool", "write_private"]

log = logging.getLogger(__name__)


def write_private(path: Path, data: dict[str, Any], *, sync: bool = False) -> None:
    """Replace ``path`` with ``data`` as JSON, mode 0600, in a 0700 directory."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    tmp.chmod(0o600)  # an existing temp file keeps its old mode through O_CREAT
    tmp.replace(path)


def read_spool(folder: Path) -> list[tuple[dict[str, Any], Path]]:
    """The updates left in ``folder`` (``<update_id>.json``), oldest first; unreadable ones are skipped."""
    found: list[tuple[int, dict[str, Any], Path]] = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            log.warning("telegram: unreadable spooled update %s skipped", path.name)
            continue
        if isinstance(data, dict) and path.stem.isdigit():
            found.append((int(path.stem), data, path))
    return [(data, path) for _, data, path in sorted(found, key=lambda f: f[0])]
