"""The message codec: lossless round trips of arbitrary messages, and safety on bad input."""

from __future__ import annotations

import enum
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms import codec
from bridgemgr.jms.codec import (
    FORMAT_VERSION,
    MAGIC,
    MAX_DEPTH,
    decode,
    decode_value,
    encode,
    encode_value,
    is_serialisable,
)
from bridgemgr.jms.destination import KINDS, Destination, Queue, TemporaryQueue, Topic, from_kind
from bridgemgr.jms.errors import MessageCodecError, MessageFormatException
from bridgemgr.jms.message import (
    JMSX_NAMES,
    MESSAGE_TYPES,
    PROPERTY_TYPES,
    BytesMessage,
    DeliveryMode,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    is_valid_property_name,
)

PREFIX = MAGIC + bytes([FORMAT_VERSION])
HEAD_END = len(PREFIX) + codec._HEAD.size  # where a top-level message's header texts start

# ---------------------------------------------------------------------------
# strategies

CHARS = st.characters(exclude_categories=()) | st.sampled_from("\x00\ud800\udbff\udc00\udfffé\u20ac😀")
TEXT = st.text(CHARS, max_size=20)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
DESTINATIONS = st.builds(from_kind, st.sampled_from(sorted(KINDS)), TEXT)

VALUES = {
    PropertyType.BOOLEAN: st.booleans(),
    PropertyType.BYTE: st.integers(-(2**7), 2**7 - 1),
    PropertyType.SHORT: st.integers(-(2**15), 2**15 - 1),
    PropertyType.INT: INT32,
    PropertyType.LONG: INT64,
    PropertyType.FLOAT: st.floats(width=32),
    PropertyType.DOUBLE: st.floats(),
    PropertyType.STRING: TEXT,
    PropertyType.CHAR: st.characters(max_codepoint=0xFFFF, exclude_categories=()),
    PropertyType.BYTES: st.binary(max_size=20),
}


def typed(types) -> st.SearchStrategy[tuple[PropertyType, object]]:
    return st.sampled_from(sorted(types)).flatmap(lambda t: VALUES[t].map(lambda v: (t, v)))


PROPERTY_NAMES = (
    st.from_regex(r"[A-Za-z_$][A-Za-z0-9_$]{0,12}", fullmatch=True)
    | st.text(st.characters(categories=["Lu", "Ll", "Lo", "Nd", "Sc", "Pc", "Mn", "Nl"]), min_size=1, max_size=6)
    | st.sampled_from(sorted(JMSX_NAMES))
    | st.from_regex(r"JMS_[A-Z_]{1,12}", fullmatch=True)
).filter(is_valid_property_name)

BIG_INTS = st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1) | st.integers()
SCALARS = (
    st.none()
    | st.booleans()
    | INT64
    | BIG_INTS
    | st.floats()
    | TEXT
    | st.binary(max_size=20)
    | st.binary(max_size=20).map(JavaSerialized)
    | DESTINATIONS
)


def object_values(depth: int) -> st.SearchStrategy:
    leaves = SCALARS if depth >= 2 else SCALARS | st.deferred(lambda: messages(depth + 1))
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
        max_leaves=8,
    )


