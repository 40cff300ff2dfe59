"""Units the database refused, retried in order until written (robot.storage.pending)."""

from __future__ import annotations

import asyncio
from typing import Any

from robot.storage import Engine, Pending
from robot.storage.base import CommitUnknown


async def test_units_are_retried_in_order_and_an_idempotent_one_even_when_its_commit_was_unknown(
        engine: Engine) -> None:
    engine.migrate("t", ["CREATE TABLE IF NOT EXISTS t (n INTEGER, position INTEGER)"])
    await engine.open()
    pending = Pending(engine, first_s=0.01, max_s=0.02)
    # The retries: "one" is refused again, then written; "two" is cut while committing (and not
    # written), then written.
    real = engine.transaction
    failures: list[Exception | None] = [OSError("unreachable"), None, CommitUnknown("cut while committing")]

    async def flaky(fn: Any, *, durable: bool = False) -> Any:
        failure = failures.pop(0) if failures else None
        if failure is not None:
            raise failure
        return await real(fn, durable=durable)

    engine.transaction = flaky  # type: ignore[method-assign]
    try:
        def insert(n: int) -> Any:
            return lambda tx: tx.execute("INSERT INTO t SELECT ?, count(*) FROM t", [n])

        pending.add(insert(1), "one", OSError("unreachable"))
        pending.add(insert(2), "two", CommitUnknown("cut"), idempotent=True)  # (say, setting a flag)
        pending.add(insert(3), "three", CommitUnknown("cut"))  # may be written: never again
        assert len(pending) == 2
        for _ in range(500):
            if not pending:
                break
            await asyncio.sleep(0.01)
        assert not pending and not failures
        rows = await engine.run(lambda tx: [r[0] for r in tx.execute("SELECT n FROM t ORDER BY position").fetchall()])
        assert rows == [1, 2]
    finally:
        await pending.stop()
        await engine.close()
