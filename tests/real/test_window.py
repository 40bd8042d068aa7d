"""The confirm window against real brokers: pipelined STOMP receipts on ActiveMQ's and
RabbitMQ's STOMP connectors (a refused SEND fails that send alone), ActiveMQ's JMS 1.1
client batching a window in a local transaction (JPype), and bridge links with a window
between queues of each broker: every message once, in order."""

from __future__ import annotations

import threading
import uuid

import pytest
from test_bridges import bridge_xml, cf_xml, take

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import JMSException, TransportException
from bridgemgr.jms.message import Message, TextMessage
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from jmsbridge_support import FAST, wait_until

pytestmark = pytest.mark.timeout(180)


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, JMSException | None]] = []
        self.lock = threading.Lock()

    def on_completion(self, message: Message) -> None:
        with self.lock:
            self.outcomes.append((message.text, None))  # type: ignore[attr-defined]

    def on_exception(self, message: Message, exception: JMSException) -> None:
        with self.lock:
            self.outcomes.append((message.text, exception))  # type: ignore[attr-defined]


def qname(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["activemq", "rabbitmq"])
def stomp_server(request):
    server = request.getfixturevalue(request.param)
    return request.param, server


def test_stomp_send_async_pipelines_and_completes_in_order(stomp_server):
    _, server = stomp_server
    factory = naming.lookup("ConnectionFactory", server.stomp_env())
    queue = Queue(qname("w"))
    listener = Recorder()
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(queue)
        for i in range(300):
            producer.send_async(TextMessage(f"m{i}"), listener)
        producer.flush()
    assert listener.outcomes == [(f"m{i}", None) for i in range(300)]
    assert [m.text for m in take(factory, queue, 300)] == [f"m{i}" for i in range(300)]


def test_rabbitmq_refusing_a_send_of_a_window_misattributes_nothing(rabbitmq):
    """RabbitMQ answers a SEND to an exchange that does not exist with an ERROR that names
    no receipt (its receipts wait for publisher confirms, so it may come before those of
    earlier sends), then closes the connection. Which send it refused cannot be told: no
    send hears a refusal meant for another, the refused one is never confirmed, and every
    unanswered one hears a transport failure (retriable: a link moves such a window again
    one message at a time, where each refusal is its own); a send made after the close
    came fails at once with one."""
    factory = naming.lookup("ConnectionFactory", rabbitmq.stomp_env())
    queue = Queue(qname("w"))
    listener = Recorder()
    raised: dict[str, Exception] = {}
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(None)
        for text, dest in (("a", queue), ("b", queue), ("x", Queue("/exchange/no-such-exchange/k")), ("c", queue)):
            try:
                producer.send_async(TextMessage(text), listener, dest)
            except TransportException as exc:  # (the ERROR came before this send: a busy machine)
                raised[text] = exc
        producer.flush()
    assert "x" not in raised
    outcomes = dict(listener.outcomes) | raised
    assert sorted(outcomes) == ["a", "b", "c", "x"]
    assert isinstance(outcomes["x"], TransportException) and "no-such-exchange" in str(outcomes["x"])
    for text in "abc":
        assert outcomes[text] is None or isinstance(outcomes[text], TransportException)


def test_activemq_java_send_async_commits_a_window_at_once(activemq):
    factory = naming.lookup("ConnectionFactory", activemq.jndi())
    queue = Queue(qname("w"))
    listener = Recorder()
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(queue)
        for i in range(50):
            producer.send_async(TextMessage(f"m{i}"), listener)
        assert listener.outcomes == []  # in the local transaction, not committed yet
        assert take(factory, queue, 0, total=0.5) == []
        producer.flush()
    assert listener.outcomes == [(f"m{i}", None) for i in range(50)]
    assert [m.text for m in take(factory, queue, 50)] == [f"m{i}" for i in range(50)]


@pytest.mark.parametrize("provider", ["activemq-jms", "activemq-stomp", "rabbitmq-stomp"])
def test_a_link_with_a_window_moves_every_message_once_in_order(provider, request, tmp_path):
    server = request.getfixturevalue(provider.partition("-")[0])
    env = server.jndi() if provider == "activemq-jms" else server.stomp_env()
    factory = naming.lookup("ConnectionFactory", env)
    src, dst = qname("src"), qname("dst")
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(Queue(src))
        for i in range(1000):
            producer.send(TextMessage(f"m{i}"))
    link = (
        '<link name="l" transacted="false"><source connection-factory-ref="far" destination-ref="s"/>'
        '<target connection-factory-ref="far" destination-ref="d"/></link>'
    )
    xml = bridge_xml(
        "w",
        link,
        cf_xml("far", env),
        f'<destination ref-name="s" name="{src}"/><destination ref-name="d" name="{dst}"/>',
    )
    broker = Broker(tmp_path / "host")
    bridge = JMSBridge(
        parse_bridge_config(xml, "real.xml"),
        load_properties([], ["imq.bridge.w.link.window=64"], environ={}),
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        tuning=FAST,
    )
    try:
        assert bridge.start() is State.STARTED
        assert bridge.links[0].window == 64  # type: ignore[attr-defined]
        counters = bridge.links[0].counters
        wait_until(lambda: counters.transferred == 1000, timeout=120, what="1000 transferred")
        assert counters.to_dmq == 0
    finally:
        bridge.stop()
        broker.close()
    assert [m.text for m in take(factory, Queue(dst), 1000)] == [f"m{i}" for i in range(1000)]
    assert take(factory, Queue(src), 0, total=0.5) == []


def test_a_windowed_stomp_link_subscribes_with_three_windows_of_prefetch(rabbitmq, tmp_path):
    """The STOMP provider subscribes a windowed link's source with prefetch-count at least
    three windows (here 3 x 500, over the URL's 1000)."""
    env = rabbitmq.stomp_env()
    src, dst = qname("psrc"), qname("pdst")
    link = (
        '<link name="l" transacted="false"><source connection-factory-ref="far" destination-ref="s"/>'
        '<target connection-factory-ref="far" destination-ref="d"/><property name="window" value="500"/></link>'
    )
    xml = bridge_xml(
        "w",
        link,
        cf_xml("far", env),
        f'<destination ref-name="s" name="{src}"/><destination ref-name="d" name="{dst}"/>',
    )
    broker = Broker(tmp_path / "host")
    bridge = JMSBridge(
        parse_bridge_config(xml, "real.xml"), host_factory=lambda env: EmbeddedConnectionFactory(broker), tuning=FAST
    )
    try:
        assert bridge.start() is State.STARTED
        out = rabbitmq.ctl("list_consumers", "-q", "--no-table-headers", "queue_name", "prefetch_count")
        assert f"{src}\t1500" in out.splitlines()
    finally:
        bridge.stop()
        broker.close()
