"""A throwaway PostgreSQL cluster for tests and benches: ``initdb`` in a temporary folder, the
server on a loopback port, gone when stopped (its files deleted in the background). Uses the
machine's PostgreSQL server binaries (Debian's ``postgresql`` package, which ``.ci/run`` installs);
as root, the server runs as the ``postgres`` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from robot.storage.pgnet import LISTENER

__all__ = ["PgCluster", "cut_listeners", "listeners", "pgbouncer", "server_binaries"]


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``postgres`` (newest Debian version first), or None."""
    versions = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()]
    for folder in sorted(versions, key=lambda p: int(p.parent.name), reverse=True):
        if (folder / "initdb").exists():
            return folder
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def listeners(url: str) -> int:
    """How many sessions on ``url``'s database wait for notifications (each engine keeps one)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = %s", (LISTENER,)).fetchone()
        return int(row[0]) if row else 0


def cut_listeners(url: str) -> None:
    """End every LISTEN session on ``url``'s database, as a server restart or a network cut would,
    and return once they are gone (notifications sent from now on reach none of them)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s "
            "AND pid <> pg_backend_pid()", (LISTENER,)).fetchall()]
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone() != (0,):
            if time.monotonic() > deadline:
                raise RuntimeError("the LISTEN sessions did not end within 10 s")
            time.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepting(port: int, process: subprocess.Popen[bytes], log: Path, what: str, timeout_s: float) -> None:
    """Return once ``process`` accepts TCP on ``port``; raise with the end of its ``log`` if it exits
    or does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} did not start: " + log.read_text()[-2000:])
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {timeout_s:g} s")


@contextlib.contextmanager
def pgbouncer(url: str, mode: Literal["session", "transaction"], server_pool: int = 20) -> Iterator[str]:
    """A PgBouncer (Debian's ``pgbouncer`` package, which ``.ci/run`` installs) in ``mode`` in front of
    ``url``'s server, on loopback, with up to ``server_pool`` server connections per database; yields
    the URL through it. As root it runs as ``postgres``."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError("PgBouncer not found: install Debian's pgbouncer package (.ci/run does)")
    server = urlsplit(url)
    folder = Path(tempfile.mkdtemp(prefix="qunbot-pgbouncer-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["-u", "postgres"]
    port = _free_port()
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={server.port} user=postgres\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = any\n"
        f"pool_mode = {mode}\ndefault_pool_size = {server_pool}\nlogfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n")
    process = subprocess.Popen([binary, *as_user, str(folder / "pgbouncer.ini")])
    try:
        _accepting(port, process, folder / "pgbouncer.log", "PgBouncer", 10)
        yield url.replace(f":{server.port}/", f":{port}/")
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


class PgCluster:
    """``with PgCluster() as pg: url = pg.create_database()``."""

    def __init__(self) -> None:
        bins = server_binaries()
        if bins is None:
            raise RuntimeError("PostgreSQL server binaries not found: install Debian's postgresql package "
                               "(.ci/run does)")
        self.bins = bins
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="qunbot-pg-"))
        self.data = self.root / "data"
        self.process: subprocess.Popen[bytes] | None = None
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> PgCluster:
        if self._as:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(str(self.bins / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync")
        self._serve()
        return self

    def _serve(self) -> None:
        with (self.root / "server.log").open("ab") as log:  # the server keeps its own copy
            self.process = subprocess.Popen(
                [*self._as, str(self.bins / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                 "-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
                stdout=log, stderr=subprocess.STDOUT)
        _accepting(self.port, self.process, self.root / "server.log", "PostgreSQL", 30)
        time.sleep(0.2)  # accepting TCP is not quite accepting logins

    def crash(self) -> None:
        """Stop the server as a crash would (an immediate shutdown: every connection cut, open
        transactions lost, crash recovery at the next start); its data stays for :meth:`restart`."""
        if self.process is not None and self.process.poll() is None:
            # SIGQUIT to the postmaster itself (runuser may sit between).
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int((self.data / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Start the server again after :meth:`crash`, on the same port, with the same data."""
        self._serve()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str = "") -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        # An immediate shutdown, which waits neither for clients a test left connected nor for the
        # shutdown checkpoint of a cluster about to be deleted.
        self.crash()
        # Deleted by a process of its own that nobody waits for: a test session's few hundred databases
        # are gigabytes, whose deletion took 14 s here (at the end of a test run, on its critical path).
        with contextlib.suppress(OSError):
            subprocess.Popen(["rm", "-rf", "--", str(self.root)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            return
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
