"""The PostgreSQL engine: many qunbot processes, one database.

psycopg 3 with a connection pool. A store's unit of work is the same synchronous function of a
:class:`~robot.storage.base.Tx` that runs on SQLite, so both engines run one code path; here it
runs on a worker thread holding a pooled connection, inside one transaction, and the event loop
never waits on the network. Notifications (``tx.notify``) travel with ``pg_notify`` and reach
every process through one async ``LISTEN`` connection that is checked and reconnects by itself
(:mod:`robot.storage.pgnet`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, TypeVar

from robot.storage.base import (
    SCHEMA_TABLE,
    CommitUnknown,
    Dialect,
    Engine,
    Step,
    StorageError,
    ticks,
    unit_error,
)
from robot.storage.lanes import Lanes
from robot.storage.pgnet import Listener, Pooled, shut, tcp_settings
from robot.storage.pgtx import PostgresTx, read_only

__all__ = ["PostgresDatabase", "PostgresTx", "redact_dsn"]

T = TypeVar("T")
log = logging.getLogger(__name__)
_RETRIES = 5
_SKEW_WARN = timedelta(seconds=2)
_SKEW_EVERY_S = 300.0  # clocks drift by parts per million: a measure every few minutes is plenty
_MIGRATION_LOCK = 7_362_514_001  # pg_advisory_xact_lock key: one process migrates at a time
_SCHEMA = "schema"  # notification: a process upgraded the schema (the others check it is not past theirs)


def redact_dsn(text: str, url: str = "") -> str:
    """``text`` (a URL, or an error quoting one) with passwords replaced, for logs and errors; with
    ``url``, its password (and the pieces of it around an ``@``, which libpq quotes as a host name)
    wherever the text repeats them (libpq quotes a bad percent-escape, too)."""
    for source in {url, text} - {""}:
        found = re.search(r"://[^:/@\s]*:(\S*)@", source)  # the password runs to the last @ (a "/" in it too)
        param = re.search(r"password=([^&\s]*)", source, flags=re.IGNORECASE)
        secrets = [m.group(1) for m in (found, param) if m]
        for piece in sorted({p for secret in secrets for p in (secret, *secret.split("@"))}, key=len, reverse=True):
            if len(piece) >= 3:
                text = text.replace(piece, "***")
    text = re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", text)
    return re.sub(r"(password=)[^&\s]*", r"\1***", text, flags=re.IGNORECASE)


class _Rehearsed(Exception):
    """The first run of a unit under :attr:`~robot.storage.base.Engine.rehearse`: roll it back."""


class PostgresDatabase(Engine):
    """A PostgreSQL database (``postgresql://user:pass@host/db``) shared by any number of processes."""

    dialect: Dialect = "postgresql"
    crash_safe = False  # synchronous_commit is off but for durable units (see open())

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, stall_s: float | None = None,
                 listen_url: str | None = None) -> None:
        """``stall_s``: the server ends a transaction of this process's that stays idle this long.
        ``listen_url``: the same database without a pooler in transaction mode, for ``LISTEN``; with
        it, ``url`` may go through one (no session setting, no prepared statement is left on it)."""
        super().__init__()
        self.url = url
        self.where = redact_dsn(url)
        self.listen_url = listen_url or url  #: the LISTEN connection's
        self.listen_where = redact_dsn(self.listen_url)
        #: ``url`` may go through a pooler in transaction mode: every setting is made per transaction.
        self.pooled = self.listen_url != url
        self.min_size, self.max_size = min_size, max_size
        self.stall_s = stall_s
        self.wait_s = 30.0  #: how long a unit waits for a connection while the server cannot be reached
        self.listen_retry_s = 0.5  #: first wait before the LISTEN connection is tried again (doubling, up to 10 s)
        self.listen_wait_s = 10.0  #: how long open() waits for it (the bot starts without it after that)
        self.listen_check_s = 30.0  #: how often the LISTEN connection is checked (a notification sent to it)
        self.listen_answer_s = 10.0  #: and how long that may take before the connection is replaced
        self.tcp: dict[str, Any] = {}  #: the TCP keepalive settings the URL leaves to qunbot (pgnet.TCP)
        self.listen_tcp: dict[str, Any] = {}  #: and those listen_url leaves
        self._settings: list[tuple[str, str]] = []  # set on every connection (configure)
        self._pool: Any = None
        self._threads: Lanes | None = None
        self.listener = Listener(self, self._deliver, self._gap, self._error)
        self.subscribe(_SCHEMA, self._recheck_schema)
        self.after_gap(self._recheck_schema)
        self._clock_watch: asyncio.Task[None] | None = None
        self._anchor: tuple[datetime, float] | None = None  # the server's time at the last measure, and its tick
        self._busy: set[Any] = set()  # connections a unit is using now: see close()
        self._session: dict[str, Any] = {}  # every connection's settings: the pool's and run_ahead's alike
        self._ahead: concurrent.futures.ThreadPoolExecutor | None = None  # run_ahead's thread, and its
        self._own: Any = None  # connection: outside the pool, which a backlog of units may fill
        self._inflight = 0  # units awaited now
        self._progress = 0.0  # ticks() when one last finished (or was queued with none in flight)

    def _error(self, exc: BaseException) -> StorageError:
        # psycopg's messages may quote the DSN: show ours, redacted, and the server's reason only.
        reason = redact_dsn(str(exc), self.url).splitlines()[0] if str(exc) else type(exc).__name__
        return StorageError(f"cannot use the database {self.where}: {reason}")

    async def open(self) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StorageError("[storage] url names PostgreSQL, but psycopg is not installed: "
                               "pip install 'qunbot[postgresql]'") from exc
        self._threads = Lanes(self.max_size, "qunbot-pg")  # urgent units first (robot/storage/lanes.py)
        self._ahead = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qunbot-pg-ahead")
        # Like SQLite's synchronous=NORMAL, a unit's commit does not wait for the WAL flush: a
        # server crash may drop the last milliseconds of such commits, never corrupt or half-apply
        # them. A durable unit (rows a user is told about) turns it back on for itself.
        self._settings = [("synchronous_commit", "off")]
        if self.stall_s is not None:
            # A unit never waits inside its transaction, so one left idle is a frozen or cut-off
            # process's: the server ends it, and its row locks (a budget, a reminder, a lease) with
            # it, instead of holding every other process up until TCP notices, hours later.
            idle_ms = max(1, round(self.stall_s * 1000))
            self._settings.append(("idle_in_transaction_session_timeout", str(idle_ms)))
        try:
            from psycopg.conninfo import conninfo_to_dict

            self.tcp = tcp_settings(conninfo_to_dict(self.url))
            self.listen_tcp = tcp_settings(conninfo_to_dict(self.listen_url))
        except psycopg.Error as exc:
            raise self._error(exc) from None  # (its cause may quote the password: a traceback would show it)
        # Set once connected, not as the startup packet's options: PgBouncer refuses those. Through a
        # pooler in transaction mode each transaction may run on another server connection, which
        # other clients share: settings are made per transaction (SET LOCAL) and nothing is prepared.
        self._session = {"autocommit": True, **self.tcp, **({"prepare_threshold": None} if self.pooled else {})}
        self._pool = ConnectionPool(self.url, min_size=self.min_size, max_size=self.max_size, open=False,
                                    name="qunbot", reconnect_timeout=60, timeout=self.wait_s, kwargs=self._session,
                                    configure=None if self.pooled else self._configure)
        try:
            # One plain connection first: a wrong host or password (or a pooler refusing a
            # setting) fails now, with the server's reason, not as a pool that never fills.
            await self._call(self._try_connect)
            await self._call(lambda: self._pool.open(wait=True, timeout=15))
            if not self.reading:  # (open_to_read: not even schema_version is created)
                await self._apply(dict(self._migrations))
            await self._check_clock()
        except StorageError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise self._error(exc) from None  # (its cause may quote the password: a traceback would show it)
        try:
            await self.listener.start(self.listen_wait_s)
        except Pooled as exc:
            await self.close()
            raise StorageError(f"cannot use the database {self.where} for several processes (LISTEN on "
                               f"{self.listen_where}): {redact_dsn(str(exc), self.listen_url)}") from None
        self.opened = True
        self._clock_watch = asyncio.create_task(self._watch_clock(), name="qunbot-pg-clock")

    def _configure(self, conn: Any, *, local: bool = False, durable: bool = False) -> None:
        """The session's settings, on a new connection (the pool's, run_ahead's); ``local``: for this
        transaction alone (:attr:`pooled`), with synchronous_commit on if ``durable``."""
        pairs = [(k, "on" if durable and k == "synchronous_commit" else v) for k, v in self._settings]
        conn.execute("SELECT " + ", ".join(f"set_config(%s, %s, {'true' if local else 'false'})" for _ in pairs),
                     [v for pair in pairs for v in pair])

    def _try_connect(self) -> None:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=10, **self._session) as conn:
            self._configure(conn, local=self.pooled)

    async def _call(self, fn: Callable[[], T], urgent: bool = False) -> T:
        assert self._threads is not None
        if not self._inflight:
            self._progress = ticks()
        self._inflight += 1
        try:
            return await asyncio.wrap_future(self._threads.submit(fn, urgent=urgent))
        finally:
            self._inflight -= 1
            self._progress = ticks()

    def hold_ordinary(self, until: float | None) -> None:
        if until is None:  # units held back were not stalled: the stall clock starts again now
            self._progress = ticks()
        if self._threads is not None:
            self._threads.hold(until)

    def stalled_s(self) -> float:
        if self._threads is not None and self._threads.holding():
            return 0.0  # (the leases trust this: a burst's window must not look like a dead database)
        return ticks() - self._progress if self._inflight else 0.0

    def _work(self, fn: Callable[[PostgresTx], T], durable: bool, ahead: bool = False) -> T:
        import psycopg
        from psycopg_pool import PoolTimeout

        rehearsing = self.rehearse
        last = _RETRIES - 1 + rehearsing
        # Every pooled connection may be one the server dropped (a restart, a failover): each is tried
        # and discarded, beyond the retries a conflict gets (5 dead of 8 failed a unit, the server up).
        dropped = conflicts = 0
        while True:
            started, committing, pool = False, False, self._pool
            if pool is None:  # closed meanwhile (a unit retried after its connection was cut)
                raise StorageError(f"the database {self.where} is closed")
            try:
                with (self._own_connection() if ahead else pool.connection()) as conn, self._using(conn), \
                        conn.transaction():
                    started = True
                    if self.pooled:
                        self._configure(conn, local=True, durable=durable)
                    elif durable:
                        conn.execute("SET LOCAL synchronous_commit TO ON")
                    tx = PostgresTx(conn)
                    result = fn(tx)
                    tx.flush()
                    if rehearsing:
                        raise _Rehearsed  # rolls the first run back: the unit runs again
                    committing = True
                    return result
            except _Rehearsed:
                rehearsing = False
            except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
                conflicts += 1
                if conflicts > last:
                    raise
                log.debug("storage: retrying a unit of work after a serialization failure")
            except PoolTimeout:
                raise  # it waited wait_s for the server already
            except psycopg.OperationalError as exc:
                # A pooled connection the server dropped (a restart, an idle timeout) fails at its
                # BEGIN, before the unit did anything: the pool discards it and another is tried.
                # Past BEGIN the error goes up; one during COMMIT leaves the outcome unknown.
                if committing:
                    raise CommitUnknown(f"the connection to {self.where} failed while committing") from exc
                dropped += 1
                if started or dropped > (1 if ahead else pool.max_size + 1):
                    raise
                log.info("storage: a pooled connection to %s was closed; retrying on another", self.where)

    @contextlib.contextmanager
    def _own_connection(self) -> Iterator[Any]:
        """:meth:`run_ahead`'s connection (its thread's alone): opened when needed, dropped when it fails."""
        import psycopg

        if self._own is None or self._own.closed:
            try:
                self._own = psycopg.connect(self.url, connect_timeout=10, **self._session)
                if not self.pooled:
                    self._configure(self._own)
            except psycopg.Error as exc:  # not retried: the next call tries again
                raise self._error(exc) from None  # (its cause may quote the password: a traceback would show it)
        try:
            yield self._own
        except psycopg.OperationalError:
            conn, self._own = self._own, None
            with contextlib.suppress(Exception):
                conn.close()
            raise

    @contextlib.contextmanager
    def _using(self, conn: Any) -> Iterator[None]:
        self._busy.add(conn)
        try:
            yield
        finally:
            self._busy.discard(conn)

    def _unit(self, fn: Callable[[PostgresTx], T], durable: bool, ahead: bool = False) -> T:
        try:
            return self._work(fn, durable, ahead)
        except StopIteration as exc:  # cannot cross into the caller's asyncio future
            raise unit_error(exc) from exc

    async def run(self, fn: Callable[[PostgresTx], T], *, urgent: bool = False) -> T:
        return await self._call(lambda: self._unit(fn, False), urgent)

    async def transaction(self, fn: Callable[[PostgresTx], T], *, durable: bool = False, urgent: bool = False) -> T:
        return await self._call(lambda: self._unit(fn, durable), urgent)

    async def run_ahead(self, fn: Callable[[PostgresTx], T]) -> T:
        """On a thread and a connection of its own: the units queued for the pool cannot delay it."""
        if self._ahead is None:
            raise StorageError(f"the database {self.where} is closed")
        work = asyncio.get_running_loop().run_in_executor(self._ahead, lambda: self._unit(fn, False, True))
        try:
            return await work
        except asyncio.CancelledError:
            # Given up on (a renewal the database left unanswered): its connection may stay silent for
            # as long as TCP waits, a quarter of an hour, and hold up every later call on this one thread.
            own = self._own
            if own is not None and own in self._busy:
                shut(own)
            raise

    async def read(self, fn: Callable[[PostgresTx], T]) -> T:
        """:meth:`run` in a read-only transaction: a read that would write fails instead."""
        return await self.run(lambda tx: read_only(tx, fn))

    def run_sync(self, fn: Callable[[PostgresTx], T]) -> T:
        return self._work(fn, True)

    async def _apply(self, migrations: dict[str, list[Step]]) -> None:
        def work(tx: PostgresTx) -> None:
            tx.execute("SELECT pg_advisory_xact_lock(?)", [_MIGRATION_LOCK])
            tx.execute(SCHEMA_TABLE)
            if any([self._upgrade(tx, component, steps) for component, steps in migrations.items()]):
                tx.notify(_SCHEMA, "upgraded")

        await self._call(lambda: self._work(work, True))

    async def _recheck_schema(self, _payload: str = "") -> None:
        if self.opened and not self.outdated:
            self._newer(await self.run(lambda tx: tx.execute("SELECT component, version FROM schema_version")
                                       .fetchall()))

    def now(self) -> datetime:
        """The server's time: as read last, plus this machine's :func:`ticks` since. A step of this
        machine's wall clock in between (NTP, someone setting it) changes nothing; "this clock plus
        the last skew" would be off by the step until the next reading: leases written early, or
        read as expired."""
        if self._anchor is None:
            return super().now()
        at, tick = self._anchor
        return at + timedelta(seconds=ticks() - tick)

    async def _check_clock(self) -> None:
        """Measure :attr:`skew` (the server's clock against the middle of the round trip) and anchor :meth:`now`."""
        def measure() -> tuple[timedelta, tuple[datetime, float] | None]:
            with self._pool.connection() as conn:
                before, first = self.local(), ticks()
                row = conn.execute("SELECT clock_timestamp()").fetchone()
                after, last = self.local(), ticks()
            if row is None:
                return timedelta(0), None
            return row[0] - (before + (after - before) / 2), (row[0], (first + last) / 2)

        skew, anchor = await self._call(measure)
        if anchor is not None:
            self._anchor = anchor
        if abs(skew) > _SKEW_WARN and abs(skew - self.skew) > _SKEW_WARN / 2:
            log.warning("storage: this machine's clock is %.1f s %s the database's; qunbot keeps time by the "
                        "database's (run NTP on every machine)", abs(skew.total_seconds()),
                        "behind" if skew > timedelta(0) else "ahead of")
        self.skew = skew

    async def _watch_clock(self) -> None:
        while True:
            await asyncio.sleep(_SKEW_EVERY_S)
            try:
                await self._check_clock()
            except Exception as exc:  # the database is away: the last measure stands
                log.debug("storage: could not read the database's clock (%s)", self._error(exc))

    async def close(self) -> None:
        await self.listener.stop()
        if self._clock_watch is not None:
            self._clock_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._clock_watch
        self._clock_watch = None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(pool.close)
            await self._cut_stuck()
        if self._threads is not None:
            self._threads.shutdown()
        if self._ahead is not None:
            self._ahead.shutdown(wait=False)
        self._threads = self._ahead = None
        if self._own is not None and self._own not in self._busy:  # else it was shut, and its thread closes it
            own, self._own = self._own, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(own.close)
        self.opened = False

    async def _cut_stuck(self, grace_s: float = 2.0) -> None:
        """Shut the connections units still wait on (a database that does not answer, the network to
        it silent) once the pool is closed: their threads end with an error instead of waiting until
        TCP gives up, up to a quarter of an hour (and run_ahead's thread, which Python waits for at exit)."""
        for _ in range(round(grace_s / 0.05)):  # units finishing normally first
            if not self._busy:
                return
            await asyncio.sleep(0.05)
        for conn in list(self._busy):
            log.warning("storage: %s does not answer; closing a connection a unit still waits on", self.where)
            shut(conn)
