"""The STOMP provider against real brokers: ActiveMQ's and RabbitMQ's STOMP connectors (our
own STOMP bridge is in tests/test_provider_stomp.py). The same JMS contract on each, plus
what the brokers do differently: redelivery, durable subscriptions, selectors."""

from __future__ import annotations

import uuid

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.message import BytesMessage, MapMessage, Message, StreamMessage, TextMessage
from bridgemgr.jms.spi import AckMode
from bridgemgr.providers.stomp import StompConnectionFactory

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=["activemq", "rabbitmq"])
def broker(request):
    server = request.getfixturevalue(request.param)
    return request.param, naming.lookup("ConnectionFactory", server.stomp_env())


@pytest.fixture
def conn(broker):
    c = broker[1].create_connection()
    c.start()
    yield c
    c.close()


def qname(prefix: str = "q") -> Queue:
    return Queue(f"{prefix}.{uuid.uuid4().hex[:10]}")


def test_the_dialect_is_the_brokers(broker, conn):
    assert conn.dialect.name == broker[0]


def test_every_kind_round_trips(conn):
    q = qname()
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    sent: list[Message] = [
        TextMessage("héllo"),
        TextMessage("nul\0inside"),
        BytesMessage(b"\0\xff"),
        MapMessage({"a": 1}),
        StreamMessage(["s", 2.5]),
        Message(),
    ]
    sent[0].set_string_property("color", "red")
    sent[0].correlation_id, sent[0].type, sent[0].reply_to = "c-1", "Order", Queue("replies")
    producer = session.create_producer(q)
    for m in sent:
        producer.send(m, priority=6)
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in sent]
    session.acknowledge()
    assert [type(m) for m in got] == [type(m) for m in sent]
    assert [m.get_body() for m in got] == [m.get_body() for m in sent]
    first = got[0]
    assert first.get_string_property("color") == "red" and first.priority == 6
    assert (first.correlation_id, first.type, first.reply_to) == ("c-1", "Order", Queue("replies"))
    assert first.destination == q and first.message_id


def test_client_acknowledge_and_recover(conn):
    q = qname("recover")
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    producer = session.create_producer(q)
    for i in range(100):
        producer.send(TextMessage(str(i)))
    consumer = session.create_consumer(q)
    first = [consumer.receive(10) for _ in range(100)]
    assert sorted(int(m.text) for m in first) == list(range(100))
    session.recover()
    again = [consumer.receive(10) for _ in range(100)]
    assert all(m is not None and m.redelivered for m in again)
    session.acknowledge()
    assert consumer.receive(0.5) is None


def test_acknowledging_as_it_goes_flows_past_200(conn):
    """What a link does (an acknowledgement after each message, client-individual): no
    stall at ActiveMQ's page size of 200, where cumulative acknowledgements stall."""
    q = qname("many")
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    producer = session.create_producer(q)
    for i in range(500):
        producer.send(TextMessage(str(i)), delivery_mode=1)
    consumer = session.create_consumer(q)
    got = []
    for _ in range(500):
        got.append(int(consumer.receive(10).text))
        session.acknowledge()
    assert sorted(got) == list(range(500))


def test_transactions_commit_and_roll_back(conn):
    q = qname("tx")
    session = conn.create_session(True)
    producer = session.create_producer(q)
    producer.send(TextMessage("no"))
    session.rollback()
    producer.send(TextMessage("yes"))
    session.commit()
    consumer = session.create_consumer(q)
    assert consumer.receive(5).text == "yes"
    session.rollback()
    back = consumer.receive(5)
    assert back is not None and back.text == "yes" and back.redelivered
    session.commit()
    assert consumer.receive(0.5) is None


def test_durable_subscription_with_selector(broker):
    topic = Topic(f"news{uuid.uuid4().hex[:8]}")
    conn = broker[1].create_connection()
    conn.client_id = f"c{uuid.uuid4().hex[:8]}"
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    session.create_durable_subscriber(topic, "d1", "color = 'red'").close()
    producer = session.create_producer(topic)
    for color in ("red", "blue", "red"):
        m = TextMessage(color)
        m.set_string_property("color", color)
        producer.send(m)
    conn.start()
    sub = session.create_durable_subscriber(topic, "d1", "color = 'red'")
    assert [sub.receive(5).text, sub.receive(5).text] == ["red", "red"]
    assert sub.receive(0.5) is None  # blue stayed out (the broker's filter, or ours on RabbitMQ)
    session.acknowledge()
    sub.close()
    session.unsubscribe("d1")
    conn.close()


def test_activemq_jms_clients_see_jms_types(activemq):
    """Text over STOMP is a JMS TextMessage at ActiveMQ, bytes a BytesMessage, even a text
    holding NUL (sent with content-length and amq-msg-type)."""
    pytest.importorskip("jpype")
    q = qname("interop")
    with StompConnectionFactory(activemq.stomp_env()["java.naming.provider.url"]).create_connection() as c:
        producer = c.create_session().create_producer(q)
        for m in (TextMessage("plain"), TextMessage("with\0nul"), BytesMessage(b"\x01")):
            m.set_string_property("k", "v")
            producer.send(m)
    with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as jc:
        jc.start()
        consumer = jc.create_session().create_consumer(q)
        got = [consumer.receive(5) for _ in range(3)]
    assert [type(m) for m in got] == [TextMessage, TextMessage, BytesMessage]
    assert [m.get_body() for m in got] == ["plain", "with\0nul", b"\x01"]
    assert all(m.get_string_property("k") == "v" for m in got)