@st.composite
def messages(draw, depth: int = 0) -> Message:
    kind = draw(st.sampled_from(sorted(MESSAGE_TYPES)))
    m = MESSAGE_TYPES[kind]()
    m.message_id = draw(st.none() | TEXT)
    m.correlation_id = draw(st.none() | TEXT)
    m.type = draw(st.none() | TEXT)
    m.reply_to = draw(st.none() | DESTINATIONS)
    m.destination = draw(st.none() | DESTINATIONS)
    m.timestamp, m.expiration, m.delivery_time = draw(INT64), draw(INT64), draw(INT64)
    m.delivery_count, m.priority = draw(INT32), draw(INT32)
    m.delivery_mode = draw(st.sampled_from(list(DeliveryMode)) | INT32)
    m.redelivered = draw(st.booleans())
    for name, (ptype, value) in draw(st.dictionaries(PROPERTY_NAMES, typed(PROPERTY_TYPES), max_size=5)).items():
        m.set_typed_property(name, ptype, value)
    if isinstance(m, TextMessage):
        m.text = draw(st.none() | st.text(CHARS, max_size=300))
    elif isinstance(m, BytesMessage):
        m.write_bytes(draw(st.binary(max_size=300)))
    elif isinstance(m, MapMessage):
        for name, (ptype, value) in draw(st.dictionaries(TEXT.filter(bool), typed(PropertyType), max_size=6)).items():
            m.set_typed(name, ptype, value)
    elif isinstance(m, StreamMessage):
        for ptype, value in draw(st.lists(typed(PropertyType), max_size=6)):
            m.write_typed(ptype, value)
    elif isinstance(m, ObjectMessage):
        m.object = draw(object_values(depth))
    if draw(st.booleans()):
        m.set_read_only()  # a received message encodes the same as a fresh one
    return m


def assert_same_types(a: object, b: object) -> None:
    """``a`` and ``b`` hold values of the very same Python types, all the way down."""
    assert type(a) is type(b)
    if isinstance(a, Message):
        assert [(n, t, type(v)) for n, t, v in a.typed_properties()] == [
            (n, t, type(v)) for n, t, v in b.typed_properties()
        ]
        if isinstance(a, (MapMessage, StreamMessage)):
            assert [tuple(map(type, item)) for item in a.typed_items()] == [
                tuple(map(type, item)) for item in b.typed_items()
            ]  # type: ignore[attr-defined]
        else:
            assert_same_types(a.get_body(), b.get_body())
    elif isinstance(a, list):
        for x, y in zip(a, b):
            assert_same_types(x, y)
    elif isinstance(a, dict):
        for k in a:
            assert_same_types(a[k], b[k])


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sample_messages() -> list[Message]:
    """A few fixed messages covering every kind and every kind of value."""
    text = TextMessage("héllo \ud800 😀 \x00")
    text.message_id, text.correlation_id, text.type = "ID:1", "", "t"
    text.reply_to, text.destination = TemporaryQueue("tmp"), Queue("orders")
    text.timestamp, text.expiration, text.priority, text.redelivered = 1700000000000, -1, 9, True
    text.set_boolean_property("b", True)
    text.set_byte_property("i8", -128)
    text.set_short_property("i16", 32767)
    text.set_int_property("i32", -1)
    text.set_long_property("i64", 2**63 - 1)
    text.set_float_property("f32", float("nan"))
    text.set_double_property("f64", -0.0)
    text.set_string_property("JMS_SUN_S", "s")
    bytes_msg = BytesMessage(bytes(range(40)))
    bytes_msg.destination = Topic("t")
    map_msg = MapMessage()
    for ptype, value in (
        (PropertyType.CHAR, "\ud800"),
        (PropertyType.BYTES, b"\x00\x01"),
        (PropertyType.FLOAT, 1.5),
        (PropertyType.BOOLEAN, False),
        (PropertyType.STRING, "v"),
    ):
        map_msg.set_typed(ptype.name.lower(), ptype, value)
    stream_msg = StreamMessage()
    for ptype, value in (
        (PropertyType.CHAR, "c"),
        (PropertyType.BYTES, b"xy"),
        (PropertyType.LONG, -5),
        (PropertyType.DOUBLE, float("inf")),
        (PropertyType.STRING, ""),
    ):
        stream_msg.write_typed(ptype, value)
    obj = ObjectMessage(
        [
            None,
            True,
            False,
            7,
            2**70,
            -(2**80),
            0.5,
            "s",
            b"b",
            JavaSerialized(b"\xac\xed"),
            {"k": [Queue("q")]},
            text.copy(),
        ]
    )
    return [Message(), text, TextMessage(), bytes_msg, map_msg, stream_msg, obj, ObjectMessage()]


