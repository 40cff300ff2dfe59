"""Suite-wide guard: tests stand alone, so no test may read a file beside the repository.

A clean clone has nothing next to it (no ``../shared``), so a fixture read from there works on
our machines and fails for every user. An audit hook records every ``open`` of a path that lies
in the repository's parent folder but outside the repository; a test that did so fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
_BESIDE = REPO.parent
_outside: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not args or not isinstance(args[0], str | bytes | os.PathLike):
        return
    try:
        raw = os.fsdecode(args[0])
        path = Path(raw)
        path = Path(os.path.normpath(path if path.is_absolute() else Path.cwd() / path))
    except (OSError, ValueError, TypeError):
        return
    if path.is_relative_to(_BESIDE) and not path.is_relative_to(REPO):
        _outside.append(str(path))


sys.addaudithook(_audit)


@pytest.fixture
def outside_reads() -> list[str]:
    """The paths beside the repository opened so far by this test (the guard's own test clears it)."""
    return _outside


@pytest.fixture(autouse=True)
def _stand_alone() -> Iterator[None]:
    _outside.clear()
    yield
    found, _outside[:] = list(_outside), []
    if found:
        pytest.fail(f"this test read files outside the repository (copy fixtures into tests/): {found}")


@pytest.fixture(autouse=True)
def _chat_moves() -> Iterator[None]:
    """Chats given new ids are a process-wide record (robot.message.chat_moved): one test's move must not
    make another's chat an alias of some old id."""
    import robot.message

    yield
    robot.message._FORMER.clear()
    robot.message._NAMES.clear()


# -- PostgreSQL: a real throwaway cluster (initdb in a temp folder, loopback port), one per session --------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """The session's PostgreSQL server (Debian's postgresql package, installed by .ci/run); started lazily."""
    from robot.storage.pgtesting import PgCluster

    with PgCluster() as cluster:
        yield cluster


@pytest.fixture
def own_pg_cluster() -> Iterator[Any]:
    """A PostgreSQL server of the test's own, for a test that crashes or reconfigures it (doing so to
    the session's would cut every other test's connections)."""
    from robot.storage.pgtesting import PgCluster

    with PgCluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """A new, empty database on the session's server: its URL."""
    return str(pg_cluster.create_database())


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """An unopened storage engine of each kind: the store contract runs on both."""
    from robot.storage import SQLiteDatabase
    from robot.storage.postgres import PostgresDatabase

    if request.param == "sqlite":
        return SQLiteDatabase(tmp_path / "qunbot.sqlite3")
    return PostgresDatabase(request.getfixturevalue("pg_url"), max_size=4)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rehearse-units", action="store_true",
                     help="run every test with each unit of work run twice, the first run rolled back")


# -- Rehearsal: units of work must be pure functions of the database -----------------------------------
# Both engines may run a unit again (SQLite re-runs a group one of whose units failed after writing,
# PostgreSQL retries a serialization failure). The tests of these modules run twice, the second time
# with every unit rehearsed (Engine.rehearse: run, rolled back, run again): a unit with a Python side
# effect (a counter, a list, a send) shows up as a doubled outcome there. "Processes" sharing one
# PostgreSQL in one test process are rehearsed too; tests whose bots are real child processes are
# left out (the rehearsal does not reach them). ``--rehearse-units`` rehearses the whole suite.
_REHEARSED = ("robot/storage/", "reminders/", "memory/", "summary/", "robot/test_approvals.py",
              "robot/test_approvals_crash.py", "robot/test_outbox.py", "robot/test_pipeline.py",
              "robot/test_privacy.py", "robot/test_store.py", "robot/test_history.py", "robot/test_accounts_pg.py")
_NOT_REHEARSED = ("reminders/test_crash.py", "reminders/test_crash_create.py",
                  # pure: no unit of work runs in them (parsing, schedules, prompts, scoring)
                  "reminders/test_phrases.py", "reminders/test_schedule.py", "summary/test_mapreduce.py",
                  "summary/test_quality.py", "summary/test_signals.py")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--rehearse-units"):
        from robot.storage.base import Engine

        Engine.rehearse = True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    path = metafunc.definition.path
    where = path.relative_to(REPO / "tests").as_posix() if path.is_relative_to(REPO / "tests") else ""
    if (not metafunc.config.getoption("--rehearse-units") and where.startswith(_REHEARSED)
            and not where.startswith(_NOT_REHEARSED) and metafunc.definition.get_closest_marker("unrehearsed") is None
            and "raw_tx" not in metafunc.fixturenames):  # a bare transaction: no engine, nothing to rehearse
        metafunc.parametrize("_rehearsal", [False, True], indirect=True, ids=["once", "rehearsed"])


@pytest.fixture(autouse=True)
def _rehearsal(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unit of work rehearsed in this test (see above), unless the test is marked ``unrehearsed``:
    it counts the statements run, scripts the values a unit draws, or times one process against another."""
    from robot.storage.base import Engine

    if request.node.get_closest_marker("unrehearsed") is not None:
        monkeypatch.setattr(Engine, "rehearse", False)
    elif getattr(request, "param", False):
        monkeypatch.setattr(Engine, "rehearse", True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The multi-process SIGKILL test (about two and a half minutes of mostly waiting) goes first, so
    that with ``-n 4`` (``.ci/run``) one worker waits through it while the other three run everything
    else (on two cores: many tests wait on processes, sockets and timers)."""
    items.sort(key=lambda item: 0 if "tests/scale/" in item.nodeid or item.nodeid.startswith("scale/") else 1)
