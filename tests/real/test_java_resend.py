"""A transacted session sending a message it delivered (the local-transaction link's unit)
sends the Java message itself, not a conversion of ours: the target gets exactly what the
converting path gives it, field by field, and anything the conversion would change
(dropped or provider-set properties, a changed header, a non-text/bytes body, a cleared
body) still converts."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import BytesMessage, MapMessage, Message, TextMessage
from bridgemgr.jms.spi import AckMode
from bridgemgr.providers.java import client

pytest.importorskip("jpype")
pytestmark = pytest.mark.timeout(120)

FIELDS = ("correlation_id", "type", "reply_to", "delivery_mode", "priority", "redelivered", "delivery_count")


@pytest.fixture(scope="module")
def cf(activemq):
    return naming.lookup("ConnectionFactory", activemq.jndi())


@pytest.fixture
def conversions(monkeypatch) -> list[Message]:
    """The messages the Java provider converted to Java messages to send them."""
    made: list[Message] = []
    to_java = client.to_java

    def counted(msg: Message, *args: Any) -> Any:
        made.append(msg)
        return to_java(msg, *args)

    monkeypatch.setattr(client, "to_java", counted)
    return made


def originals() -> list[Message]:
    text = TextMessage("hello ünïcode")
    data = BytesMessage(bytes(range(256)) * 4)
    empty = TextMessage(None)
    for i, msg in enumerate((text, data, empty)):
        msg.correlation_id = f"corr-{i}"
        msg.type = "kind"
        msg.reply_to = Queue("replies")
        msg.set_string_property("s", "v")
        msg.set_int_property("i", 7)
        msg.set_long_property("l", 1 << 40)
        msg.set_double_property("d", 0.5)
        msg.set_boolean_property("b", True)
        msg.set_string_property("JMSXGroupID", "g")
    return [text, data, empty]


def move(cf, src: str, dst: str, convert: bool) -> None:
    """One transacted session takes each message from src and sends it to dst (priority
    and time to live of a link's send); ``convert`` sends a writable copy instead, which
    always converts."""
    with cf.create_connection() as conn:
        conn.start()
        session = conn.create_session(True, AckMode.SESSION_TRANSACTED)
        consumer = session.create_consumer(Queue(src))
        producer = session.create_producer(None)
        while (msg := consumer.receive(2)) is not None:
            out = msg.copy() if convert else msg
            producer.send(out, Queue(dst), delivery_mode=msg.delivery_mode, priority=6, time_to_live=60_000)
            session.commit()


def received(cf, queue: str, n: int) -> list[Message]:
    with cf.create_connection() as conn:
        conn.start()
        session = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        consumer = session.create_consumer(Queue(queue))
        got = [consumer.receive(5) for _ in range(n)]
        assert consumer.receive(0.2) is None
    assert all(m is not None for m in got)
    return got  # type: ignore[return-value]


def preload(cf, queue: str, messages: list[Message]) -> None:
    with cf.create_connection() as conn:
        session = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        producer = session.create_producer(Queue(queue))
        for msg in messages:
            producer.send(msg)


def test_a_delivered_message_is_sent_as_the_converting_path_sends_it(cf, conversions):
    run = uuid.uuid4().hex[:8]
    for way in ("resend", "convert"):
        preload(cf, f"{way}.{run}.src", originals())
    conversions.clear()
    move(cf, f"resend.{run}.src", f"resend.{run}.dst", convert=False)
    assert conversions == []  # no conversion back: the delivered Java messages went
    move(cf, f"convert.{run}.src", f"convert.{run}.dst", convert=True)
    assert len(conversions) == 3
    resent = received(cf, f"resend.{run}.dst", 3)
    converted = received(cf, f"convert.{run}.dst", 3)
    for a, b in zip(resent, converted):
        assert type(a) is type(b)
        assert a.get_body() == b.get_body()
        assert {n: (t, v) for n, t, v in a.typed_properties()} == {n: (t, v) for n, t, v in b.typed_properties()}
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), name
        assert a.destination == Queue(f"resend.{run}.dst")
        assert a.message_id != b.message_id and a.message_id is not None
        # time to live from the send, not the original's (which had none)
        assert 0 < a.expiration - a.timestamp <= 60_000
        assert 0 < b.expiration - b.timestamp <= 60_000


def test_what_the_conversion_would_change_still_converts(cf, conversions):
    run = uuid.uuid4().hex[:8]
    changed = TextMessage("header changed after delivery")
    mapped = MapMessage()
    mapped.set_string("k", "v")
    cleared = BytesMessage(b"cleared")
    preload(cf, f"some.{run}.src", [changed, mapped])
    jconn = cf.java.createConnection()  # a provider-set property only Java code can set
    try:
        jsession = jconn.createSession(False, 1)
        jmsg = jsession.createTextMessage("carries a provider-set property")
        jmsg.setStringProperty("JMSXUserID", "someone")
        jsession.createProducer(jsession.createQueue(f"some.{run}.src")).send(jmsg)
    finally:
        jconn.close()
    preload(cf, f"some.{run}.src", [cleared])
    conversions.clear()
    with cf.create_connection() as conn:
        conn.start()
        session = conn.create_session(True, AckMode.SESSION_TRANSACTED)
        consumer = session.create_consumer(Queue(f"some.{run}.src"))
        producer = session.create_producer(Queue(f"some.{run}.dst"))
        first = consumer.receive(5)
        first.correlation_id = "set by the bridge"
        producer.send(first)
        for _ in range(2):
            producer.send(consumer.receive(5))
        last = consumer.receive(5)
        last.clear_body()
        last.write_bytes(b"new body")
        producer.send(last)
        session.commit()
    assert len(conversions) == 4
    got = received(cf, f"some.{run}.dst", 4)
    assert got[0].correlation_id == "set by the bridge"
    assert got[3].get_body() == b"new body"


def test_a_redelivered_message_resent_arrives_as_a_first_delivery(cf, conversions):
    """A unit rolled back and taken again: its message, now redelivered, is sent to the
    target as a new message, as the converting path sends it (not redelivered, delivered
    once), whichever way it went."""
    run = uuid.uuid4().hex[:8]
    for way in ("resend", "convert"):
        preload(cf, f"{way}.{run}.src", [TextMessage(f"{way} once rolled back")])
    conversions.clear()
    for way in ("resend", "convert"):
        with cf.create_connection() as conn:
            conn.start()
            session = conn.create_session(True, AckMode.SESSION_TRANSACTED)
            consumer = session.create_consumer(Queue(f"{way}.{run}.src"))
            producer = session.create_producer(Queue(f"{way}.{run}.dst"))
            producer.send(consumer.receive(5))
            session.rollback()
            again = consumer.receive(5)
            assert again.redelivered and again.delivery_count == 2
            producer.send(again.copy() if way == "convert" else again)
            session.commit()
    assert len(conversions) == 1  # the convert way's copy: the redelivered message was resent
    resent, converted = received(cf, f"resend.{run}.dst", 1)[0], received(cf, f"convert.{run}.dst", 1)[0]
    assert (converted.redelivered, converted.delivery_count) == (False, 1)
    assert (resent.redelivered, resent.delivery_count) == (False, 1)
