"""A read of the PostgreSQL store while the database is down is an outage
(StoreUnavailable: tried again when it is back), not a broken store (StoreError), whether
the connection breaks under the read or cannot be made; and a consumer whose queue pages in
from a restarting database gets every message once the database is back, in order."""

from __future__ import annotations

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import StoreError, StoreUnavailable
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase, parse_jdbc_url
from waiting import wait_for

pytestmark = pytest.mark.slow
Q = Queue("outage")


def settings(database) -> JdbcSettings:
    return JdbcSettings(parse_jdbc_url(database.url()), "imq_outage")


def open_broker(database) -> Broker:
    return Broker(None, database=PostgresDatabase(settings(database), False), memory_window=2)


def test_a_read_while_the_database_is_down_is_unavailable_not_broken(database):
    broker = open_broker(database)
    try:
        db = broker.store.database  # type: ignore[union-attr]
        assert db.page(Q.name, 0, 10) == []  # connected, nothing stored
        database.stop_fast()
        with pytest.raises(StoreUnavailable):  # the connection broke under the read
            db.page(Q.name, 0, 10)
        with pytest.raises(StoreUnavailable):  # and cannot be made again
            db.page(Q.name, 0, 10)
        database.start()
        assert db.page(Q.name, 0, 10) == []
    finally:
        broker.close()


def test_a_read_error_that_is_not_an_outage_stays_a_store_error(database):
    broker = open_broker(database)
    try:
        db = broker.store.database  # type: ignore[union-attr]
        with pytest.raises(StoreError) as caught:
            db._read("SELECT no_such_column FROM msgs", ())  # a bug, not an outage
        assert not isinstance(caught.value, StoreUnavailable)
    finally:
        broker.close()


def test_a_consumer_paging_in_through_a_restart_gets_every_message_once_in_order(database):
    broker = open_broker(database)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    try:
        conn.start()
        session = conn.create_session()
        producer = session.create_producer(Q)
        for i in range(20):
            producer.send(TextMessage(str(i)))
        consumer = session.create_consumer(Q)
        got = [consumer.receive(5).text]  # type: ignore[union-attr]
        database.stop_fast()
        outage: list[Exception] = []

        def take() -> bool:
            try:
                m = consumer.receive(0.2)
            except StoreUnavailable as exc:
                outage.append(exc)
                if len(outage) == 1:
                    database.start()
                return False
            if m is not None:
                got.append(m.text)  # type: ignore[attr-defined]
            return len(got) == 20

        wait_for(take, timeout=60)
        assert outage, "the page-in never met the outage"
        assert got == [str(i) for i in range(20)]
    finally:
        conn.close()
        broker.close()
