"""What every store sees of the database: a transaction (:class:`Tx`) and an engine to run one.

Stores write plain SQL with ``?`` placeholders in the dialect both engines speak (``INSERT ... ON
CONFLICT``, ``RETURNING``, ``COALESCE``); where the two differ a store asks ``tx.dialect``. Work is
a synchronous function of a :class:`Tx`, run by the engine off the event loop: SQLite on its one
writer thread (commits grouped), PostgreSQL on a pool of connections.

Schema changes are versioned per component (``history``, ``reminders``, a plugin's name...): the
engine applies the steps a database has not seen, in order, at open, and refuses a database whose
version for a component is newer than the code.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from function_calls.problems import mend_text

__all__ = ["CommitUnknown", "Cursor", "Dialect", "Engine", "Listener", "Step", "StorageError", "Tx", "as_stored", "iso",
           "mend_params", "mend_rows", "parse_iso", "ticks", "unit_error", "utcnow"]

T = TypeVar("T")
E = TypeVar("E")
Dialect = Literal["sqlite", "postgresql"]
log = logging.getLogger(__name__)


def as_stored(text: str) -> str:
    """``text`` as every engine stores it: NUL (which PostgreSQL's text cannot hold) as U+FFFD, a lone
    surrogate mended. What is signed before it is stored (a snapshot's MAC) must be signed so."""
    return mend_text(text.replace("\x00", "\ufffd") if "\x00" in text else text)


def mend_params(params: Sequence[Any]) -> tuple[Any, ...]:
    """Parameters with every text (also inside a list) passed through :func:`mend_text`."""
    return tuple(mend_text(p) if isinstance(p, str) else list(mend_params(p)) if isinstance(p, list) else p
                 for p in params)


def mend_rows(rows: Sequence[Sequence[Any]]) -> Sequence[Sequence[Any]]:
    """Rows of scalars for ``executemany`` passed through :func:`mend_params`, checked in one pass:
    rows whose texts UTF-8 can carry (nearly every batch) come back as they are, not copied. (A
    list inside is not looked into: SQLite cannot bind one anyway.)"""
    try:  # a surrogate never pairs up across strings: each still fails alone
        "".join(map(str, itertools.chain.from_iterable(rows))).encode("utf-8")
    except UnicodeEncodeError:
        return [mend_params(r) for r in rows]
    return rows


def unit_error(exc: BaseException) -> BaseException:
    """What a unit's caller is given for ``exc``: a StopIteration (a stray ``next()`` on an empty
    result) cannot be set on an asyncio future, and the caller would wait for ever; it becomes a
    RuntimeError caused by it."""
    if isinstance(exc, StopIteration):
        error = RuntimeError("a unit of work raised StopIteration (next() on an exhausted iterator?)")
        error.__cause__ = exc
        return error
    return exc


def utcnow() -> datetime:
    return datetime.now(UTC)


def ticks() -> float:
    """Seconds on a clock nobody sets that counts on through a system suspend (Linux's boot time;
    the monotonic clock elsewhere): for "how long since", where the wall clock may be stepped."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _BOOTTIME else time.monotonic()


_BOOTTIME = hasattr(time, "CLOCK_BOOTTIME")


def iso(moment: datetime) -> str:
    """Aware datetime -> sortable UTC text (microseconds kept). Naive input is a bug."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    """:func:`iso`'s text back to an aware UTC datetime; any other shape is a ``ValueError``."""
    # fromisoformat is ~50x faster than strptime: history windows parse thousands of these a second.
    if len(text) != 27 or text[10] != "T" or text[19] != "." or text[-1] != "Z":
        raise ValueError(f"not a stored timestamp: {text!r}")
    return datetime.fromisoformat(text)


class StorageError(OSError):
    """The database cannot be opened or used as it stands (unreachable, read-only, newer than this
    code): the message names the database (never its password) and the cause, for one line at start."""


class CommitUnknown(StorageError):
    """The connection failed while a unit committed: the unit may have been applied or not. Any
    other error from a unit means it was not applied, so only this one forbids a blind retry."""


class Cursor(Protocol):
    """The part of a DB-API cursor the stores use."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx(Protocol):
    """One transaction (or, for :meth:`Engine.run`, one unit of work that commits as a whole).

    A unit of work must be a pure function of the database: an engine may run it again after
    rolling an earlier run back (SQLite re-runs a group in which a unit failed after writing,
    PostgreSQL a unit that hit a serialization failure). Python side effects belong after the
    ``await``, not inside the unit.
    """

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement with ``?`` placeholders."""
        ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts."""
        ...

    def execute_returning_dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Alias of :meth:`query` (the name sqlite-utils gives it)."""
        ...

    def notify(self, channel: str, payload: str) -> None:
        """Tell every process's listeners of ``channel`` after this transaction commits."""
        ...


Step = str | Callable[[Tx], object]
"""A migration step: SQL (``{id}``, ``{real}``, ``{blob}`` become the dialect's types) or a function."""

Listener = Callable[[str], Awaitable[None] | None]

_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL", "blob": "BLOB"},
    "postgresql": {"id": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "real": "DOUBLE PRECISION",
                   "blob": "BYTEA"},
}


def padded(rows: Sequence[T], most: int) -> list[T]:
    """``rows`` (at most ``most``) padded to a power of two with repeats of the last one, for an INSERT
    whose repeated row is a no-op (``ON CONFLICT … DO NOTHING``): a few statement shapes serve every
    count, so the engines' statement caches keep the hot path's statements."""
    out = list(rows)
    return out + out[-1:] * (min(most, 1 << (len(out) - 1).bit_length()) - len(out))


def unnest(*types: str) -> str:
    """``unnest(?::text[], …)``: many rows for PostgreSQL as one array per column
    (:func:`columns`). The statement stays short whatever their number: psycopg parses a statement
    of more than 50 parameters again at every call, a third of a firing pass's time on the client."""
    return "unnest(" + ", ".join(f"?::{t}[]" for t in types) + ")"


def columns(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """``rows`` as one list per column (the parameters of :func:`unnest`)."""
    return [list(column) for column in zip(*rows, strict=True)]


def in_chunks(values: Sequence[Any], size: int = 500) -> Iterator[tuple[list[Any], str]]:
    """``values`` ``size`` at a time, each part with its ``?`` marks for ``IN (...)``: SQLite bounds
    a statement's parameters, and a burst or a /forget may touch thousands of rows."""
    for start in range(0, len(values), size):
        part = list(values[start:start + size])
        yield part, ",".join("?" * len(part))


def render_step(sql: str, dialect: Dialect) -> str:
    """A migration's SQL with ``{id}``/``{real}``/``{blob}`` written in ``dialect``."""
    out = sql
    for name, value in _TYPES[dialect].items():
        out = out.replace("{" + name + "}", value)
    return out


class Engine:
    """An open-able database: run work, apply migrations, carry notifications between processes."""

    dialect: Dialect
    where: str  # the database for messages (a file path, or host/dbname: never a password)
    #: Run every unit of work twice, the first run rolled back (tests: ``pytest --rehearse-units``).
    #: Both engines may run a unit again (SQLite re-runs a group one of whose units failed after
    #: writing, PostgreSQL retries a serialization failure), so a unit must be a pure function of
    #: the database; with this on, a Python side effect of a unit shows as a doubled outcome.
    rehearse: bool = False
    #: Whether a commit survives a crash of the database's own process without ``durable``: SQLite's
    #: does (its log is written at the commit, synced later); PostgreSQL's, made without waiting for
    #: the log's flush, may be lost with the server's last fraction of a second. A unit whose loss
    #: nothing would redo (a reply queued for a message handled once) passes ``durable`` when False.
    crash_safe: bool = True

    def __init__(self) -> None:
        self._migrations: dict[str, list[Step]] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._gap_listeners: list[Callable[[], Awaitable[None] | None]] = []
        self._outdated_listeners: list[Callable[[str], Awaitable[None] | None]] = []
        #: Why this process must stop, once another one upgraded the schema past this code (else "").
        self.outdated = ""
        self.opened = False
        self.reading = False  #: opened by :meth:`open_to_read`: for reads alone
        #: This machine's clock, and the database's minus it (PostgreSQL measures it at open and every
        #: few minutes; an SQLite file is used from one machine).
        self.local: Callable[[], datetime] = utcnow
        self.skew = timedelta(0)

    def now(self) -> datetime:
        """The time every process sharing the database agrees on: this machine's clock corrected by
        :attr:`skew`. Leases, claims and due times compare instants written by several machines, and
        one machine's clock running ahead would take a living process's accounts."""
        return self.local() + self.skew

    # -- migrations ----------------------------------------------------------------------------

    def migrate(self, component: str, steps: Sequence[Step]) -> None:
        """Register ``component``'s schema, version ``len(steps)``, applied at :meth:`open` (constructors)."""
        if component in self._migrations and list(self._migrations[component]) != list(steps):
            raise ValueError(f"two different schemas registered for {component!r}")
        self._migrations[component] = list(steps)

    def schemas(self) -> dict[str, int]:
        """Each registered component's schema version (what this code knows)."""
        return {component: len(steps) for component, steps in self._migrations.items()}

    async def ensure(self, component: str, steps: Sequence[Step]) -> None:
        """Register a schema and, if the database is already open, bring it up to date now (plugins)."""
        self.migrate(component, steps)
        if self.opened:
            await self._apply({component: list(steps)})

    def _upgrade(self, tx: Tx, component: str, steps: list[Step]) -> bool:
        """Bring ``component`` up to ``steps``; whether anything changed."""
        row = tx.execute("SELECT version FROM schema_version WHERE component = ?", [component]).fetchone()
        have = int(row[0]) if row else 0
        if have > len(steps):
            raise StorageError(
                f"the database {self.where} holds {component!r} at schema version {have}, newer than this "
                f"qunbot knows ({len(steps)}): upgrade qunbot (or restore a backup) before starting it")
        for number, step in enumerate(steps[have:], start=have + 1):
            if isinstance(step, str):
                for statement in render_step(step, self.dialect).split(";"):
                    if statement.strip():
                        tx.execute(statement)
            else:
                step(tx)
            log.debug("storage: %s schema %s -> %d", self.where, component, number)
        if len(steps) > have:
            tx.execute("INSERT INTO schema_version (component, version) VALUES (?, ?) ON CONFLICT (component) "
                       "DO UPDATE SET version = excluded.version", [component, len(steps)])
        return len(steps) > have

    def when_outdated(self, listener: Callable[[str], Awaitable[None] | None]) -> None:
        """Call ``listener(why)`` once another process has upgraded the database's schema past what
        this code knows (PostgreSQL: processes share it): this one should stop, and be restarted on
        the new version, rather than go on writing rows the new schema may no longer mean."""
        self._outdated_listeners.append(listener)

    def _newer(self, versions: Iterable[tuple[object, object]]) -> None:
        """Given the database's (component, version) rows: if one is past this code's, say so, once."""
        for component, version in versions:
            known = self._migrations.get(str(component))
            if self.outdated or known is None or int(str(version)) <= len(known):
                continue
            self.outdated = (f"another process upgraded the database {self.where}: {str(component)!r} is at "
                             f"schema version {version}, newer than this qunbot knows ({len(known)}); restart "
                             "this process on the new version")
            log.error("storage: %s", self.outdated)
            for listener in list(self._outdated_listeners):
                _call("a listener of schema upgrades", listener, self.outdated)

    async def _apply(self, migrations: dict[str, list[Step]]) -> None:
        raise NotImplementedError

    # -- work ----------------------------------------------------------------------------------

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def open_to_read(self) -> None:
        """Open for :meth:`read` alone (``qunbot doctor``, ``qunbot pending``): apply no migration (even
        one registered), create nothing, write nothing, wait for no writer."""
        self.reading = True
        await self.open()

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn(tx)``, which only reads, without waiting for any writer: SQLite's units otherwise
        open with the write lock (another program's write transaction holds them up). PostgreSQL's
        reads never wait for writers: this is :meth:`run` in a read-only transaction."""
        return await self.run(fn)

    async def read_present(self, fn: Callable[[Tx], T], empty: E) -> T | E:
        """:meth:`read`, or ``empty`` when the table ``fn`` reads does not exist (a database no bot has used)."""
        try:
            return await self.read(fn)
        except StorageError:
            raise
        except Exception as exc:
            if "no such table" in str(exc) or "does not exist" in str(exc):
                return empty
            raise

    def hold_ordinary(self, until: float | None) -> None:
        """Start no unit that is not urgent before ``until`` (``time.monotonic()``; None: start them
        again), while a burst of sends goes out. PostgreSQL's threads wait (robot/storage/lanes.py);
        SQLite's writer, which opens each group with the urgent units, goes on as it is."""

    async def run(self, fn: Callable[[Tx], T], *, urgent: bool = False) -> T:
        """Run ``fn(tx)`` off the event loop; its statements commit together when it returns.

        ``urgent``: work whose lateness people see (reminders firing, the outbox sending) goes
        ahead of the other work queued (a burst of messages). On PostgreSQL the pool's threads take
        urgent units before any other queued unit (none is kept idle for them: robot/storage/lanes.py);
        SQLite's writer opens its next group with the urgent units, ahead of the rest of its queue,
        so there one waits for the group under way and its own group.
        """
        raise NotImplementedError

    async def transaction(self, fn: Callable[[Tx], T], *, durable: bool = False, urgent: bool = False) -> T:
        """Run ``fn(tx)`` atomically. ``durable``: on disk before this returns (rows a user is told
        about); ``urgent``: as for :meth:`run`."""
        raise NotImplementedError

    async def run_ahead(self, fn: Callable[[Tx], T]) -> T:
        """:meth:`run`, not delayed by the work queued before it (lease renewals: a burst of messages
        must not make a process give its accounts up). SQLite's writer takes all the queued work in
        a few groups and nobody else can take a lease there, so this is :meth:`run`."""
        return await self.run(fn)

    def run_sync(self, fn: Callable[[Tx], T]) -> T:
        """Blocking variant for the CLI and start-up code, never for async code paths."""
        raise NotImplementedError

    def stalled_s(self) -> float:
        """Seconds the process's work has waited with no unit finishing (0 with none waiting): a pool
        whose connections went silent. Lease renewals, which :meth:`run_ahead` keeps apart, stop then."""
        return 0.0

    async def checkpoint(self) -> None:
        """Leave no old copy of deleted rows in logs the engine keeps (after a forget)."""

    # -- notifications ---------------------------------------------------------------------------

    def subscribe(self, channel: str, listener: Listener) -> None:
        """Call ``listener(payload)`` for every :meth:`Tx.notify` on ``channel``, from any process."""
        self._listeners.setdefault(channel, []).append(listener)

    def after_gap(self, listener: Callable[[], Awaitable[None] | None]) -> None:
        """Call ``listener()`` when notifications from other processes may have been missed: PostgreSQL's
        LISTEN connection was lost and is back (a server restart, a network cut). What was said
        meanwhile is gone, so re-read what it would have told (a cache dropped, a timer re-armed).
        Notifications on SQLite stay in the process and are never missed."""
        self._gap_listeners.append(listener)

    def _deliver(self, channel: str, payload: str) -> None:
        for listener in list(self._listeners.get(channel, ())):
            _call(f"a listener of {channel}", listener, payload)

    def _gap(self) -> None:
        for listener in list(self._gap_listeners):
            _call("a listener of missed notifications", listener)


def _call(what: str, listener: Callable[..., Awaitable[None] | None], *args: str) -> None:
    try:
        result = listener(*args)
        if result is not None:
            task = asyncio.ensure_future(result)
            task.add_done_callback(_log_failure)
    except Exception:
        log.exception("storage: %s failed", what)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("storage: a listener failed", exc_info=task.exception())


SCHEMA_TABLE = ("CREATE TABLE IF NOT EXISTS schema_version (component TEXT PRIMARY KEY, "
                "version INTEGER NOT NULL)")
