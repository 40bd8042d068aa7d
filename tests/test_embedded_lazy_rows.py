"""Lazy rows: a persistent text or bytes message sent outside a transaction (here
through the HostBroker, as the STOMP bridge sends) is encoded for the store only if its
row is still pending when its batch is cut, or when the broker pages it out; one
consumed before is never encoded. What is written reads back the same after a restart,
a message whose headers cannot be encoded is still refused at send, and the snapshot a
writer may be encoding is never handed to an application."""

from __future__ import annotations

import pytest

from bridgemgr.jms import codec
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import MessageFormatException
from bridgemgr.jms.hostbroker import Principal
from bridgemgr.jms.message import BytesMessage, DeliveryMode, TextMessage
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker

ADMIN = Principal("admin")
QUEUE = Queue("lazy")


def message(i: int, kind: type = TextMessage) -> TextMessage | BytesMessage:
    m = TextMessage(f"body {i}") if kind is TextMessage else BytesMessage(b"body %d" % i)
    m.delivery_mode = DeliveryMode.PERSISTENT
    m.set_string_property("n", str(i))
    return m


@pytest.fixture
def encodes(monkeypatch):
    """Messages codec.encode was asked to encode."""
    seen: list[object] = []
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda m: (seen.append(m), encode(m))[1])
    return seen


def test_a_message_consumed_before_its_batch_is_cut_is_never_encoded(tmp_path, encodes):
    broker = Broker(tmp_path / "store", sync=True)  # batches linger 0.5 s: none is cut here
    try:
        host = EmbeddedHostBroker(broker)
        producer, client = host.connect(ADMIN), host.connect(ADMIN)
        consumer = host.subscribe(ADMIN, client, QUEUE)
        for i in range(20):
            host.send(ADMIN, producer, message(i, TextMessage if i % 2 else BytesMessage), QUEUE)
        taken = [host.receive(ADMIN, consumer, 1) for _ in range(20)]
        host.acknowledge(ADMIN, taken)
        broker.store.flush()
        assert encodes == []
        assert broker.store.stats()["rows"] == 0
        with broker.lock:
            assert broker.queues["lazy"].bytes == 0
    finally:
        broker.close()


@pytest.mark.parametrize("window", [1000, 2])  # in memory; all but two paged out
def test_rows_pending_at_the_cut_are_written_and_read_back_after_a_restart(tmp_path, window):
    broker = Broker(tmp_path / "store", sync=True, memory_window=window)
    host = EmbeddedHostBroker(broker)
    producer = host.connect(ADMIN)
    for i in range(10):
        host.wait_durable(ADMIN, host.send(ADMIN, producer, message(i, TextMessage if i % 2 else BytesMessage), QUEUE))
    with broker.lock:
        assert broker.queues["lazy"].bytes > 0
    broker.close()
    broker = Broker(tmp_path / "store", sync=True, memory_window=window)
    try:
        host = EmbeddedHostBroker(broker)
        consumer = host.subscribe(ADMIN, host.connect(ADMIN), QUEUE)
        taken = [host.receive(ADMIN, consumer, 1) for _ in range(10)]
        assert [d.message.get_string_property("n") for d in taken] == [str(i) for i in range(10)]
        assert [type(d.message) for d in taken] == [TextMessage if i % 2 else BytesMessage for i in range(10)]
        assert taken[3].message.get_body() == "body 3" and taken[4].message.get_body() == b"body 4"
        host.acknowledge(ADMIN, taken)
        with broker.lock:
            assert broker.queues["lazy"].bytes == 0
    finally:
        broker.close()


def test_paged_out_lazy_rows_keep_the_byte_count_true(tmp_path):
    """A message routed lazily counts an estimated size; paged out, it is encoded and
    counts what it pages back in with, so consuming everything leaves zero bytes."""
    broker = Broker(tmp_path / "store", sync=True, memory_window=3)
    try:
        host = EmbeddedHostBroker(broker)
        producer, client = host.connect(ADMIN), host.connect(ADMIN)
        for i in range(12):
            host.send(ADMIN, producer, message(i), QUEUE)
        consumer = host.subscribe(ADMIN, client, QUEUE)
        taken = [host.receive(ADMIN, consumer, 1) for _ in range(12)]
        assert [d.message.get_string_property("n") for d in taken] == [str(i) for i in range(12)]
        host.acknowledge(ADMIN, taken)
        with broker.lock:
            assert broker.queues["lazy"].bytes == 0
    finally:
        broker.close()


def test_a_message_whose_headers_cannot_be_encoded_is_refused_at_send(tmp_path):
    broker = Broker(tmp_path / "store", sync=True)
    try:
        host = EmbeddedHostBroker(broker)
        bad = message(1)
        bad.correlation_id = 5  # type: ignore[assignment]  # what a careless transformer might set
        with pytest.raises(MessageFormatException, match="correlation_id=5"):
            host.send(ADMIN, host.connect(ADMIN), bad, QUEUE)
        assert broker.queue_depth("lazy") == 0
        broker.store.flush()
        assert broker.store.problem() is None
    finally:
        broker.close()


def test_an_auto_acknowledged_delivery_does_not_hand_out_a_row_being_encoded(tmp_path):
    """The writer cut a batch holding a lazy row (it encodes it outside the lock); an
    AUTO_ACKNOWLEDGE consumer takes the message meanwhile and changes a header: the
    store encodes the broker's snapshot, not the application's message."""
    from bridgemgr.jms.spi import AckMode
    from bridgemgr.providers.embedded import EmbeddedConnectionFactory

    broker = Broker(tmp_path / "store", sync=True)
    try:
        host = EmbeddedHostBroker(broker)
        host.send(ADMIN, host.connect(ADMIN), message(1), QUEUE)
        store = broker.store
        with store.lock:
            claim = store._take()  # the batch is cut; its write has not begun
        conn = EmbeddedConnectionFactory(broker).create_connection()
        conn.start()
        got = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE).create_consumer(QUEUE).receive(1)
        got.correlation_id = 5  # type: ignore[assignment]  # the application's to change
        assert store._commit(claim), store.problem()
        conn.close()
    finally:
        broker.close()
