"""Brokers on a store spec: a directory (the SQLite store) or
``jdbc:postgresql://host:port/db?user=U#schema`` (the jdbc store in that schema), so the
crash tests run the same workload on both stores, in this process or a child; and a
store filled until its writes fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import JMSException
from bridgemgr.jms.hostbroker import Principal
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase, parse_jdbc_url


def jdbc(spec: str | Path) -> JdbcSettings | None:
    text = str(spec)
    if not text.startswith("jdbc:"):
        return None
    return JdbcSettings(parse_jdbc_url(text.split("#")[0]), urlsplit(text).fragment or "imq_test")


def open_at(spec: str | Path, sync: bool = False, **options: Any) -> Broker:
    settings = jdbc(spec)
    if settings is None:
        return Broker(spec, sync=sync, **options)
    return Broker(None, sync=sync, database=PostgresDatabase(settings, sync), **options)


def fill(broker: Broker, room_pages: int = 20) -> None:
    """Leave ``room_pages`` pages to ``broker``'s SQLite store, then send 1 KiB messages to
    queue "filler" that nobody waits for (STOMP SENDs without receipt) until the store
    refuses: they stay pending, so every later write of the store fails until
    ``max_page_count`` is raised again. (A send that waits, and fails, is withdrawn: it
    would leave nothing pending.)"""
    assert broker.store is not None
    db = broker.store.database._db  # type: ignore[attr-defined]
    db.execute(f"PRAGMA max_page_count={db.execute('PRAGMA page_count').fetchone()[0] + room_pages}")
    host = EmbeddedHostBroker(broker)
    principal = Principal("filler")
    client = host.connect(principal)
    try:
        for i in range(100_000):
            host.send(principal, client, TextMessage(f"f{i}" + "x" * 1000), Queue("filler"))
            if i % 50 == 49:
                broker.wait_durable(broker.store.ticket())
    except JMSException:
        return
    finally:
        host.disconnect(principal, client)
    raise AssertionError("the store took 100,000 messages: it did not fill")
