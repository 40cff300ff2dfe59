"""Child processes that skip importing the third-party libraries (openai alone costs a second and more).

A test that needs a real process (SIGKILLed, signalled, its stdio and exit status observed) paid a
fresh interpreter's imports each time: about two seconds of CPU per start, most of it openai,
aiohttp and pydantic. Here one helper interpreter per test process (the "warm" Python) imports
those libraries once, then forks a child for each start. The child then runs its program exactly as
``python -m MODULE`` / ``python SCRIPT`` / ``python -c CODE`` would: its own pid, stdin, stdout,
stderr, environment, working directory, ``sys.argv`` and ``sys.path``; the program's exit
(``SystemExit``, an uncaught exception, a signal) is the interpreter's own.

Only third-party libraries are preloaded, never this project's packages: every child imports
``robot``, ``reminders``... afresh, so whatever they compute at import (a process's lease holder
id, say) is its own, and import order (``test_exports``' cycle check) is the child's alone.

Two front ends mirror the standard ones: :func:`popen` (``subprocess.Popen``-like, with ``wait``,
``send_signal``, ``kill``, ``returncode``) and :func:`create_subprocess_exec` (``asyncio``-like,
with ``stdin``/``stdout``/``stderr`` streams, ``wait`` and ``communicate``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["AsyncWarmProcess", "WarmProcess", "create_subprocess_exec", "popen"]

ROOT = Path(__file__).resolve().parents[1]
#: What a bot process imports and costs most; never this project's own packages (see above).
#: None of them starts a thread at import (numpy does: OpenBLAS's pool; left to the child), so the fork is safe.
PRELOAD = ("openai", "aiohttp", "aiohttp.web", "pydantic", "pydantic_settings", "cryptography", "jsonschema",
           "sqlite_utils", "apscheduler.schedulers.asyncio", "tomli_w", "segno", "zoneinfo", "sqlite3", "pytest")

# The warm interpreter: preloads, then forks one child per request received on its socket (the
# request's stdin/stdout/stderr come along as file descriptors). The parent answers each request
# with the child's pid and reports each child's exit status; the child returns from serve() and
# runs its program as the script's last statement, so that the interpreter ends it as its own.
_SERVER = r'''
import importlib, json, os, runpy, select, signal, socket, sys, types

for name in json.loads(sys.argv[2]):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
BASE_PATH = sys.path[1:]  # without -c's ''


def serve():
    sock = socket.socket(fileno=int(sys.argv[1]))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = set()
    while True:
        ready = select.select([sock, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if sock not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not data:  # the test process is gone: so are its children
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w):
                os.close(fd)
            sock.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return json.loads(data)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())


request = serve()
if request is not None:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    kind, target, rest = request["kind"], request["target"], request["args"]
    first = os.getcwd() if kind == "-m" else "" if kind == "-c" else os.path.dirname(os.path.realpath(target))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *BASE_PATH]
    del request, serve
    if kind == "-m":
        sys.argv = ["-m", *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "-c":
        sys.argv = ["-c", *rest]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = [target, *rest]
        runpy.run_path(target, run_name="__main__")
'''


class _Server:
    """The warm interpreter of this test process, started at first use."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Its own stdio is no terminal (a child's sys.stdout buffers as with the pipe or file it gets).
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(theirs.fileno()), json.dumps(PRELOAD)],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     cwd=ROOT, env=env)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.pids: list[int] = []
        self.codes: dict[int, int] = {}
        threading.Thread(target=self._read, name="warm-python", daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """End the warm interpreter (it kills any child left) and reap it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        while data := self.sock.recv(1 << 16):
            message = json.loads(data)
            with self.changed:
                if "pid" in message:  # (a pid the kernel gave again: its earlier child's status is history)
                    self.codes.pop(message["pid"], None)
                    self.pids.append(message["pid"])
                else:
                    self.codes[message["exit"]] = message["code"]
                self.changed.notify_all()
        with self.changed:  # the warm interpreter died: no child of it will report again
            self.pids.append(-1)
            self.changed.notify_all()

    def start(self, args: Sequence[str], fds: Sequence[int], cwd: str | os.PathLike[str] | None,
              env: Mapping[str, str] | None) -> int:
        if args[0] != sys.executable or len(args) < 2:
            raise ValueError(f"not a Python command line: {args!r}")
        kind, target, rest = (args[1], args[2], list(args[3:])) if args[1] in ("-m", "-c") else (
            "script", str(args[1]), list(args[2:]))
        request = {"kind": kind, "target": target, "args": rest, "cwd": os.fspath(cwd or Path.cwd()),
                   "env": dict(os.environ if env is None else env)}
        with self.lock, self.changed:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
            if not self.changed.wait_for(lambda: self.pids, timeout=60):
                raise RuntimeError("the warm Python did not answer")
            pid = self.pids.pop(0)
        if pid < 0:
            raise RuntimeError(f"the warm Python exited ({self.proc.poll()})")
        return pid


_server: _Server | None = None
_starting = threading.Lock()


def _warm() -> _Server:
    global _server
    with _starting:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


class WarmProcess:
    """A started child: ``subprocess.Popen``'s ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, server: _Server, pid: int, stdout: IO[Any] | None = None) -> None:
        self._server, self.pid, self.stdout = server, pid, stdout

    @property
    def returncode(self) -> int | None:
        return self._server.codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self.pid in self._server.codes, timeout=timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            return self._server.codes[self.pid]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
          stdout: int | None = None, stderr: int | None = None, text: bool = False) -> WarmProcess:
    """``subprocess.Popen(args, ...)`` for a Python command line: stdin inherited; stdout ``subprocess.PIPE``
    (then ``proc.stdout``), a file descriptor or inherited; stderr a file descriptor or inherited."""
    server = _warm()
    fds = [0, 1 if stdout is None else stdout, 2 if stderr is None else stderr]
    if stdout != subprocess.PIPE:
        return WarmProcess(server, server.start(args, fds, cwd, env))
    read, fds[1] = os.pipe()
    try:
        pid = server.start(args, fds, cwd, env)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(fds[1])
    return WarmProcess(server, pid, os.fdopen(read, encoding="utf-8") if text else os.fdopen(read, "rb"))


