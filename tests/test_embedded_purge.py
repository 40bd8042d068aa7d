"""Purging a destination of the embedded broker: every waiting message goes, in memory,
paged out to the store and swapped, while messages in delivery stay with their consumer
and survive a restart; a producer held by FLOW_CONTROL goes on once the purge made room."""

from __future__ import annotations

import threading

from bridgemgr.jms import AckMode, DeliveryMode, Queue, TextMessage, Topic
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.queues import LimitBehavior
from stores import open_at

Q = Queue("purged")


def started(broker: Broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    return conn


def put(conn, n: int, start: int = 0, dest=Q, mode=DeliveryMode.PERSISTENT) -> None:
    producer = conn.create_session().create_producer(dest)
    for i in range(start, start + n):
        producer.send(TextMessage(str(i)), delivery_mode=mode)


def test_purge_removes_paged_and_swapped_messages_and_keeps_those_in_delivery(store_spec):
    broker = open_at(store_spec, memory_window=5)
    conn = started(broker)
    put(conn, 40)
    put(conn, 10, 40, mode=DeliveryMode.NON_PERSISTENT)  # beyond the window: the swap file
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(Q)
    held = [consumer.receive(1), consumer.receive(1)]
    consumer.close()
    assert [m.text for m in held] == ["0", "1"]

    assert broker.purge(Q) == (48, 2)
    assert broker.purge(Queue("nosuch")) is None
    depth = broker.destinations()[f"queue:{Q.name}"]
    assert (depth["pending"], depth["unacked"]) == (0, 2) and 0 < depth["bytes"] < 2 * 500  # the 2 held
    put(conn, 3, 100)  # the queue goes on working
    assert broker.browse_queue(Q.name, 10) is not None
    assert [m.text for m in broker.browse_queue(Q.name, 10) or []] == ["100", "101", "102"]
    conn.close()  # the two in delivery come back ...
    broker.close()

    broker = open_at(store_spec, memory_window=5)  # ... and the purged ones are gone for good
    conn = started(broker)
    consumer = conn.create_session().create_consumer(Q)
    got = []
    while (m := consumer.receive(0.3)) is not None:
        got.append(m.text)
    assert sorted(got, key=int) == ["0", "1", "100", "101", "102"]
    conn.close()
    broker.close()


def test_purge_frees_room_for_a_producer_held_by_flow_control(tmp_path):
    broker = Broker(tmp_path)
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=3, limit_behavior=LimitBehavior.FLOW_CONTROL))
    conn = started(broker)
    put(conn, 3)
    done = threading.Event()

    def fourth() -> None:
        put(conn, 2, 3)
        done.set()

    threading.Thread(target=fourth, daemon=True).start()
    assert not done.wait(0.5)  # held
    assert broker.purge(Q) == (3, 0)
    assert done.wait(5)
    assert [m.text for m in broker.browse_queue(Q.name, 10) or []] == ["3", "4"]
    conn.close()
    broker.close()


def test_purging_a_topic_empties_its_durable_subscriptions(tmp_path):
    broker = Broker(tmp_path)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.client_id = "c1"
    topic = Topic("news")
    conn.create_session().create_durable_subscriber(topic, "s1").close()
    put(conn, 4, dest=topic)
    assert broker.purge(topic) == (4, 0)
    assert broker.destinations()["durable:c1:s1"]["pending"] == 0
    conn.close()
    broker.close()
