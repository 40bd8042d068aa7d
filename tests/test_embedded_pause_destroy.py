"""Pausing, resuming and destroying destinations of the embedded broker (imqcmd's pause,
resume and destroy dst): a paused-CONSUMERS queue or topic delivers nothing to existing
or new consumers while its messages stay stored, paused PRODUCERS hold sends (plain,
transacted, batched) without losing one, resume lets everything go on; destroy removes a
destination with its messages (a topic: its durable subscriptions) for good, in SQLite and
PostgreSQL, and refuses one in use, the DMQ and unknown names; list_destinations lists
topics too."""

from __future__ import annotations

import threading

import pytest

from bridgemgr.jms import (
    AckMode,
    DeliveryMode,
    IllegalStateException,
    InvalidDestinationException,
    Queue,
    TextMessage,
    Topic,
)
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from stores import open_at
from waiting import quiet_for, wait_for

Q = Queue("orders")
T = Topic("news")


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    yield b
    b.close()


def started(broker: Broker, client_id: str | None = None):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    if client_id:
        conn.client_id = client_id
    conn.start()
    return conn


def put(conn, n: int, dest=Q, start: int = 0) -> None:
    producer = conn.create_session().create_producer(dest)
    for i in range(start, start + n):
        producer.send(TextMessage(str(i)), delivery_mode=DeliveryMode.PERSISTENT)


def drain(consumer, timeout: float = 0.05) -> list[str]:
    got = []
    while (m := consumer.receive(timeout)) is not None:
        got.append(m.text)
    return got


def pending(broker: Broker, dest=Q) -> int:
    found = broker.describe_destination(dest)
    assert found is not None
    return found[1]["pending"]


def state(broker: Broker, dest=Q) -> str:
    return {d.name: s for d, _, _, s in broker.list_destinations()}[dest.name]


@pytest.mark.slow
def test_paused_consumers_get_nothing_until_resume_and_no_message_is_lost(broker):
    conn = started(broker)
    put(conn, 5)
    before = conn.create_session().create_consumer(Q)
    assert [d.name for d, s in broker.pause_destinations(Q, "CONSUMERS", True) or []] == [Q.name]
    assert state(broker) == "CONSUMERS_PAUSED"
    assert before.receive(0.05) is None  # an existing consumer ...
    after = conn.create_session().create_consumer(Q)
    assert after.receive(0.05) is None  # ... and a new one get nothing
    put(conn, 5, start=5)  # producers go on
    assert pending(broker) == 10
    got: list[str] = []
    waiting = threading.Thread(target=lambda: got.append(before.receive(10).text))  # type: ignore[union-attr]
    waiting.start()  # blocked in receive() across the resume
    assert quiet_for(lambda: got, 0.05) == []
    assert broker.pause_destinations(Q, "ALL", False) == [(Q, "RUNNING")]
    wait_for(lambda: got, timeout=3, what="the resume wakes the consumer waiting in receive()")
    waiting.join(10)
    got += drain(before) + drain(after)
    assert sorted(got, key=int) == [str(i) for i in range(10)]
    assert pending(broker) == 0
    conn.close()


@pytest.mark.slow
def test_paused_producers_wait_and_every_send_arrives_after_resume(broker):
    conn = started(broker)
    assert broker.pause_destinations(Q, "PRODUCERS", True) is None  # no such queue yet
    consumer = conn.create_session().create_consumer(Q)
    broker.pause_destinations(Q, "PRODUCERS", True)
    assert state(broker) == "PRODUCERS_PAUSED"
    sent = threading.Thread(target=put, args=(conn, 20))
    sent.start()
    assert wait_for(lambda: broker.describe_destination(Q)[1]["producers_waiting"] == 1)  # type: ignore[index]
    assert sent.is_alive() and pending(broker) == 0  # held, not refused
    transacted = conn.create_session(transacted=True)
    tx_sent = threading.Thread(
        target=lambda: (transacted.create_producer(Q).send(TextMessage("tx")), transacted.commit())
    )
    tx_sent.start()
    wait_for(lambda: broker.describe_destination(Q)[1]["producers_waiting"] == 2)  # type: ignore[index]
    broker.pause_destinations(None, "PRODUCERS", False)  # every destination
    sent.join(10)
    tx_sent.join(10)
    assert not sent.is_alive() and not tx_sent.is_alive()
    got = drain(consumer, 0.2)
    assert sorted(got) == sorted([str(i) for i in range(20)] + ["tx"])
    conn.close()


