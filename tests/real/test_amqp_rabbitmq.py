"""The AMQP 0-9-1 provider (imq.amqp, pika) against a real RabbitMQ node: the JMS mapping
of headers, properties and bodies, the acknowledge modes, prefetch, publisher confirms
(a refusal is the failure of the message refused), and JMS bridge links RabbitMQ ->
RabbitMQ through it, in order, and through kill -9 of the bridge without losing a message."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.errors import JMSException, TransportException
from bridgemgr.jms.message import (
    BytesMessage,
    DeliveryMode,
    MapMessage,
    Message,
    PropertyType,
    StreamMessage,
    TextMessage,
)
from bridgemgr.jms.spi import AckMode
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.amqp import AmqpConnectionFactory
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def qname(prefix: str = "q") -> Queue:
    return Queue(f"{prefix}.{uuid.uuid4().hex[:10]}")


def factory(node, **options: str) -> AmqpConnectionFactory:
    env = node.amqp_env()
    if options:
        env["java.naming.provider.url"] += "?" + "&".join(f"{k}={v}" for k, v in options.items())
    found = naming.lookup("ConnectionFactory", env)
    assert isinstance(found, AmqpConnectionFactory)
    return found


@pytest.fixture
def conn(rabbitmq):
    c = factory(rabbitmq).create_connection()
    c.start()
    yield c
    c.close()


def declare(node, name: str, **arguments) -> None:
    with pika.BlockingConnection(pika.URLParameters(node.amqp_env()["java.naming.provider.url"])) as raw:
        raw.channel().queue_declare(name, durable=True, arguments=arguments or None)


# --- the mapping -------------------------------------------------------------------------------------


def test_every_kind_and_header_round_trips(conn):
    q = qname()
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    sent: list[Message] = [
        TextMessage("héllo"),
        TextMessage("nul\0inside"),
        BytesMessage(b"\0\xff"),
        MapMessage({"a": 1, "b": b"\x01"}),
        StreamMessage(["s", 2.5]),
        Message(),
    ]
    first = sent[0]
    first.correlation_id, first.type, first.reply_to = "c-1", "Order", Queue("replies")
    sent[1].reply_to = Topic("news")
    for name, ptype, value in [
        ("b", PropertyType.BYTE, -3),
        ("s", PropertyType.SHORT, 300),
        ("i", PropertyType.INT, -70000),
        ("l", PropertyType.LONG, 1 << 40),
        ("f", PropertyType.FLOAT, 1.5),
        ("d", PropertyType.DOUBLE, math.pi),
        ("t", PropertyType.BOOLEAN, True),
        ("str", PropertyType.STRING, "x y"),
    ]:
        first.set_typed_property(name, ptype, value)
    producer = session.create_producer(q)
    producer.send(first, priority=6, time_to_live=60_000)
    for m in sent[1:]:
        producer.send(m, delivery_mode=DeliveryMode.NON_PERSISTENT)
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in sent]
    session.acknowledge()
    assert [type(m) for m in got] == [type(m) for m in sent]
    assert [m.get_body() for m in got] == [m.get_body() for m in sent]
    g = got[0]
    assert list(g.typed_properties()) == list(first.typed_properties())
    assert (g.correlation_id, g.type, g.reply_to, g.priority) == ("c-1", "Order", Queue("replies"), 6)
    assert (g.message_id, g.timestamp, g.expiration) == (first.message_id, first.timestamp, first.expiration)
    assert g.delivery_mode == DeliveryMode.PERSISTENT and g.destination == q and not g.redelivered
    assert got[1].reply_to == Topic("news") and got[1].delivery_mode == DeliveryMode.NON_PERSISTENT
    assert got[1].expiration == 0


PROPERTY_VALUES = {
    PropertyType.BOOLEAN: st.booleans(),
    PropertyType.BYTE: st.integers(-(2**7), 2**7 - 1),
    PropertyType.SHORT: st.integers(-(2**15), 2**15 - 1),
    PropertyType.INT: st.integers(-(2**31), 2**31 - 1),
    PropertyType.LONG: st.integers(-(2**63), 2**63 - 1),
    PropertyType.FLOAT: st.floats(width=32, allow_nan=False),
    PropertyType.DOUBLE: st.floats(allow_nan=False),
    PropertyType.STRING: st.text(max_size=40),
}
property_entries = st.sampled_from(list(PROPERTY_VALUES)).flatmap(lambda t: st.tuples(st.just(t), PROPERTY_VALUES[t]))
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: (
        not n.startswith(("JMS", "NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"))
        and n.upper() not in ("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE")
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    props=st.dictionaries(names, property_entries, max_size=6),
    body=st.one_of(st.text(max_size=300), st.binary(max_size=300)),
)
def test_properties_and_bodies_round_trip(conn, props, body):
    q = qname("hyp")
    session = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
    try:
        message = TextMessage(body) if isinstance(body, str) else BytesMessage(body)
        for name, (ptype, value) in props.items():
            message.set_typed_property(name, ptype, value)
        session.create_producer(q).send(message)
        got = session.create_consumer(q).receive(5)
        assert got is not None and type(got) is type(message) and got.get_body() == body
        assert sorted(got.typed_properties()) == sorted(message.typed_properties())
    finally:
        session.close()


def test_headers_of_another_amqp_client_become_properties(rabbitmq, conn):
    q = qname("raw")
    declare(rabbitmq, q.name)
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.amqp_env()["java.naming.provider.url"])) as raw:
        raw.channel().basic_publish(
            "",
            q.name,
            b'{"a": 1}',
            pika.BasicProperties(
                content_type="application/json",
                headers={"small": 5, "big": 1 << 40, "name": "n", "x-skip": 1},
                timestamp=1_700_000_000,
                delivery_mode=2,
            ),
        )
    got = conn.create_session().create_consumer(q).receive(5)
    assert isinstance(got, TextMessage) and got.text == '{"a": 1}'
    assert got.get_property_type("small") is PropertyType.INT and got.get_int_property("small") == 5
    assert got.get_property_type("big") is PropertyType.LONG and got.get_string_property("name") == "n"
    assert got.get_string_property("JMS_AMQP_CONTENT_TYPE") == "application/json"
    assert "x-skip" not in got.property_names and got.timestamp == 1_700_000_000_000


# --- acknowledgement and prefetch -----------------------------------------------------------------


def fill(conn, q: Queue, n: int) -> None:
    session = conn.create_session()
    producer = session.create_producer(q)
    for i in range(n):
        producer.send(TextMessage(str(i)))
    session.close()


def test_client_acknowledge_and_recover(conn):
    q = qname("client")
    fill(conn, q, 50)
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(q)
    first = [consumer.receive(5) for _ in range(30)]
    assert [m.text for m in first] == [str(i) for i in range(30)]
    session.recover()
    again = [consumer.receive(5) for _ in range(50)]
    assert [m.text for m in again] == [str(i) for i in range(50)]
    assert all(m.redelivered for m in again[:30])
    again[10].acknowledge()  # CLIENT: acknowledges every message delivered so far
    session.recover()
    assert consumer.receive(0.5) is None


def test_an_acknowledgement_waits_until_the_one_before_it_is_written(conn):
    """At most one of a session's acknowledgements waits for the I/O thread: a link's
    window slides only as far as RabbitMQ can know (a crash repeats under two windows; a
    busy I/O thread once let three runs of acknowledgements wait in the process)."""
    q = qname("paced")
    fill(conn, q, 3)
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(q)
    assert [consumer.receive(5).text for _ in range(3)] == ["0", "1", "2"]
    gate = threading.Event()
    conn.hand_over(lambda: gate.wait(10))  # the I/O thread busy
    session.acknowledge_oldest(1)  # handed over: returns at once
    second = threading.Thread(target=session.acknowledge_oldest, args=(1,))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "a second acknowledgement went on while the first was unwritten"
    gate.set()
    second.join(10)
    assert not second.is_alive()
    session.acknowledge()
    session.close()
    assert drain(conn, q, quiet=0.5) == []


def test_individual_acknowledge_acks_that_message_only(conn):
    q = qname("individual")
    fill(conn, q, 3)
    session = conn.create_session(False, AckMode.INDIVIDUAL_ACKNOWLEDGE)
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in range(3)]
    got[1].acknowledge()
    session.recover()
    assert sorted(consumer.receive(5).text for _ in range(2)) == ["0", "2"]
    assert consumer.receive(0.3) is None


def test_auto_acknowledge_and_a_closed_consumer_gives_back_its_prefetch(conn):
    q = qname("auto")
    fill(conn, q, 20)
    session = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(q)
    assert [consumer.receive(5).text for _ in range(5)] == ["0", "1", "2", "3", "4"]
    consumer.close()  # 15 prefetched, never handed over: they go back
    rest = session.create_consumer(q)
    assert [rest.receive(5).text for _ in range(15)] == [str(i) for i in range(5, 20)]
    assert rest.receive(0.3) is None


def test_a_message_listener_gets_every_message_on_its_own_thread(conn, caplog):
    """A failing listener is logged by the provider and does not stop the deliveries."""
    q = qname("listener")
    fill(conn, q, 3)
    got: list[tuple[str, str]] = []

    def listener(message: Message) -> None:
        got.append((message.text, threading.current_thread().name))
        if message.text == "0":
            raise RuntimeError("the listener fails")

    consumer = conn.create_session().create_consumer(q)
    consumer.set_message_listener(listener)
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [text for text, _ in got] == ["0", "1", "2"]
    assert {thread for _, thread in got} == {f"amqp listener {consumer.tag}"}
    failed = [r for r in caplog.records if r.getMessage() == "the message listener failed"]
    assert [r.name for r in failed] == ["bridgemgr.providers.amqp.client"]


def test_prefetch_limits_what_is_delivered_before_an_ack(rabbitmq):
    q = qname("prefetch")
    with factory(rabbitmq, prefetch="5").create_connection() as c:
        c.start()
        fill(c, q, 12)
        session = c.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(q)
        assert [consumer.receive(5).text for _ in range(5)] == ["0", "1", "2", "3", "4"]
        assert consumer.receive(0.5) is None  # five unacknowledged: the broker waits
        session.acknowledge()
        assert consumer.receive(5).text == "5"


def test_transacted_session_commits_and_rolls_back(conn):
    q = qname("tx")
    session = conn.create_session(True)
    producer = session.create_producer(q)
    producer.send(TextMessage("gone"))
    session.rollback()
    producer.send(TextMessage("kept"))
    session.commit()
    consumer = session.create_consumer(q)
    assert consumer.receive(5).text == "kept"
    session.rollback()
    again = consumer.receive(5)
    assert again.text == "kept" and again.redelivered
    session.commit()
    assert consumer.receive(0.3) is None


# --- publisher confirms ---------------------------------------------------------------------------


def test_a_nack_is_the_failure_of_the_message_refused(rabbitmq, conn):
    q = qname("full")
    declare(rabbitmq, q.name, **{"x-max-length": 3, "x-overflow": "reject-publish"})
    producer = conn.create_session().create_producer(q)
    producer.confirm_sends = True
    sent = []
    for i in range(3):
        m = TextMessage(str(i))
        producer.send(m, delivery_mode=DeliveryMode.NON_PERSISTENT)
        sent.append(m)
    refused = TextMessage("3")
    with pytest.raises(JMSException, match=r"basic\.nack") as failure:
        producer.send(refused, delivery_mode=DeliveryMode.NON_PERSISTENT)
    assert refused.message_id in str(failure.value)


def test_pipelined_confirms_complete_in_order_each_for_its_message(rabbitmq, conn):
    q = qname("window")
    declare(rabbitmq, q.name, **{"x-max-length": 40, "x-overflow": "reject-publish"})
    producer = conn.create_session().create_producer(q)
    messages = [TextMessage(str(i)) for i in range(60)]
    futures = [producer.publish(m) for m in messages]
    outcomes = [f.exception(10) for f in futures]
    assert all(e is None for e in outcomes[:40])
    assert all(isinstance(e, JMSException) and m.message_id in str(e) for e, m in zip(outcomes[40:], messages[40:]))
    more = producer.publish(TextMessage("more"))
    producer.flush()
    assert isinstance(more.exception(0), JMSException)


class SocketCalls:
    """Counts socket sends (pika's transport's and the connection's own, send_now) and
    receives (the transport's)."""

    def __init__(self, monkeypatch):
        from pika.adapters.utils import io_services_utils as io

        from bridgemgr.providers.amqp import client

        self.sends, self.recvs = 0, 0
        send, recv = io._AsyncTransportBase._sigint_safe_send, io._AsyncTransportBase._sigint_safe_recv
        send_now = client.send_now

        def counted_send(sock, data):
            self.sends += 1
            return send(sock, data)

        def counted_send_now(sock, data):
            self.sends += 1
            return send_now(sock, data)

        monkeypatch.setattr(client, "send_now", counted_send_now)

        def counted_recv(sock, max_bytes):
            self.recvs += 1
            return recv(sock, max_bytes)

        monkeypatch.setattr(io._AsyncTransportBase, "_sigint_safe_send", staticmethod(counted_send))
        monkeypatch.setattr(io._AsyncTransportBase, "_sigint_safe_recv", staticmethod(counted_recv))


def test_a_window_of_publishes_leaves_in_a_few_socket_writes(rabbitmq, conn, monkeypatch):
    """The frames made in one pass of the I/O loop go out in one write: a window of 300
    publishes handed over at once is a handful of writes, not three per message."""
    q = qname("writes")
    producer = conn.create_session().create_producer(q)
    producer.send(TextMessage("declared"))
    calls = SocketCalls(monkeypatch)
    release = threading.Event()
    conn.hand_over(lambda: release.wait(10))  # the I/O thread takes all 300 in one wake-up
    for _ in range(300):
        producer.publish(BytesMessage(b"x" * 1024))
    release.set()
    producer.flush()
    assert calls.sends < 20, calls.sends
    session = conn.create_session()
    consumer = session.create_consumer(q)
    assert sum(consumer.receive(5) is not None for _ in range(301)) == 301


def test_frames_leave_without_waiting_for_the_next_pass_of_the_loop(rabbitmq, conn, monkeypatch):
    """A command's frames are written where they are made, when the socket takes them:
    pika's transport would only buffer them and send on the loop's next pass (a wake-up
    per write)."""
    calls = SocketCalls(monkeypatch)
    session = conn.create_session()
    answered = threading.Event()
    sent_at_once: list[int] = []

    def qos() -> None:  # on the I/O thread, outside a read or a drain
        before = calls.sends
        session.channel.pika.basic_qos(prefetch_count=7, callback=lambda _f: answered.set())
        sent_at_once.append(calls.sends - before)

    conn._pika.ioloop.add_callback_threadsafe(qos)
    assert answered.wait(5)
    assert sent_at_once == [1]


def test_a_message_larger_than_the_socket_takes_at_once_arrives_whole(conn):
    """A write the socket takes in part leaves the rest to pika's transport, in order."""
    q = qname("large")
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB: far more than a socket buffer
    producer = conn.create_session().create_producer(q)
    for i in range(3):
        message = BytesMessage(body[i:] + body[:i])
        producer.send(message)
    consumer = conn.create_session().create_consumer(q)
    for i in range(3):
        got = consumer.receive(10)
        assert got is not None and got.get_body() == body[i:] + body[:i]


def test_deliveries_are_read_in_large_chunks(rabbitmq, conn, monkeypatch):
    """Reads take up to 256 KiB (pika reads 4 KiB: a recv per four 1 KiB messages)."""
    q, n = qname("reads"), 2000
    producer = conn.create_session().create_producer(q)
    for _ in range(n):
        producer.publish(BytesMessage(b"x" * 1024))
    producer.flush()
    consumer = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE).create_consumer(q)
    conn.hand_over(lambda: time.sleep(1))  # the prefetch waits in the socket meanwhile
    calls = SocketCalls(monkeypatch)
    deadline = time.monotonic() + 30
    while consumer.inbox.qsize() < 1000 and time.monotonic() < deadline:  # the prefetch
        time.sleep(0.05)
    assert consumer.inbox.qsize() == 1000
    assert calls.recvs < 100, calls.recvs  # 1 MiB: at least 250 reads of 4 KiB


class Recorder:
    def __init__(self):
        self.outcomes = []

    def on_completion(self, message):
        self.outcomes.append((message.text, None))

    def on_exception(self, message, exception):
        self.outcomes.append((message.text, exception))


def test_send_async_tells_each_listener_its_own_outcome_in_order(rabbitmq, conn):
    q = qname("async")
    declare(rabbitmq, q.name, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    producer = conn.create_session().create_producer(q)
    recorder = Recorder()
    messages = [TextMessage(str(i)) for i in range(8)]
    for m in messages:
        producer.send_async(m, recorder)
    producer.flush()
    assert [text for text, _ in recorder.outcomes] == [str(i) for i in range(8)]
    assert [e is None for _, e in recorder.outcomes] == [True] * 5 + [False] * 3
    assert all(m.message_id in str(e) for m, (_, e) in zip(messages[5:], recorder.outcomes[5:]))


def test_an_unroutable_send_is_returned_as_that_messages_failure(rabbitmq):
    with factory(rabbitmq, **{"declare-queues": "false"}).create_connection() as c:
        producer = c.create_session().create_producer(qname("missing"))
        m = TextMessage("x")
        with pytest.raises(JMSException, match="NO_ROUTE") as failure:
            producer.send(m)
        assert m.message_id in str(failure.value)
        producer.send(TextMessage("to a topic nobody hears"), Topic("nobody"))  # not a failure


def test_a_connection_the_broker_closes_fails_the_waiting_receive_and_tells_the_listener(rabbitmq):
    c = factory(rabbitmq).create_connection()
    heard = []
    c.set_exception_listener(heard.append)
    c.start()
    consumer = c.create_session().create_consumer(qname("lost"))
    rabbitmq.ctl("close_all_connections", "test: going away")
    with pytest.raises(TransportException, match="going away"):
        consumer.receive(30)
    assert len(heard) == 1 and isinstance(heard[0], TransportException)
    c.close()


# --- bridge links through the provider ----------------------------------------------------------------


def link_xml(env: dict[str, str], src: str, dst: str) -> bytes:
    props = "".join(f'<property name="{k}" value="{v}"/>' for k, v in env.items())
    return f"""<jmsbridge name="amqp">
      <link name="move" transacted="false"><source connection-factory-ref="rmq" destination-ref="src"/>
        <target connection-factory-ref="rmq" destination-ref="dst"/></link>
      <connection-factory ref-name="rmq" lookup-name="ConnectionFactory"
        connect-attempt-interval-in-seconds="1">{props}</connection-factory>
      <connection-factory ref-name="host"/>
      <destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>
    </jmsbridge>""".encode()


def drain(conn, q: Queue, quiet: float = 2.0) -> list[str]:
    session = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(q)
    got = []
    while (m := consumer.receive(quiet)) is not None:
        got.append(m.text)
    session.close()
    return got


def test_a_bridge_link_moves_rabbitmq_to_rabbitmq_in_order(rabbitmq, conn, tmp_path):
    src, dst, n = qname("bsrc"), qname("bdst"), 2000
    fill(conn, src, n)
    host = Broker(tmp_path / "host")
    bridge = JMSBridge(
        parse_bridge_config(link_xml(rabbitmq.amqp_env(), src.name, dst.name), "amqp.xml"),
        host_factory=lambda env: EmbeddedConnectionFactory(host),
    )
    try:
        assert bridge.start() is State.STARTED
        counters = bridge.links[0].counters
        deadline = time.monotonic() + 120
        while counters.transferred < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counters.transferred == n and counters.to_dmq == 0
    finally:
        bridge.stop()
        host.close()
    assert drain(conn, dst) == [str(i) for i in range(n)]
    assert drain(conn, src, 0.3) == []


def test_a_windowed_link_asks_the_source_for_three_windows_of_prefetch(rabbitmq, conn, tmp_path):
    """basic.qos of the link's source channel is 3 x imq.bridge.<name>.link.window when that
    is more than the URL's prefetch (1000 by default): a prefetch of one window stalls the
    source at every window until its acknowledgement reaches the broker."""
    src, dst = qname("psrc"), qname("pdst")
    fill(conn, src, 5)
    host = Broker(tmp_path / "host")
    props = load_properties(
        [],
        ["imq.bridge.amqp.type=jms", "imq.bridge.amqp.xmlurl=amqp.xml", "imq.bridge.amqp.link.window=500"],
        environ={},
    )
    bridge = JMSBridge(
        parse_bridge_config(link_xml(rabbitmq.amqp_env(), src.name, dst.name), "amqp.xml"),
        props,
        host_factory=lambda env: EmbeddedConnectionFactory(host),
    )
    try:
        assert bridge.start() is State.STARTED
        out = rabbitmq.ctl("list_consumers", "-q", "--no-table-headers", "queue_name", "prefetch_count")
        assert f"{src.name}\t1500" in out.splitlines()
    finally:
        bridge.stop()
        host.close()
    assert drain(conn, dst) == [str(i) for i in range(5)]


def test_a_full_window_acknowledges_its_confirmed_head_and_slides(rabbitmq, conn, tmp_path, monkeypatch):
    """Through AMQP a full window waits for its oldest send only and acknowledges the
    source up to the last confirmed send (basic.ack multiple), its later sends still out:
    the unit rarely completes whole (once the source is idle), every message arrives
    once, in order."""
    from bridgemgr.jmsbridge.transfer import ClientAcknowledge
    from bridgemgr.providers.amqp.client import AmqpSession

    heads, wholes = [], []
    oldest, complete = AmqpSession.acknowledge_oldest, ClientAcknowledge.complete
    monkeypatch.setattr(
        AmqpSession, "acknowledge_oldest", lambda self, count: (heads.append(count), oldest(self, count))[1]
    )
    monkeypatch.setattr(ClientAcknowledge, "complete", lambda self: (wholes.append(1), complete(self))[1])
    src, dst, n = qname("ssrc"), qname("sdst"), 2000
    fill(conn, src, n)
    host = Broker(tmp_path / "host")
    xml = link_xml(rabbitmq.amqp_env(), src.name, dst.name).replace(
        b"</link>", b'<property name="window" value="50"/></link>'
    )
    bridge = JMSBridge(parse_bridge_config(xml, "amqp.xml"), host_factory=lambda env: EmbeddedConnectionFactory(host))
    try:
        assert bridge.start() is State.STARTED
        counters = bridge.links[0].counters
        deadline = time.monotonic() + 120
        while counters.transferred < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counters.transferred == n and counters.to_dmq == 0
    finally:
        bridge.stop()
        host.close()
    assert drain(conn, dst) == [str(i) for i in range(n)]
    assert sum(heads) + 50 * len(wholes) >= n and len(heads) >= 10
    assert all(0 < h <= 50 for h in heads) and len(wholes) <= 5


def test_a_link_puts_exactly_the_messages_the_target_refuses_in_the_dmq(rabbitmq, conn, tmp_path):
    src, dst = qname("rsrc"), qname("rdst")
    declare(rabbitmq, dst.name, **{"x-max-length": 6, "x-overflow": "reject-publish"})
    fill(conn, src, 10)
    host = Broker(tmp_path / "host")
    bridge = JMSBridge(
        parse_bridge_config(link_xml(rabbitmq.amqp_env(), src.name, dst.name), "amqp.xml"),
        host_factory=lambda env: EmbeddedConnectionFactory(host),
    )
    try:
        assert bridge.start() is State.STARTED
        counters = bridge.links[0].counters
        deadline = time.monotonic() + 60
        while counters.transferred + counters.to_dmq < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (counters.transferred, counters.to_dmq) == (6, 4)
        dead = EmbeddedConnectionFactory(host).create_connection()
        dead.start()
        consumer = dead.create_session().create_consumer(Queue("imq.bridge.jms.dmq"))
        refused = [consumer.receive(5) for _ in range(4)]
        assert [m.get_body().text for m in refused] == ["6", "7", "8", "9"]
        assert all("basic.nack" in m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION") for m in refused)
        dead.close()
    finally:
        bridge.stop()
        host.close()
    assert drain(conn, dst) == [str(i) for i in range(6)]


CHILD = """
import sys, time
from pathlib import Path
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
host = Broker(Path(sys.argv[2]))
bridge = JMSBridge(parse_bridge_config(Path(sys.argv[1]).read_bytes(), "amqp.xml"),
                   host_factory=lambda env: EmbeddedConnectionFactory(host))
bridge.start()
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_kill_9_of_the_bridge_with_a_full_window_loses_nothing_and_repeats_at_most_a_window(rabbitmq, conn, tmp_path):
    """kill -9 of a bridge whose link (window 200, the XML link property) runs flat out,
    so its window is full: nothing is lost, and what reaches the target is runs of the
    source's order, each kill restarting at the oldest unacknowledged message: at most the
    window's unconfirmed sends, plus the confirmed ones whose acknowledgement had not left
    yet (it goes to the source over its own connection while the next sends go out over the
    target's), so under two windows back; only messages the source never saw acknowledged
    come twice."""
    src, dst, n, window = qname("ksrc"), qname("kdst"), 5000, 200
    fill(conn, src, n)
    xml = tmp_path / "amqp.xml"
    xml.write_bytes(
        link_xml(rabbitmq.amqp_env(), src.name, dst.name).replace(
            b"</link>", f'<property name="window" value="{window}"/></link>'.encode()
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    kills = 0
    for round_ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(xml), str(tmp_path / f"host{round_}")],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.1 + 0.1 * round_)  # a windowed link moves thousands a second: kill early
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        if rabbitmq_depth(rabbitmq, src.name) == 0:
            break
    # a last run, not killed, moves the rest
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(xml), str(tmp_path / "hostlast")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while rabbitmq_depth(rabbitmq, src.name) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = [int(t) for t in drain(conn, dst)]
    assert kills >= 2
    assert set(got) == set(range(n))  # nothing lost (duplicates may be)
    assert list(dict.fromkeys(got)) == list(range(n))  # and in order
    restarts = [(prev, nxt) for prev, nxt in itertools.pairwise(got) if nxt != prev + 1]
    assert len(restarts) <= kills
    assert all(prev - 2 * window < nxt <= prev for prev, nxt in restarts), restarts
    assert len(got) - n <= kills * 2 * window


def rabbitmq_depth(node, queue: str) -> int:
    """Ready plus unacknowledged messages of ``queue``."""
    out = node.ctl("list_queues", "-q", "--no-table-headers", "name", "messages")
    for line in out.splitlines():
        name, _, count = line.strip().partition("\t")
        if name == queue:
            return int(count)
    return 0