def craft(*parts: bytes) -> bytes:
    return PREFIX + b"".join(parts)


# ---------------------------------------------------------------------------
# round trips


@pytest.mark.slow
@FAST
@given(messages())
def test_any_message_round_trips_losslessly(m):
    blob = encode(m)
    assert blob.startswith(PREFIX)
    decoded = decode(blob)
    assert decoded == m
    assert_same_types(decoded, m)
    assert encode(decoded) == blob  # the encoding is deterministic
    assert decode_value(blob) == m  # a message blob is a value blob holding a message


@pytest.mark.slow
@FAST
@given(messages(), st.integers(min_value=0, max_value=2**31 - 1))
def test_the_head_peek_and_the_delivery_patch_agree_with_a_full_decode(m, count):
    """A receiver that passes blobs on (receive_blob) reads the message id from the head and
    sets the delivery count in place: exactly what decoding and encoding would give."""
    blob = encode(m)
    assert codec.message_id(blob) == m.message_id
    patched = codec.with_delivery(blob, count)
    received = decode(blob)
    received.delivery_count, received.redelivered = count, count > 1
    assert patched == encode(received)
    assert decode(patched) == received


def test_the_head_peek_and_the_patch_refuse_what_is_not_a_message():
    for bad in (b"", b"IMQB", PREFIX + bytes([codec.T_STR]) + b"\0\0\0\0", b"nope" * 30):
        with pytest.raises(MessageCodecError):
            codec.message_id(bad)
        with pytest.raises(MessageCodecError):
            codec.with_delivery(bad, 2)
    cut = encode(TextMessage("x"))[:-1]  # the head checks out; whoever decodes names the cut
    with pytest.raises(MessageCodecError, match="truncated"):
        decode(codec.with_delivery(cut, 2))


@pytest.mark.slow
@FAST
@given(messages())
def test_decoded_messages_are_writable(m):
    decoded = decode(encode(m))
    assert not decoded.is_read_only
    decoded.set_string_property("added", "x")
    decoded.clear_body()
    assert isinstance(decoded, type(m))


@pytest.mark.slow
@FAST
@given(object_values(0))
def test_any_object_value_round_trips(value):
    assert is_serialisable(value)
    decoded = decode_value(encode_value(value))
    assert ObjectMessage(decoded) == ObjectMessage(value)
    assert_same_types(decoded, value)


@pytest.mark.parametrize("m", sample_messages(), ids=lambda m: type(m).__name__)
def test_sample_messages_round_trip(m):
    decoded = decode(encode(m))
    assert decoded == m
    assert_same_types(decoded, m)


def test_headers_come_back_exactly():
    m = TextMessage("x")
    m.delivery_mode = DeliveryMode.NON_PERSISTENT
    m.reply_to, m.destination = TemporaryQueue("r"), Topic("d")
    m.message_id, m.correlation_id, m.type = "ID:1", "", None
    m.timestamp, m.expiration, m.delivery_time = -(2**63), 2**63 - 1, 5
    m.delivery_count, m.priority, m.redelivered = 2**31 - 1, 0, True
    d = decode(encode(m))
    assert d.headers() == m.headers()
    assert d.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert type(d.reply_to) is TemporaryQueue and type(d.destination) is Topic
    assert d.correlation_id == "" and d.type is None and d.redelivered is True


def test_property_types_and_special_floats_survive():
    m = Message()
    m.set_byte_property("b", 1)
    m.set_int_property("i", 1)
    m.set_long_property("l", 1)
    m.set_float_property("f", 0.1)
    m.set_double_property("d", 0.1)
    m.set_double_property("nz", -0.0)
    m.set_double_property("inf", float("-inf"))
    m.set_float_property("nan", float("nan"))
    d = decode(encode(m))
    assert [(n, t) for n, t, _ in d.typed_properties()] == [(n, t) for n, t, _ in m.typed_properties()]
    assert d.get_float_property("f") == struct.unpack(">f", struct.pack(">f", 0.1))[0]
    assert d.get_double_property("d") == 0.1
    assert str(d.get_double_property("nz")) == "-0.0"
    assert d == m
    other = m.copy()
    other.set_double_property("nz", 0.0)
    assert other != m  # equality tells -0.0 from 0.0, so the round trip above proves the sign