@pytest.mark.slow
def test_a_paused_topic_holds_every_subscription_and_a_pause_is_not_kept_across_restart(tmp_path):
    broker = Broker(tmp_path)
    conn = started(broker, "c1")
    durable = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE).create_durable_subscriber(T, "s1")
    plain = conn.create_session().create_consumer(T)
    other = started(broker)
    broker.pause_destinations(T, "CONSUMERS", True)
    put(other, 3, T)
    assert durable.receive(0.05) is None and plain.receive(0.05) is None
    found = broker.describe_destination(T)
    assert found is not None and found[1]["pending"] == 6  # 3 for each subscription, kept
    assert found[1]["subscriptions"] == 2 and found[1]["durable_subscriptions"] == 1
    broker.pause_destinations(T, "PRODUCERS", True)
    assert state(broker, T) == "PAUSED"
    conn.close()
    other.close()
    broker.close()

    broker = Broker(tmp_path)  # a restart resumes (as the original's does); nothing lost
    assert state(broker, T) == "RUNNING"
    conn = started(broker, "c1")
    durable = conn.create_session().create_durable_subscriber(T, "s1")
    assert drain(durable) == ["0", "1", "2"]
    conn.close()
    broker.close()


def test_destroy_removes_a_queue_and_its_messages_for_good_and_refuses_one_in_use(store_spec):
    broker = open_at(store_spec)
    conn = started(broker)
    put(conn, 7)
    consumer = conn.create_session().create_consumer(Q)
    with pytest.raises(IllegalStateException, match="1 active consumer"):
        broker.destroy(Q)
    consumer.close()
    broker.pause_destinations(Q, "PRODUCERS", True)
    assert broker.destroy(Q) == 7
    assert broker.describe_destination(Q) is None
    assert broker.destroy(Q) is None and broker.destroy(Topic("nosuch")) is None
    with pytest.raises(InvalidDestinationException, match=r"mq\.sys\.dmq cannot be destroyed"):
        broker.destroy(Queue("mq.sys.dmq"))
    put(conn, 1, start=100)  # auto-created afresh, not paused: the pause went with it
    assert pending(broker) == 1 and state(broker) == "RUNNING"
    conn.close()
    broker.close()

    broker = open_at(store_spec)
    conn = started(broker)
    assert drain(conn.create_session().create_consumer(Q)) == ["100"]  # the 7 are gone
    conn.close()
    broker.close()


def test_destroy_of_a_topic_takes_its_durable_subscriptions(store_spec):
    broker = open_at(store_spec)
    conn = started(broker, "c1")
    conn.create_session().create_durable_subscriber(T, "s1").close()
    put(conn, 4, T)
    listed = {(d.name, d.is_topic): counts for d, _, counts, _ in broker.list_destinations(queues=False)}
    assert listed == {("news", True): listed[("news", True)]} and listed[("news", True)]["pending"] == 4
    assert broker.destroy(T) == 4
    assert ("c1", "s1") not in broker.durable and broker.describe_destination(T) is None
    conn.close()
    broker.close()
    broker = open_at(store_spec)
    assert ("c1", "s1") not in broker.durable and broker.describe_destination(T) is None
    broker.close()


@pytest.mark.slow
def test_a_producer_held_by_a_pause_keeps_its_place_quietly(broker):
    """While paused nothing trickles in: the count stays 0 for a while, then all arrive."""
    conn = started(broker)
    put(conn, 1)
    broker.pause_destinations(Q, "ALL", True)
    sent = threading.Thread(target=put, args=(conn, 3, Q, 1))
    sent.start()
    assert quiet_for(lambda: pending(broker), 0.1) == 1
    broker.pause_destinations(Q, "ALL", False)
    sent.join(10)
    assert pending(broker) == 4
    conn.close()


def test_destroy_refuses_a_queue_with_messages_in_delivery_and_keeps_them(broker):
    conn = started(broker)
    put(conn, 2)
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(Q)
    assert consumer.receive(1).text == "0"  # type: ignore[union-attr]
    consumer.close()  # the message stays in the session's transaction
    with pytest.raises(IllegalStateException, match="1 message"):
        broker.destroy(Q)
    assert pending(broker) == 1
    session.rollback()
    assert broker.destroy(Q) == 2
    conn.close()
