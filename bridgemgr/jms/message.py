"""The JMS message model: headers, typed properties, the six body kinds.

How it works: a message keeps its JMS headers as plain attributes and its properties
as ``name -> (PropertyType, value)`` so the type a sender chose (int8 vs int32, float
vs double) survives the codec, the broker and a trip through Java. Reads convert
as the JMS conversion table allows (``CONVERSIONS``). A received message is
read-only (properties and body) until ``clear_properties()`` / ``clear_body()``;
Bytes and Stream bodies are write-only until ``reset()``, as in JMS.

Names follow JMS in snake_case (``set_int_property``, ``get_string_property``); header
fields drop the JMS prefix (``message_id``, ``correlation_id``, ``reply_to`` ...).
"""

from __future__ import annotations

import math
import re
import struct
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Self, cast

from .destination import Destination
from .errors import (
    MessageEOFException,
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
)


class DeliveryMode(IntEnum):
    NON_PERSISTENT = 1
    PERSISTENT = 2


DEFAULT_DELIVERY_MODE = DeliveryMode.PERSISTENT
DEFAULT_PRIORITY = 4
DEFAULT_TIME_TO_LIVE = 0
# What a message's headers count for where its size is estimated, not encoded (the
# embedded broker and its store estimate a message not encoded as its body + 200).
HEADER_BYTES = 200


_F32 = struct.Struct(">f")


class PropertyType(IntEnum):
    """Java value types of properties, map entries and stream items."""

    BOOLEAN = 1
    BYTE = 2  # int8
    SHORT = 3  # int16
    INT = 4  # int32
    LONG = 5  # int64
    FLOAT = 6  # float32
    DOUBLE = 7
    STRING = 8
    CHAR = 9  # map/stream bodies only: one UTF-16 code unit
    BYTES = 10  # map/stream bodies only


INT_RANGES: dict[PropertyType, tuple[int, int]] = {
    PropertyType.BYTE: (-(2**7), 2**7 - 1),
    PropertyType.SHORT: (-(2**15), 2**15 - 1),
    PropertyType.INT: (-(2**31), 2**31 - 1),
    PropertyType.LONG: (-(2**63), 2**63 - 1),
}
PROPERTY_TYPES = frozenset(PropertyType) - {PropertyType.CHAR, PropertyType.BYTES}

# What each typed getter accepts (JMS 1.1 section 3.5.4 and the Map/Stream tables).
CONVERSIONS: dict[PropertyType, frozenset[PropertyType]] = {
    PropertyType.BOOLEAN: frozenset({PropertyType.BOOLEAN, PropertyType.STRING}),
    PropertyType.BYTE: frozenset({PropertyType.BYTE, PropertyType.STRING}),
    PropertyType.SHORT: frozenset({PropertyType.BYTE, PropertyType.SHORT, PropertyType.STRING}),
    PropertyType.INT: frozenset({PropertyType.BYTE, PropertyType.SHORT, PropertyType.INT, PropertyType.STRING}),
    PropertyType.LONG: frozenset(
        {PropertyType.BYTE, PropertyType.SHORT, PropertyType.INT, PropertyType.LONG, PropertyType.STRING}
    ),
    PropertyType.FLOAT: frozenset({PropertyType.FLOAT, PropertyType.STRING}),
    PropertyType.DOUBLE: frozenset({PropertyType.FLOAT, PropertyType.DOUBLE, PropertyType.STRING}),
    PropertyType.STRING: frozenset(PropertyType) - {PropertyType.BYTES},
    PropertyType.CHAR: frozenset({PropertyType.CHAR}),
    PropertyType.BYTES: frozenset({PropertyType.BYTES}),
}

# ---------------------------------------------------------------------------
# property names

SELECTOR_RESERVED = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
JMSX_NAMES = frozenset(
    {
        "JMSXUserID",
        "JMSXAppID",
        "JMSXDeliveryCount",
        "JMSXGroupID",
        "JMSXGroupSeq",
        "JMSXProducerTXID",
        "JMSXConsumerTXID",
        "JMSXRcvTimestamp",
        "JMSXState",
    }
)
# A Java identifier (Character.isJavaIdentifierStart, then isJavaIdentifierPart): a
# letter, letter-number, currency symbol or connector first; then those, digits,
# combining marks and the "identifier-ignorable" format and control characters.
_ASCII_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$\x00-\x08\x0e-\x1b\x7f]*\Z")
_IDENT_START = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_IDENT_PART = _IDENT_START | {"Nd", "Mn", "Mc", "Cf"}
_IDENT_IGNORABLE_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x9f]")


def _is_java_identifier(name: str) -> bool:
    if name.isascii():
        return _ASCII_IDENT.match(name) is not None
    category = unicodedata.category
    return category(name[0]) in _IDENT_START and all(
        category(c) in _IDENT_PART or _IDENT_IGNORABLE_CONTROLS.match(c) for c in name[1:]
    )


