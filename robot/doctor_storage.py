"""``qunbot doctor``'s storage lines: the engine, whether this data_dir's ``secret.key`` is the
database's, the live processes and their accounts, and the outbox rows waiting for an account that
no process holds.

It reads the database as it stands and writes nothing (no migration is applied), without waiting for
another program's writer: a table that is not there yet reads as empty. It fails a database ``qunbot
run`` would refuse: a component's schema newer than this qunbot's (its plugins' too), an SQLite file this
user cannot write, or one ``PRAGMA quick_check`` finds damaged. The URL is shown with its password
redacted, and errors too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from robot import secret_key
from robot.bot import Bot
from robot.channels.base import ACCOUNT_LEASE, CHANNEL_LEASE
from robot.config import Settings
from robot.outbox_store import LEASED_PLATFORMS, ONE_PROCESS_PLATFORMS
from robot.snapshots import SnapshotError, load_secret
from robot.storage import Engine, SQLiteDatabase, StorageError, Tx, iso
from robot.storage.leases import PROCESS_PREFIX
from robot.storage.postgres import redact_dsn

__all__ = ["Check", "reading", "storage_checks", "waiting_sync", "weixin_logins"]



class Check(NamedTuple):
    """One line of the report: ``ok``/``FAIL``, what, and the detail."""

    ok: bool
    what: str
    detail: str


def waiting_sync(tx: Tx, leased: Sequence[str], held: Sequence[str],
                 one_process: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Pending rows no running process can send, per platform and account: how many, since when.

    ``held``: the live lease names. Rows of the ``leased`` platforms wait when no process holds their
    account (``account:<platform>:<account>``); a row naming no account waits when no process holds
    any account of its platform. Rows of the ``one_process`` platforms wait when no process runs
    the channel (``channel:<platform>``).
    """
    platforms = [*leased, *one_process]
    if not platforms:
        return []
    marks = ", ".join("?" for _ in platforms)
    groups = tx.query(f"SELECT platform, account, count(*) AS n, min(created_at) AS oldest FROM outbox "
                      f"WHERE status = 'pending' AND platform IN ({marks}) GROUP BY platform, account "
                      "ORDER BY platform, account", platforms)
    names = set(held)
    serving = {name.split(":", 2)[1] for name in names if name.startswith("account:") and name.count(":") >= 2}
    return [g for g in groups
            if (CHANNEL_LEASE.format(platform=g["platform"]) not in names if g["platform"] in one_process
                else ACCOUNT_LEASE.format(platform=g["platform"], account=g["account"]) not in names if g["account"]
                else g["platform"] not in serving)]


async def storage_checks(settings: Settings, now: datetime | None = None, *,
                         known: dict[str, int] | None = None) -> list[Check]:
    """The storage engine, each live process with the accounts it holds, and the rows no process can send.
    ``known``: each component's schema version this qunbot knows, when a scratch bot already said (else one
    is set up here)."""
    async with reading(settings, now, known=known) as (checks, _):
        return checks


@contextlib.asynccontextmanager
async def reading(settings: Settings, now: datetime | None = None, *,
                  known: dict[str, int] | None = None) -> AsyncIterator[tuple[list[Check], Engine | None]]:
    """:func:`storage_checks`' lines, and the database they read, still open to read for the doctor's other
    checks (one connection for the whole report) and closed on leaving; None when there is no database yet
    or it cannot be opened (the first line says which)."""
    checks, db = await _checked(settings, now, known)
    try:
        yield checks, db
    finally:
        if db is not None:
            await db.close()


async def _checked(settings: Settings, now: datetime | None,
                   known: dict[str, int] | None) -> tuple[list[Check], Engine | None]:
    url = settings.storage.url.get_secret_value().strip()
    try:
        db = settings.storage.engine(settings.bot.data_dir)
    except (StorageError, OSError) as exc:  # (a data dir it cannot create: the report went no further)
        return [Check(False, "storage", str(exc) if isinstance(exc, StorageError) else
                      f"{exc.strerror}: {exc.filename}")], None
    if isinstance(db, SQLiteDatabase):
        where = f"SQLite {db.where}"
        folder = Path(db.path).parent
        if await asyncio.to_thread(lambda: folder.exists() and not folder.is_dir()):  # (it said "not created yet")
            return [Check(False, "storage", f"{folder} is not a directory: `qunbot run` cannot create {db.where}")], None
        if not await asyncio.to_thread(Path(db.path).is_file):
            return [Check(True, "storage", f"{where} (not created yet: no process has run)")], None
    else:
        where = f"PostgreSQL {redact_dsn(url)}"
    known = known if known is not None else await _known_schemas(settings)
    try:
        await db.open_to_read()
        try:
            if refused := await _refused(db, known):
                return [Check(False, "storage", f"{where}: {refused}")], db
            stamp = iso(now or db.now())  # the database's time, as the processes' leases are written in
            none: list[dict[str, Any]] = []
            leases = await db.read_present(lambda tx: tx.query(
                "SELECT name, holder FROM leases WHERE expires_at >= ? ORDER BY name", [stamp]), none)
            held = [str(r["name"]) for r in leases if not str(r["name"]).startswith(PROCESS_PREFIX)]
            waiting = await db.read_present(
                lambda tx: waiting_sync(tx, LEASED_PLATFORMS, held, ONE_PROCESS_PLATFORMS), none)
            stored = await db.read_present(secret_key.stored_sync, None)
        except BaseException:
            await db.close()
            raise
    except Exception as exc:  # unreachable, refused, newer than this code: the reason, never the password
        return [Check(False, "storage", f"{where}: {redact_dsn(str(exc), url)[:300]}")], None
    checks = [Check(True, "storage", where)]
    if db.dialect == "postgresql":  # leases and claims keep the database's time; logs keep this machine's
        off = db.skew.total_seconds()
        checks.append(Check(abs(off) < 2, "clock", f"this machine's clock is {abs(off):.3f} s "
                            f"{'behind' if off >= 0 else 'ahead of'} the database's" + ("" if abs(off) < 2 else
                            " (qunbot keeps the database's time; run NTP here so logs agree)")))
    checks.append(await _key_check(settings.bot.data_dir / "secret.key", stored))
    checks += _processes(leases)
    for row in waiting:
        if row["platform"] in ONE_PROCESS_PLATFORMS:
            why = "the channel, which no running process runs"
        else:
            why = (f"account {row['account']}" if row["account"] else "its default account") + \
                  ", which no running process holds"
        checks.append(Check(False, "outbox", f"{row['n']} message(s) for {row['platform']} wait for {why} "
                                             f"(oldest queued {row['oldest'][:19]})"))
    return checks, db


