"""Shared fixtures: embedded brokers in temporary directories, started connections, and a
real PostgreSQL server for the jdbc store (started on first use, once per session)."""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from bridgemgr import props as props_module
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

# Hypothesis' per-example deadline (200 ms) measures the machine, not the code: on a shared
# CI runner an example that writes a file or a database row can take longer and fail a
# test that is right. Properties are what the tests check; their time is pytest-timeout's.
settings.register_profile("imqbridge", deadline=None)
settings.load_profile("imqbridge")

# The fast tier (`tests/run -m "not slow"`, docs/architecture.md) must stay under a minute:
# tests over 0.3 s are marked slow by hand (@pytest.mark.slow, or pytestmark for a
# module), and here: everything under SLOW_DIRS and every test that uses a real server
# (starting one takes seconds), so a new test there is slow without a mark. The guard below
# names unmarked tests over SLOW_SECONDS and a fast tier over FAST_TIER_SECONDS. (0.3 s:
# the fast tier's ~2000 tests take 30 ms each on average; two hundred at 0.3 s would be its
# whole minute.)
SLOW_SECONDS = 0.3
FAST_TIER_SECONDS = 60.0
SLOW_DIRS = ("real", "spark")
SERVER_FIXTURES = {"postgresql", "restartable_postgresql", "activemq", "rabbitmq", "spark"}


# tests/run runs the suite in pytest-xdist workers (--dist loadgroup): most slow tests wait
# (for a restart, a timeout, a kill), so more workers than cores still shorten the wall
# time. The scheduler below gives a worker a whole file at a time, in order, as a serial
# run would (a module fixture's service is started once, not once per worker; no test may
# rely on the ones before it: each must pass alone, in any order), and every Spark test to
# one worker: it alone starts the Spark session and the cluster, and Spark's CPU-bound tests
# do not share the machine's two cores with each other. (xdist's own loadgroup reads
# `xdist_group` marks into node ids, which pytest 9 no longer lets it change: every test
# was then scheduled on its own, and each worker started Spark and every module's service.)
SERIAL_DIRS = ("spark",)


def worker_unit(nodeid: str) -> str:
    """The unit a worker takes whole: a file, or one of SERIAL_DIRS."""
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    serial = next((d for d in SERIAL_DIRS if d in parts[:-1]), None)
    return f"dir:{serial}" if serial else path


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    config.option.loadscopereorder = False  # the order of the collection (below), not by size
    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    slow_dirs = [here / d for d in SLOW_DIRS]
    for item in items:
        path = Path(item.path)
        if any(d in path.parents for d in slow_dirs) or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if getattr(config.option, "loadgroup", False):  # an xdist worker of tests/run: longest first
        items[:] = longest_units_first(items)


