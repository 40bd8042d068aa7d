"""Shared fixtures: embedded brokers in temporary directories, started connections, and a
real PostgreSQL server for the jdbc store (started on first use, once per session)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory


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