async def weixin_logins(db: Engine) -> set[str]:
    """The Weixin bot ids logged in in ``db`` (opened by :func:`reading`; none before its first start).

    Only the ids are read, never the sealed values: whether this data_dir's ``secret.key`` opens them
    is the ``secret.key`` line's business.
    """
    none: list[dict[str, Any]] = []
    rows = await db.read_present(lambda tx: tx.query(
        "SELECT account FROM channel_state WHERE platform = 'weixin' AND key = 'account'"), none)
    return {str(r["account"]) for r in rows}


async def _known_schemas(settings: Settings) -> dict[str, int]:
    """Each component's schema version this qunbot knows, the configured plugins' too: what a bot registers
    as it starts, here on a scratch in-memory database (a plugin that fails is left out: its line says why)."""
    with tempfile.TemporaryDirectory(prefix="qunbot-doctor-") as scratch:
        local = settings.model_copy(update={"bot": settings.bot.model_copy(update={"data_dir": Path(scratch)})})
        choices: tuple[list[str] | None, ...] = (None, [])  # the configured plugins; failing that, none
        for plugins in choices:
            try:
                bot = Bot(local, channels=[], plugins=plugins, database=":memory:")
            except Exception:
                continue
            try:
                await bot.start()
            except Exception:  # (start stopped what it started; the schemas registered so far are known)
                return bot.db.schemas()
            await bot.stop(flush_timeout_s=0)
            return bot.db.schemas()
    return {}


async def _refused(db: Engine, known: dict[str, int]) -> str:
    """Why ``qunbot run`` would refuse or fail on ``db`` (a newer schema; SQLite: a file this user cannot
    write, a damaged page), or ""."""
    none: list[dict[str, Any]] = []
    rows = await db.read_present(
        lambda tx: tx.query("SELECT component, version FROM schema_version ORDER BY component"), none)
    for row in rows:
        have, mine = int(row["version"]), known.get(str(row["component"]))
        if mine is not None and have > mine:
            return (f"{str(row['component'])!r} is at schema version {have}, newer than this qunbot knows ({mine}): "
                    "upgrade qunbot (or restore a backup)")
    if not isinstance(db, SQLiteDatabase):
        return ""
    if why := await asyncio.to_thread(_unwritable, Path(db.where)):
        return why + ": `qunbot run` as this user cannot start on it"
    said = await db.read(lambda tx: tx.execute("PRAGMA quick_check(3)").fetchall())
    found = [line for r in said for line in str(r[0]).splitlines() if not line.startswith("*** in database")]
    return "" if found == ["ok"] else f"damaged (PRAGMA quick_check: {'; '.join(found)[:200]}): restore a backup"


def _unwritable(path: Path) -> str:
    """Why this user cannot write the SQLite file ``path`` (its WAL, its SHM, their folder), or ""."""
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and not os.access(file, os.W_OK):
            return f"this user cannot write {file}"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"this user cannot create files in {path.parent} (SQLite's -wal and -shm)"
    return ""


async def _key_check(path: Path, stored: str | None) -> Check:
    """Whether ``path`` is the key the database was first used with (``stored``, its fingerprint)."""
    if stored is None:
        return Check(True, "secret.key", f"{path} (the database records its key at the first start)")
    if not await asyncio.to_thread(path.is_file):
        return Check(False, "secret.key", f"{path} does not exist: copy the database's here (from a process "
                                          "using it, or a backup); `qunbot run` refuses to start without it")
    try:
        same = secret_key.matches(await asyncio.to_thread(load_secret, path), stored)
    except SnapshotError as exc:
        return Check(False, "secret.key", str(exc))
    except OSError as exc:  # (unreadable: owned by root after a deploy's copy; the report went no further)
        return Check(False, "secret.key", f"{path}: cannot read it ({exc.strerror})")
    return Check(same, "secret.key", f"{path}: " + ("the database's" if same else "not the key the database was "
                 "first used with: copy the right one here; `qunbot run` refuses to start with this one"))


def _processes(leases: list[dict[str, Any]]) -> list[Check]:
    alive = sorted(str(r["holder"]) for r in leases if str(r["name"]) == PROCESS_PREFIX + str(r["holder"]))
    accounts: dict[str, list[str]] = {}
    for row in leases:
        name = str(row["name"])
        if not name.startswith(PROCESS_PREFIX):
            accounts.setdefault(str(row["holder"]), []).append(name.removeprefix("account:"))
    if not alive and not accounts:
        return [Check(True, "processes", "none running now")]
    lines = [Check(True, "processes", f"{len(alive)} running")]
    for holder in sorted(set(alive) | set(accounts)):
        held = ", ".join(accounts.get(holder, [])) or "no account"
        lines.append(Check(True, f"process {holder}", f"holds {held}"))
    return lines
