"""Pacing over real sockets: a STOMP producer to a queue whose consumers are taking waits
while more than PACE_HIGH messages wait for them (so persistent messages are consumed
before their store batch is cut); without consumers, with consumers that stopped
taking or that take by a selector, and on topics, producers are not held and the queue
pages as before."""

from __future__ import annotations

import threading
import time

import pytest

from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.queues import PACE_HIGH
from bridgemgr.stompbridge.frames import Frame, encode_frame
from stomp_support import Raw, make_bridge, make_users, qname

BODY = b"x" * 1024


@pytest.fixture(scope="module")
def netloop():
    with NetLoop("stomp-pacing-loop") as loop:
        yield loop


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("broker") / "store", sync=True)  # as the service runs it
    yield b
    b.close()


@pytest.fixture(scope="module")
def bridge(netloop, broker, tmp_path_factory):
    b = make_bridge(netloop, broker, make_users(tmp_path_factory.mktemp("users")))
    yield b
    b.stop()


def sends(queue: str, count: int) -> bytes:
    """``count`` persistent SENDs of 1 KiB, a receipt asked on the last."""
    frames = [
        encode_frame(
            Frame(
                "SEND",
                {
                    "destination": f"/queue/{queue}",
                    "persistent": "true",
                    "content-length": str(len(BODY)),
                    **({"receipt": "last"} if i == count - 1 else {}),
                },
                BODY,
            ),
            "1.2",
        )
        for i in range(count)
    ]
    return b"".join(frames)


def flooding_producer(port: int) -> Raw:
    """A connected producer whose one sendall of a whole flood may take up to a minute:
    paced to a slow consumer on a loaded machine it takes longer than Raw's 5 s (a
    socket timeout bounds the whole sendall)."""
    producer = Raw(port)
    producer.connect()
    producer.sock.settimeout(60)
    return producer


class DepthWatch:
    """The deepest a queue's backlog got, sampled every millisecond until stopped."""

    def __init__(self, broker: Broker, queue: str) -> None:
        self.broker, self.queue, self.deepest = broker, queue, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.deepest = max(self.deepest, self.broker.queue_depth(self.queue))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.deepest


def slow_reader(raw: Raw, stop: threading.Event) -> threading.Thread:
    """Read ``raw``'s socket a little at a time: a consumer slower than the producer."""

    def run() -> None:
        while not stop.is_set() and not raw.closed:
            raw._read(0.05)
            time.sleep(0.002)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_producer_is_paced_to_a_slower_ack_auto_consumer(bridge, broker):
    queue, count = qname("paced"), 6000
    consumer = Raw(bridge.tcp_port, rcvbuf=16384)
    consumer.connect()
    consumer.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "auto", "receipt": "subscribed"})
    consumer.wait(lambda f: f.command == "RECEIPT")
    stop = threading.Event()
    reader = slow_reader(consumer, stop)
    producer = flooding_producer(bridge.tcp_port)
    rows = broker.store.stats()["rows"]
    watch = DepthWatch(broker, queue)
    try:
        producer.send(sends(queue, count))
        producer.wait(lambda f: f.command == "RECEIPT", timeout=60)
        deadline = time.monotonic() + 60
        while sum(f.command == "MESSAGE" for f in consumer.frames) < count and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        deepest = watch.stop()
        stop.set()
        reader.join()
        producer.close()
        consumer.close()
    assert sum(f.command == "MESSAGE" for f in consumer.frames) == count
    # held once its consumers were PACE_HIGH behind (unpaced: thousands waited)
    assert deepest <= PACE_HIGH + 1, deepest
    broker.store.flush()
    assert broker.store.stats()["rows"] - rows < 2 * count  # some consumed before their batch


@pytest.mark.slow
def test_a_producer_without_consumers_is_not_paced(bridge, broker):
    queue, count = qname("unpaced"), 3000
    producer = flooding_producer(bridge.tcp_port)
    started = time.monotonic()
    producer.send(sends(queue, count))
    producer.wait(lambda f: f.command == "RECEIPT", timeout=30)
    producer.close()
    assert broker.queue_depth(queue) == count
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_a_producer_is_not_held_by_consumers_that_stopped_taking(bridge, broker):
    """A client-ack subscription that never acknowledges takes its consumerFlowLimit
    (1000) and stops: the producer is held for at most PACE_STALL, then pages as before."""
    queue, count = qname("stalled"), 4000
    consumer = Raw(bridge.tcp_port)
    consumer.connect()
    consumer.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "client", "receipt": "subscribed"})
    consumer.wait(lambda f: f.command == "RECEIPT")
    producer = flooding_producer(bridge.tcp_port)
    producer.send(sends(queue, count))
    producer.wait(lambda f: f.command == "RECEIPT", timeout=30)
    assert broker.queue_depth(queue) == count - 1000
    producer.close()
    consumer.close()


def test_consumers_with_selectors_do_not_pace_producers(tmp_path):
    """A consumer whose selector matches none of the backlog keeps polling (receive with
    a timeout) and taking the few it wants: the producer is never held, since that
    backlog would never shrink."""
    from bridgemgr.jms.destination import Queue
    from bridgemgr.jms.hostbroker import Principal
    from bridgemgr.jms.message import TextMessage
    from bridgemgr.providers.embedded.host import EmbeddedHostBroker

    admin, queue = Principal("admin"), Queue("selected")
    b = Broker(tmp_path / "store")
    try:
        host = EmbeddedHostBroker(b)
        consumer = host.subscribe(admin, host.connect(admin), queue, selector="wanted = 'yes'")
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                delivery = host.receive(admin, consumer, 0.005)
                if delivery is not None:
                    host.acknowledge(admin, [delivery])

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        producer = host.connect(admin)
        try:
            for i in range(PACE_HIGH * 2):
                m = TextMessage(f"m{i}")
                m.set_string_property("wanted", "yes" if i % 100 == 0 else "no")
                host.send(admin, producer, m, queue)  # ProducerFlowControl if held
                if i % 50 == 0:
                    time.sleep(0.01)  # the poller takes and waits meanwhile
        finally:
            stop.set()
            poller.join()
        assert b.queue_depth("selected") == PACE_HIGH * 2 - 6
    finally:
        b.close()


def test_topic_publishers_are_not_paced_to_a_slow_subscriber(tmp_path):
    """A topic's subscriptions fill and page as before: one slow subscriber does not
    hold the publishers the other subscribers read."""
    from bridgemgr.jms.destination import Topic
    from bridgemgr.jms.hostbroker import Principal
    from bridgemgr.jms.message import TextMessage
    from bridgemgr.providers.embedded.host import EmbeddedHostBroker

    admin, topic = Principal("admin"), Topic("fanned")
    b = Broker(tmp_path / "store")
    try:
        host = EmbeddedHostBroker(b)
        consumer = host.subscribe(admin, host.connect(admin), topic)
        stop = threading.Event()

        def slow() -> None:
            while not stop.is_set():
                delivery = host.receive(admin, consumer, 0.005)
                if delivery is not None:
                    host.acknowledge(admin, [delivery])
                    time.sleep(0.002)

        reader = threading.Thread(target=slow, daemon=True)
        reader.start()
        producer = host.connect(admin)
        try:
            for i in range(PACE_HIGH * 3):
                host.send(admin, producer, TextMessage(f"m{i}"), topic)  # ProducerFlowControl if held
                if i == 10:
                    time.sleep(0.05)  # the subscriber is taking
        finally:
            stop.set()
            reader.join()
    finally:
        b.close()
