"""A link's source backlog from RabbitMQ (the AMQP provider's consumer.backlog():
queue.declare passive's message-count plus what it prefetched and has not handed over),
asked at most every few seconds, as the link's info() (what /metrics and `list link -v`
show) reports it while the link is held by a full FLOW_CONTROL target; and what such a
held link's consumer prefetches from RabbitMQ (AMQP and STOMP) when its messages are big."""

from __future__ import annotations

import time
import uuid

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import TextMessage
from bridgemgr.jms.spi import AckMode
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.amqp import client as amqp
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.queues import LimitBehavior

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def connection(node, prefetch: int = 10):
    env = node.amqp_env()
    env["java.naming.provider.url"] += f"?prefetch={prefetch}"
    conn = naming.lookup("ConnectionFactory", env).create_connection()
    conn.start()
    return conn


def fill(conn, q: Queue, n: int) -> None:
    session = conn.create_session()
    producer = session.create_producer(q)
    for i in range(n):
        producer.send(TextMessage(str(i)))
    session.close()


def test_a_consumers_backlog_is_ready_plus_prefetched_and_cached(rabbitmq, monkeypatch):
    q = Queue(f"backlog.{uuid.uuid4().hex[:10]}")
    conn = connection(rabbitmq, prefetch=10)
    try:
        fill(conn, q, 50)
        consumer = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE).create_consumer(q)
        deadline = time.monotonic() + 10
        while consumer.inbox.qsize() < 10 and time.monotonic() < deadline:  # its prefetch arrived
            time.sleep(0.05)
        assert consumer.backlog() == 50
        for _ in range(4):
            assert consumer.receive(5) is not None
        fill(conn, q, 5)
        assert consumer.backlog() == 50  # the last answer, for BACKLOG_EVERY seconds
        monkeypatch.setattr(amqp, "BACKLOG_EVERY", 0.0)
        assert consumer.backlog() == 51  # 55 sent, 4 handed over (unacked: not waiting)
    finally:
        conn.close()


def link_xml(bridge: str, env: dict[str, str], src: str, dst: str) -> bytes:
    """Bridge ``bridge``: one non-transacted link from queue ``src`` of the provider
    ``env`` names (JNDI properties) to queue ``dst`` of the host broker."""
    props = "".join(f'<property name="{k}" value="{v}"/>' for k, v in env.items())
    return f"""<jmsbridge name="{bridge}">
      <link name="move" transacted="false"><source connection-factory-ref="far" destination-ref="src"/>
        <target connection-factory-ref="host" destination-ref="dst"/></link>
      <connection-factory ref-name="far" lookup-name="ConnectionFactory">{props}</connection-factory>
      <connection-factory ref-name="host"/>
      <destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>
    </jmsbridge>""".encode()


def test_a_held_links_backlog_comes_from_rabbitmq(rabbitmq, tmp_path):
    src, n = f"held.{uuid.uuid4().hex[:10]}", 200
    conn = connection(rabbitmq)
    fill(conn, Queue(src), n)
    conn.close()
    xml = link_xml("amqp", rabbitmq.amqp_env(), src, "held.dst")
    host = Broker(tmp_path / "host")
    host.configure_destination(
        Queue("held.dst"), DestinationLimits(max_num_msgs=20, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )
    bridge = JMSBridge(parse_bridge_config(xml, "amqp.xml"), host_factory=lambda env: EmbeddedConnectionFactory(host))
    try:
        assert bridge.start() is State.STARTED
        link = bridge.links[0]
        deadline = time.monotonic() + 60
        while host.queue_depth("held.dst") < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # held by the full target: nothing more is received
        received = link.counters.received
        assert 20 <= received < n
        info = link.info()
        assert info["backlog"] == n - received, (info["backlog"], received)
    finally:
        host.configure_destination(Queue("held.dst"), DestinationLimits())  # let it go, to stop
        bridge.stop()
        host.close()


@pytest.mark.parametrize("protocol, first_run", [("amqp", 0), ("stomp", 5)])
def test_a_held_links_prefetch_holds_three_byte_bounds(rabbitmq, tmp_path, protocol, first_run):
    """windowBytes=64k, the window and the URL's prefetch at their 1000, 16 KiB messages
    (4 fill 64k), a link held by a full target: it holds at most 3 x 4 of the 200 waiting,
    not all of them. AMQP from the link's first connection ever (it asks RabbitMQ for one
    message until the first shows its size, then for 12 on the open channel); STOMP
    after a restart (a bridge made again over the same folder, which kept the size from
    its first run of 5 messages). Everything arrives once, in order."""
    env = rabbitmq.amqp_env() if protocol == "amqp" else rabbitmq.stomp_env()
    src, n = f"bounded.{uuid.uuid4().hex[:10]}", 200
    bodies = [f"{i:03d}" + "y" * 16384 for i in range(first_run + n)]

    def fill(texts: list[str]) -> None:
        conn = naming.lookup("ConnectionFactory", env).create_connection()
        producer = conn.create_session().create_producer(Queue(src))
        for text in texts:
            producer.send(TextMessage(text))
        conn.close()

    xml = link_xml("far", env, src, "bounded.dst")
    host = Broker(tmp_path / "host")
    settings = load_properties(
        [], [f"imq.varhome={tmp_path / 'var'}", "imq.bridge.far.link.windowBytes=64k"], environ={}
    )

    def bridge() -> JMSBridge:
        return JMSBridge(
            parse_bridge_config(xml, "far.xml"), settings, host_factory=lambda env: EmbeddedConnectionFactory(host)
        )

    try:
        if first_run:  # the service's earlier run
            fill(bodies[:first_run])
            earlier = bridge()
            assert earlier.start() is State.STARTED
            deadline = time.monotonic() + 30
            while earlier.links[0].counters.transferred < first_run and time.monotonic() < deadline:
                time.sleep(0.05)
            earlier.stop()
        fill(bodies[first_run:])
        host.configure_destination(
            Queue("bounded.dst"), DestinationLimits(max_num_msgs=20, limit_behavior=LimitBehavior.FLOW_CONTROL)
        )
        held = bridge()
        try:
            assert held.start() is State.STARTED
            link = held.links[0]
            assert link.window == 1000
            deadline = time.monotonic() + 60
            while host.queue_depth("bounded.dst") < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # held by the full target: what the broker pushes meanwhile waits in the inbox
            consumer = link._consumer
            assert consumer is not None
            inbox = consumer.inbox if protocol == "amqp" else consumer.subscription.inbox
            assert inbox.qsize() <= 12, inbox.qsize()
            host.configure_destination(Queue("bounded.dst"), DestinationLimits())
            out = EmbeddedConnectionFactory(host).create_connection()
            out.start()
            receiver = out.create_session().create_consumer(Queue("bounded.dst"))
            got = [m.text for m in iter(lambda: receiver.receive(10), None)]
            out.close()
            assert [text[:3] for text in got] == [b[:3] for b in bodies]  # all, once, in order
        finally:
            host.configure_destination(Queue("bounded.dst"), DestinationLimits())  # let it go, to stop
            held.stop()
    finally:
        host.close()
