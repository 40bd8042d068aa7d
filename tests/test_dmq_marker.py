"""The DMQ marker: an HMAC over the DMQ properties the bridge sets and the body, with the
instance's key. It survives the trip through the host broker (in process and over mq://);
a missing marker, another key, or any change to a marked property or the body fails it;
the bridge's DMQ sender marks what it sends (test_servicekeys: the key)."""

from __future__ import annotations

import pytest

from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import ObjectMessage, TextMessage
from bridgemgr.jmsbridge import dmq as d
from bridgemgr.jmsbridge.pipeline import DMQReason
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from remote.support import Harness

KEY = bytes(range(32))


def letter(text: str = "order 1") -> d.DeadLetter:
    original = TextMessage(text)
    original.message_id = "ID:o-1"
    original.set_int_property("n", 1)
    return d.DeadLetter(original, DMQReason.SEND_FAILURE, "refused", "jb", "l1", "src", "dst", None, "p1", "p2")


def through(factory, message):
    """``message`` sent to a queue and received back from it."""
    conn = factory.create_connection()
    try:
        session = conn.create_session()
        session.create_producer(Queue("marked")).send(message)
        conn.start()
        return session.create_consumer(Queue("marked")).receive(5)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def broker():
    broker = Broker()
    yield broker
    broker.close()


def test_a_marked_message_verifies_after_the_broker_in_process_and_over_mq(broker):
    dead = d.dmq_message(letter(), letter().original, 1_700_000_000_000, KEY)
    assert d.verify_marker(dead, KEY)
    assert d.verify_marker(through(EmbeddedConnectionFactory(broker), dead), KEY)
    with Harness(broker) as harness:
        assert d.verify_marker(through(harness.factory(), dead), KEY)


def test_a_message_without_the_right_marker_fails(broker):
    unmarked = d.dmq_message(letter(), letter().original, 1_700_000_000_000)
    assert not d.verify_marker(unmarked, KEY)
    other_key = d.dmq_message(letter(), letter().original, 1_700_000_000_000, b"k" * 32)
    assert not d.verify_marker(other_key, KEY)
    assert not d.verify_marker(d.dmq_message(letter(), letter().original, 1, KEY), None)
    # a real marker copied onto changed content
    real = d.dmq_message(letter(), letter().original, 1_700_000_000_000, KEY)
    for change in (
        lambda m: m.set_string_property(d.TARGET_DESTINATION, "elsewhere"),
        lambda m: m.set_string_property(d.DMQ_REASON, "MESSAGE_EXPIRED"),
        lambda m: setattr(m, "object", TextMessage("order 2")),
    ):
        forged = d.dmq_message(letter(), letter().original, 1_700_000_000_000, KEY)
        change(forged)
        assert forged.get_string_property(d.DMQ_MARKER) == real.get_string_property(d.DMQ_MARKER)
        assert not d.verify_marker(forged, KEY)


def test_a_truncated_body_is_marked_too():
    unencodable = ObjectMessage(object())
    dead = d.dmq_message(
        d.DeadLetter(unencodable, DMQReason.TRANSFORM_FAILURE, None, "jb", "l1", "src", "dst", None, "p1", "p2"),
        unencodable,
        5,
        KEY,
    )
    assert dead.get_string_property(d.BODY_TRUNCATED) == "true" and d.verify_marker(dead, KEY)
