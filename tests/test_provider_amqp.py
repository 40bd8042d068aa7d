"""The AMQP 0-9-1 provider's pure part (bridgemgr/providers/amqp/wire.py) and its naming:
provider URLs, destinations, and messages through pika's own encoding of the content
header and back. The provider against a real RabbitMQ: tests/real/test_amqp_rabbitmq.py."""

from __future__ import annotations

import socket

import pika
import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, TemporaryQueue, Topic
from bridgemgr.jms.errors import NamingException, TransportException
from bridgemgr.jms.message import BytesMessage, DeliveryMode, MapMessage, PropertyType, TextMessage
from bridgemgr.providers.amqp import AmqpConnectionFactory, from_amqp, parse_url, route, to_amqp
from bridgemgr.providers.amqp.client import send_now

ENV = {
    "java.naming.factory.initial": "imq.amqp",
    "java.naming.provider.url": "amqp://bridge:s3cret@127.0.0.1:5672/%2F?prefetch=50&heartbeat=20",
}


def test_the_context_gives_a_factory_and_destinations_without_connecting():
    cf = naming.lookup("ConnectionFactory", ENV)
    assert isinstance(cf, AmqpConnectionFactory)
    assert cf.options.prefetch == 50 and cf.options.parameters.heartbeat == 20
    assert "s3cret" not in repr(cf) and "bridge:***@" in repr(cf)
    assert naming.lookup("queue/orders", ENV) == Queue("orders")
    assert naming.lookup("topic/news", ENV) == Topic("news")
    with pytest.raises(NamingException, match="not bound"):
        naming.lookup("orders", ENV)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("stomp://h:1", "use amqp://"),
        ("amqp://h:1/?prefetch=-1", "prefetch"),
        ("amqp://h:1/?declare-queues=maybe", "declare-queues"),
        ("amqp://u:pw@h:1/?heartbeat=soon", "heartbeat"),
    ],
)
def test_bad_urls_are_named_without_their_password(url, problem):
    with pytest.raises(NamingException, match=problem) as failure:
        parse_url(url)
    assert "pw@" not in str(failure.value)


def test_a_closed_port_is_a_transport_error_naming_it():
    cf = AmqpConnectionFactory("amqp://guest:guest@127.0.0.1:1/%2F")
    with pytest.raises(TransportException, match=r"127\.0\.0\.1:1"):
        cf.create_connection()


def test_destinations_route_to_the_default_exchange_or_amq_topic():
    assert route(Queue("q")) == ("", "q")
    assert route(TemporaryQueue("amq.gen-x")) == ("", "amq.gen-x")
    assert route(Topic("a.b")) == ("amq.topic", "a.b")


def through_pika(message):
    """``message`` as a delivery: its content header encoded and decoded by pika."""
    properties, body = to_amqp(message)
    decoded = pika.BasicProperties()
    decoded.decode(b"".join(properties.encode()))
    exchange, key = route(message.destination)
    return from_amqp(decoded, body, exchange=exchange, routing_key=key, redelivered=True, fallback=message.destination)


def stamped(message, dest=None):
    message.message_id, message.timestamp, message.expiration = "ID:1", 1_700_000_000_123, 1_700_000_060_123
    message.destination, message.priority, message.delivery_mode = dest or Queue("q"), 7, DeliveryMode.PERSISTENT
    return message


def test_headers_and_typed_properties_survive_pikas_encoding():
    m = stamped(TextMessage("héllo"))
    m.correlation_id, m.type, m.reply_to = "c", "T", Topic("replies")
    for name, ptype, value in [
        ("b", PropertyType.BYTE, -1),
        ("s", PropertyType.SHORT, 2),
        ("i", PropertyType.INT, 3),
        ("l", PropertyType.LONG, 4),
        ("f", PropertyType.FLOAT, 0.5),
        ("d", PropertyType.DOUBLE, 0.1),
        ("z", PropertyType.BOOLEAN, False),
        ("t", PropertyType.STRING, "v"),
    ]:
        m.set_typed_property(name, ptype, value)
    got = through_pika(m)
    assert isinstance(got, TextMessage) and got.text == "héllo"
    assert list(got.typed_properties()) == list(m.typed_properties())
    assert (got.message_id, got.timestamp, got.expiration, got.priority) == ("ID:1", m.timestamp, m.expiration, 7)
    assert (got.correlation_id, got.type, got.reply_to) == ("c", "T", Topic("replies"))
    assert got.delivery_mode == DeliveryMode.PERSISTENT and got.redelivered and got.destination == Queue("q")


def test_bodies_map_to_content_types():
    text, _ = to_amqp(stamped(TextMessage("x")))
    raw, _ = to_amqp(stamped(BytesMessage(b"\0")))
    mapped, _ = to_amqp(stamped(MapMessage({"k": 1})))
    assert (text.content_type, raw.content_type) == ("text/plain; charset=utf-8", "application/octet-stream")
    assert mapped.content_type == "application/x-imqbridge-jms"
    assert through_pika(stamped(MapMessage({"k": 1}), Topic("t"))).get_body() == {"k": 1}
    json = stamped(BytesMessage(b"{}"))
    json.set_string_property("JMS_AMQP_CONTENT_TYPE", "application/json")
    properties, _ = to_amqp(json)
    assert properties.content_type == "application/json"
    back = through_pika(json)
    assert isinstance(back, TextMessage) and back.get_string_property("JMS_AMQP_CONTENT_TYPE") == "application/json"


def test_send_now_gives_back_what_the_socket_did_not_take():
    """A write the socket takes in part leaves the rest (for pika's transport); a failed
    socket leaves all of it (the transport then meets the error)."""
    ours, peer = socket.socketpair()
    try:
        ours.setblocking(False)
        data = bytes(range(256)) * 40_000  # 10 MB: more than the socket buffers hold
        rest = send_now(ours, data)
        taken = len(data) - len(rest)
        assert 0 < taken < len(data) and rest == data[taken:]
        assert send_now(ours, rest) == rest  # full: EAGAIN, nothing taken
        peer.close()
        assert send_now(ours, b"abc") == b"abc"  # EPIPE
    finally:
        ours.close()
