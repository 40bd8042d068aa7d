"""Shared fixtures: embedded brokers in temporary directories, started connections, and a
real PostgreSQL server for the jdbc store (started on first use, once per session)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process here, with pytest's exit status, once every result and summary
    is written: the suite leaves a JPype JVM in this process next to threads of stomp.py,
    Spark's py4j gateway and the brokers, and interpreter finalization with all of them
    crashed once in four full runs (SIGSEGV after "N passed"), which CI would count as a
    failure. The service's own clean exit is tested where it matters (test_service_e2e,
    test_serve: serve processes stopped with SIGTERM must exit 0)."""
    if _exit_status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)


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


@pytest.fixture(params=["sqlite", "postgresql"])
def store_spec(request, tmp_path) -> str:
    """Where a test's broker keeps its store: a directory (SQLite) or a schema of its own in
    the PostgreSQL server (tests/stores.py opens either)."""
    if request.param == "sqlite":
        return str(tmp_path / "store")
    server = request.getfixturevalue("postgresql")
    return f"{server.url()}#t{uuid.uuid4().hex[:12]}"


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
