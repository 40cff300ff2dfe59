"""PostgreSQL through PgBouncer, as many hosts offer it: a real PgBouncer (Debian's package, installed
by .ci/run) in front of the session's throwaway server, on loopback.

In session mode qunbot works as on a direct connection: its session settings are set once connected
(PgBouncer refuses them in the startup packet), and notifications reach every process. In
transaction mode ``LISTEN`` cannot work (the server connection it was said on goes back to the pool),
nor can a session setting be relied on: the process refuses to start, and says why, unless
``[storage] listen_url`` gives it a direct URL to listen on: then its settings are made per
transaction, nothing is prepared, and no setting is left on the server connections others share.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from robot.storage import StorageError
from robot.storage.pgtesting import pgbouncer
from robot.storage.postgres import PostgresDatabase
from tests.robot.conftest import eventually

pytestmark = pytest.mark.unrehearsed  # about connections, not units of work


async def has_its_settings(db: PostgresDatabase) -> None:
    """``db``'s units run with its settings (``stall_s`` 7.5): commits not waiting for the log's
    flush, but a durable unit's; a transaction left idle ended by the server."""
    shown = await db.run(lambda tx: tx.query(
        "SELECT current_setting('idle_in_transaction_session_timeout') AS idle, "
        "current_setting('synchronous_commit') AS sync"))
    assert shown == [{"idle": "7500ms", "sync": "off"}]
    durable = await db.transaction(lambda tx: tx.execute("SHOW synchronous_commit").fetchone()[0], durable=True)
    assert durable == "on"


async def test_through_pgbouncer_in_session_mode_a_process_keeps_its_settings_and_hears_the_others(
        pg_url: str) -> None:
    with pgbouncer(pg_url, "session") as pooled:
        far, near = PostgresDatabase(pooled, max_size=2, stall_s=7.5), PostgresDatabase(pg_url, max_size=2)
        far.listen_check_s, far.listen_answer_s = 0.2, 8.0  # (3 s: a loaded CI run replaced it, losing a notice)
        heard: list[str] = []
        far.subscribe("reminders", heard.append)
        await far.open()  # refused before: "unsupported startup parameter: options"
        await near.open()
        try:
            await has_its_settings(far)
            await asyncio.sleep(1)  # several checks of the LISTEN connection: it keeps hearing

            async def hears() -> bool:  # again if a loaded run replaced the LISTEN connection meanwhile (what
                if not heard:  # it missed then is re-read by design: a gap), as the transaction-mode test does
                    await near.transaction(lambda tx: tx.notify("reminders", "deleted 3"))
                    await asyncio.sleep(0.5)
                return bool(heard)

            await eventually(hears, timeout=20)
            assert set(heard) == {"deleted 3"}
        finally:
            await far.close()
            await near.close()


async def test_through_pgbouncer_in_transaction_mode_a_process_refuses_to_start_and_says_why(
        pg_url: str) -> None:
    with pgbouncer(pg_url, "transaction") as pooled:
        db = PostgresDatabase(pooled, max_size=2, stall_s=5)
        db.listen_answer_s = 1.0
        db.listen_wait_s = 0.5  # for the connection: its check (two answers' time) comes on top
        with pytest.raises(StorageError) as refused:
            await db.open()
        said = str(refused.value)
        assert "a pooler in transaction mode? Use a direct or session-mode URL" in said
        assert urlsplit(pooled).netloc.split("@")[-1] in said  # which database: host and port
        assert not db.opened


async def test_through_pgbouncer_in_transaction_mode_with_a_listen_url_a_process_works_and_leaves_nothing_behind(
        pg_url: str) -> None:
    with pgbouncer(pg_url, "transaction", server_pool=2) as pooled:  # six clients share two server connections
        far = PostgresDatabase(pooled, max_size=3, stall_s=7.5, listen_url=pg_url)
        other = PostgresDatabase(pooled, max_size=3, listen_url=pg_url)  # another process on the pooler
        far.listen_check_s, far.listen_answer_s = 0.2, 8.0  # (3 s: a loaded CI run replaced it, losing a notice)
        heard: list[str] = []
        far.subscribe("reminders", heard.append)
        await far.open()
        await other.open()
        try:
            await has_its_settings(far)
            await far.run(lambda tx: tx.execute("CREATE TABLE n (v INTEGER)"))

            def add(v: int) -> int:  # the same statements again and again, on connections that move
                def unit(tx: Any) -> int:
                    tx.execute("INSERT INTO n (v) VALUES (?)", [v])
                    return int(tx.execute("SELECT count(*) FROM n WHERE v <= ?", [v]).fetchone()[0])
                return unit

            results = await asyncio.gather(*(db.transaction(add(i)) for i in range(100) for db in (far, other)))
            assert len(results) == 200 and await far.run(lambda tx: tx.query("SELECT count(*) AS c FROM n")) == [
                {"c": 200}]
            # The server connections PgBouncer hands to anyone else carry no setting of qunbot's.
            with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as plain:
                for _ in range(20):
                    row = plain.execute("SELECT current_setting('synchronous_commit'), "
                                        "current_setting('idle_in_transaction_session_timeout')").fetchone()
                    assert row == ("on", "0")
            await asyncio.sleep(1)  # several checks of the LISTEN connection: it keeps hearing

            async def hears() -> bool:  # sent through the pooler; again if a loaded run replaced the LISTEN
                if not heard:  # connection meanwhile (what it missed then is re-read by design: a gap)
                    await other.transaction(lambda tx: tx.notify("reminders", "deleted 3"))
                    await asyncio.sleep(0.5)
                return bool(heard)

            await eventually(hears, timeout=20)
            assert set(heard) == {"deleted 3"}
        finally:
            await far.close()
            await other.close()


async def test_a_listen_url_naming_another_database_is_refused(pg_url: str, pg_cluster: Any) -> None:
    with pgbouncer(pg_url, "transaction") as pooled:
        elsewhere = pg_cluster.create_database()
        db = PostgresDatabase(pooled, max_size=2, listen_url=elsewhere)
        db.listen_answer_s, db.listen_wait_s = 1.0, 0.5
        with pytest.raises(StorageError, match="does \\[storage\\] listen_url name the same database as url") as got:
            await db.open()
        assert f"(LISTEN on {elsewhere})" in str(got.value)  # which connection it was
        assert not db.opened
