"""What the host broker counts per destination for /metrics, in process: the bytes of a
destination without a byte limit (persistent, non-persistent, paged to the store and the
swap file, after a restart) stay exact and come back to 0 when it empties; producers
count bound ones from creation and anonymous ones from their first send there, until
they close. (test_metrics_destinations.py scrapes the same over HTTP from a real serve.)"""

from __future__ import annotations

from bridgemgr.jms import DeliveryMode, Queue, TextMessage, codec
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

Q = Queue("counted")
BODY = "x" * 1000


def counts(broker: Broker, name: str = Q.name) -> dict[str, int]:
    return broker.metrics()["destinations"][("queue", name)]


def started(broker: Broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    return conn


def put(broker: Broker, n: int, mode: DeliveryMode) -> None:
    with started(broker) as conn:
        producer = conn.create_session().create_producer(Q)
        for _ in range(n):
            producer.send(TextMessage(BODY), delivery_mode=mode)


def take_all(broker: Broker) -> int:
    with started(broker) as conn:
        consumer = conn.create_session().create_consumer(Q)
        n = 0
        while consumer.receive(0.2) is not None:
            n += 1
        return n


def test_bytes_are_counted_without_a_byte_limit_and_return_to_zero(tmp_path):
    broker = Broker(tmp_path / "store", memory_window=5)  # most of them paged: store, swap file
    try:
        put(broker, 20, DeliveryMode.PERSISTENT)
        put(broker, 20, DeliveryMode.NON_PERSISTENT)
        encoded = len(codec.encode(TextMessage(BODY)))
        found = counts(broker)
        assert found["depth"] == 40
        assert 40 * 1000 < found["bytes"] < 40 * (encoded + 300), found
        assert broker.queues[Q.name].swapped > 0
        assert take_all(broker) == 40
        assert counts(broker)["bytes"] == 0
    finally:
        broker.close()


def test_messages_recovered_at_open_are_not_read_for_their_bytes_and_never_go_negative(tmp_path):
    broker = Broker(tmp_path / "store", memory_window=5)
    put(broker, 10, DeliveryMode.PERSISTENT)
    assert counts(broker)["bytes"] > 10 * 1000
    broker.close()
    broker = Broker(tmp_path / "store", memory_window=5)
    try:
        assert counts(broker) | {"bytes": 0} == counts(broker)  # not read at open (a table scan)
        put(broker, 3, DeliveryMode.PERSISTENT)  # new ones are counted
        assert 3 * 1000 < counts(broker)["bytes"] < 3 * 1300
        assert take_all(broker) == 13
        assert counts(broker)["bytes"] == 0
    finally:
        broker.close()


def test_producers_bound_from_creation_anonymous_from_their_first_send_until_close():
    broker = Broker(None)
    try:
        conn = started(broker)
        session = conn.create_session()
        bound = session.create_producer(Q)
        anonymous = session.create_producer()
        other = Queue("elsewhere")
        bound.send(TextMessage("creates the queue"))
        assert counts(broker)["producers"] == 1
        for _ in range(3):
            anonymous.send(TextMessage("a"), Q)
        anonymous.send(TextMessage("b"), other)
        assert counts(broker)["producers"] == 2
        assert counts(broker, other.name)["producers"] == 1
        anonymous.close()
        assert counts(broker)["producers"] == 1
        assert counts(broker, other.name)["producers"] == 0
        bound.close()
        again = session.create_producer()
        again.send(TextMessage("c"), Queue(Q.name))  # an equal destination, another object
        assert counts(broker)["producers"] == 1
        conn.close()  # closes its sessions and their producers
        assert counts(broker)["producers"] == 0
    finally:
        broker.close()