def test_text_none_and_empty_differ():
    assert decode(encode(TextMessage(None))).text is None
    assert decode(encode(TextMessage(""))).text == ""


def test_lone_surrogates_round_trip():
    m = TextMessage("\udc00a\ud800")
    m.set_string_property("s", "\ud83d")
    m.message_id = "\udfff"
    assert decode(encode(m)) == m


def test_java_serialized_stays_java_serialized():
    value = decode_value(encode_value([JavaSerialized(b"\xac\xed\x00\x05"), b"\xac\xed"]))
    assert type(value[0]) is JavaSerialized and type(value[1]) is bytes


def test_big_ints_round_trip():
    for n in (0, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**100, -(10**100), 2**64 - 1):
        assert decode_value(encode_value(n)) == n


def test_dmq_style_nesting_round_trips():
    inner = TextMessage("original")
    inner.set_string_property("JMS_SUN_JMSBRIDGE_SOURCE", "x")
    m = inner
    for level in range(20):
        m = ObjectMessage(m)
        m.set_int_property("level", level)
    assert decode(encode(m)) == m


def test_bytes_body_in_read_mode_encodes_whole_body():
    m = BytesMessage(b"abcdef")
    m.reset()
    m.read_bytes(3)
    d = decode(encode(m))
    assert d.get_body() == b"abcdef"
    d.write_bytes(b"g")  # decoded in write mode


def test_decode_accepts_bytearray_and_memoryview():
    blob = encode(TextMessage("x"))
    assert decode(bytearray(blob)) == decode(memoryview(blob)) == TextMessage("x")
    with pytest.raises(TypeError):
        decode("not bytes")  # type: ignore[arg-type]


def test_format_version_is_in_the_blob():
    assert encode(Message())[: len(PREFIX)] == PREFIX
    assert isinstance(FORMAT_VERSION, int)


# ---------------------------------------------------------------------------
# not serialisable


class Custom:
    pass


class Colour(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


NOT_SERIALISABLE = [
    {1, 2},
    frozenset(),
    (1, 2),
    object(),
    Custom(),
    {1: "int key"},
    {"ok": {2: "nested int key"}},
    bytearray(b"x"),
    memoryview(b"x"),
    Colour.RED,
    MyStr("s"),
    Destination("base"),
    1j,
    [1, [2, {"x": {3}}]],
    ObjectMessage({4}),
]


@pytest.mark.parametrize("value", NOT_SERIALISABLE, ids=lambda v: type(v).__name__)
def test_not_serialisable_values(value):
    assert not is_serialisable(value)
    with pytest.raises(MessageFormatException, match="not serialisable"):
        encode(ObjectMessage(value))
    with pytest.raises(MessageFormatException, match="not serialisable"):
        encode_value(value)


def test_not_serialisable_inside_a_nested_message():
    with pytest.raises(MessageFormatException, match="not serialisable"):
        encode(ObjectMessage([ObjectMessage({"s": {1}})]))


def test_nesting_limit_on_encode():
    def nested(depth):
        value = None
        for _ in range(depth):
            value = [value]
        return value

    assert decode_value(encode_value(nested(MAX_DEPTH))) == nested(MAX_DEPTH)
    assert not is_serialisable(nested(MAX_DEPTH + 1))
    with pytest.raises(MessageFormatException, match=r"not serialisable.*deeper"):
        encode(ObjectMessage(nested(MAX_DEPTH)))  # the message itself is one level
    cyclic: list = []
    cyclic.append(cyclic)
    assert not is_serialisable(cyclic)


def test_nested_messages_over_the_limit():
    m: Message = TextMessage("x")
    for _ in range(MAX_DEPTH):
        m = ObjectMessage(m)
    with pytest.raises(MessageFormatException, match="not serialisable"):
        encode(m)


def test_bad_headers_are_refused_clearly():
    m = TextMessage("x")
    m.message_id = 5  # type: ignore[assignment]
    with pytest.raises(MessageFormatException, match="message_id=5"):
        encode(m)
    m = TextMessage("x")
    m.priority = 2**40
    with pytest.raises(MessageFormatException, match="priority"):
        encode(m)
    m = TextMessage("x")
    m.reply_to = "queue://q"  # type: ignore[assignment]
    with pytest.raises(MessageFormatException, match="reply_to"):
        encode(m)
    with pytest.raises(MessageFormatException, match="not a message"):
        encode("text")  # type: ignore[arg-type]


_TEXTS = st.one_of(st.none(), st.text(max_size=5), st.integers(), st.binary(max_size=3))
_DESTS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            Queue("q"),
            Topic("t"),
            TemporaryQueue("tq"),
            Queue(7),  # type: ignore[arg-type]
            "queue://q",
            Destination("d"),
        ]
    ),
)
_INTS = st.one_of(st.integers(-(2**64), 2**64), st.none(), st.floats(allow_nan=False), st.booleans())


