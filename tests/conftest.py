"""Shared fixtures: embedded brokers in temporary directories, started connections."""

from __future__ import annotations

import pytest

from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory


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