def longest_units_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The units of ``worker_unit`` in the order the scheduler should hand them out: the
    longest first, so no worker starts a long file when the others are done; each unit's
    tests keep their order. Seconds from tests/durations.json (tests/durations.py writes
    it from a run); a unit it lacks counts 5 s per slow test and 0.05 s per other."""
    known = json.loads((Path(__file__).parent / "durations.json").read_text())
    guess: dict[str, float] = {}
    for item in items:
        unit = worker_unit(item.nodeid)
        guess[unit] = guess.get(unit, 0.0) + (5.0 if item.get_closest_marker("slow") else 0.05)
    return sorted(items, key=lambda item: -known.get(worker_unit(item.nodeid), guess[worker_unit(item.nodeid)]))


_durations: dict[str, float] = {}
_marked_slow: set[str] = set()
_started = time.monotonic()


def pytest_runtest_logreport(report):
    """(In the xdist controller too: a report carries its test's markers as keywords.)"""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _marked_slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, config):
    """The guard of the fast tier: with -m "not slow", name each test that took longer than
    SLOW_SECONDS (setup, call and teardown) and is not marked slow, and say so when the
    session took longer than FAST_TIER_SECONDS. A warning, not a failure: timings on a
    shared machine are noisy; mark a test that is slow everywhere."""
    if "not slow" not in (config.getoption("markexpr") or ""):
        return
    elapsed = time.monotonic() - _started
    if elapsed > FAST_TIER_SECONDS:
        terminalreporter.write_sep(
            "=",
            f"the fast tier took {elapsed:.0f} s, over "
            f"{FAST_TIER_SECONDS:g} s: mark its slowest tests slow "
            "(--durations=30 lists them)",
            yellow=True,
        )
    over = sorted(((d, n) for n, d in _durations.items() if d > SLOW_SECONDS and n not in _marked_slow), reverse=True)
    if over:
        terminalreporter.write_sep(
            "=", f"unmarked tests slower than {SLOW_SECONDS:g} s (mark them @pytest.mark.slow)", yellow=True
        )
        for d, n in over:
            terminalreporter.write_line(f"{d:6.2f}s {n}")


def pytest_configure(config):
    """Tracebacks of every thread on a fatal signal, without pytest's faulthandler plugin:
    the tests start a JPype JVM, which replaces the SIGSEGV handler with its own (HotSpot
    takes SIGSEGV on purpose, at safepoint polls); the plugin's faulthandler.disable() at
    the end would put back the handler of before the JVM, and the JVM's shutdown at exit
    would then kill the process with SIGSEGV after "N passed" (pyproject.toml turns the
    plugin off). Enabled here, faulthandler stays on until the interpreter is gone, after
    JPype has stopped the JVM."""
    if config.pluginmanager.has_plugin("faulthandler"):
        raise pytest.UsageError(
            "run the tests with -p no:faulthandler (pyproject.toml's "
            "addopts): it disables faulthandler while the JVM runs"
        )
    # A descriptor of its own: pytest's capture redirects descriptor 2 during tests.
    faulthandler.enable(file=os.dup(sys.stderr.fileno()), all_threads=True)


@pytest.fixture(scope="session")
def postgresql():
    from pgserver import PostgreSQL, missing_postgresql

    reason = missing_postgresql()
    if reason:
        pytest.skip(reason)
    # Not under pytest's (root-only) temporary root: user postgres must reach its files.
    base = Path(tempfile.mkdtemp(prefix="imqbridge-postgresql-"))
    try:
        server = PostgreSQL(base).start()
        yield server
        server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def restartable_postgresql():
    """A PostgreSQL server that tests stop and start (an outage), apart from the one of
    ``postgresql``: one per worker, each test with a database of its own (``database``),
    instead of a server started (initdb: seconds) for each test."""
    from pgserver import PostgreSQL, missing_postgresql

    reason = missing_postgresql()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="imqbridge-pg-outage-"))
    server = PostgreSQL(base)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def database(restartable_postgresql):
    """A database of this test's own on ``restartable_postgresql``, which the test may stop
    and start (it is running again afterwards, for the next test)."""
    from pgserver import Database

    server = restartable_postgresql
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    db = Database(server, "t" + uuid.uuid4().hex[:12])
    server.create_database(db.name)
    yield db
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    db.drop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_spec(request, tmp_path) -> str:
    """Where a test's broker keeps its store: a directory (SQLite) or a schema of its own in
    the PostgreSQL server (tests/stores.py opens either)."""
    if request.param == "sqlite":
        return str(tmp_path / "store")
    server = request.getfixturevalue("postgresql")
    return f"{server.url()}#t{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _varhome_of_the_test(tmp_path_factory, monkeypatch):
    """Properties without imq.varhome (load_properties(..., environ={})) put a bridge's
    files (its log, txlog, largest.<link>) in a folder of the test's own, not in ./var,
    where the next test or run would find them (a remembered message size changes what
    a link asks of its source)."""
    monkeypatch.setattr(props_module, "DEFAULT_VARHOME", str(tmp_path_factory.mktemp("var")))


@pytest.fixture
def broker(tmp_path):
    """A persistent embedded broker (no fsync) in a fresh directory."""
    b = Broker(tmp_path / "store")
    yield b
    b.close()


@pytest.fixture
def factory(broker):
    return EmbeddedConnectionFactory(broker)


@pytest.fixture
def conn(factory):
    c = factory.create_connection()
    c.start()
    yield c
    c.close()


@pytest.fixture
def session(conn):
    return conn.create_session()
