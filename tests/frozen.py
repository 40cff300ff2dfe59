"""A real child process frozen in the middle of a transaction (SIGSTOP), as a paused VM or a
stopped process is: the database sees its transaction idle, with its locks held, and no hang-up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path


@contextlib.asynccontextmanager
async def frozen_child(script: str, *args: str) -> AsyncIterator[subprocess.Popen[str]]:
    """Run ``script`` (Python source taking ``args``), which prints "holding" inside its unit and then
    reads a line from stdin; stop it with SIGSTOP once it says so, and kill it at the end. To let
    it go on: SIGCONT, then a line on its stdin (``communicate``)."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.strip() == "holding", child.stderr.read() if child.stderr else line
        # Sent from here: a process stopping itself runs on a moment (its other threads may commit).
        os.kill(child.pid, signal.SIGSTOP)
        async with asyncio.timeout(5):
            while not _stopped(child.pid):
                await asyncio.sleep(0.01)
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await asyncio.to_thread(child.wait)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