@given(
    kind=st.sampled_from([TextMessage, BytesMessage]),
    body=st.one_of(st.none(), st.text(max_size=5), st.integers()),
    texts=st.tuples(_TEXTS, _TEXTS, _TEXTS),
    dests=st.tuples(_DESTS, _DESTS),
    ints=st.tuples(*[_INTS] * 6),
)
def test_check_headers_refuses_exactly_what_encode_refuses(kind, body, texts, dests, ints):
    """check_headers (the broker's check of a message it encodes later, off its thread)
    answers as encode does, with the same error, whatever its headers hold."""
    m = kind()
    if kind is TextMessage:
        m._text = body
    m.message_id, m.correlation_id, m.type = texts
    m.reply_to, m.destination = dests
    m.timestamp, m.expiration, m.delivery_time, m.delivery_count, m.delivery_mode, m.priority = ints
    try:
        encode(m)
    except MessageFormatException as exc:
        with pytest.raises(MessageFormatException) as checked:
            codec.check_headers(m)
        assert str(checked.value) == str(exc)
    else:
        codec.check_headers(m)


def test_check_headers_of_a_plain_text_or_bytes_message_encodes_nothing(monkeypatch):
    """The broker checks every persistent message it routes lazily (stored encoded later,
    if at all): a text or bytes message with str texts, known destinations and ints that
    fit is checked without encoding its texts and body (0.8 -> 0.5 us a message); one that
    is not goes through the encoder's head and is refused as encode refuses it."""
    heads: list[object] = []
    head = codec._head
    monkeypatch.setattr(codec, "_head", lambda m, kind: (heads.append(m), head(m, kind))[1])
    text, data = TextMessage("x" * 1000), BytesMessage(b"y" * 1000)
    for m in (text, data):
        m.message_id, m.correlation_id, m.type = "ID:1", "c", "t"
        m.destination, m.reply_to = Queue("q"), TemporaryQueue("tq")
        m.timestamp = m.expiration = m.delivery_time = 2**63 - 1
        codec.check_headers(m)
    assert heads == []
    text.priority = 2**31
    with pytest.raises(MessageFormatException, match="priority"):
        codec.check_headers(text)
    assert heads == [text]


# ---------------------------------------------------------------------------
# corrupt input


def test_unknown_version_is_named():
    blob = bytearray(encode(TextMessage("x")))
    blob[len(MAGIC)] = 99
    with pytest.raises(MessageCodecError, match="version 99"):
        decode(bytes(blob))
    with pytest.raises(MessageCodecError, match="version 0"):
        decode_value(MAGIC + b"\x00")


