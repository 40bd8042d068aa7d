"""Client failover in an HA cluster end to end (docs/ha.md#clients), real `serve` processes on
a real PostgreSQL server. A client of a killed instance lands where its store went: its
factory's next connection names the broker it last reached, and a live instance that does
not serve that broker's store sends it to the one that does, though an earlier address of
its list is live; the bridge there moves everything. The messages a killed instance had
delivered to a consumer that had not acknowledged them come back, flagged redelivered,
each once, within the monitor interval."""

from __future__ import annotations

import time

import psycopg
import pytest

from bridgemgr.jms import CLIENT_ACKNOWLEDGE, DeliveryMode, JMSException, Queue, TextMessage
from bridgemgr.jmsbridge.config import Property
from bridgemgr.jmsbridge.imqcf import AddressListFactory, imq_settings
from bridgemgr.providers.embedded.cluster import instance_schema
from bridgemgr.providers.embedded.remote import RemoteConnection, RemoteConnectionFactory
from ha_support import MONITOR, PASSWORD, Cluster, host_xml
from pgserver import free_port
from service_support import take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def reconnect(factory: RemoteConnectionFactory) -> RemoteConnection | None:
    try:
        return factory.create_connection("admin", PASSWORD)
    except JMSException:
        return None


def address_list(urls: str) -> AddressListFactory:
    """A bridge's <connection-factory> with this imqAddressList (one mq:// client per address)."""
    settings, problems = imq_settings([Property("imqAddressList", urls)])
    assert problems == []
    return AddressListFactory(settings)


@pytest.mark.parametrize("kind", [RemoteConnectionFactory, address_list])
def test_a_client_whose_first_live_address_is_not_the_owner_lands_on_the_taker(tmp_path, postgresql, kind):
    cluster = Cluster(tmp_path / "cluster", postgresql, {"jb2": host_xml("jb2")})
    try:
        b2, b3 = cluster.start("B2", "jb2"), cluster.start("B3", "")
        b1_port = free_port()  # B1 comes up after the takeover, first live address of the list
        factory = kind(f"mq://{b2.address},mq://127.0.0.1:{b1_port},mq://{b3.address}")

        def produce(texts: list[str]) -> str:
            with factory.create_connection("admin", PASSWORD) as conn:
                producer = conn.create_session().create_producer(Queue("jb2.in"))
                for text in texts:
                    producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)
                return conn.broker

        texts = [f"m{i:03d}" for i in range(200)]
        assert produce(texts[:100]) == "B2"
        b2.kill()
        wait_for(lambda: b3.when("took over broker B2"), 6 * MONITOR)
        cluster.start("B1", "", f"imq.portmapper.port={b1_port}")
        assert produce(texts[100:]) == "B3"
        got = [m.text for m in take(b3, PASSWORD, "jb2.out", 200)]
        assert sorted(got) == texts, (len(got), len(set(got)))
    finally:
        cluster.stop()


def test_what_a_killed_instance_had_delivered_comes_back_flagged_once(tmp_path, postgresql):
    cluster = Cluster(tmp_path / "cluster", postgresql, {})
    try:
        b2, b3 = cluster.start("B2", ""), cluster.start("B3", "")
        factory = RemoteConnectionFactory(f"mq://{b2.address},mq://{b3.address}", prefetch=0)
        conn = factory.create_connection("admin", PASSWORD)
        session = conn.create_session(False, CLIENT_ACKNOWLEDGE)
        producer = session.create_producer(Queue("w"))
        texts = [f"w{i:02d}" for i in range(50)]
        for text in texts:
            producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)
        consumer = session.create_consumer(Queue("w"))
        conn.start()
        [consumer.receive(5) for _ in range(10)][-1].acknowledge()  # done with the first 10
        assert [consumer.receive(5).text for _ in range(10)] == texts[10:20]  # in flight
        schema = instance_schema(cluster.clusterid, "B2")

        def counted() -> int:  # in flight with a delivery count in B2's store
            with psycopg.connect(**postgresql.conninfo(cluster.database)) as db:
                return db.execute(f'SELECT COUNT(*) FROM "{schema}".msgs WHERE dcount > 0').fetchone()[0]

        wait_for(lambda: counted() == 10, 10, "the delivery counts in B2's store")
        killed = time.monotonic()
        b2.kill()
        conn.close()
        # (a link reconnects the same way: until B2's store is served again, it is told
        # to try again, and B3, its taker, serves it within the monitor interval)
        with wait_for(lambda: reconnect(factory), 6 * MONITOR) as again:
            assert again.broker == "B3"
            again.start()
            consumer = again.create_session(False, CLIENT_ACKNOWLEDGE).create_consumer(Queue("w"))
            got = [consumer.receive(6 * MONITOR)]
            assert time.monotonic() - killed <= 2 * MONITOR + 2
            got += list(iter(lambda: consumer.receive(1), None))
            got[-1].acknowledge()
        assert [m.text for m in got] == texts[10:]
        assert [m.text for m in got if m.redelivered] == texts[10:20]
        assert take(b3, PASSWORD, "w") == []
    finally:
        cluster.stop()
