"""How the PostgreSQL engine keeps its connections honest over a network (see :mod:`robot.storage.postgres`).

- Every connection sends TCP keepalives (:func:`tcp_settings`): a peer gone without a word (a host
  powered off, a NAT or firewall that forgot a connection after minutes of quiet) is noticed within
  about a minute instead of TCP's quarter of an hour, or never for an idle connection; the probes
  every 30 s also keep such a NAT from forgetting an idle connection.
- A connection that stops answering is shut (:func:`shut`), so whatever waits on it gets an error now.
- The one ``LISTEN`` connection (:class:`Listener`) hears every process's notifications. A connection
  can go silent with no error, or go on answering and yet pass nothing on (a pooler in transaction
  mode): waiting on it alone could miss every notification from then on, unnoticed. So every
  ``listen_check_s`` the process sends itself a notification from a pooled connection; if it has
  not come back within ``listen_answer_s``, the connection is replaced (and what may have been
  missed is read again) unless it still answers a query, which means a pooler: a process refuses
  to start on one. With ``[storage] listen_url`` (a direct or session-mode URL), the LISTEN
  connection uses it, and ``url`` may go through a pooler in transaction mode; a ``listen_url``
  naming another database fails the same check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from robot.storage.pgtx import CHANNEL

if TYPE_CHECKING:
    from robot.storage.postgres import PostgresDatabase

__all__ = ["LISTENER", "TCP", "Listener", "Pooled", "answers", "shut", "tcp_settings"]

log = logging.getLogger("robot.storage.postgres")

LISTENER = "qunbot listener"  #: the LISTEN connection's application_name (pg_stat_activity shows it)

#: libpq's TCP settings for every connection, where the URL does not set its own.
TCP = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3",
       "tcp_user_timeout": "60000"}


def tcp_settings(given: dict[str, Any]) -> dict[str, Any]:
    """:data:`TCP`'s settings that ``given`` (the URL's, parsed) leaves to qunbot."""
    return {key: value for key, value in TCP.items() if key not in given}


def shut(conn: Any) -> None:
    """Shut ``conn``'s socket: a thread waiting on it gets an error now instead of when TCP gives up."""
    with contextlib.suppress(Exception), socket.fromfd(conn.pgconn.socket, socket.AF_INET,
                                                       socket.SOCK_STREAM) as twin:
        twin.shutdown(socket.SHUT_RDWR)  # on the connection itself, which the twin shares


async def answers(conn: Any, within_s: float) -> bool:
    """Whether the async ``conn`` answers a query within ``within_s``; if not, its socket is shut
    (an error otherwise, such as the server having closed it, goes up)."""
    check = asyncio.ensure_future(conn.execute("SELECT 1"))
    try:
        done, _ = await asyncio.wait({check}, timeout=within_s)
    finally:
        if not check.done():
            # Cancelling the query instead would have psycopg ask the server to cancel it and wait.
            shut(conn)
            with contextlib.suppress(Exception):
                await check
    if done:
        check.result()
    return bool(done)


class Pooled(Exception):
    """Notifications cannot reach this process through ``[storage] url`` (a pooler in transaction mode)."""