class AsyncWarmProcess(WarmProcess):
    """``asyncio.subprocess.Process``'s ``stdin``, ``stdout``, ``stderr``, ``wait`` and ``communicate``."""

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None  # type: ignore[assignment]
    stderr: asyncio.StreamReader | None

    async def wait(self) -> int:  # type: ignore[override]
        while self.returncode is None:  # (a poll: cancelled by an asyncio.timeout at any point)
            await asyncio.sleep(0.02)
        if self.stdin is not None:  # as asyncio's: the pipe to a process gone is closed
            self.stdin.close()
        return self.returncode

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        async def feed() -> None:
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                    with contextlib.suppress(ConnectionError):
                        await self.stdin.drain()
                self.stdin.close()

        async def read(stream: asyncio.StreamReader | None) -> bytes:
            return b"" if stream is None else await stream.read()

        _, out, err = await asyncio.gather(feed(), read(self.stdout), read(self.stderr))
        await self.wait()
        return out, err


async def create_subprocess_exec(*args: str, cwd: str | os.PathLike[str] | None = None,
                                 env: Mapping[str, str] | None = None, stdin: int | None = None,
                                 stdout: int | None = None, stderr: int | None = None) -> AsyncWarmProcess:
    """``asyncio.create_subprocess_exec`` for a Python command line (PIPE, STDOUT or inherited)."""
    loop = asyncio.get_running_loop()
    fds = [0, 1, 2]  # the child's stdin, stdout, stderr: inherited unless piped
    ends: dict[int, int] = {}  # ours of each pipe
    try:
        for target, wanted in enumerate((stdin, stdout, stderr)):
            if wanted == asyncio.subprocess.PIPE:
                read, write = os.pipe()
                fds[target], ends[target] = (read, write) if target == 0 else (write, read)
            elif wanted == asyncio.subprocess.STDOUT and target == 2:
                fds[2] = fds[1]
            elif wanted is not None:
                raise ValueError(f"unsupported: {wanted!r}")
        server = _warm()
        pid = await asyncio.to_thread(server.start, list(args), fds, cwd, env)
    except BaseException:
        for fd in ends.values():
            os.close(fd)
        raise
    finally:
        for target in ends:
            os.close(fds[target])
    proc = AsyncWarmProcess(server, pid)
    proc.stdin = proc.stdout = proc.stderr = None
    if 0 in ends:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(ends[0], "wb", buffering=0))
        proc.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
    for target in (1, 2):
        if target in ends:
            reader = asyncio.StreamReader(limit=2**16, loop=loop)
            await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r, loop=loop),  # type: ignore[misc]
                                         os.fdopen(ends[target], "rb", buffering=0))
            setattr(proc, "stdout" if target == 1 else "stderr", reader)
    return proc
