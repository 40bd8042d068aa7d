"""The AMQP provider's own reading of deliveries (wire.decode_deliver,
decode_content_header, Deliveries) against pika's decoding of the same bytes, made by
pika's own encoders: random properties of every kind, present or absent, header tables
with nested values, bodies split across body frames at random frame_max; and malformed
frames refused with a FrameError naming the frame where pika would take them."""

from __future__ import annotations

import decimal
import struct
from datetime import UTC, datetime

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pika import frame as pika_frame
from pika.channel import ContentFrameAssembler
from pika.spec import Basic

from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import JMSException
from bridgemgr.jms.message import BytesMessage, PropertyType, property_name_problem
from bridgemgr.providers.amqp.wire import (
    PROPERTY_NAMES,
    Deliveries,
    FrameError,
    TypedProperties,
    decode_content_header,
    decode_deliver,
    from_amqp,
    to_amqp,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

short_text = st.text(max_size=40).filter(lambda t: len(t.encode()) <= 255)
key = st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= 255)
scalar = st.one_of(
    st.text(max_size=30),
    st.binary(max_size=30),
    st.booleans(),
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=UTC)
    ),
)
value = st.recursive(
    scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(key, inner, max_size=4)), max_leaves=12
)
headers = st.dictionaries(key, value, max_size=6)
# fields pika never writes but other clients do: kind and its raw bytes
raw_field = st.sampled_from([b"b", b"B", b"s", b"U", b"u", b"I", b"i", b"l", b"L", b"f", b"d", b"D", b"T"]).flatmap(
    lambda k: st.binary(min_size=_WIDTH[k], max_size=_WIDTH[k]).map(lambda raw: k + raw)
)
_WIDTH = {
    b"b": 1,
    b"B": 1,
    b"s": 2,
    b"U": 2,
    b"u": 2,
    b"I": 4,
    b"i": 4,
    b"l": 8,
    b"L": 8,
    b"f": 4,
    b"d": 8,
    b"D": 5,
    b"T": 8,
}


@st.composite
def properties(draw: st.DrawFn) -> pika.BasicProperties:
    fields = {
        "content_type": short_text,
        "content_encoding": short_text,
        "headers": headers,
        "delivery_mode": st.integers(0, 255),
        "priority": st.integers(0, 255),
        "correlation_id": short_text,
        "reply_to": short_text,
        "expiration": short_text,
        "message_id": short_text,
        "timestamp": st.integers(0, 2**64 - 1),
        "type": short_text,
        "user_id": short_text,
        "app_id": short_text,
        "cluster_id": short_text,
    }
    return pika.BasicProperties(**{name: draw(st.none() | strategy) for name, strategy in fields.items()})


def pika_delivery(frames: list[bytes]) -> tuple[object, object, bytes]:
    """What pika makes of a delivery's frames: (method, properties, body)."""
    assembler = ContentFrameAssembler()
    for raw in frames:
        consumed, value = pika_frame.decode_frame(raw)
        assert consumed == len(raw)
        result = assembler.process(value)
    method_frame, header_frame, body = result
    return method_frame.method, header_frame.properties, body


def ours(frames: list[bytes]) -> tuple[object, object, bytes]:
    deliveries = Deliveries()
    result = None
    for raw in frames:
        kind, channel, size = struct.unpack_from(">BHI", raw)
        assert raw[-1] == 0xCE and len(raw) == size + 8
        payload = raw[7:-1]
        if kind == 1:
            deliveries.begin(channel, decode_deliver(payload, channel))
        else:
            assert result is None
            result = deliveries.content(kind, channel, payload)
    assert result is not None
    return result


def same_properties(mine: object, theirs: object) -> None:
    for name in PROPERTY_NAMES:
        assert getattr(mine, name) == getattr(theirs, name), name


def delivery_frames(
    channel: int, method: Basic.Deliver, props: pika.BasicProperties, body: bytes, frame_max: int
) -> list[bytes]:
    step = frame_max - 8
    frames = [pika_frame.Method(channel, method).marshal(), pika_frame.Header(channel, len(body), props).marshal()]
    frames += [pika_frame.Body(channel, body[at : at + step]).marshal() for at in range(0, len(body), step)]
    return frames


