"""A link's source backlog from RabbitMQ (the AMQP provider's consumer.backlog():
queue.declare passive's message-count plus what it prefetched and has not handed over),
asked at most every few seconds, as the link's info() (what /metrics and `list link -v`
show) reports it while the link is held by a full FLOW_CONTROL target."""

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


def test_a_held_links_backlog_comes_from_rabbitmq(rabbitmq, tmp_path):
    src, n = f"held.{uuid.uuid4().hex[:10]}", 200
    conn = connection(rabbitmq)
    fill(conn, Queue(src), n)
    conn.close()
    props = "".join(f'<property name="{k}" value="{v}"/>' for k, v in rabbitmq.amqp_env().items())
    xml = f"""<jmsbridge name="amqp">
      <link name="move" transacted="false"><source connection-factory-ref="rmq" destination-ref="src"/>
        <target connection-factory-ref="host" destination-ref="dst"/></link>
      <connection-factory ref-name="rmq" lookup-name="ConnectionFactory">{props}</connection-factory>
      <connection-factory ref-name="host"/>
      <destination ref-name="src" name="{src}"/><destination ref-name="dst" name="held.dst"/>
    </jmsbridge>""".encode()
    host = Broker(tmp_path / "host")
    host.configure_destination(Queue("held.dst"), DestinationLimits(
        max_num_msgs=20, limit_behavior=LimitBehavior.FLOW_CONTROL))
    bridge = JMSBridge(parse_bridge_config(xml, "amqp.xml"),
                       host_factory=lambda env: EmbeddedConnectionFactory(host))
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
