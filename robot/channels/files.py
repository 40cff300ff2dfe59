"""Small state files channels keep beside the database (credentials, poll cursors, spooled updates), and
the JSON text they write there and to sockets."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["json_text", "sync_folder", "write_private"]


def json_text(data: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """``data`` as JSON text that encodes to UTF-8: other scripts kept as they are, unless it holds
    a lone surrogate (half an emoji, a forged update), which only JSON's escapes can carry."""
    text = json.dumps(data, ensure_ascii=False, default=default)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(data, default=default)
    return text


def write_private(path: Path, data: dict[str, Any], *, sync: bool = False) -> None:
    """Replace ``path`` with ``data`` as JSON, mode 0600, in a 0700 directory; ``sync`` fsyncs it first.

    The rename is atomic; fsync (the file, then its folder's entry) only where a power cut must not lose
    it (credentials, a spooled update): a cursor lost that way costs a replay, which the bot's dedupe absorbs.
    Each call has a temp file of its own: two writers of one name at once (a webhook update Telegram
    sent twice) both succeed, the last rename wins.
    """
    raw = json_text(data).encode()  # before any file is made: a value JSON cannot hold leaves no temp file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # (made 0600)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """fsync ``folder``, so a file just renamed into it is there after a power cut (a no-op where
    folders cannot be opened, Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # (a file system that cannot sync folders)
            raise
    finally:
        os.close(fd)