@pytest.mark.slow
@SETTINGS
@given(
    channel=st.integers(1, 65535),
    consumer_tag=short_text,
    delivery_tag=st.integers(1, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=short_text,
    routing_key=short_text,
    props=properties(),
    body=st.binary(max_size=3000) | st.integers(0, 3).map(lambda n: b"x" * (4096 - 8) * n),
    frame_max=st.integers(9, 1200) | st.just(4096),
)
def test_a_delivery_reads_as_pika_reads_it(
    channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, props, body, frame_max
):
    method = Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    frames = delivery_frames(channel, method, props, body, frame_max)
    their_method, their_props, their_body = pika_delivery(frames)
    my_method, my_props, my_body = ours(frames)
    for name in ("consumer_tag", "delivery_tag", "redelivered", "exchange", "routing_key"):
        assert getattr(my_method, name) == getattr(their_method, name), name
    same_properties(my_props, their_props)
    assert my_body == their_body == body


def header_payload(props: pika.BasicProperties, body_size: int = 0) -> bytes:
    return pika_frame.Header(1, body_size, props).marshal()[7:-1]


def with_raw_headers(fields: list[tuple[bytes, bytes]]) -> bytes:
    """A content header with only a headers table of these (name, raw field) pairs."""
    table = b"".join(bytes([len(n)]) + n + raw for n, raw in fields)
    return struct.pack(">HHQH", 60, 0, 0, pika.BasicProperties.FLAG_HEADERS) + struct.pack(">I", len(table)) + table


@pytest.mark.slow
@SETTINGS
@given(fields=st.lists(st.tuples(st.binary(min_size=1, max_size=8), raw_field), max_size=8))
def test_every_field_kind_of_other_clients_reads_as_pika_reads_it_or_is_refused(fields):
    payload = with_raw_headers(fields)
    try:
        theirs = pika.BasicProperties().decode(payload, 12)
    except (ValueError, OverflowError, OSError):  # a float NaN or infinity, a timestamp past 9999: pika fails too
        with pytest.raises(FrameError, match="content header frame on channel 7"):
            decode_content_header(payload, 7)
        return
    size, mine = decode_content_header(payload, 7)
    assert size == 0
    same_properties(mine, theirs)


@pytest.mark.slow
@SETTINGS
@given(props=properties(), cut=st.integers(1, 10_000))
def test_a_cut_content_header_is_refused_by_name(props, cut):
    payload = header_payload(props)
    cut = min(cut, len(payload))
    with pytest.raises(FrameError, match="malformed content header frame on channel 3"):
        decode_content_header(payload[:-cut], 3)


@pytest.mark.slow
@SETTINGS
@given(props=properties(), at=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_a_changed_content_header_reads_as_pika_reads_it_or_is_refused(props, at, byte):
    payload = bytearray(header_payload(props, 5))
    payload[at % len(payload)] = byte
    payload = bytes(payload)
    try:
        size, mine = decode_content_header(payload, 3)
    except FrameError as exc:
        assert "content header frame on channel 3" in str(exc)
        return
    theirs = pika.BasicProperties().decode(payload, 12)
    same_properties(mine, theirs)
    assert size == struct.unpack_from(">Q", payload, 4)[0]


@pytest.mark.parametrize(
    ("payload", "what"),
    [
        (b"\x00\x3c\x00\x3c\x05amq.c", "past its end"),  # consumer tag longer than the frame
        (b"\x00\x3c\x00\x3c\x00" + b"\x00" * 8 + b"\x00\x00\x00\x00", "a byte too many"),
        (b"\x00\x3c\x00\x50\x00", "basic.ack, not basic.deliver"),
    ],
)
def test_a_malformed_basic_deliver_is_refused_by_name(payload, what):
    with pytest.raises(FrameError, match=r"malformed basic\.deliver frame on channel 9"):
        decode_deliver(payload, 9)


def test_pika_would_take_a_message_id_past_the_frame_as_a_shorter_one_we_refuse_it():
    props = header_payload(pika.BasicProperties(message_id="ID:12345"))
    cut = props[:-3]  # its length still says 8
    assert pika.BasicProperties().decode(cut, 12).message_id == "ID:12"
    with pytest.raises(FrameError, match="malformed content header frame on channel 2"):
        decode_content_header(cut, 2)


def deliver_payload(channel: int, delivery_tag: int) -> bytes:
    return pika_frame.Method(channel, Basic.Deliver("c", delivery_tag, False, "", "q")).marshal()[7:-1]


def test_frames_out_of_place_in_a_delivery_are_refused_by_name():
    deliveries = Deliveries()
    deliveries.begin(4, decode_deliver(deliver_payload(4, 1), 4))
    with pytest.raises(FrameError, match="type 3 on channel 4 where the content header"):
        deliveries.content(3, 4, b"body")
    deliveries.content(2, 4, header_payload(pika.BasicProperties(), 4))
    with pytest.raises(FrameError, match="body frame on channel 4 past the body size"):
        deliveries.content(3, 4, b"12345")
    with pytest.raises(FrameError, match=r"basic\.deliver frame on channel 4 before the content"):
        deliveries.begin(4, decode_deliver(deliver_payload(4, 2), 4))


def test_a_delivery_without_body_is_whole_at_its_header():
    deliveries = Deliveries()
    deliveries.begin(1, decode_deliver(pika_frame.Method(1, Basic.Deliver("c", 1, True, "", "q")).marshal()[7:-1], 1))
    method, props, body = deliveries.content(2, 1, header_payload(pika.BasicProperties(headers={"a": {"b": [1, "x"]}})))
    assert body == b"" and method.redelivered and props.headers == {"a": {"b": [1, "x"]}}
    assert not deliveries.reading(1)


def test_a_decimal_header_reads_as_pika_reads_it():
    payload = header_payload(pika.BasicProperties(headers={"d": decimal.Decimal("1.25")}))
    assert decode_content_header(payload, 1)[1].headers == {"d": decimal.Decimal("1.25")}


@pytest.mark.slow
@SETTINGS
@given(props=properties())
def test_our_encoding_of_properties_is_pikas(props):
    fields = {name: getattr(props, name) for name in PROPERTY_NAMES}
    assert b"".join(TypedProperties([], **fields).encode()) == b"".join(props.encode())


typed_property = st.one_of(
    st.tuples(st.just(PropertyType.BYTE), st.integers(-128, 127)),
    st.tuples(st.just(PropertyType.SHORT), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just(PropertyType.INT), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(PropertyType.LONG), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(PropertyType.DOUBLE), st.floats(allow_nan=False)),
    st.tuples(st.just(PropertyType.BOOLEAN), st.booleans()),
    st.tuples(st.just(PropertyType.STRING), st.text(max_size=20)),
)


@SETTINGS
@given(
    props=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(
            lambda name: property_name_problem(name) is None
        ),  # not "in", "is", ...
        typed_property,
        max_size=6,
    ),
    body=st.binary(max_size=100),
)
@pytest.mark.slow
def test_typed_properties_come_back_through_our_reading(props, body):
    message = BytesMessage(body)
    for name, (ptype, value) in props.items():
        message.set_typed_property(name, ptype, value)
    message.message_id, message.timestamp = "ID:x:1", 1_700_000_000_123
    properties, payload = to_amqp(message)
    frames = delivery_frames(5, Basic.Deliver("c", 1, False, "", "q"), properties, payload, 4096)
    _, read, got_body = ours(frames)
    got = from_amqp(read, got_body, exchange="", routing_key="q", redelivered=False, fallback=Queue("q"))
    assert list(got.typed_properties()) == list(message.typed_properties())
    assert got.get_body() == body and got.message_id == "ID:x:1" and got.timestamp == 1_700_000_000_123


def test_a_property_name_longer_than_a_short_string_is_refused_by_name():
    message = BytesMessage(b"")
    message.set_int_property("p" * 256, 1)
    properties, _ = to_amqp(message)
    with pytest.raises(JMSException, match=r"property name 'ppp.*longer than 255 bytes"):
        properties.encode()
