"""The Telegram channel's files: private JSON state and the webhook spool.

Everything is written 0600 through a temporary file and a rename. A spooled webhook update is
fsync'ed, since the 200 that follows tells Telegram it never needs to send the update again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from robot.channels.files import write_private

__all__ = ["read_spool", "write_private"]


log = logging.getLogger(__name__)


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
