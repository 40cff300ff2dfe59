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
from pathlib import Path

from robot.storage.pgnet import LISTENER

__all__ = ["PgCluster", "cut_listeners", "listeners", "server_binaries"]


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
        log = (self.root / "server.log").open("wb")
        self.process = subprocess.Popen(
            [*self._as, str(self.bins / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
             "-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("PostgreSQL did not start: " + (self.root / "server.log").read_text()[-2000:])
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                time.sleep(0.2)  # accepting TCP is not quite accepting logins
                return self
            time.sleep(0.05)
        raise RuntimeError("PostgreSQL did not start within 30 s")

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
        if self.process is not None and self.process.poll() is None:
            # SIGQUIT to the postmaster itself (runuser may sit between): an immediate shutdown, which
            # waits neither for clients a test left connected nor for the shutdown checkpoint of a
            # cluster about to be deleted.
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int((self.data / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
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
