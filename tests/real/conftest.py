"""Session fixtures for tests against real servers: ActiveMQ Classic, RabbitMQ (with its
STOMP plugin) and PostgreSQL 15 on 127.0.0.1, free ports, temporary data directories. Each
starts on first use only (a test that needs none pays nothing) and stops at the end of the
session; a test skips, naming the reason, only when the Debian package is not installed.
(``postgresql`` here replaces tests/conftest.py's fixture of that name for tests/real.)"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from servers import ActiveMQ, PostgreSQL, RabbitMQ, missing_package


@pytest.fixture(scope="session")
def activemq(tmp_path_factory):
    reason = missing_package("activemq")
    if reason:
        pytest.skip(reason)
    broker = ActiveMQ(tmp_path_factory.mktemp("activemq")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory):
    reason = missing_package("rabbitmq-server")
    if reason:
        pytest.skip(reason)
    # Not under pytest's (root-only) temporary root: user rabbitmq must reach its files.
    base = Path(tempfile.mkdtemp(prefix="imqbridge-rabbitmq-"))
    try:
        node = RabbitMQ(base).start()
        yield node
        node.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgresql():
    """PostgreSQL 15 with user and database imqtest (password over TCP, loopback only);
    stopped with a fast shutdown, so no session of a failed test keeps it waiting."""
    reason = missing_package("postgresql")
    if reason:
        pytest.skip(reason)
    # Not under pytest's (root-only) temporary root: user postgres must reach its files.
    base = Path(tempfile.mkdtemp(prefix="imqbridge-postgresql-"))
    try:
        server = PostgreSQL(base).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