class Listener:
    """A process's one ``LISTEN`` connection: connects, checks it still hears, reconnects by itself.

    ``deliver(channel, payload)`` gets every notification; ``gap()`` is called when listening again
    after a time without (what was said meanwhile is lost). Its timings are the engine's
    ``listen_retry_s``, ``listen_check_s`` and ``listen_answer_s``, read at each use.
    """

    def __init__(self, db: PostgresDatabase, deliver: Callable[[str, str], None], gap: Callable[[], None],
                 error: Callable[[BaseException], Exception]) -> None:
        self.db, self.deliver, self.gap, self.error = db, deliver, gap, error
        self.late = False  #: started without listening: the first LISTEN ends a gap
        self.probe_channel = f"qunbot_probe_{secrets.token_hex(6)}"  # this connection's alone
        self._probes = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self, wait_s: float) -> None:
        """Listen, waiting up to ``wait_s`` for the connection (and then for its check); without it,
        go on and keep trying in the background. Raises :class:`Pooled` when the server answers on
        it but passes no notification on: a setup that would never work."""
        conn = None
        try:
            conn = await self._connect(wait_s)
        except Pooled:
            raise
        except Exception as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else str(self.error(exc))
            log.warning("storage: not listening to %s yet (%s); going on, and reading again what may have "
                        "been missed once it listens", self.db.listen_where, why)
        self.late = conn is None
        self._task = asyncio.create_task(self._run(conn), name="qunbot-pg-listen")

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _connect(self, within_s: float | None = None) -> Any:
        """A connection listening to every notification (connected within ``within_s``), checked to
        hear them; else an error."""
        import psycopg

        conn = None
        try:
            async with asyncio.timeout(within_s):
                conn = await psycopg.AsyncConnection.connect(self.db.listen_url, autocommit=True, connect_timeout=10,
                                                             application_name=LISTENER, **self.db.listen_tcp)
                await conn.execute(f"LISTEN {CHANNEL}")
                await conn.execute(f"LISTEN {self.probe_channel}")
            await self._hears(conn)  # bounded by listen_answer_s, whatever within_s
        except BaseException:
            if conn is not None:
                await conn.close()
            raise
        return conn

    async def _run(self, conn: Any) -> None:
        failures = 0
        while True:
            try:
                if conn is None:
                    conn = await self._connect()
                    log.info("storage: listening to %s again; re-reading what may have been missed",
                             self.db.listen_where)
                    self.late, failures = False, 0
                    self.gap()
                async with conn:
                    while True:
                        await self._pass_on(conn, self.db.listen_check_s)
                        await self._hears(conn)
            except asyncio.CancelledError:
                raise  # the connection is closed by the async with (no await runs before it)
            except Exception as exc:
                why = str(exc) if isinstance(exc, Pooled | _Silent) else str(self.error(exc))
            conn = None
            delay = min(self.db.listen_retry_s * 2 ** failures, 10.0)
            failures += 1
            log.warning("storage: the LISTEN connection to %s failed (%s); reconnecting in %.1fs",
                        self.db.listen_where, why, delay)
            await asyncio.sleep(delay)

    async def _pass_on(self, conn: Any, seconds: float, *, until: str | None = None) -> bool:
        """Deliver what arrives for ``seconds`` (or until the probe ``until`` does: then True)."""
        async for note in conn.notifies(timeout=seconds):
            if note.channel == self.probe_channel:
                if until is not None and note.payload == until:
                    return True
                continue  # a late answer to an earlier probe
            try:
                channel, payload = json.loads(note.payload)
            except (ValueError, TypeError):
                log.warning("storage: ignoring a malformed notification %.100r", note.payload)
                continue
            self.deliver(str(channel), str(payload))
        return False

    async def _hears(self, conn: Any) -> None:
        """Return if a notification another connection sends reaches ``conn`` in time, or if that
        one cannot be sent in time but ``conn`` answers; else raise :class:`Pooled` or
        :class:`_Silent` (the connection then shut)."""
        self._probes += 1
        token, wait_s = str(self._probes), self.db.listen_answer_s
        try:
            async with asyncio.timeout(wait_s):  # behind a backlog of work, or on a connection gone silent
                await self.db.run(lambda tx: tx.execute("SELECT pg_notify(?, ?)", [self.probe_channel, token]))
        except TimeoutError:
            sent = False
        else:
            sent = True
            if await self._pass_on(conn, wait_s, until=token):
                return
        if not await answers(conn, wait_s):
            raise _Silent(f"it did not answer within {wait_s:g} s")
        if not sent:
            return  # it answers; whether it hears is for the next check to tell
        # The server answers on it, but passes nothing on: LISTEN went to a server connection that
        # went back to a pool (PgBouncer or Supavisor in transaction mode).
        shut(conn)
        hint = ("does [storage] listen_url name the same database as url, directly or through a pooler in "
                "session mode?") if self.db.pooled else ("a pooler in transaction mode? Use a direct or session-mode "
                                                         "URL, or set [storage] listen_url to one")
        raise Pooled(f"it answers, but a notification sent to it did not arrive within {wait_s:g} s: {hint}")


class _Silent(Exception):
    """The LISTEN connection stopped answering (its socket is shut)."""