def test_bad_magic_and_short_blobs():
    with pytest.raises(MessageCodecError, match="not a message blob"):
        decode(b"\x80\x04pickle")
    for short in (b"", MAGIC[:2], MAGIC, PREFIX):
        with pytest.raises(MessageCodecError, match="truncated"):
            decode(short)


def test_trailing_garbage():
    with pytest.raises(MessageCodecError, match="trailing"):
        decode(encode(TextMessage("x")) + b"\x00")
    with pytest.raises(MessageCodecError, match="trailing"):
        decode_value(encode_value([1]) + b"junk")


def test_value_blob_that_is_not_a_message():
    with pytest.raises(MessageCodecError, match="not a message"):
        decode(encode_value([1, 2]))


@pytest.mark.timeout(10)
def test_huge_length_fields_fail_fast_without_allocating():
    text_blob = bytearray(encode(TextMessage("abc")))
    text_blob[HEAD_END - 4 : HEAD_END] = struct.pack(">I", 0x7FFFFFF0)  # the body size
    blobs = [
        bytes(text_blob),
        craft(bytes([codec.T_STR]), struct.pack(">I", 2**31), b"abc"),
        craft(bytes([codec.T_BYTES]), struct.pack(">I", 2**32 - 2), b"abc"),
        craft(bytes([codec.T_BIGINT]), struct.pack(">I", 2**31), b"\x01"),
        craft(bytes([codec.T_LIST]), struct.pack(">I", 2**32 - 1), b"\x00"),
        craft(bytes([codec.T_DICT]), struct.pack(">I", 2**32 - 1), b"\x00"),
    ]
    tracemalloc.start()
    try:
        for blob in blobs:
            with pytest.raises(MessageCodecError):
                decode_value(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_count_fields_are_checked_against_the_data():
    m = MapMessage({"a": 1})
    blob = bytearray(encode(m))
    blob[HEAD_END - 4 : HEAD_END] = struct.pack(">I", 2**32 - 2)  # the entry count
    with pytest.raises(MessageCodecError, match="exceed"):
        decode(bytes(blob))


def test_deep_nesting_in_a_blob_is_refused():
    deep = craft((bytes([codec.T_LIST]) + struct.pack(">I", 1)) * 50_000, bytes([codec.T_NONE]))
    with pytest.raises(MessageCodecError, match="deeper"):
        decode_value(deep)
    # nested messages: ObjectMessage heads all the way down
    head = encode(ObjectMessage())[len(PREFIX) : -1]  # an ObjectMessage without its None body
    with pytest.raises(MessageCodecError, match="deeper"):
        decode(PREFIX + head * (MAX_DEPTH + 1) + bytes([codec.T_NONE]))
    assert decode(PREFIX + head * MAX_DEPTH + bytes([codec.T_NONE])) is not None


def _property_blob(name: str, ptype: PropertyType, value: object) -> bytearray:
    m = Message()
    m._props[name] = (ptype, value)  # behind the setters' back, as a corrupt peer might
    return bytearray(encode(m))


def test_invalid_property_names_in_a_blob():
    for name in ("1abc", "NULL", "JMSFoo", "a-b", ""):
        with pytest.raises(MessageCodecError, match="property name"):
            decode(bytes(_property_blob(name, PropertyType.INT, 1)))


def test_invalid_value_types_in_a_blob():
    for ptype, value in ((PropertyType.CHAR, "c"), (PropertyType.BYTES, b"x")):
        with pytest.raises(MessageCodecError, match="not valid for a property"):
            decode(bytes(_property_blob("p", ptype, value)))
    for code in (0, 11, 255):
        blob = _property_blob("p", PropertyType.INT, 1)
        blob[HEAD_END + 4 + 4 + 1] = code  # after the names length, the name length and "p"
        with pytest.raises(MessageCodecError, match=f"code {code}"):
            decode(bytes(blob))
    blob = _property_blob("p", PropertyType.BOOLEAN, True)
    blob[-1] = 2  # the last value
    with pytest.raises(MessageCodecError, match="boolean"):
        decode(bytes(blob))


def test_invalid_destination_kinds_and_flags():
    m = Message()
    m.destination = Queue("q")
    blob = bytearray(encode(m))
    blob[len(PREFIX) + 3] = 7  # the destination kind
    with pytest.raises(MessageCodecError, match="destination kind 7"):
        decode(bytes(blob))
    blob = bytearray(encode(Message()))
    blob[len(PREFIX) + 1] = 0x80  # a reserved flag
    with pytest.raises(MessageCodecError, match="flags"):
        decode(bytes(blob))
    with pytest.raises(MessageCodecError, match="destination kind 9"):
        decode_value(craft(bytes([codec.T_DEST, 9]), struct.pack(">I", 0)))


def test_repeated_names_and_bad_utf8():
    blob = bytearray(encode(MapMessage({"a": 1, "b": 2})))
    names = blob.index(b"ab", HEAD_END)
    blob[names + 1] = ord("a")
    with pytest.raises(MessageCodecError, match="repeated"):
        decode(bytes(blob))
    with pytest.raises(MessageCodecError, match="UnicodeDecodeError"):
        decode_value(craft(bytes([codec.T_STR]), struct.pack(">I", 2), b"\xff\xfe"))
    with pytest.raises(MessageCodecError, match="repeated"):
        decode_value(
            craft(
                bytes([codec.T_DICT]), struct.pack(">I", 2), (struct.pack(">I", 1) + b"k" + bytes([codec.T_NONE])) * 2
            )
        )


def _decodes_or_refuses(blob: bytes) -> None:
    try:
        result = decode(blob)
    except MessageCodecError:
        return
    assert isinstance(result, Message)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_escape_as_other_errors(data):
    _decodes_or_refuses(data)
    _decodes_or_refuses(PREFIX + data)
    try:
        decode_value(PREFIX + data)
    except MessageCodecError:
        pass


@pytest.mark.timeout(60)
def test_every_truncation_of_a_valid_blob_is_refused():
    for m in sample_messages():
        blob = encode(m)
        for cut in range(len(blob)):
            with pytest.raises(MessageCodecError):
                decode(blob[:cut])


@pytest.mark.timeout(120)
def test_every_bit_flip_of_a_valid_blob_decodes_or_is_refused():
    for m in sample_messages():
        blob = bytearray(encode(m))
        for i in range(len(blob)):
            for bit in range(8):
                blob[i] ^= 1 << bit
                _decodes_or_refuses(bytes(blob))
                blob[i] ^= 1 << bit


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_random_corruption_of_random_messages(m, data):
    blob = bytearray(encode(m))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    _decodes_or_refuses(bytes(blob))


def test_caches_give_the_same_result_and_stay_bounded():
    m = MapMessage({"a": "x", "b": True, "c": "\ud800"})
    m.set_string_property("p", "v")
    m.destination = Queue("q")
    blob = encode(m)
    assert decode(blob) == decode(blob) == m  # the second decode hits every cache
    for i in range(3 * codec._CACHE_LIMIT):
        junk = Message()
        junk.set_int_property(f"p{i}", i)
        junk.destination = Queue(f"q{i}")
        assert decode(encode(junk)) == junk
    for cache in (codec._PROPERTY_NAMES, codec._DESTINATIONS, codec._ENCODED_NAMES, codec._LAYOUTS):
        assert len(cache) <= codec._CACHE_LIMIT
    assert decode(blob) == m


def test_a_cached_name_prefix_is_still_checked_against_the_data():
    m = Message()
    m.set_string_property("name", "value")
    blob = encode(m)
    decode(blob)  # cache the prefix
    for cut in range(len(blob)):
        with pytest.raises(MessageCodecError):
            decode(blob[:cut])
