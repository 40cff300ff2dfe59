"""Outbox claims on both engines: one process sends a row; a dead or expired claim is free again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from robot.doctor_storage import waiting_sync
from robot.history import HistoryStore
from robot.message import ChatRef, OutgoingMessage
from robot.outbox import Outbox
from robot.outbox_claims import Scope, claim_many_sync, claim_sync, release_sync
from robot.storage import Engine, Tx, iso
from robot.storage.leases import Leases

NOW = datetime.now(UTC)
ALL = Scope()
G1 = ChatRef(platform="telegram", chat_id="g1", kind="group", account="111")


async def setup(engine: Engine) -> tuple[Outbox, Leases, Leases]:
    HistoryStore(engine)
    outbox = Outbox(engine)
    a, b = Leases(engine, ttl_s=30, holder="A"), Leases(engine, ttl_s=30, holder="B")
    await engine.open()
    assert await a.acquire("process:A") and await b.acquire("process:B")
    return outbox, a, b


async def claim(engine: Engine, leases: Leases, scope: Scope = ALL, until_s: float = 60) -> tuple[list[str], bool]:
    rows, blocked = await engine.run(lambda tx: claim_sync(
        tx, "telegram", G1.key, scope, leases.holder, iso(NOW), iso(NOW + timedelta(seconds=until_s)),
        leases.alive_sync))
    return [str(r["key"]) for r in rows], blocked


async def test_a_living_processs_claim_holds_and_a_dead_ones_is_taken_over(engine: Engine) -> None:
    outbox, a, b = await setup(engine)
    try:
        await outbox.enqueue(*(OutgoingMessage(key=f"k{i}", chat=G1, text=f"#{i}") for i in range(3)))
        assert await claim(engine, a) == (["k0", "k1", "k2"], False)
        if engine.dialect == "postgresql":  # A is alive: B waits, and the chat's order with it
            assert await claim(engine, b) == ([], True)

            def a_dies(tx: Tx) -> None:
                tx.execute("UPDATE leases SET expires_at = ? WHERE name = 'process:A'", [iso(NOW - timedelta(1))])

            await engine.run(a_dies)
        # On SQLite another holder is this process's dead predecessor: free at once.
        assert await claim(engine, b) == (["k0", "k1", "k2"], False)
        assert {r["claimed_by"] for r in await outbox.rows()} == {"B"}
        # An expired claim is free even though its holder lives.
        assert await claim(engine, b, until_s=-1) == (["k0", "k1", "k2"], False)
        assert (await claim(engine, a))[0] == ["k0", "k1", "k2"]
        # Given up claims are anyone's at once.
        assert await engine.run(lambda tx: release_sync(tx, "A")) == 3
        assert {r["claimed_by"] for r in await outbox.rows()} == {None}
    finally:
        await engine.close()


async def test_claims_of_several_chats_in_one_transaction_answer_each_chat(engine: Engine) -> None:
    outbox, a, _ = await setup(engine)
    try:
        g2 = G1.model_copy(update={"chat_id": "g2"})
        await outbox.enqueue(OutgoingMessage(key="one", chat=G1, text="1"), OutgoingMessage(key="two", chat=g2, text="2"))
        now, until = iso(NOW), iso(NOW + timedelta(seconds=60))
        items = [("telegram", chat.key, ALL, now, until) for chat in (g2, G1, g2)]  # not in lock order
        got = await engine.run(lambda tx: claim_many_sync(tx, items, a.holder, a.alive_sync))
        assert [([str(r["key"]) for r in rows], blocked) for rows, blocked in got] == [
            (["two"], False), (["one"], False), (["two"], False)]
    finally:
        await engine.close()


async def test_claims_of_several_chats_keep_each_chats_order_limit_and_holder(engine: Engine) -> None:
    outbox, a, b = await setup(engine)
    try:
        g2, g3 = G1.model_copy(update={"chat_id": "g2"}), G1.model_copy(update={"chat_id": "g3"})
        await outbox.enqueue(*(OutgoingMessage(key=f"a{i:02d}", chat=G1, text="x") for i in range(40)),
                             OutgoingMessage(key="b0", chat=g2, text="x"), OutgoingMessage(key="b1", chat=g2, text="x"))
        now, until = iso(NOW), iso(NOW + timedelta(seconds=60))

        def claims(leases: Leases, *chats: ChatRef) -> Callable[[Tx], list[tuple[list[str], bool]]]:
            items = [("telegram", chat.key, ALL, now, until) for chat in chats]
            return lambda tx: [([str(r["key"]) for r in rows], blocked)
                               for rows, blocked in claim_many_sync(tx, items, leases.holder, leases.alive_sync)]

        first = [f"a{i:02d}" for i in range(32)]  # at most CLAIM_LIMIT of a chat, oldest first
        assert await engine.run(claims(a, G1, g2, g3)) == [(first, False), (["b0", "b1"], False), ([], False)]
        if engine.dialect == "postgresql":  # A lives: B waits on both chats
            assert await engine.run(claims(b, g2, G1)) == [([], True), ([], True)]
        assert await engine.run(claims(a, g3, G1)) == [([], False), (first, False)]  # its own claims hold it not
    finally:
        await engine.close()


async def test_a_process_claims_only_the_accounts_it_holds(engine: Engine) -> None:
    outbox, a, _ = await setup(engine)
    try:
        other = G1.model_copy(update={"account": "222"})
        nobody = G1.model_copy(update={"account": ""})
        await outbox.enqueue(OutgoingMessage(key="mine", chat=G1, text="1"),
                             OutgoingMessage(key="theirs", chat=other, text="2"),
                             OutgoingMessage(key="unnamed", chat=nobody, text="3"))
        assert await claim(engine, a, Scope(("111",))) == (["mine"], False)
        assert await claim(engine, a, Scope(("111",), empty=True)) == (["mine", "unnamed"], False)
        assert await claim(engine, a, Scope(())) == ([], False)
        # Nobody holds account 222: its row waits, and is reported; 111 is held.
        waiting = await engine.run(lambda tx: waiting_sync(tx, ["telegram"], ["account:telegram:111"]))
        assert [(w["platform"], w["account"], w["n"]) for w in waiting] == [("telegram", "222", 1)]
        waiting = await engine.run(lambda tx: waiting_sync(tx, ["telegram"], []))
        assert [(w["account"], w["n"]) for w in waiting] == [("", 1), ("111", 1), ("222", 1)]
    finally:
        await engine.close()


async def test_a_start_keeps_the_wait_of_rows_another_living_process_sends(engine: Engine) -> None:
    """A starting process does not inherit its last run's backoff; the rows of an account another living
    process holds keep theirs (a platform's flood wait among them: sent at once, it is broken)."""
    from robot.storage.leases import LeaseKeeper

    outbox, a, b = await setup(engine)
    starting = Outbox(engine, leases=LeaseKeeper(a))
    try:
        assert await b.acquire("account:telegram:111")
        theirs, nobodys = G1, G1.model_copy(update={"account": "222"})
        await outbox.enqueue(OutgoingMessage(key="theirs", chat=theirs, text="1"),
                             OutgoingMessage(key="nobodys", chat=nobodys, text="2"))
        later = iso(datetime.now(UTC) + timedelta(minutes=5))
        await engine.run(lambda tx: tx.execute("UPDATE outbox SET next_at = ?", [later]))
        await starting.start()
        due = {str(r["key"]): str(r["next_at"]) < later for r in await outbox.rows()}
        # On SQLite another holder is this process's dead predecessor: no wait is kept.
        assert due == {"theirs": engine.dialect == "sqlite", "nobodys": True}
    finally:
        await starting.stop(0)
        await engine.close()
