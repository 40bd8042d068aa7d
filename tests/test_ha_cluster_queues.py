"""Cluster-wide queues of an HA cluster (docs/ha.md): instances of one cluster on a real
PostgreSQL server serve the same queues; a message sent to one reaches a consumer on
another, once (providers/embedded/clusterdst.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import Queue
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@dataclass
class Member:
    brokerid: str
    host: Any
    queues: Any
    cluster: Any

    def connection(self, stack: ExitStack) -> Any:
        conn = self.host.connection_factory().create_connection()
        stack.callback(conn.close)
        conn.start()
        return conn


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster
    from bridgemgr.providers.embedded.clusterdst import open_cluster_queues
    from bridgemgr.providers.embedded.host import open_host_broker

    database = postgresql.create_database("cq" + uuid.uuid4().hex[:10])
    clusterid = "c" + uuid.uuid4().hex[:8]

    with ExitStack() as stack:

        def start(brokerid: str) -> Member:
            props = load_properties(
                [],
                [
                    f"imq.varhome={tmp_path / brokerid}",
                    f"imq.instancename={brokerid}",
                    "imq.cluster.ha=true",
                    f"imq.cluster.clusterid={clusterid}",
                    f"imq.brokerid={brokerid}",
                    "imq.persist.store=jdbc",
                    f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
                ],
                environ={},
            )
            cluster = open_cluster(props, brokerid, {})
            stack.callback(cluster.leave)
            host = open_host_broker(props)
            stack.callback(host.close)
            cluster.attach(host)
            queues = open_cluster_queues(cluster, host)
            stack.callback(queues.stop)
            return Member(brokerid, host, queues, cluster)

        yield start, stack


def texts_of(consumer: Any, into: list[str], count: int, timeout: float) -> None:
    def more() -> bool:
        message = consumer.receive(0.05)
        if message is not None:
            into.append(message.text)
        return len(into) >= count

    wait_for(more, timeout, f"{count} messages")


def test_a_message_sent_to_one_instance_reaches_a_consumer_on_another_once(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    consumer = b2.connection(stack).create_session().create_consumer(Queue("orders"))
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("orders"))
    sent = [f"m{i}" for i in range(50)]
    for text in sent:
        producer.send(session.create_text_message(text))
    got: list[str] = []
    texts_of(consumer, got, len(sent), 20)
    quiet_for(lambda: len(got) + (1 if consumer.receive(0.05) else 0), 1.0, 10)
    assert got == sent
    assert b1.queues.handed_off == 50 and b2.queues.taken_in == 50
