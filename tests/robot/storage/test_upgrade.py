"""A rolling upgrade on PostgreSQL: once one process has upgraded the shared schema past what the
others' code knows, they stop (and say why) instead of going on writing rows the new schema may no
longer mean; restarted on the old code they refuse to start, on the new one they run.

Real parts: the session's throwaway PostgreSQL server, and a real ``qunbot run`` process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import pytest

from robot.storage.base import StorageError
from robot.storage.pgtesting import cut_listeners
from robot.storage.postgres import PostgresDatabase
from tests.robot.conftest import console_ready, eventually

pytestmark = pytest.mark.unrehearsed  # about processes and schemas, not units of work

OLD = ["CREATE TABLE things (id INTEGER PRIMARY KEY)"]
NEW = [*OLD, "ALTER TABLE things ADD COLUMN colour TEXT"]


async def test_a_process_whose_schema_another_process_upgraded_is_told_to_stop(pg_url: str) -> None:
    old = PostgresDatabase(pg_url, max_size=2)
    old.migrate("things", OLD)
    told: list[str] = []
    old.when_outdated(told.append)
    await old.open()
    newer = PostgresDatabase(pg_url, max_size=2)
    newer.migrate("things", NEW)
    newer.migrate("gadgets", ["CREATE TABLE gadgets (id INTEGER)"])
    try:
        other = PostgresDatabase(pg_url, max_size=2)
        other.migrate("gadgets", ["CREATE TABLE gadgets (id INTEGER)"])
        await other.open()  # a component the old code does not have: nothing of its own changed
        await other.close()
        await asyncio.sleep(0.5)
        assert told == [] and old.outdated == ""
        await newer.open()
        await eventually(lambda: bool(told), timeout=10)
        assert told == [old.outdated]
        assert "'things' is at schema version 2, newer than this qunbot knows (1)" in told[0]
        assert "restart this process on the new version" in told[0]
        assert newer.outdated == ""  # the process that upgraded it goes on
        restarted = PostgresDatabase(pg_url, max_size=2)
        restarted.migrate("things", OLD)
        with pytest.raises(StorageError, match="newer than this qunbot knows"):
            await restarted.open()
    finally:
        await old.close()
        await newer.close()


async def test_an_upgrade_announced_while_a_process_was_not_listening_is_noticed_when_it_listens_again(
        pg_url: str) -> None:
    old = PostgresDatabase(pg_url, max_size=2)
    old.migrate("things", OLD)
    old.listen_retry_s = 2.0  # a gap long enough to upgrade in
    await old.open()
    newer = PostgresDatabase(pg_url, max_size=2)
    newer.migrate("things", NEW)
    try:
        await asyncio.to_thread(cut_listeners, pg_url)
        await newer.open()  # its announcement reaches nobody
        await eventually(lambda: bool(old.outdated), timeout=20)
        assert "'things' is at schema version 2" in old.outdated
    finally:
        await old.close()
        await newer.close()


async def test_qunbot_run_stops_with_the_reason_when_another_process_upgrades_the_schema(
        pg_url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "qunbot.toml"
    cfg.write_text(f'[bot]\ndata_dir = "{tmp_path / "data"}"\n[storage]\nurl = "{pg_url}"\n'
                   "[channels.console]\nenabled = true\n", encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "robot.cli", "--config", str(cfg), "run", cwd=tmp_path, env=dict(os.environ),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        seen = await console_ready(proc, timeout=30)
        # What a newer qunbot does at its start: one more step of the history schema, announced.
        newer = PostgresDatabase(pg_url, max_size=2)
        await newer.open()
        try:
            await newer.transaction(lambda tx: (
                tx.execute("UPDATE schema_version SET version = version + 1 WHERE component = 'history'"),
                tx.notify("schema", "upgraded")))
        finally:
            await newer.close()
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            rest = await proc.stderr.read()
            assert await proc.wait() == 1
        text = (seen + rest).decode()
        assert "error: stopped: another process upgraded the database" in text and "'history'" in text
        assert "Traceback" not in text and "shutting down: flushing the outbox" in text
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
