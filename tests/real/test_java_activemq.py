"""The Java provider against a real ActiveMQ Classic over OpenWire: JPype, the real JNDI
InitialContext, ActiveMQ's own client; every message kind and header through the broker,
acknowledgement modes, transactions, durable subscriptions, temporary destinations,
errors, threads, and a process that exits with connections left open."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, TemporaryQueue, Topic
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidSelectorError,
)
from bridgemgr.jms.message import (
    BytesMessage,
    DeliveryMode,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
)
from bridgemgr.jms.spi import AckMode

pytest.importorskip("jpype")
pytestmark = pytest.mark.timeout(120)


def qname(prefix: str = "q") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def cf(activemq):
    return naming.lookup("ConnectionFactory", activemq.jndi())


@pytest.fixture
def conn(cf):
    c = cf.create_connection()
    c.start()
    yield c
    c.close()


def test_metadata_names_activemq(conn):
    assert conn.metadata.provider_name == "ActiveMQ" and conn.metadata.jms_version == "1.1"


def test_every_kind_and_header_through_the_broker(conn):
    q, replies = Queue(qname()), Queue(qname("replies"))
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    kinds: list[Message] = [
        TextMessage("héllo\0"),
        BytesMessage(b"\x00\xff" * 300),
        MapMessage(),
        StreamMessage(),
        ObjectMessage(JavaSerialized(b"")),
        Message(),
    ]
    kinds[2].set_char("c", "€")
    kinds[2].set_bytes("b", b"\x01")
    kinds[2].set_float("f", 0.1)
    kinds[3].write_short(-3)
    kinds[3].write_char("x")
    kinds[4] = ObjectMessage(["a", 1])
    for i, m in enumerate(kinds):
        m.set_byte_property("b", i)
        m.set_long_property("l", 2**40)
        m.set_float_property("f", 1.25)
        m.set_boolean_property("t", True)
        m.correlation_id = f"c{i}"
        m.type = "kind"
        m.reply_to = replies
    producer = session.create_producer(q)
    for m in kinds:
        producer.send(m, delivery_mode=DeliveryMode.NON_PERSISTENT, priority=7, time_to_live=600_000)
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in kinds]
    session.acknowledge()
    for sent, back in zip(kinds, got):
        assert type(back) is type(sent)
        assert back.message_id == sent.message_id and back.message_id.startswith("ID:")
        assert back.timestamp == sent.timestamp and back.expiration == sent.expiration > back.timestamp
        assert (back.delivery_mode, back.priority, back.destination) == (DeliveryMode.NON_PERSISTENT, 7, q)
        assert (back.correlation_id, back.type, back.reply_to) == (sent.correlation_id, "kind", replies)
        assert [(n, p) for n, p, _ in sorted(back.typed_properties())] == [
            ("b", PropertyType.BYTE),
            ("f", PropertyType.FLOAT),
            ("l", PropertyType.LONG),
            ("t", PropertyType.BOOLEAN),
        ]
        assert back.delivery_count == 1 and not back.redelivered
    assert got[0].text == "héllo\0" and got[1].get_body() == b"\x00\xff" * 300
    assert sorted(got[2].typed_items()) == sorted(kinds[2].typed_items())  # a map has no order
    assert got[3].typed_items() == kinds[3].typed_items()
    assert isinstance(got[4].object, JavaSerialized)


def test_java_objects_stay_opaque_and_arrive_intact(activemq, conn):
    """A Java client's ObjectMessage crosses Python as serial bytes (compressed on the wire
    too), without ActiveMQ's list of classes trusted to deserialise (we never do), and a Java
    client that trusts them reads back the very object."""

    def factory(options: str):
        return naming.lookup(
            "ConnectionFactory", activemq.jndi(**{"java.naming.provider.url": f"{activemq.url}?{options}"})
        )

    compressed, trusting = factory("jms.useCompression=true"), factory("jms.trustAllPackages=true")
    q1, q2 = Queue(qname("obj")), Queue(qname("obj"))
    with compressed.create_connection() as jc:
        jsession = jc.create_session()
        hashmap = __import__("jpype").JClass("java.util.HashMap", loader=jsession.flavor.loader)()
        hashmap.put("k", "v")
        jsession.java.createProducer(jsession.java_destination(q1)).send(jsession.java.createObjectMessage(hashmap))
    session = conn.create_session()
    got = session.create_consumer(q1).receive(5)
    assert isinstance(got.object, JavaSerialized) and got.object[:2] == b"\xac\xed"
    session.create_producer(q2).send(got)
    with trusting.create_connection() as jc:
        jc.start()
        jsession = jc.create_session()
        back = jsession.java.createConsumer(jsession.java_destination(q2)).receive(5000)
        assert str(back.getObject().get("k")) == "v"


def test_client_acknowledge_recover_and_individual(conn):
    q = Queue(qname("ack"))
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    producer = session.create_producer(q)
    for i in range(3):
        producer.send(TextMessage(str(i)))
    consumer = session.create_consumer(q)
    assert [consumer.receive(5).text for _ in range(3)] == ["0", "1", "2"]
    session.recover()
    again = [consumer.receive(5) for _ in range(3)]
    assert [m.text for m in again] == ["0", "1", "2"]
    assert all(m.redelivered and m.delivery_count == 2 for m in again)
    again[0].acknowledge()  # CLIENT: everything the session delivered
    session.recover()
    assert consumer.receive(0.5) is None
    individual = conn.create_session(False, AckMode.INDIVIDUAL_ACKNOWLEDGE)
    q2 = Queue(qname("individual"))
    p2 = individual.create_producer(q2)
    for i in range(3):
        p2.send(TextMessage(str(i)))
    c2 = individual.create_consumer(q2)
    got = [c2.receive(5) for _ in range(3)]
    got[1].acknowledge()
    c2.close()
    c3 = individual.create_consumer(q2)
    assert sorted(c3.receive(5).text for _ in range(2)) == ["0", "2"]


def test_local_transactions(conn):
    q = Queue(qname("tx"))
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
    assert back.text == "yes" and back.redelivered
    session.commit()
    assert consumer.receive(0.3) is None


def test_durable_subscription_with_selector(cf):
    topic, name = Topic(qname("news")), "d1"
    conn = cf.create_connection()
    conn.client_id = f"client-{uuid.uuid4().hex[:6]}"
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    session.create_durable_subscriber(topic, name, "color = 'red' AND n > 1").close()
    producer = session.create_producer(topic)
    for n, color in enumerate(["red", "red", "blue", "red"]):
        m = TextMessage(f"{color}{n}")
        m.set_string_property("color", color)
        m.set_int_property("n", n)
        producer.send(m)
    conn.start()
    sub = session.create_durable_subscriber(topic, name, "color = 'red' AND n > 1")
    assert sub.receive(5).text == "red3" and sub.receive(0.3) is None
    session.acknowledge()
    sub.close()
    session.unsubscribe(name)
    conn.close()


def test_temporary_queue_as_reply_to(conn, cf):
    session = conn.create_session()
    temp = session.create_temporary_queue()
    assert isinstance(temp, TemporaryQueue)
    requests = Queue(qname("requests"))
    request = TextMessage("ping")
    request.reply_to = temp
    session.create_producer(requests).send(request)
    with cf.create_connection() as other:  # the server side: answers to the reply-to it got
        other.start()
        osession = other.create_session()
        got = osession.create_consumer(requests).receive(5)
        assert got.reply_to == temp
        osession.create_producer(None).send(TextMessage("pong"), got.reply_to)
    assert session.create_consumer(temp).receive(5).text == "pong"


def test_errors_are_ours(conn, cf):
    session = conn.create_session()
    with pytest.raises(InvalidSelectorError, match="InvalidSelectorException"):
        session.create_consumer(Queue("q"), "color = = 'red'")
    one = cf.create_connection()
    one.client_id = "taken"
    two = cf.create_connection()
    try:
        with pytest.raises(InvalidClientIDException):
            two.client_id = "taken"
            two.create_session()
    finally:
        one.close()
        two.close()
    closed = cf.create_connection()
    s = closed.create_session()
    closed.close()
    with pytest.raises(IllegalStateException, match="closed"):
        s.create_producer(Queue("q"))


def test_threads_and_a_listener(cf):
    """Each thread its own connection, all at once; a MessageListener runs on Java's thread."""
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with cf.create_connection() as c:
                c.start()
                s = c.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
                q = Queue(qname("thread"))
                p = s.create_producer(q)
                for i in range(100):
                    p.send(TextMessage(str(i)), delivery_mode=DeliveryMode.NON_PERSISTENT)
                consumer = s.create_consumer(q)
                assert [consumer.receive(5).text for _ in range(100)] == [str(i) for i in range(100)]
                s.acknowledge()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    got: list[str] = []
    done = threading.Event()
    with cf.create_connection() as c:
        q = Queue(qname("listener"))
        s = c.create_session()

        def on_message(m: Message) -> None:
            got.append(threading.current_thread().name)
            done.set()

        s.create_consumer(q).set_message_listener(on_message)
        c.start()
        c.create_session().create_producer(q).send(TextMessage("async"))
        assert done.wait(10)
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert got and got[0] != threading.main_thread().name


def test_the_process_exits_with_connections_left_open(activemq, tmp_path):
    """Open connections keep the JVM alive unless closed: the provider closes them at exit."""
    script = tmp_path / "leave_open.py"
    script.write_text(
        textwrap.dedent(f"""
        import threading
        from bridgemgr.jms import naming
        from bridgemgr.jms.destination import Queue
        cf = naming.lookup("ConnectionFactory", {activemq.jndi()!r})
        conns = [cf.create_connection() for _ in range(3)]
        conns[0].start()
        consumer = conns[0].create_session().create_consumer(Queue("leave.open"))
        threading.Thread(target=consumer.receive, daemon=True).start()  # blocked in Java
        print("opened", flush=True)
    """)
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "opened" in done.stdout
    assert time.monotonic() - started < 45
