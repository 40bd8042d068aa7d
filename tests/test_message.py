"""The JMS message model: property rules, typed values and conversions, body states."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import message as message_module
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import (
    MessageEOFException,
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
)
from bridgemgr.jms.message import (
    BytesMessage,
    DeliveryMode,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    create_message,
    decode_modified_utf8,
    encode_modified_utf8,
    is_valid_property_name,
    java_float_string,
    property_name_problem,
)


def f32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


# ---------------------------------------------------------------------------
# property names


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "_x",
        "$y",
        "x1",
        "camelCase",
        "café",
        "\u20acuro",
        "\u00b5s",
        "x\u0301",
        "\u2160x",
        "JMSXGroupID",
        "JMSXDeliveryCount",
        "JMS_SUN_JMSBRIDGE_NAME",
        "JMS_",
        "jmsLower",
        "Jms",
        "nullable",
        "ISO",
        "inx",
        "a\x01b",
    ],
)
def test_valid_property_names(name):
    assert is_valid_property_name(name), property_name_problem(name)
    m = Message()
    m.set_string_property(name, "v")
    assert m.get_string_property(name) == "v"


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "non-empty"),
        (None, "non-empty"),
        (5, "non-empty"),
        ("1a", "Java identifier"),
        ("a-b", "Java identifier"),
        ("a b", "Java identifier"),
        ("a.b", "Java identifier"),
        ("\u00bdx", "Java identifier"),
        ("x\u00b2", "Java identifier"),
        ("\ud800", "Java identifier"),
        ("-", "Java identifier"),
        ("NULL", "reserved word"),
        ("null", "reserved word"),
        ("True", "reserved word"),
        ("FALSE", "reserved word"),
        ("not", "reserved word"),
        ("And", "reserved word"),
        ("oR", "reserved word"),
        ("between", "reserved word"),
        ("LIKE", "reserved word"),
        ("in", "reserved word"),
        ("Is", "reserved word"),
        ("Escape", "reserved word"),
        ("JMSFoo", "JMS prefix"),
        ("JMS", "JMS prefix"),
        ("JMSXFoo", "JMSX prefix"),
        ("JMSX", "JMSX prefix"),
        ("JMSCorrelationID", "JMS prefix"),
    ],
)
def test_invalid_property_names(name, why):
    assert not is_valid_property_name(name)
    assert why in property_name_problem(name)
    with pytest.raises(MessageFormatException, match=why):
        Message().set_int_property(name, 1)


# ---------------------------------------------------------------------------
# typed setters


@pytest.mark.parametrize(
    "setter, lo, hi",
    [
        ("set_byte_property", -(2**7), 2**7 - 1),
        ("set_short_property", -(2**15), 2**15 - 1),
        ("set_int_property", -(2**31), 2**31 - 1),
        ("set_long_property", -(2**63), 2**63 - 1),
    ],
)
def test_integer_setters_check_their_range(setter, lo, hi):
    m = Message()
    getattr(m, setter)("lo", lo)
    getattr(m, setter)("hi", hi)
    assert (m.get_long_property("lo"), m.get_long_property("hi")) == (lo, hi)
    for bad in (lo - 1, hi + 1):
        with pytest.raises(MessageFormatException, match="out of range"):
            getattr(m, setter)("x", bad)
    for wrong in (True, 1.0, "1", None):
        with pytest.raises(MessageFormatException):
            getattr(m, setter)("x", wrong)
    assert not m.property_exists("x")


def test_float_setter_rounds_to_float32():
    m = Message()
    m.set_float_property("f", 0.1)
    assert m.get_float_property("f") == f32(0.1) != 0.1
    m.set_float_property("big", 1e39)
    assert m.get_float_property("big") == math.inf
    m.set_float_property("neg", -1e39)
    assert m.get_float_property("neg") == -math.inf
    m.set_float_property("max", 3.4028235e38)
    assert m.get_float_property("max") == f32(3.4028235e38) < math.inf
    m.set_float_property("nan", math.nan)
    assert math.isnan(m.get_float_property("nan"))
    m.set_float_property("i", 3)
    assert m.get_float_property("i") == 3.0 and isinstance(m.get_float_property("i"), float)


def test_double_setter():
    m = Message()
    m.set_double_property("d", 0.1)
    assert m.get_double_property("d") == 0.1
    with pytest.raises(MessageFormatException, match="out of range"):
        m.set_double_property("huge", 10**400)
    for wrong in (True, "1.0", None):
        with pytest.raises(MessageFormatException):
            m.set_double_property("x", wrong)


def test_boolean_and_string_setters_check_types():
    m = Message()
    with pytest.raises(MessageFormatException):
        m.set_boolean_property("b", 1)
    with pytest.raises(MessageFormatException):
        m.set_string_property("s", b"bytes")
    m.set_boolean_property("b", False)
    assert m.get_property_type("b") is PropertyType.BOOLEAN


def test_set_object_property_infers_java_types():
    m = Message()
    for name, value, ptype in (
        ("b", True, PropertyType.BOOLEAN),
        ("i", 7, PropertyType.INT),
        ("l", 2**40, PropertyType.LONG),
        ("d", 1.5, PropertyType.DOUBLE),
        ("s", "x", PropertyType.STRING),
    ):
        m.set_object_property(name, value)
        assert m.get_property_type(name) is ptype and m.get_object_property(name) == value
    for wrong in (b"x", None, [1], 2**64):
        with pytest.raises(MessageFormatException):
            m.set_object_property("w", wrong)


def test_set_typed_property():
    m = Message()
    m.set_typed_property("a", 4, 1)  # an int code is accepted and normalised
    assert m.get_property_type("a") is PropertyType.INT
    for bad in (PropertyType.CHAR, PropertyType.BYTES):
        with pytest.raises(MessageFormatException, match="not a property type"):
            m.set_typed_property("x", bad, "c")
    for bad in (99, "INT", None):
        with pytest.raises(MessageFormatException, match="unknown value type"):
            m.set_typed_property("x", bad, 1)


# ---------------------------------------------------------------------------
# the conversion table

CONVERSIONS = [
    # (type, stored value, getter, expected value or exception)
    (PropertyType.BYTE, 5, "short", 5),
    (PropertyType.BYTE, 5, "int", 5),
    (PropertyType.BYTE, 5, "long", 5),
    (PropertyType.SHORT, 5, "byte", MessageFormatException),
    (PropertyType.SHORT, 5, "long", 5),
    (PropertyType.INT, 5, "long", 5),
    (PropertyType.INT, 5, "short", MessageFormatException),
    (PropertyType.LONG, 5, "int", MessageFormatException),
    (PropertyType.LONG, 5, "double", MessageFormatException),
    (PropertyType.INT, 5, "float", MessageFormatException),
    (PropertyType.INT, 1, "boolean", MessageFormatException),
    (PropertyType.FLOAT, 0.5, "double", 0.5),
    (PropertyType.DOUBLE, 0.5, "float", MessageFormatException),
    (PropertyType.BOOLEAN, True, "int", MessageFormatException),
    (PropertyType.BOOLEAN, True, "string", "true"),
    (PropertyType.BOOLEAN, False, "string", "false"),
    (PropertyType.INT, -12, "string", "-12"),
    (PropertyType.FLOAT, 0.1, "string", "0.1"),
    (PropertyType.DOUBLE, 0.1, "string", "0.1"),
    (PropertyType.DOUBLE, 1e10, "string", "1.0E10"),
    (PropertyType.DOUBLE, 100.0, "string", "100.0"),
    (PropertyType.DOUBLE, math.nan, "string", "NaN"),
    (PropertyType.DOUBLE, -math.inf, "string", "-Infinity"),
    (PropertyType.FLOAT, 1e-5, "string", "1.0E-5"),
    (PropertyType.STRING, "12", "int", 12),
    (PropertyType.STRING, "+12", "byte", 12),
    (PropertyType.STRING, "-12", "long", -12),
    (PropertyType.STRING, "x", "int", MessageFormatException),
    (PropertyType.STRING, "12.0", "int", MessageFormatException),
    (PropertyType.STRING, " 12", "int", MessageFormatException),
    (PropertyType.STRING, "300", "byte", MessageFormatException),
    (PropertyType.STRING, "300", "short", 300),
    (PropertyType.STRING, "1.5", "double", 1.5),
    (PropertyType.STRING, " 1.5d ", "double", 1.5),
    (PropertyType.STRING, "1e3", "double", 1000.0),
    (PropertyType.STRING, "-Infinity", "double", -math.inf),
    (PropertyType.STRING, "0.1", "float", f32(0.1)),
    (PropertyType.STRING, "inf", "double", MessageFormatException),
    (PropertyType.STRING, "1_0", "double", MessageFormatException),
    (PropertyType.STRING, "", "double", MessageFormatException),
    (PropertyType.STRING, "TRUE", "boolean", True),
    (PropertyType.STRING, "yes", "boolean", False),
    (PropertyType.STRING, "s", "string", "s"),
]


@pytest.mark.parametrize("ptype, value, getter, expected", CONVERSIONS)
def test_property_conversions(ptype, value, getter, expected):
    m = Message()
    m.set_typed_property("p", ptype, value)
    get = getattr(m, f"get_{getter}_property")
    if isinstance(expected, type):
        with pytest.raises(expected):
            get("p")
    else:
        result = get("p")
        assert result == expected and type(result) is type(expected)


def test_string_of_nan_parses():
    m = Message()
    m.set_string_property("p", "NaN")
    assert math.isnan(m.get_double_property("p"))


def test_missing_properties():
    m = Message()
    assert m.get_boolean_property("nope") is False
    assert m.get_string_property("nope") is None
    assert m.get_object_property("nope") is None
    assert m.get_property_type("nope") is None
    for getter in ("byte", "short", "int", "long", "float", "double"):
        with pytest.raises(MessageFormatException, match="does not exist"):
            getattr(m, f"get_{getter}_property")("nope")


def test_jmsx_delivery_count_comes_from_the_header():
    m = Message()
    assert not m.property_exists("JMSXDeliveryCount")
    assert m.get_object_property("JMSXDeliveryCount") is None
    m.delivery_count = 3
    assert m.property_exists("JMSXDeliveryCount")
    assert m.get_int_property("JMSXDeliveryCount") == 3
    assert m.get_long_property("JMSXDeliveryCount") == 3
    assert m.get_string_property("JMSXDeliveryCount") == "3"
    assert m.get_object_property("JMSXDeliveryCount") == 3
    assert m.get_property_type("JMSXDeliveryCount") is PropertyType.INT
    assert "JMSXDeliveryCount" not in m.property_names  # not a stored property
    m.set_int_property("JMSXDeliveryCount", 9)  # an explicit value wins
    assert m.get_int_property("JMSXDeliveryCount") == 9


@pytest.mark.parametrize(
    "value, single, text",
    [
        (1.0, False, "1.0"),
        (-1.5, False, "-1.5"),
        (0.001, False, "0.001"),
        (1e-4, False, "1.0E-4"),
        (1234567.0, False, "1234567.0"),
        (1e7, False, "1.0E7"),
        (123456789.0, False, "1.23456789E8"),
        (5e-324, False, "4.9E-324"),
        (1.7976931348623157e308, False, "1.7976931348623157E308"),
        (0.0, False, "0.0"),
        (-0.0, False, "-0.0"),
        (0.1, True, "0.1"),
        (1.4e-45, True, "1.4E-45"),
        (3.4028234663852886e38, True, "3.4028235E38"),
        (16777216.0, True, "1.6777216E7"),
        (0.3, True, "0.3"),
    ],
)
def test_java_float_strings(value, single, text):
    assert java_float_string(value, single) == text


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_java_float_strings_read_back(d, f):
    assert float(java_float_string(d)) == d
    assert f32(float(java_float_string(f, single=True))) == f


# ---------------------------------------------------------------------------
# read-only states


def test_read_only_properties_until_clear_properties():
    m = TextMessage("body")
    m.set_int_property("a", 1)
    m.set_read_only()
    assert m.is_read_only
    with pytest.raises(MessageNotWriteableException):
        m.set_int_property("b", 2)
    assert m.get_int_property("a") == 1  # reads still work
    m.clear_body()  # the body becomes writable, the properties stay read-only
    m.text = "new"
    with pytest.raises(MessageNotWriteableException):
        m.set_int_property("b", 2)
    m.clear_properties()
    assert m.property_names == [] and not m.is_read_only
    m.set_int_property("b", 2)


def test_read_only_body_until_clear_body():
    m = TextMessage("body")
    m.set_read_only()
    with pytest.raises(MessageNotWriteableException):
        m.text = "x"
    m.clear_properties()  # properties only
    with pytest.raises(MessageNotWriteableException):
        m.text = "x"
    m.clear_body()
    assert m.text is None
    m.text = "x"
    obj = ObjectMessage([1])
    obj.set_read_only()
    with pytest.raises(MessageNotWriteableException):
        obj.object = 2
    mapped = MapMessage({"a": 1})
    mapped.set_read_only()
    with pytest.raises(MessageNotWriteableException):
        mapped.set_int("b", 1)
    assert mapped.get_int("a") == 1


def test_text_must_be_str():
    with pytest.raises(MessageFormatException):
        TextMessage(b"bytes")  # type: ignore[arg-type]
    m = TextMessage()
    with pytest.raises(MessageFormatException):
        m.text = 5  # type: ignore[assignment]


# ---------------------------------------------------------------------------
# BytesMessage


def test_bytes_body_is_write_only_until_reset():
    m = BytesMessage()
    m.write_int(1)
    with pytest.raises(MessageNotReadableException):
        m.read_int()
    with pytest.raises(MessageNotReadableException):
        m.get_body_length()
    m.reset()
    assert m.get_body_length() == 4
    assert m.read_int() == 1
    with pytest.raises(MessageNotWriteableException):
        m.write_int(2)
    m.clear_body()
    m.write_byte(1)
    assert m.get_body() == b"\x01"


def test_set_read_only_puts_bytes_in_read_mode():
    m = BytesMessage(b"\x00\x07")
    m.set_read_only()
    assert m.read_short() == 7


def test_java_data_output_formats():
    m = BytesMessage()
    m.write_boolean(True)
    m.write_byte(-1)
    m.write_short(-2)
    m.write_char("A")
    m.write_int(1)
    m.write_long(-(2**63))
    m.write_float(1.0)
    m.write_double(-2.5)
    assert m.get_body() == (
        b"\x01"
        b"\xff"
        b"\xff\xfe"
        b"\x00A"
        b"\x00\x00\x00\x01"
        b"\x80\x00\x00\x00\x00\x00\x00\x00"
        b"\x3f\x80\x00\x00" + struct.pack(">d", -2.5)
    )
    m.reset()
    assert [
        m.read_boolean(),
        m.read_byte(),
        m.read_short(),
        m.read_char(),
        m.read_int(),
        m.read_long(),
        m.read_float(),
        m.read_double(),
    ] == [True, -1, -2, "A", 1, -(2**63), 1.0, -2.5]


def test_unsigned_reads():
    m = BytesMessage(b"\xff\xff\xfe")
    m.reset()
    assert m.read_unsigned_byte() == 255
    assert m.read_unsigned_short() == 0xFFFE


def test_write_utf_is_modified_utf8():
    m = BytesMessage()
    m.write_utf("a\x00b")
    m.write_utf("\U0001f600")
    m.write_utf("\u00e9\u20ac")
    assert m.get_body() == (b"\x00\x04a\xc0\x80b\x00\x06\xed\xa0\xbd\xed\xb8\x80\x00\x05\xc3\xa9\xe2\x82\xac")
    m.reset()
    assert [m.read_utf(), m.read_utf(), m.read_utf()] == ["a\x00b", "\U0001f600", "\u00e9\u20ac"]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=()), max_size=50))
def test_modified_utf8_round_trips(text):
    data = encode_modified_utf8(text)
    assert b"\x00" not in data
    assert decode_modified_utf8(data) == text


def test_malformed_modified_utf8():
    for bad in (b"\xc3", b"\xe2\x82", b"\xff", b"\xc3\x41", b"\xe2\x41\x80"):
        with pytest.raises(MessageFormatException):
            decode_modified_utf8(bad)


def test_write_utf_limit():
    with pytest.raises(MessageFormatException, match="65535"):
        BytesMessage().write_utf("x" * 65536)
    m = BytesMessage()
    m.write_utf("x" * 65535)


def test_reading_past_the_end():
    m = BytesMessage(b"\x00\x01")
    m.reset()
    with pytest.raises(MessageEOFException):
        m.read_int()
    assert m.read_short() == 1  # the failed read did not move
    with pytest.raises(MessageEOFException):
        m.read_byte()


def test_read_utf_past_the_end_does_not_move():
    m = BytesMessage(b"\x00\x05ab")
    m.reset()
    with pytest.raises(MessageEOFException):
        m.read_utf()
    assert m.read_short() == 5
    bad = BytesMessage(b"\x00\x01\xff")
    bad.reset()
    with pytest.raises(MessageFormatException):
        bad.read_utf()
    assert bad.read_short() == 1


def test_read_bytes():
    m = BytesMessage(b"abcde")
    m.reset()
    assert m.read_bytes(2) == b"ab"
    assert m.read_bytes(10) == b"cde"
    assert m.read_bytes(1) == b""  # JMS: -1 at the end
    with pytest.raises(MessageFormatException, match="negative"):
        m.read_bytes(-1)
    m.reset()
    assert m.read_bytes() == b"abcde"


def test_write_bytes_with_offset_and_length():
    m = BytesMessage()
    m.write_bytes(b"abcdef", 1, 3)
    m.write_bytes(bytearray(b"xy"), 1)
    m.write_bytes(memoryview(b"z"))
    assert m.get_body() == b"bcdyz"
    for offset, length in ((7, None), (-1, 1), (2, 5), (0, -1)):
        with pytest.raises(MessageFormatException, match="outside"):
            m.write_bytes(b"abcdef", offset, length)


def test_bytes_write_object():
    m = BytesMessage()
    for value in ("s", b"\x01", True, 7, 2**40, 1.5):
        m.write_object(value)
    m.reset()
    assert [m.read_utf(), m.read_byte(), m.read_boolean(), m.read_int(), m.read_long(), m.read_double()] == [
        "s",
        1,
        True,
        7,
        2**40,
        1.5,
    ]
    with pytest.raises(MessageFormatException):
        BytesMessage().write_object(None)


# ---------------------------------------------------------------------------
# StreamMessage


def test_stream_is_write_only_until_reset():
    m = StreamMessage()
    m.write_int(1)
    with pytest.raises(MessageNotReadableException):
        m.read_int()
    with pytest.raises(MessageNotReadableException):
        m.read_object()
    m.reset()
    assert m.read_int() == 1
    with pytest.raises(MessageEOFException):
        m.read_int()
    with pytest.raises(MessageNotWriteableException):
        m.write_int(2)
    m.clear_body()
    m.write_int(2)


def test_stream_conversions():
    m = StreamMessage()
    m.write_byte(1)
    m.write_int(2)
    m.write_char("c")
    m.write_float(0.5)
    m.write_string("42")
    m.write_bytes(b"raw")
    m.write_boolean(True)
    m.reset()
    assert m.read_short() == 1
    assert m.read_long() == 2
    assert m.read_string() == "c"
    assert m.read_double() == 0.5
    assert m.read_int() == 42
    assert m.read_bytes() == b"raw"
    assert m.read_string() == "true"


def test_failed_stream_conversion_does_not_advance():
    m = StreamMessage(["text", 5])
    m.reset()
    with pytest.raises(MessageFormatException):
        m.read_int()  # "text" is not a number
    with pytest.raises(MessageFormatException):
        m.read_char()  # a STRING is never a char
    assert m.read_string() == "text"
    with pytest.raises(MessageFormatException):
        m.read_short()  # INT cannot narrow
    with pytest.raises(MessageFormatException):
        m.read_bytes()
    assert m.read_object() == 5
    with pytest.raises(MessageEOFException):
        m.read_object()


def test_stream_typed_items_and_write_typed():
    m = StreamMessage()
    m.write_typed(9, "x")  # CHAR by code
    m.write_typed(PropertyType.BYTES, bytearray(b"b"))
    assert m.typed_items() == [(PropertyType.CHAR, "x"), (PropertyType.BYTES, b"b")]
    with pytest.raises(MessageFormatException):
        m.write_typed(42, 1)
    with pytest.raises(MessageFormatException):
        m.write_char("\U0001f600")


# ---------------------------------------------------------------------------
# MapMessage


def test_map_typed_get_and_set():
    m = MapMessage()
    m.set_int("i", 5)
    m.set_char("c", "x")
    m.set_bytes("b", b"\x00")
    m.set_float("f", 0.1)
    m.set_string("s", "7")
    m.set_boolean("t", True)
    m.set_typed("l", PropertyType.LONG, 2**40)
    assert m.get_long("i") == 5
    with pytest.raises(MessageFormatException):
        m.get_short("i")
    assert m.get_char("c") == "x" and m.get_string("c") == "x"
    with pytest.raises(MessageFormatException):
        m.get_char("s")
    assert m.get_bytes("b") == b"\x00"
    with pytest.raises(MessageFormatException):
        m.get_string("b")
    assert m.get_double("f") == f32(0.1)
    assert m.get_int("s") == 7 and m.get_string("t") == "true"
    assert m.get_long("l") == 2**40
    assert m.get_bytes("missing") is None and m.get_string("missing") is None
    assert m.get_boolean("missing") is False and m.get_object("missing") is None
    with pytest.raises(MessageFormatException):
        m.get_int("missing")
    assert m.item_exists("i") and not m.item_exists("missing")
    assert m.map_names == ["i", "c", "b", "f", "s", "t", "l"]
    assert m.get_body()["s"] == "7"


def test_map_rejects_bad_names_and_values():
    m = MapMessage()
    for name in ("", None):
        with pytest.raises(MessageFormatException):
            m.set_int(name, 1)  # type: ignore[arg-type]
    with pytest.raises(MessageFormatException):
        m.set_byte("b", 128)
    with pytest.raises(MessageFormatException):
        m.set_char("c", "ab")
    with pytest.raises(MessageFormatException):
        m.set_object("o", [1])
    m.set_int("any name works, not only identifiers", 1)


# ---------------------------------------------------------------------------
# copies, equality, kinds


def test_copy_is_independent_and_writable():
    m = MapMessage({"a": 1})
    m.set_string_property("p", "v")
    m.destination = Queue("q")
    m.set_read_only()
    c = m.copy()
    assert c == m and not c.is_read_only
    c.set_int("b", 2)
    c.set_string_property("p", "changed")
    assert not m.item_exists("b") and m.get_string_property("p") == "v"

    b = BytesMessage(b"ab")
    bc = b.copy()
    bc.write_bytes(b"c")
    assert b.get_body() == b"ab"

    s = StreamMessage([1])
    sc = s.copy()
    sc.write_int(2)
    assert s.typed_items() == [(PropertyType.INT, 1)]


def test_copy_of_an_object_body_shares_nothing_mutable():
    inner = TextMessage("inner")
    m = ObjectMessage({"list": [1, {"k": "v"}], "msg": inner})
    c = m.copy()
    c.object["list"].append(2)
    c.object["list"][1]["k"] = "changed"
    c.object["msg"].text = "changed"
    assert m.object == {"list": [1, {"k": "v"}], "msg": inner}
    assert inner.text == "inner"


def test_equality():
    a, b = Message(), Message()
    a.set_double_property("nan", math.nan)
    b.set_double_property("nan", math.nan)
    a.set_int_property("x", 1)
    a.set_int_property("y", 2)
    b.set_int_property("y", 2)
    b.set_int_property("x", 1)
    assert a == b  # NaN equals NaN, and property order does not matter
    b.set_long_property("x", 1)
    assert a != b  # the type matters
    zero, negative_zero = MapMessage(), MapMessage()
    zero.set_double("z", 0.0)
    negative_zero.set_double("z", -0.0)
    assert zero != negative_zero  # as Java's Double.equals
    assert TextMessage("x") != BytesMessage(b"x")
    assert Message() != "not a message"
    assert ObjectMessage([1]) != ObjectMessage([True])
    assert ObjectMessage(b"x") != ObjectMessage(JavaSerialized(b"x"))
    assert ObjectMessage([math.nan]) == ObjectMessage([math.nan])
    s1, s2 = StreamMessage(), StreamMessage()
    s1.write_float(math.nan)
    s2.write_float(math.nan)
    assert s1 == s2


@pytest.mark.parametrize(
    "kind, cls",
    [
        ("MESSAGE", Message),
        ("TEXT", TextMessage),
        ("BYTES", BytesMessage),
        ("MAP", MapMessage),
        ("STREAM", StreamMessage),
        ("OBJECT", ObjectMessage),
        ("text", TextMessage),
    ],
)
def test_create_message(kind, cls):
    m = create_message(kind)
    assert type(m) is cls and m.message_type == kind.upper()
    assert not m.is_read_only and m.delivery_mode == DeliveryMode.PERSISTENT and m.priority == 4


def test_create_message_of_unknown_kind():
    with pytest.raises(MessageFormatException, match="unknown message type"):
        create_message("XML")


def test_properties_view_is_read_only():
    m = Message()
    m.set_int_property("a", 1)
    view = m.properties
    assert dict(view) == {"a": 1}
    with pytest.raises(TypeError):
        view["b"] = 2  # type: ignore[index]


def test_acknowledge_calls_the_session_hook():
    calls = []
    m = Message()
    m.acknowledge()  # no hook: nothing happens
    m._ack = lambda: calls.append(1)
    m.acknowledge()
    assert calls == [1]


def test_repr_shows_headers_properties_and_body():
    m = TextMessage("hello")
    m.message_id = "ID:1"
    m.set_int_property("n", 1)
    text = repr(m)
    assert "ID:1" in text and "n=1" in text and "hello" in text


@pytest.mark.parametrize("kind", ["MESSAGE", "TEXT", "BYTES", "MAP", "STREAM", "OBJECT"])
def test_property_accessors_work_on_every_kind(kind):
    m = create_message(kind)
    m.set_int_property("p", 5)
    m.set_string_property("s", "7")
    assert m.get_int_property("p") == 5 and m.get_long_property("s") == 7
    assert m.get_string_property("missing") is None
    if isinstance(m, MapMessage):  # map entries and properties are separate namespaces
        m.set_int("p", 9)
        assert m.get_int_property("p") == 5 and m.get_int("p") == 9
        assert not m.item_exists("s")


# --- set_string_property's fast path against _set ---------------------------------------------


class Text(str):
    """A str subclass: not the plain str the fast path takes."""


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["ts", "app_id", "JMSXGroupID", "JMSBad", "1bad", "", "sp ace", "new_name_x"]),
    st.sampled_from(["v", "", "\udc80", Text("t"), 5, None, b"b"]),
    st.booleans(),
    st.booleans(),
)
def test_set_string_property_fast_path_acts_as_set(name, value, seen, read_only):
    """A name checked before and a plain str go straight into the properties; whatever
    the name, value, and read-only state, the outcome (properties, or the error) is the
    one _set gives."""
    if seen and property_name_problem(name) is None:
        Message().set_string_property(name, "seed")  # now a checked name

    def run(setter: str) -> tuple[object, ...]:
        m = Message()
        m.set_string_property("other", "o")
        m._props_ro = read_only
        try:
            if setter == "fast":
                m.set_string_property(name, value)
            else:
                m._set(name, PropertyType.STRING, value)
        except (MessageFormatException, MessageNotWriteableException) as exc:
            return ("refused", type(exc), str(exc))
        return ("set", [(k, t, v, type(v)) for k, (t, v) in m._props.items()])

    assert run("fast") == run("general")


def test_set_string_property_of_a_checked_name_skips_set(monkeypatch):
    """The per-message case (a converter stamping the same names on every message) does
    no name or value check again."""
    monkeypatch.setattr(message_module, "_CHECKED_NAMES", set())  # others may have filled it
    Message().set_string_property("fast_path_name", "seed")
    calls = []
    monkeypatch.setattr(Message, "_set", lambda self, *args: calls.append(args))
    m = Message()
    m.set_string_property("fast_path_name", "v")
    assert calls == [] and m.get_string_property("fast_path_name") == "v"
    m.set_string_property("fast_path_name", Text("t"))  # not a plain str: the checks
    assert len(calls) == 1