def property_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid JMS property name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "a property name must be a non-empty string"
    if not _is_java_identifier(name):
        return f"property name {name!r} is not a Java identifier"
    if name.upper() in SELECTOR_RESERVED:
        return f"property name {name!r} is a reserved word of the selector language"
    if name.startswith("JMSX"):
        if name not in JMSX_NAMES:
            return f"property name {name!r} uses the reserved JMSX prefix but is not a JMSX property"
    elif name.startswith("JMS") and not name.startswith("JMS_"):
        return f"property name {name!r} uses the reserved JMS prefix (only JMSX and JMS_ names are allowed)"
    return None


# names that passed property_name_problem: a bridge stamps the same few on every message
_CHECKED_NAMES: set[str] = set()
_CHECKED_NAMES_LIMIT = 4096


def is_valid_property_name(name: object) -> bool:
    return property_name_problem(name) is None


# ---------------------------------------------------------------------------
# typed values


def _round_f32(value: float) -> float:
    """``(float) value`` in Java: the nearest float32, infinite past its range."""
    try:
        rounded: float = _F32.unpack(_F32.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    return rounded


def as_value_type(ptype: Any) -> PropertyType:
    """``ptype`` as a PropertyType (an int code is accepted); MessageFormatException if unknown."""
    try:
        return PropertyType(ptype)
    except (ValueError, TypeError):
        raise MessageFormatException(f"unknown value type {ptype!r}") from None


def check_value(ptype: PropertyType, value: Any) -> Any:
    """Validate ``value`` for ``ptype`` and return it normalised; raise MessageFormatException."""
    if ptype in INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MessageFormatException(f"{ptype.name} value must be an int, not {type(value).__name__}")
        lo, hi = INT_RANGES[ptype]
        if not lo <= value <= hi:
            raise MessageFormatException(f"{value} is out of range for {ptype.name} ({lo}..{hi})")
        return value
    if ptype is PropertyType.BOOLEAN:
        if not isinstance(value, bool):
            raise MessageFormatException(f"BOOLEAN value must be a bool, not {type(value).__name__}")
        return value
    if ptype in (PropertyType.FLOAT, PropertyType.DOUBLE):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MessageFormatException(f"{ptype.name} value must be a float, not {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:
            raise MessageFormatException(f"{value} is out of range for {ptype.name}") from None
        return _round_f32(value) if ptype is PropertyType.FLOAT else value
    if ptype is PropertyType.STRING:
        if not isinstance(value, str):
            raise MessageFormatException(f"STRING value must be a str, not {type(value).__name__}")
        return value
    if ptype is PropertyType.CHAR:
        if not isinstance(value, str) or len(value) != 1 or ord(value) > 0xFFFF:
            raise MessageFormatException("CHAR value must be one character of the Basic Multilingual Plane")
        return value
    if ptype is PropertyType.BYTES:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise MessageFormatException(f"BYTES value must be bytes, not {type(value).__name__}")
        return bytes(value)
    raise MessageFormatException(f"unknown value type {ptype!r}")


def infer_type(value: Any) -> PropertyType:
    """The Java type a plain Python value maps to (``set_object_property``)."""
    if isinstance(value, bool):
        return PropertyType.BOOLEAN
    if isinstance(value, int):
        low, high = INT_RANGES[PropertyType.INT]
        return PropertyType.INT if low <= value <= high else PropertyType.LONG
    if isinstance(value, float):
        return PropertyType.DOUBLE
    if isinstance(value, str):
        return PropertyType.STRING
    if isinstance(value, (bytes, bytearray, memoryview)):
        return PropertyType.BYTES
    raise MessageFormatException(f"a {type(value).__name__} cannot be a JMS property or map value")


def java_string(ptype: PropertyType, value: Any) -> str:
    """``String.valueOf`` of a typed value, as a Java client would read it."""
    if ptype is PropertyType.BOOLEAN:
        return "true" if value else "false"
    if ptype in (PropertyType.FLOAT, PropertyType.DOUBLE):
        return java_float_string(value, single=ptype is PropertyType.FLOAT)
    return str(value)


def java_float_string(value: float, single: bool = False) -> str:
    """Java's ``Float.toString`` (``single``) or ``Double.toString`` (JDK 19+): the shortest
    digits that read back as the same value (the closest of the 1- and 2-digit ones when
    one digit is enough), plain from 1e-3 to 1e7, else ``d.dddE<n>``."""
    if single:
        value = _round_f32(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"

    def reads_back(text: str) -> bool:
        return (_round_f32(float(text)) if single else float(text)) == value

    text = repr(value)  # the shortest digits that round-trip a double
    if single:
        text = next(t for t in (f"{value:.{n}e}" for n in range(9)) if reads_back(t))
    sign, digit_tuple, exponent = Decimal(text).normalize().as_tuple()
    if len(digit_tuple) == 1 and reads_back(f"{value:.1e}"):
        sign, digit_tuple, exponent = Decimal(f"{value:.1e}").normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # value = 0.<digits> * 10**point
    if -3 < point <= 7:
        if point <= 0:
            body = "0." + "0" * -point + digits
        elif point >= len(digits):
            body = digits + "0" * (point - len(digits)) + ".0"
        else:
            body = digits[:point] + "." + digits[point:]
    else:
        body = f"{digits[0]}.{digits[1:] or '0'}E{point - 1}"
    return "-" + body if sign else body


def convert(ptype: PropertyType, value: Any, want: PropertyType, what: str) -> Any:
    """Read a ``ptype`` value as ``want`` following the JMS conversion table."""
    if ptype not in CONVERSIONS[want]:
        raise MessageFormatException(f"{what} is {ptype.name} and cannot be read as {want.name}")
    if ptype is want:
        return value
    if want is PropertyType.STRING:
        return java_string(ptype, value)
    if ptype is PropertyType.STRING:
        return _parse_string(value, want, what)
    return float(value) if want is PropertyType.DOUBLE else value  # widening


# What Integer.parseInt and Double.parseDouble accept (Java trims chars <= ' ' for floats).
_JAVA_INT = re.compile(r"[+-]?\d+\Z")
_JAVA_FLOAT = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)\Z")
_JAVA_TRIM = "".join(map(chr, range(0x21)))


def _parse_string(text: str, want: PropertyType, what: str) -> Any:
    if want is PropertyType.BOOLEAN:
        return text.lower() == "true"  # Boolean.valueOf: anything else is false
    try:
        if want in INT_RANGES:
            if not _JAVA_INT.match(text):
                raise ValueError(text)
            return check_value(want, int(text))
        number = text.strip(_JAVA_TRIM)
        if not _JAVA_FLOAT.match(number):
            raise ValueError(text)
        return check_value(want, float(number.rstrip("fFdD")))
    except (ValueError, MessageFormatException):
        raise MessageFormatException(f"{what} value {text!r} is not a valid {want.name}") from None


def _missing(want: PropertyType, what: str) -> Any:
    """JMS reads a missing value as ``valueOf(null)``."""
    if want is PropertyType.BOOLEAN:
        return False
    if want is PropertyType.STRING:
        return None
    raise MessageFormatException(f"{what} does not exist and cannot be read as {want.name}")


# ---------------------------------------------------------------------------
# messages


class Message:
    """A JMS message with headers and properties and no body."""

    message_type = "MESSAGE"
    __slots__ = (
        "_ack",
        "_body_ro",
        "_props",
        "_props_ro",
        "correlation_id",
        "delivery_count",
        "delivery_mode",
        "delivery_time",
        "destination",
        "expiration",
        "message_id",
        "priority",
        "redelivered",
        "reply_to",
        "timestamp",
        "type",
    )

    def __init__(self) -> None:
        self.message_id: str | None = None
        self.timestamp: int = 0
        self.correlation_id: str | None = None
        self.reply_to: Destination | None = None
        self.destination: Destination | None = None
        self.delivery_mode: int = DEFAULT_DELIVERY_MODE
        self.redelivered: bool = False
        self.type: str | None = None
        self.expiration: int = 0
        self.priority: int = DEFAULT_PRIORITY
        self.delivery_count: int = 0
        self.delivery_time: int = 0
        self._props: dict[str, tuple[PropertyType, Any]] = {}
        self._props_ro = False
        self._body_ro = False
        self._ack: Callable[[], None] | None = None

    # --- properties -------------------------------------------------------
    def _set(self, name: str, ptype: PropertyType, value: Any) -> None:
        if self._props_ro:
            raise MessageNotWriteableException(
                f"properties of a received message are read-only (call clear_properties() first): {name}"
            )
        if name not in _CHECKED_NAMES:
            problem = property_name_problem(name)
            if problem:
                raise MessageFormatException(problem)
            if len(_CHECKED_NAMES) < _CHECKED_NAMES_LIMIT and type(name) is str:
                _CHECKED_NAMES.add(name)
        self._props[name] = (ptype, check_value(ptype, value))

    def set_boolean_property(self, name: str, value: bool) -> None:
        self._set(name, PropertyType.BOOLEAN, value)

    def set_byte_property(self, name: str, value: int) -> None:
        self._set(name, PropertyType.BYTE, value)

    def set_short_property(self, name: str, value: int) -> None:
        self._set(name, PropertyType.SHORT, value)

    def set_int_property(self, name: str, value: int) -> None:
        self._set(name, PropertyType.INT, value)

    def set_long_property(self, name: str, value: int) -> None:
        self._set(name, PropertyType.LONG, value)

    def set_float_property(self, name: str, value: float) -> None:
        self._set(name, PropertyType.FLOAT, value)

    def set_double_property(self, name: str, value: float) -> None:
        self._set(name, PropertyType.DOUBLE, value)

    def set_string_property(self, name: str, value: str) -> None:
        # the usual call (a bridge's converter, per message): a name checked before and a
        # plain str need none of _set's checks; anything else takes _set, which names a problem
        if type(value) is str and name in _CHECKED_NAMES and not self._props_ro:
            self._props[name] = (PropertyType.STRING, value)
            return
        self._set(name, PropertyType.STRING, value)

    def set_object_property(self, name: str, value: bool | int | float | str) -> None:
        ptype = infer_type(value)
        if ptype is PropertyType.BYTES:
            raise MessageFormatException("bytes cannot be a JMS property value")
        self._set(name, ptype, value)

    def set_typed_property(self, name: str, ptype: PropertyType, value: Any) -> None:
        """Set a property with an explicit type (codecs and provider bridges use this)."""
        ptype = as_value_type(ptype)
        if ptype not in PROPERTY_TYPES:
            raise MessageFormatException(f"{ptype.name} is not a property type")
        self._set(name, ptype, value)

    def _entry(self, name: str) -> tuple[PropertyType, Any] | None:
        """A property's (type, value); JMSXDeliveryCount comes from ``delivery_count``."""
        entry = self._props.get(name)
        if entry is None and name == "JMSXDeliveryCount" and self.delivery_count:
            return (PropertyType.INT, self.delivery_count)
        return entry

    def _get(self, name: str, want: PropertyType) -> Any:
        entry = self._entry(name)
        if entry is None:
            return _missing(want, f"property {name!r}")
        return convert(entry[0], entry[1], want, f"property {name!r}")

    def get_boolean_property(self, name: str) -> bool:
        return cast("bool", self._get(name, PropertyType.BOOLEAN))

    def get_byte_property(self, name: str) -> int:
        return cast("int", self._get(name, PropertyType.BYTE))

    def get_short_property(self, name: str) -> int:
        return cast("int", self._get(name, PropertyType.SHORT))

    def get_int_property(self, name: str) -> int:
        return cast("int", self._get(name, PropertyType.INT))

    def get_long_property(self, name: str) -> int:
        return cast("int", self._get(name, PropertyType.LONG))

    def get_float_property(self, name: str) -> float:
        return cast("float", self._get(name, PropertyType.FLOAT))

    def get_double_property(self, name: str) -> float:
        return cast("float", self._get(name, PropertyType.DOUBLE))

    def get_string_property(self, name: str) -> str | None:
        return cast("str | None", self._get(name, PropertyType.STRING))

    def get_object_property(self, name: str) -> bool | int | float | str | None:
        entry = self._entry(name)
        return None if entry is None else entry[1]

    def get_property_type(self, name: str) -> PropertyType | None:
        entry = self._entry(name)
        return None if entry is None else entry[0]

    def property_exists(self, name: str) -> bool:
        return self._entry(name) is not None

    @property
    def property_names(self) -> list[str]:
        return list(self._props)

    @property
    def properties(self) -> Mapping[str, Any]:
        """A read-only view ``name -> value`` of the properties."""
        return MappingProxyType({k: v for k, (_, v) in self._props.items()})

    def typed_properties(self) -> Iterator[tuple[str, PropertyType, Any]]:
        for name, (ptype, value) in self._props.items():
            yield name, ptype, value

    def clear_properties(self) -> None:
        self._props = {}
        self._props_ro = False

    # --- body -------------------------------------------------------------
    def clear_body(self) -> None:
        self._body_ro = False

    def _check_writable(self) -> None:
        if self._body_ro:
            raise MessageNotWriteableException("the body of a received message is read-only (call clear_body() first)")

    def get_body(self) -> Any:
        """The body as one Python value (JMS 2 ``getBody``)."""
        return None

    # --- provider side ----------------------------------------------------
    def acknowledge(self) -> None:
        """Acknowledge as the receiving session's mode says (CLIENT: all delivered so far)."""
        if self._ack is not None:
            self._ack()

    def set_read_only(self) -> None:
        """Make properties and body read-only, as a received message is."""
        self._props_ro = True
        self._body_ro = True

    @property
    def is_read_only(self) -> bool:
        return self._props_ro

    @property
    def is_body_read_only(self) -> bool:
        """The body is as received (clear_body() makes it writable)."""
        return self._body_ro

    def copy(self) -> Self:
        """An independent copy with the same headers, properties and body, writable."""
        clone = type(self).__new__(type(self))
        clone.message_id = self.message_id
        clone.timestamp = self.timestamp
        clone.correlation_id = self.correlation_id
        clone.reply_to = self.reply_to
        clone.destination = self.destination
        clone.delivery_mode = self.delivery_mode
        clone.redelivered = self.redelivered
        clone.type = self.type
        clone.expiration = self.expiration
        clone.priority = self.priority
        clone.delivery_count = self.delivery_count
        clone.delivery_time = self.delivery_time
        clone._props = dict(self._props)
        clone._props_ro = False
        clone._body_ro = False
        clone._ack = None
        self._copy_body(clone)
        return clone

    def _copy_body(self, clone: Self) -> None:
        pass

    def body_size(self) -> int:
        """Bytes the body takes, about (the broker's message size limits; exact where it
        is text or bytes, without copying it)."""
        return 0

    def size(self) -> int:
        """Bytes the message takes, about: its body, its properties' names and values (a
        number: 8) and HEADER_BYTES for its headers (a bridge link's byte bound; nothing is
        encoded)."""
        size = self.body_size() + HEADER_BYTES
        for name, (_, value) in self._props.items():
            size += len(name) + (len(value) if type(value) is str else 8)
        return size

    def _body_equal(self, other: Self) -> bool:
        return True

    def headers(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in HEADER_FIELDS}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return (
            self.headers() == other.headers()
            and _typed_dict_equal(self._props, other._props)
            and self._body_equal(other)
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable (mutable, equal by value); typeshed has no way to say so

    def _body_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        heads = ", ".join(f"{k}={v!r}" for k, v in self.headers().items() if v not in (None, 0, False))
        props = ", ".join(f"{k}={v!r}" for k, (_, v) in self._props.items())
        body = self._body_repr()
        return f"{type(self).__name__}({heads}; properties={{{props}}}{'; ' + body if body else ''})"

    __str__ = __repr__


HEADER_FIELDS = (
    "message_id",
    "timestamp",
    "correlation_id",
    "reply_to",
    "destination",
    "delivery_mode",
    "redelivered",
    "type",
    "expiration",
    "priority",
    "delivery_count",
    "delivery_time",
)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


class TextMessage(Message):
    message_type = "TEXT"
    __slots__ = ("_text",)

    def __init__(self, text: str | None = None) -> None:
        super().__init__()
        if text is not None and not isinstance(text, str):
            raise MessageFormatException(f"text must be a str, not {type(text).__name__}")
        self._text = text

    @property
    def text(self) -> str | None:
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._check_writable()
        if value is not None and not isinstance(value, str):
            raise MessageFormatException(f"text must be a str, not {type(value).__name__}")
        self._text = value

    def get_body(self) -> str | None:
        return self._text

    def clear_body(self) -> None:
        super().clear_body()
        self._text = None

    def _copy_body(self, clone: Self) -> None:
        clone._text = self._text

    def body_size(self) -> int:
        text = self._text
        if text is None:
            return 0
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

    def _body_equal(self, other: Self) -> bool:
        return self._text == other._text

    def _body_repr(self) -> str:
        return f"text={_short(self._text)}"


# Java DataOutput encodings, big-endian, for Bytes bodies.
_FORMATS = {
    PropertyType.BOOLEAN: struct.Struct(">?"),
    PropertyType.BYTE: struct.Struct(">b"),
    PropertyType.SHORT: struct.Struct(">h"),
    PropertyType.CHAR: struct.Struct(">H"),
    PropertyType.INT: struct.Struct(">i"),
    PropertyType.LONG: struct.Struct(">q"),
    PropertyType.FLOAT: struct.Struct(">f"),
    PropertyType.DOUBLE: struct.Struct(">d"),
}


def encode_modified_utf8(text: str) -> bytes:
    """Java's modified UTF-8 (NUL as C0 80, astral characters as surrogate pairs)."""
    if text.isascii() and "\x00" not in text:
        return text.encode("ascii")
    raw = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", raw):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | (unit >> 6) & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def decode_modified_utf8(data: bytes) -> str:
    """Java's ``DataInput.readUTF`` decoding; MessageFormatException on malformed bytes."""
    if data.isascii():
        return data.decode("ascii")
    units = []
    i, n = 0, len(data)
    try:
        while i < n:
            b = data[i]
            if b < 0x80:
                units.append(b)
                i += 1
            elif b >> 5 == 0b110 and data[i + 1] >> 6 == 0b10:
                units.append((b & 0x1F) << 6 | data[i + 1] & 0x3F)
                i += 2
            elif b >> 4 == 0b1110 and data[i + 1] >> 6 == 0b10 and data[i + 2] >> 6 == 0b10:
                units.append((b & 0x0F) << 12 | (data[i + 1] & 0x3F) << 6 | data[i + 2] & 0x3F)
                i += 3
            else:
                raise MessageFormatException(f"invalid modified UTF-8 sequence at byte {i}")
    except IndexError:
        raise MessageFormatException("truncated modified UTF-8 string") from None
    return struct.pack(f">{len(units)}H", *units).decode("utf-16-be", "surrogatepass")


class _PrimitiveBody:
    """The typed writes and reads of the eight Java primitives that BytesMessage and
    StreamMessage share; each body says what a write and a read of a type do."""

    __slots__ = ()

    def _write(self, ptype: PropertyType, value: Any) -> None:
        raise NotImplementedError

    def _read(self, ptype: PropertyType) -> Any:
        raise NotImplementedError

    def write_boolean(self, v: bool) -> None:
        self._write(PropertyType.BOOLEAN, v)

    def write_byte(self, v: int) -> None:
        self._write(PropertyType.BYTE, v)

    def write_short(self, v: int) -> None:
        self._write(PropertyType.SHORT, v)

    def write_char(self, v: str) -> None:
        self._write(PropertyType.CHAR, v)

    def write_int(self, v: int) -> None:
        self._write(PropertyType.INT, v)

    def write_long(self, v: int) -> None:
        self._write(PropertyType.LONG, v)

    def write_float(self, v: float) -> None:
        self._write(PropertyType.FLOAT, v)

    def write_double(self, v: float) -> None:
        self._write(PropertyType.DOUBLE, v)

    def read_boolean(self) -> bool:
        return cast("bool", self._read(PropertyType.BOOLEAN))

    def read_byte(self) -> int:
        return cast("int", self._read(PropertyType.BYTE))

    def read_short(self) -> int:
        return cast("int", self._read(PropertyType.SHORT))

    def read_char(self) -> str:
        return cast("str", self._read(PropertyType.CHAR))

    def read_int(self) -> int:
        return cast("int", self._read(PropertyType.INT))

    def read_long(self) -> int:
        return cast("int", self._read(PropertyType.LONG))

    def read_float(self) -> float:
        return cast("float", self._read(PropertyType.FLOAT))

    def read_double(self) -> float:
        return cast("float", self._read(PropertyType.DOUBLE))


class BytesMessage(_PrimitiveBody, Message):
    """An uninterpreted byte body, written and read as a Java DataOutput/DataInput stream."""

    message_type = "BYTES"
    __slots__ = ("_buf", "_pos", "_reading")

    def __init__(self, body: bytes | bytearray | None = None) -> None:
        super().__init__()
        self._buf = bytearray(body or b"")
        self._pos = 0
        self._reading = False

    def get_body(self) -> bytes:
        return bytes(self._buf)

    def get_body_length(self) -> int:
        self._check_readable()
        return len(self._buf)

    def reset(self) -> None:
        """Put the body in read-only mode at its start."""
        self._reading = True
        self._body_ro = True
        self._pos = 0

    def set_read_only(self) -> None:
        super().set_read_only()
        self.reset()

    def clear_body(self) -> None:
        super().clear_body()
        self._buf = bytearray()
        self._pos = 0
        self._reading = False

    def _check_readable(self) -> None:
        if not self._reading:
            raise MessageNotReadableException("the bytes body is write-only (call reset() to read it)")

    def _write(self, ptype: PropertyType, value: Any) -> None:
        self._check_writable()
        checked = check_value(ptype, value)
        self._buf += _FORMATS[ptype].pack(checked if ptype is not PropertyType.CHAR else ord(checked))

    def _read(self, ptype: PropertyType) -> Any:
        self._check_readable()
        fmt = _FORMATS[ptype]
        if self._pos + fmt.size > len(self._buf):
            raise MessageEOFException("end of the bytes body reached")
        (value,) = fmt.unpack_from(self._buf, self._pos)
        self._pos += fmt.size
        return chr(value) if ptype is PropertyType.CHAR else value

    def read_unsigned_byte(self) -> int:
        return self.read_byte() & 0xFF

    def read_unsigned_short(self) -> int:
        return self.read_short() & 0xFFFF

    def write_utf(self, text: str) -> None:
        self._check_writable()
        data = encode_modified_utf8(check_value(PropertyType.STRING, text))
        if len(data) > 0xFFFF:
            raise MessageFormatException("write_utf: encoded string longer than 65535 bytes")
        self._buf += struct.pack(">H", len(data)) + data

    def read_utf(self) -> str:
        """A length-prefixed modified UTF-8 string; on failure the position is unchanged."""
        start = self._pos
        n = self.read_unsigned_short()
        end = self._pos + n
        try:
            if end > len(self._buf):
                raise MessageEOFException("end of the bytes body reached")
            text = decode_modified_utf8(bytes(self._buf[self._pos : end]))
        except (MessageEOFException, MessageFormatException):
            self._pos = start
            raise
        self._pos = end
        return text

    def write_bytes(self, data: bytes | bytearray | memoryview, offset: int = 0, length: int | None = None) -> None:
        self._check_writable()
        data = check_value(PropertyType.BYTES, data)
        if length is None:
            length = len(data) - offset
        if not (0 <= offset <= len(data) and 0 <= length <= len(data) - offset):
            raise MessageFormatException(f"offset {offset} and length {length} are outside {len(data)} bytes")
        self._buf += memoryview(data)[offset : offset + length]

    def read_bytes(self, length: int | None = None) -> bytes:
        """Up to ``length`` bytes (all remaining when None); b'' at the end (JMS: -1)."""
        self._check_readable()
        if length is not None and length < 0:
            raise MessageFormatException(f"read_bytes: negative length {length}")
        end = len(self._buf) if length is None else min(len(self._buf), self._pos + length)
        data = bytes(self._buf[self._pos : end])
        self._pos = end
        return data

    def write_object(self, value: Any) -> None:
        if isinstance(value, str):
            self.write_utf(value)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self.write_bytes(value)
        else:
            self._write(infer_type(value) if not isinstance(value, float) else PropertyType.DOUBLE, value)

    def _copy_body(self, clone: Self) -> None:
        clone._buf = bytearray(self._buf)
        clone._pos = 0
        clone._reading = False

    def body_size(self) -> int:
        return len(self._buf)

    def _body_equal(self, other: Self) -> bool:
        return self._buf == other._buf

    def _body_repr(self) -> str:
        return f"body={len(self._buf)} bytes"


class MapMessage(Message):
    """A body of named, typed values."""

    message_type = "MAP"
    __slots__ = ("_map",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._map: dict[str, tuple[PropertyType, Any]] = {}
        for name, value in (values or {}).items():
            self.set_object(name, value)

    def _put(self, name: str, ptype: PropertyType, value: Any) -> None:
        self._check_writable()
        if not isinstance(name, str) or not name:
            raise MessageFormatException("a map entry name must be a non-empty string")
        self._map[name] = (ptype, check_value(ptype, value))

    def set_boolean(self, name: str, v: bool) -> None:
        self._put(name, PropertyType.BOOLEAN, v)

    def set_byte(self, name: str, v: int) -> None:
        self._put(name, PropertyType.BYTE, v)

    def set_short(self, name: str, v: int) -> None:
        self._put(name, PropertyType.SHORT, v)

    def set_char(self, name: str, v: str) -> None:
        self._put(name, PropertyType.CHAR, v)

    def set_int(self, name: str, v: int) -> None:
        self._put(name, PropertyType.INT, v)

    def set_long(self, name: str, v: int) -> None:
        self._put(name, PropertyType.LONG, v)

    def set_float(self, name: str, v: float) -> None:
        self._put(name, PropertyType.FLOAT, v)

    def set_double(self, name: str, v: float) -> None:
        self._put(name, PropertyType.DOUBLE, v)

    def set_string(self, name: str, v: str) -> None:
        self._put(name, PropertyType.STRING, v)

    def set_bytes(self, name: str, v: bytes) -> None:
        self._put(name, PropertyType.BYTES, v)

    def set_object(self, name: str, value: Any) -> None:
        self._put(name, infer_type(value), value)

    def set_typed(self, name: str, ptype: PropertyType, value: Any) -> None:
        self._put(name, as_value_type(ptype), value)

    def _get_item(self, name: str, want: PropertyType) -> Any:
        entry = self._map.get(name)
        if entry is None:
            if want is PropertyType.BYTES:
                return None
            return _missing(want, f"map entry {name!r}")
        return convert(entry[0], entry[1], want, f"map entry {name!r}")

    def get_boolean(self, name: str) -> bool:
        return cast("bool", self._get_item(name, PropertyType.BOOLEAN))

    def get_byte(self, name: str) -> int:
        return cast("int", self._get_item(name, PropertyType.BYTE))

    def get_short(self, name: str) -> int:
        return cast("int", self._get_item(name, PropertyType.SHORT))

    def get_char(self, name: str) -> str:
        return cast("str", self._get_item(name, PropertyType.CHAR))

    def get_int(self, name: str) -> int:
        return cast("int", self._get_item(name, PropertyType.INT))

    def get_long(self, name: str) -> int:
        return cast("int", self._get_item(name, PropertyType.LONG))

    def get_float(self, name: str) -> float:
        return cast("float", self._get_item(name, PropertyType.FLOAT))

    def get_double(self, name: str) -> float:
        return cast("float", self._get_item(name, PropertyType.DOUBLE))

    def get_string(self, name: str) -> str | None:
        return cast("str | None", self._get_item(name, PropertyType.STRING))

    def get_bytes(self, name: str) -> bytes | None:
        return cast("bytes | None", self._get_item(name, PropertyType.BYTES))

    def get_object(self, name: str) -> Any:
        entry = self._map.get(name)
        return None if entry is None else entry[1]

    def item_exists(self, name: str) -> bool:
        return name in self._map

    @property
    def map_names(self) -> list[str]:
        return list(self._map)

    def typed_items(self) -> Iterator[tuple[str, PropertyType, Any]]:
        for name, (ptype, value) in self._map.items():
            yield name, ptype, value

    def get_body(self) -> dict[str, Any]:
        return {k: v for k, (_, v) in self._map.items()}

    def clear_body(self) -> None:
        super().clear_body()
        self._map = {}

    def _copy_body(self, clone: Self) -> None:
        clone._map = dict(self._map)

    def body_size(self) -> int:
        return sum(len(name) + _value_size(value) for name, (_, value) in self._map.items())

    def _body_equal(self, other: Self) -> bool:
        return _typed_dict_equal(self._map, other._map)

    def _body_repr(self) -> str:
        return f"map={_short(self.get_body())}"


class StreamMessage(_PrimitiveBody, Message):
    """A body that is a sequence of typed values, written then read in order."""

    message_type = "STREAM"
    __slots__ = ("_items", "_pos", "_reading")

    def __init__(self, items: list[Any] | None = None) -> None:
        super().__init__()
        self._items: list[tuple[PropertyType, Any]] = []
        self._pos = 0
        self._reading = False
        for value in items or ():
            self.write_object(value)

    def _write(self, ptype: PropertyType, value: Any) -> None:
        self._check_writable()
        self._items.append((ptype, check_value(ptype, value)))

    def write_string(self, v: str) -> None:
        self._write(PropertyType.STRING, v)

    def write_bytes(self, v: bytes) -> None:
        self._write(PropertyType.BYTES, v)

    def write_object(self, value: Any) -> None:
        self._write(infer_type(value), value)

    def write_typed(self, ptype: PropertyType, value: Any) -> None:
        self._write(as_value_type(ptype), value)

    def reset(self) -> None:
        self._reading = True
        self._body_ro = True
        self._pos = 0

    def set_read_only(self) -> None:
        super().set_read_only()
        self.reset()

    def _read(self, want: PropertyType) -> Any:
        if not self._reading:
            raise MessageNotReadableException("the stream body is write-only (call reset() to read it)")
        if self._pos >= len(self._items):
            raise MessageEOFException("end of the stream body reached")
        ptype, value = self._items[self._pos]
        result = convert(ptype, value, want, f"stream item {self._pos}")
        self._pos += 1  # JMS: a failed conversion does not advance
        return result

    def read_string(self) -> str:
        return cast("str", self._read(PropertyType.STRING))

    def read_bytes(self) -> bytes:
        return cast("bytes", self._read(PropertyType.BYTES))

    def read_object(self) -> Any:
        if not self._reading:
            raise MessageNotReadableException("the stream body is write-only (call reset() to read it)")
        if self._pos >= len(self._items):
            raise MessageEOFException("end of the stream body reached")
        self._pos += 1
        return self._items[self._pos - 1][1]

    def typed_items(self) -> list[tuple[PropertyType, Any]]:
        return list(self._items)

    def get_body(self) -> list[Any]:
        return [v for _, v in self._items]

    def clear_body(self) -> None:
        super().clear_body()
        self._items = []
        self._pos = 0
        self._reading = False

    def _copy_body(self, clone: Self) -> None:
        clone._items = list(self._items)
        clone._pos = 0
        clone._reading = False

    def body_size(self) -> int:
        return sum(_value_size(value) for _, value in self._items)

    def _body_equal(self, other: Self) -> bool:
        items = other._items
        return len(self._items) == len(items) and all(map(_same_typed, self._items, items))

    def _body_repr(self) -> str:
        return f"items={_short(self.get_body())}"


class ObjectMessage(Message):
    """A body holding one object value.

    The object must be something the codec can encode (None, bool, int, float, str,
    bytes, lists, str-keyed dicts, Destinations, Messages, JavaSerialized); anything else
    is "not serialisable" and fails when the message is sent or stored. Nothing is ever
    pickled.
    """

    message_type = "OBJECT"
    __slots__ = ("_object",)

    def __init__(self, obj: Any = None) -> None:
        super().__init__()
        self._object = obj

    @property
    def object(self) -> Any:
        return self._object

    @object.setter
    def object(self, value: Any) -> None:
        self._check_writable()
        self._object = value

    def get_body(self) -> Any:
        return self._object

    def clear_body(self) -> None:
        super().clear_body()
        self._object = None

    def _copy_body(self, clone: Self) -> None:
        clone._object = _copy_object(self._object)

    def body_size(self) -> int:
        return _value_size(self._object)

    def _body_equal(self, other: Self) -> bool:
        return _object_equal(self._object, other._object)

    def _body_repr(self) -> str:
        return f"object={_short(self._object)}"


def _value_size(value: Any) -> int:
    """Bytes of a body value, about: strings and bytes by length, containers by their
    items, anything else 8."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _value_size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_value_size(v) for v in value)
    return 8


class JavaSerialized(bytes):
    """An opaque Java-serialised object (from a Java provider); never deserialised here."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"JavaSerialized({len(self)} bytes)"


def _copy_object(value: Any) -> Any:
    """A copy of an object body that shares nothing mutable (lists, dicts, messages)."""
    if isinstance(value, Message):
        return value.copy()
    if type(value) is list:
        return [_copy_object(v) for v in value]
    if type(value) is dict:
        return {k: _copy_object(v) for k, v in value.items()}
    return value


def _same_float(a: float, b: float) -> bool:
    """Java's ``Double.equals``: NaN equals NaN, 0.0 and -0.0 differ."""
    if a == b:
        return a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b


def _same_typed(x: tuple[PropertyType, Any], y: tuple[PropertyType, Any]) -> bool:
    """Two typed values are equal: same type and same value (floats as ``_same_float``)."""
    if x[0] != y[0]:
        return False
    a, b = x[1], y[1]
    if isinstance(a, float) and isinstance(b, float):
        return _same_float(a, b)
    return bool(a == b)


def _typed_dict_equal(a: dict[str, tuple[PropertyType, Any]], b: dict[str, tuple[PropertyType, Any]]) -> bool:
    """Properties or map entries are equal whatever their order."""
    return a.keys() == b.keys() and all(_same_typed(v, b[k]) for k, v in a.items())


def _object_equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return _same_float(a, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_object_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_object_equal(a[k], b[k]) for k in a)
    return bool(a == b)


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.message_type: cls for cls in (Message, TextMessage, BytesMessage, MapMessage, StreamMessage, ObjectMessage)
}


def create_message(message_type: str = "MESSAGE") -> Message:
    """A new, writable message of the named kind (MESSAGE, TEXT, BYTES, MAP, STREAM, OBJECT)."""
    try:
        return MESSAGE_TYPES[message_type.upper()]()
    except KeyError:
        raise MessageFormatException(f"unknown message type {message_type!r}") from None
