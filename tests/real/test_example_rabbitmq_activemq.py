"""examples/rabbitmq-activemq/ run as shipped, against a real RabbitMQ node and a real
ActiveMQ Classic broker: only the two brokers' addresses are changed to the test servers'
free ports, and `serve -props` runs it. 300 messages a plain AMQP client (pika) publishes
to RabbitMQ's queue orders arrive, each once, at ActiveMQ's queue orders.from-rabbitmq
(read by a STOMP client), and RabbitMQ's queue is left empty."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pika
import pytest
from test_bridges import take  # AUTO_ACKNOWLEDGE: ActiveMQ pages a STOMP consumer as it acks

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from service_support import Daemon
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rabbitmq-activemq"
XML = "rabbitmq-activemq-bridge.xml"
COUNT = 300


def test_the_example_bridges_rabbitmq_to_activemq(rabbitmq, activemq, tmp_path):
    folder = tmp_path / "example"
    shutil.copytree(EXAMPLE, folder)
    xml = (folder / XML).read_text()
    for shipped, here in (
        ("127.0.0.1:5672/", f"127.0.0.1:{rabbitmq.amqp_port}/"),
        ("tcp://127.0.0.1:61616?", f"{activemq.url}?"),
    ):
        assert xml.count(shipped) == 1, shipped
        xml = xml.replace(shipped, here)
    (folder / XML).write_text(xml)
    daemon = Daemon(
        folder / "broker.properties", "-D", f"imq.varhome={tmp_path / 'var'}", "-D", "imq.portmapper.port=0"
    )
    try:
        assert daemon.bridges == {"rabbit2amq": "STARTED"}, daemon.lines
        url = f"amqp://guest:guest@127.0.0.1:{rabbitmq.amqp_port}/%2F"
        with pika.BlockingConnection(pika.URLParameters(url)) as producer:
            channel = producer.channel()
            channel.queue_declare("orders", durable=True)  # as the link declared it
            channel.confirm_delivery()
            for i in range(COUNT):
                channel.basic_publish(
                    "",
                    "orders",
                    f"order {i}".encode(),
                    pika.BasicProperties(content_type="text/plain", delivery_mode=2, headers={"n": i}),
                )
        got = take(naming.lookup("ConnectionFactory", activemq.stomp_env()), Queue("orders.from-rabbitmq"), COUNT)

        def left() -> int:
            with pika.BlockingConnection(pika.URLParameters(url)) as conn:
                return conn.channel().queue_declare("orders", durable=True, passive=True).method.message_count

        wait_for(lambda: left() == 0, 30, "RabbitMQ's queue orders empty")
    finally:
        daemon.stop()
    counts = Counter(m.text for m in got)
    assert set(counts) == {f"order {i}" for i in range(COUNT)}
    assert sum(counts.values()) == COUNT  # each once on a clean run
    assert daemon.proc.returncode == 0, daemon.lines
