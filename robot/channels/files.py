"""Small state files channels keep beside the database (credentials, poll cursors, spooled updates), and
the JSON text they write there and to sockets."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["json_text", "write_private"]


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

    The rename is atomic; fsync only where a power cut must not lose it (credentials, a spooled
    update): a cursor lost that way costs a replay, which the bot's dedupe absorbs.
    """
    raw = json_text(data).encode()  # before any file is made: a value JSON cannot hold leaves no temp file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        tmp.chmod(0o600)  # an existing temp file keeps its old mode through O_CREAT
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
