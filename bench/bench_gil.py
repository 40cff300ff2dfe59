"""What one SQLite statement costs the writer thread while the event loop is busy; prints figures, asserts nothing.

Run: ``.venv/bin/python bench/bench_gil.py [--statements 2000]``

The embedded engine runs every statement on its one writer thread (the event loop never blocks on
SQLite). Python's ``sqlite3`` lets go of the interpreter lock around each statement, so each statement
has to win the lock back from whatever Python the event loop is running. This script measures, side by
side in one run, the writer's statements (an INSERT into a WAL file, and the SAVEPOINT/RELEASE pair
that wraps each unit of work) with the rest of the process idle, and while another thread runs
Python, as the event loop does under load. It explains ``bench_scale.py``'s figures: the writer's
CPU per message and the event loop's add up to the wall time instead of overlapping.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["main", "measure"]


def measure(conn: sqlite3.Connection, statements: int, step: Callable[[sqlite3.Connection, int], None], *,
            busy: bool) -> tuple[float, float]:
    """(wall µs, CPU µs) per ``step`` on a thread of its own; ``busy``: another thread runs Python meanwhile."""
    out: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    def writer() -> None:
        conn.execute("BEGIN IMMEDIATE")
        wall, cpu = time.perf_counter(), time.thread_time()
        for i in range(statements):
            step(conn, i)
        out.extend(((time.perf_counter() - wall) / statements * 1e6, (time.thread_time() - cpu) / statements * 1e6))
        conn.execute("COMMIT")

    spinner = threading.Thread(target=spin) if busy else None
    if spinner is not None:
        spinner.start()
        time.sleep(0.01)
    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    stop.set()
    if spinner is not None:
        spinner.join()
    return out[0], out[1]


def _insert(conn: sqlite3.Connection, i: int) -> None:
    conn.execute("INSERT INTO history (chat, text) VALUES (?, ?)", (f"g{i % 50}", f"第{i}条"))


def _savepoint(conn: sqlite3.Connection, i: int) -> None:
    conn.execute("SAVEPOINT unit")
    conn.execute("RELEASE unit")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--statements", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "gil.db", isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, chat TEXT, text TEXT)")
        conn.execute("CREATE INDEX history_chat ON history (chat)")
        print(f"{args.statements} statements on a writer thread, in one transaction (wall / CPU per statement)")
        print(f"   {'statement':<26} {'rest of the process idle':>26} {'another thread runs Python':>28} {'CPU ratio':>10}")
        for label, step in (("INSERT (indexed)", _insert), ("SAVEPOINT + RELEASE", _savepoint)):
            alone = measure(conn, args.statements * 10, step, busy=False)
            busy = measure(conn, args.statements, step, busy=True)
            print(f"   {label:<26} {alone[0]:11.1f} µs / {alone[1]:6.1f} µs {busy[0]:13.1f} µs / {busy[1]:6.1f} µs "
                  f"{busy[1] / alone[1]:9.1f}x")
        conn.close()
    print("   (each statement releases the interpreter lock and must win it back; while the event loop runs, "
          "that costs a forced switch)")


if __name__ == "__main__":
    main()
