"""MessageRenderer, the subscriber threads' MESSAGE writer, against the general way
(to_message_frame then encode_frame): the same bytes or the same refusal for any message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridgemgr.jms.destination import Queue, TemporaryQueue, Topic
from bridgemgr.jms.message import BytesMessage, DeliveryMode, MapMessage, Message, PropertyType, TextMessage
from bridgemgr.stompbridge.convert import (
    CONTENT_TYPE_PROPERTY,
    Destinations,
    MessageRenderer,
    header_to_property,
    to_message_frame,
)
from bridgemgr.stompbridge.frames import PRE_CONNECT, V10, V11, V12, encode_frame

# Texts rich in what escaping and refusals are about.
texts = st.text(st.sampled_from([*"ab:\\\n\r\0 é"]), max_size=8)
property_names = st.sampled_from(
    [
        "a",
        "b",
        "priority",
        "type",
        "destination",
        "ack",
        "ts",
        CONTENT_TYPE_PROPERTY,
        header_to_property("x-request-id"),
        header_to_property("content-type"),
        header_to_property("a"),
        header_to_property("k:1"),
        header_to_property(""),
        "stomp$zz",
    ]
)
property_values = st.one_of(
    st.tuples(st.just(PropertyType.STRING), texts),
    st.tuples(st.just(PropertyType.INT), st.integers(-5, 5)),
    st.tuples(st.just(PropertyType.BOOLEAN), st.booleans()),
    st.tuples(st.just(PropertyType.DOUBLE), st.sampled_from([0.5, 1e20, float("nan")])),
)
# TemporaryQueue("new") is the connection's own, known by its alias /temp-queue/mine
destinations = st.sampled_from(
    [Queue("q"), Queue("a:b\\c"), Topic("t"), TemporaryQueue("tmp"), TemporaryQueue("new"), None]
)


@st.composite
def messages(draw: Any) -> Message:
    kind = draw(st.sampled_from(["text", "bytes", "map"]))
    message: Message = (
        TextMessage(draw(texts))
        if kind == "text"
        else BytesMessage(draw(st.binary(max_size=8)))
        if kind == "bytes"
        else MapMessage()
    )
    message.destination = draw(destinations)
    message.message_id = draw(st.none() | st.just("ID:1-127.0.0.1(a:b)-1") | texts)
    message.expiration = draw(st.integers(0, 2**45))
    message.priority = draw(st.integers(0, 9))
    message.timestamp = draw(st.integers(0, 2**45))
    message.delivery_mode = draw(st.sampled_from([DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT]))
    message.reply_to = draw(st.none() | destinations)
    message.correlation_id = draw(st.none() | texts)
    message.type = draw(st.none() | texts)
    for name, (ptype, value) in draw(st.dictionaries(property_names, property_values, max_size=4)).items():
        message.set_typed_property(name, ptype, value)
    return message


def outcome(fn: Any) -> tuple[str, object]:
    try:
        return ("bytes", fn())
    except Exception as exc:
        return (type(exc).__name__, getattr(exc, "detail", str(exc)))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    messages(),
    st.sampled_from(["1", "sub:1\\x", "é\n"]),
    st.sampled_from([PRE_CONNECT, V10, V11, V12]),
    st.none() | st.sampled_from(["7", "a:b"]),
    st.integers(1, 3),
    st.booleans(),
)
@example(TextMessage("x"), "1", V12, None, 1, True)
def test_the_renderer_writes_what_the_general_way_writes(
    message, subscription, version, ack, delivery_count, decode_names
):
    """Bytes equal (header order, first value of a name, escapes), or the same refusal
    (HeaderNotEncodable naming the header, NotDeliverable), for every version."""
    names = Destinations(lambda topic: TemporaryQueue("new"))
    names.to_jms("/temp-queue/mine")
    renderer = MessageRenderer(subscription, names, None, version, decode_names)
    general = outcome(
        lambda: encode_frame(
            to_message_frame(message, subscription, names, None, ack, delivery_count, decode_names), version
        )
    )
    assert outcome(lambda: renderer.render(message, ack, delivery_count)) == general
    assert outcome(lambda: renderer.render(message, ack, delivery_count)) == general  # destinations cached


def test_a_property_name_is_escaped_once_per_subscription():
    """A subscriber renders the same few property names on every message: the renderer
    escapes a name (and decodes an encoded one) once, then writes the cached header line;
    the values are escaped per message."""
    renderer = MessageRenderer("1", Destinations(lambda topic: TemporaryQueue("new")), None, V12, True)
    escaped: list[str] = []
    escape = renderer._escape
    assert escape is not None
    renderer._escape = lambda text: escaped.append(text) or escape(text)
    frames = []
    for value in ("v:1", "v:2"):
        message = BytesMessage(b"x")
        message.destination = Queue("q")
        message.set_string_property(header_to_property("x:id"), value)
        frames.append(renderer.render(message))
    assert escaped.count("x:id") == 1 and "v:1" in escaped and "v:2" in escaped
    assert b"\nx\\cid:v\\c2\n" in frames[1]
