"""One bot process per SQLite file: the second one started by mistake is refused.

SQLite serves one bot process (its leases are always granted, any other claim is a dead
predecessor's): a second ``qunbot run`` or ``qunbot chat`` on the same file (a systemd unit and a
terminal, say) would poll the same accounts and take over the first one's outbox claims, sending
replies twice. The bot holds an exclusive ``flock`` on ``<file>.lock`` while it runs; the kernel
drops it with the process, also a killed one, so no stale lock is ever left to clear by hand.
Readers of the file (``qunbot backup``, ``doctor``) take no lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from robot.storage.base import StorageError

__all__ = ["sole_process"]


@contextlib.contextmanager
def sole_process(database: Path) -> Iterator[None]:
    """Hold ``<database>.lock`` for the block, or raise :class:`StorageError` naming the holder."""
    try:
        import fcntl
    except ImportError:  # not POSIX (Windows): no flock to hold
        yield
        return
    lock = database.with_name(database.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 100, 0).decode("utf-8", "replace").strip() or "another process"
            raise StorageError(f"another qunbot process ({holder}) runs on {database}; stop it first "
                               "(several processes share a PostgreSQL database: see Scale out)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # (the lock goes with it)
