"""AMQP provider URLs, destinations and deliveries <-> JMS messages (sans-IO).

The pure part of the AMQP 0-9-1 provider, no sockets: parse_url() (our OPTIONS, the rest
pika's own URL parameters), route() (a Queue through the default exchange, a Topic on
amq.topic), to_amqp()/from_amqp() (the mapping table is in docs/jms-bridges.md), and the
frame codec the client reads deliveries with (TypedProperties, Deliveries).

Rules: JMS property types survive the trip through the x-jms-types header; Map, Stream,
Object and body-less messages travel as our codec's bytes (CODEC_TYPE); every frame length
is checked, and a malformed frame is a FrameError naming it.

Design notes: docs/architecture.md#internals-providersamqpwirepy.
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
from pika import data as pika_data

from ...jms import codec, naming
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import JMSException, NamingException
from ...jms.message import (
    BytesMessage,
    DeliveryMode,
    Message,
    PropertyType,
    TextMessage,
    property_name_problem,
)

CODEC_TYPE = "application/x-imqbridge-jms"
TEXT_TYPE = "text/plain; charset=utf-8"
BYTES_TYPE = "application/octet-stream"
TOPIC_EXCHANGE = "amq.topic"
# A content type other than ours is kept in this property (and sent as the content type).
CONTENT_TYPE_PROPERTY = "JMS_AMQP_CONTENT_TYPE"
# JMSTimestamp in milliseconds (the AMQP timestamp has whole seconds).
TIMESTAMP_HEADER = "x-jms-timestamp"
# The JMS types pika cannot read back: NAME=KIND,... for byte, short, long, float and
# double properties (an int, boolean and string is what a plain AMQP value reads as).
TYPES_HEADER = "x-jms-types"
_HINTED = frozenset({PropertyType.BYTE, PropertyType.SHORT, PropertyType.LONG, PropertyType.FLOAT, PropertyType.DOUBLE})
_TEXT_TYPES = ("text/", "application/json", "application/xml")


@dataclass(frozen=True)
class AmqpOptions:
    """A provider URL: pika's connection parameters and our options."""

    url: str  # without our options and without the password: for messages and logs
    parameters: pika.URLParameters
    prefetch: int = 1000  # basic.qos prefetch-count of every session's channel
    declare_queues: bool = True  # declare (durable) a queue that does not exist on first use
    timeout: float = 30.0  # seconds to wait for the broker's answer to a command or a confirm


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "prefetch": ("prefetch", _positive),
    "declare-queues": ("declare_queues", _bool),
    "timeout": ("timeout", float),
}


def parse_url(url: str) -> AmqpOptions:
    """amqp://user:pass@host:port/vhost[?opt=value&...]; NamingException when it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise NamingException(
            f"{naming.PROVIDER_URL}={naming.without_password(url)!r}: use "
            "amqp://user:password@host:port/vhost (amqps:// for TLS)"
        )
    ours: dict[str, Any] = {}
    theirs = []
    for name, text in parse_qsl(parts.query, keep_blank_values=True):
        if name in OPTIONS:
            attr, parse = OPTIONS[name]
            try:
                ours[attr] = parse(text)
            except ValueError:
                raise NamingException(
                    f"{naming.PROVIDER_URL}={naming.without_password(url)!r}: option {name}={text!r} is not valid"
                ) from None
        else:
            theirs.append((name, text))
    plain = urlunsplit(parts._replace(query=urlencode(theirs)))
    try:
        parameters = pika.URLParameters(plain)
    except Exception as exc:
        raise NamingException(
            f"{naming.PROVIDER_URL}={naming.without_password(url)!r}: {exc} (our options: {', '.join(sorted(OPTIONS))})"
        ) from None
    return AmqpOptions(naming.without_password(plain), parameters, **ours)


# --- destinations -----------------------------------------------------------------------------------


def route(dest: Destination) -> tuple[str, str]:
    """(exchange, routing key) a message for ``dest`` is published to."""
    if dest.is_topic:
        return TOPIC_EXCHANGE, dest.name
    return "", dest.name


def reply_to_text(dest: Destination) -> str:
    return f"/topic/{dest.name}" if dest.is_topic else dest.name


def reply_to_destination(text: str | None) -> Destination | None:
    if not text:
        return None
    if text.startswith("/topic/"):
        return Topic(text[len("/topic/") :])
    return TemporaryQueue(text) if text.startswith("amq.gen-") else Queue(text)


def delivered_to(exchange: str, routing_key: str, fallback: Destination) -> Destination:
    """JMSDestination of a delivery: where it was published, when that says a queue or topic."""
    if exchange == "":
        return TemporaryQueue(routing_key) if routing_key.startswith("amq.gen-") else Queue(routing_key)
    if exchange == TOPIC_EXCHANGE:
        return TemporaryTopic(routing_key) if isinstance(fallback, TemporaryTopic) else Topic(routing_key)
    return fallback


# --- typed headers --------------------------------------------------------------------------------

_KINDS = {
    PropertyType.BYTE: (b"b", ">b"),
    PropertyType.SHORT: (b"s", ">h"),
    PropertyType.INT: (b"I", ">i"),
    PropertyType.LONG: (b"l", ">q"),
}


class TypedProperties(pika.BasicProperties):
    """BasicProperties whose headers table carries JMS property types exactly: ``typed``
    holds (name, PropertyType, value); ``headers`` the untyped rest (pika's encoding)."""

    def __init__(self, typed: list[tuple[str, PropertyType, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.typed = typed

    def encode(self) -> list[bytes]:
        """The content header's property flags and fields, as pika encodes them, made here:
        pika's generic field helpers were a sixth of a busy link's CPU."""
        flags = 0
        out: list[bytes] = [b""]
        for bit, name, kind in _ENCODED:
            value = getattr(self, name)
            if value is None:
                if name != "headers" or not self.typed:
                    continue
                value = {}
            flags |= bit
            if kind == _SHORT_STRING:
                _put_short(out, value, name)
            elif kind == _TABLE:
                _put_table(out, self.typed if name == "headers" else [], value)
            elif kind == _OCTET:
                out.append(_B(value))
            else:
                out.append(_Q(value))
        out[0] = _H(flags)
        return out


_B = struct.Struct(">B").pack
_H = struct.Struct(">H").pack
_I = struct.Struct(">I").pack
_Q = struct.Struct(">Q").pack
_INT = struct.Struct(">ci").pack
_LONG = struct.Struct(">cq").pack
# BasicProperties in flag order (bit 15 first): (flag bit, attribute, kind); kinds:
_SHORT_STRING, _TABLE, _OCTET, _U64_FIELD = 0, 1, 2, 3
_ENCODED = tuple(
    (1 << (15 - i), name, kind)
    for i, (name, kind) in enumerate(
        (
            ("content_type", _SHORT_STRING),
            ("content_encoding", _SHORT_STRING),
            ("headers", _TABLE),
            ("delivery_mode", _OCTET),
            ("priority", _OCTET),
            ("correlation_id", _SHORT_STRING),
            ("reply_to", _SHORT_STRING),
            ("expiration", _SHORT_STRING),
            ("message_id", _SHORT_STRING),
            ("timestamp", _U64_FIELD),
            ("type", _SHORT_STRING),
            ("user_id", _SHORT_STRING),
            ("app_id", _SHORT_STRING),
            ("cluster_id", _SHORT_STRING),
        )
    )
)


def _put_short(out: list[bytes], value: Any, what: str) -> None:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise JMSException(f"{what} {value!r} is longer than 255 bytes (an AMQP short string)")
    out.append(_B(len(raw)))
    out.append(raw)


def _put_table(out: list[bytes], typed: list[tuple[str, PropertyType, Any]], rest: dict[Any, Any]) -> None:
    """A field table of the typed properties, then ``rest`` (values as pika encodes them)."""
    table: list[bytes] = []
    for name, ptype, value in typed:
        _put_short(table, name, "property name")
        kind = _KINDS.get(ptype)
        if kind is not None:
            table.append(kind[0] + struct.pack(kind[1], value))
        elif ptype in (PropertyType.FLOAT, PropertyType.DOUBLE):
            _put_value(table, repr(value))  # pika reads 'f' and 'd' as integers
        else:
            _put_value(table, value)  # string, boolean
    for name, value in rest.items():
        _put_short(table, name, "header name")
        _put_value(table, value)
    body = b"".join(table)
    out.append(_I(len(body)))
    out.append(body)


def _put_value(out: list[bytes], value: Any) -> None:
    if type(value) is str:
        raw = value.encode()
        out.append(b"S" + _I(len(raw)))
        out.append(raw)
    elif type(value) is int:
        out.append(_INT(b"I", value) if -(2**31) <= value < 2**31 else _LONG(b"l", value))
    else:
        pika_data.encode_value(out, value)


# --- messages -------------------------------------------------------------------------------------


def to_amqp(message: Message) -> tuple[TypedProperties, bytes]:
    """Properties and body to publish ``message`` with (its headers set by the producer)."""
    ctype = message.get_object_property(CONTENT_TYPE_PROPERTY)
    typed = [(n, t, v) for n, t, v in message.typed_properties() if n != CONTENT_TYPE_PROPERTY]
    if isinstance(message, TextMessage):
        body = (message.text or "").encode("utf-8")
        content_type = str(ctype) if ctype else TEXT_TYPE
    elif isinstance(message, BytesMessage):
        body = message.get_body()
        content_type = str(ctype) if ctype else BYTES_TYPE
    else:
        body = codec.encode(message)
        content_type = CODEC_TYPE
    ttl = message.expiration - message.timestamp if message.expiration else None
    headers: dict[str, Any] = {TIMESTAMP_HEADER: message.timestamp}
    hints = ",".join(f"{n}={t.name}" for n, t, _ in typed if t in _HINTED)
    if hints:
        headers[TYPES_HEADER] = hints
    properties = TypedProperties(
        typed,
        content_type=content_type,
        headers=headers,
        delivery_mode=2 if message.delivery_mode == DeliveryMode.PERSISTENT else 1,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=reply_to_text(message.reply_to) if message.reply_to is not None else None,
        expiration=None if ttl is None else str(max(0, ttl)),
        message_id=message.message_id,
        timestamp=message.timestamp // 1000 if message.timestamp else None,
        type=message.type,
    )
    return properties, body


def _is_text(ctype: str) -> bool:
    return ctype.lower().startswith(_TEXT_TYPES)


def _charset(ctype: str) -> str:
    for param in ctype.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


def from_amqp(
    properties: Any, body: bytes, *, exchange: str, routing_key: str, redelivered: bool, fallback: Destination
) -> Message:
    """Our read-only message for a delivery (``properties``: pika's BasicProperties)."""
    ctype = properties.content_type or ""
    headers = properties.headers or {}
    msg: Message
    if ctype == CODEC_TYPE:
        msg = codec.decode(body)
    else:
        if ctype and _is_text(ctype):
            try:
                msg = TextMessage(body.decode(_charset(ctype)))
            except (UnicodeDecodeError, LookupError):
                msg = BytesMessage(body)
        else:
            msg = BytesMessage(body)
        if ctype and ctype != BYTES_TYPE and not (isinstance(msg, TextMessage) and ctype == TEXT_TYPE):
            msg.set_string_property(CONTENT_TYPE_PROPERTY, ctype)
        kinds = _types(headers.get(TYPES_HEADER))
        for name, value in headers.items():
            if property_name_problem(name) is None:
                _set_property(msg, name, kinds.get(name), value)
        stamp = headers.get(TIMESTAMP_HEADER)
        msg.timestamp = (
            stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else _seconds(properties.timestamp) * 1000
        )
        ttl = properties.expiration
        msg.expiration = msg.timestamp + int(ttl) if ttl and ttl.isdigit() else 0
        msg.priority = min(9, max(0, properties.priority if properties.priority is not None else 4))
        msg.delivery_mode = DeliveryMode.PERSISTENT if properties.delivery_mode == 2 else DeliveryMode.NON_PERSISTENT
        msg.correlation_id = properties.correlation_id
        msg.type = properties.type
        msg.reply_to = reply_to_destination(properties.reply_to)
    msg.message_id = properties.message_id
    msg.destination = delivered_to(exchange, routing_key, fallback)
    msg.redelivered = redelivered
    msg.delivery_count = 2 if redelivered else 1
    msg.set_read_only()
    return msg


def _types(text: Any) -> dict[str, PropertyType]:
    """TYPES_HEADER: ``name=KIND,...`` -> {name: PropertyType}; unknown kinds are left out."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return {}
    kinds = {}
    for item in text.split(","):
        name, _, kind = item.partition("=")
        if kind in PropertyType.__members__:
            kinds[name] = PropertyType[kind]
    return kinds


def _set_property(msg: Message, name: str, kind: PropertyType | None, value: Any) -> None:
    """One header as a property: typed as TYPES_HEADER says, else by its AMQP value."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        if kind in (PropertyType.FLOAT, PropertyType.DOUBLE):
            msg.set_typed_property(name, kind, float(value))
            return
        if kind is not None and not isinstance(value, bool) and isinstance(value, int):
            msg.set_typed_property(name, kind, int(value))
            return
    except (ValueError, TypeError, JMSException):
        pass  # not what the types header says: take the value as it is
    if isinstance(value, bool):
        msg.set_boolean_property(name, value)
    elif isinstance(value, int):
        if -(2**31) <= value < 2**31:
            msg.set_int_property(name, int(value))
        elif -(2**63) <= value < 2**63:
            msg.set_long_property(name, int(value))
    elif isinstance(value, float | decimal.Decimal):
        msg.set_double_property(name, float(value))
    elif isinstance(value, str):
        msg.set_string_property(name, value)


def _seconds(value: Any) -> int:
    return value if isinstance(value, int) else 0


# --- deliveries off the wire ----------------------------------------------------------------------
# pika makes a frame object per frame, a method object per delivery and decodes the
# properties through generic per-field helpers: a third of a busy link's CPU. These
# decode basic.deliver, its content header and its body frames directly; every length is
# checked against its frame (pika's slices would silently take a short string or a table
# that runs past its frame as a shorter value), and a frame that is not what it says is
# refused with a FrameError naming it. Field values mean what they mean in pika (short
# strings str, or bytes when not UTF-8; the header table's values as pika_data.decode_value
# gives them), so from_amqp reads either.

FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3
DELIVER_ID = b"\x00\x3c\x00\x3c"  # basic.deliver: class 60, method 60
_U8 = struct.Struct(">B").unpack_from
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_HEADER_START = struct.Struct(">HHQH").unpack_from  # class, weight, body size, property flags
# header table values read here; the others (f, d, D, T, ...) are pika_data.decode_value's
_FIXED: dict[int, tuple[Callable[..., tuple[Any, ...]], int]] = {
    ord("b"): (struct.Struct(">b").unpack_from, 1),
    ord("B"): (_U8, 1),
    ord("s"): (struct.Struct(">h").unpack_from, 2),
    ord("U"): (struct.Struct(">h").unpack_from, 2),
    ord("u"): (_U16, 2),
    ord("I"): (struct.Struct(">i").unpack_from, 4),
    ord("i"): (_U32, 4),
    ord("l"): (struct.Struct(">q").unpack_from, 8),
    ord("L"): (struct.Struct(">q").unpack_from, 8),
}


class FrameError(JMSException):
    """A frame from the broker that is not what its type says (a protocol error)."""


class Deliver:
    """basic.deliver's fields (the names of pika's Basic.Deliver)."""

    __slots__ = ("consumer_tag", "delivery_tag", "exchange", "redelivered", "routing_key")

    def __init__(
        self, consumer_tag: Any, delivery_tag: int, redelivered: bool, exchange: Any, routing_key: Any
    ) -> None:
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key


PROPERTY_NAMES = tuple(name for _, name, _ in _ENCODED)


class DeliveredProperties:
    """A delivery's content header properties (the names of pika's BasicProperties);
    None for each one the header leaves out."""

    __slots__ = PROPERTY_NAMES

    def __init__(self, values: list[Any]) -> None:
        (
            self.content_type,
            self.content_encoding,
            self.headers,
            self.delivery_mode,
            self.priority,
            self.correlation_id,
            self.reply_to,
            self.expiration,
            self.message_id,
            self.timestamp,
            self.type,
            self.user_id,
            self.app_id,
            self.cluster_id,
        ) = values

    def __repr__(self) -> str:
        return f"DeliveredProperties({', '.join(f'{n}={getattr(self, n)!r}' for n in PROPERTY_NAMES)})"


class _Short(Exception):
    """A field runs past the end of its frame or table."""


def _short_string(buf: bytes, at: int, limit: int) -> tuple[Any, int]:
    if at >= limit:
        raise _Short
    end = at + 1 + buf[at]
    if end > limit:
        raise _Short
    raw = buf[at + 1 : end]
    try:
        return raw.decode(), end
    except UnicodeDecodeError:
        return raw, end


def decode_deliver(payload: bytes, channel: int) -> Deliver:
    """The basic.deliver method frame payload (class and method id first)."""
    limit = len(payload)
    try:
        if payload[:4] != DELIVER_ID:
            raise _Short
        consumer_tag, at = _short_string(payload, 4, limit)
        if at + 9 > limit:
            raise _Short
        delivery_tag = _U64(payload, at)[0]
        redelivered = bool(payload[at + 8] & 1)
        exchange, at = _short_string(payload, at + 9, limit)
        routing_key, at = _short_string(payload, at, limit)
    except _Short:
        at = -1
    if at != limit:
        raise FrameError(f"malformed basic.deliver frame on channel {channel} ({limit} bytes: {payload[:64]!r})")
    return Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)


def _sized(buf: bytes, at: int, limit: int) -> tuple[int, int]:
    """(start, end) of a field with a 4-byte size first at ``at``, inside ``limit``."""
    if at + 4 > limit:
        raise _Short
    end = at + 4 + _U32(buf, at)[0]
    if end > limit:
        raise _Short
    return at + 4, end


def _table(buf: bytes, at: int, limit: int) -> tuple[dict[Any, Any], int]:
    """An AMQP field table at ``at`` (its 4-byte size first)."""
    at, end = _sized(buf, at, limit)
    table = {}
    while at < end:
        key, at = _short_string(buf, at, end)
        table[key], at = _value(buf, at, end)
    return table, at


def _value(buf: bytes, at: int, limit: int) -> tuple[Any, int]:
    if at >= limit:
        raise _Short
    kind = buf[at]
    at += 1
    if kind == 83 or kind == 120:  # S long string, x byte array
        at, end = _sized(buf, at, limit)
        raw = buf[at:end]
        if kind == 83:
            try:
                return raw.decode(), end
            except UnicodeDecodeError:
                pass
        return raw, end
    if kind == 116:  # t boolean
        if at >= limit:
            raise _Short
        return buf[at] != 0, at + 1
    fixed = _FIXED.get(kind)
    if fixed is not None:
        if at + fixed[1] > limit:
            raise _Short
        return fixed[0](buf, at)[0], at + fixed[1]
    if kind == 70:  # F table
        return _table(buf, at, limit)
    if kind == 65:  # A array
        at, end = _sized(buf, at, limit)
        items = []
        while at < end:
            item, at = _value(buf, at, end)
            items.append(item)
        return items, at
    if kind == 86:  # V void
        return None, at
    width = {ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8}.get(kind)
    if width is None:
        raise FrameError(f"unknown field type {bytes([kind])!r}")
    if at + width > limit:
        raise _Short
    return pika_data.decode_value(buf, at - 1)


def decode_content_header(payload: bytes, channel: int) -> tuple[int, DeliveredProperties]:
    """A content header frame payload of class basic: (body size, properties)."""
    limit = len(payload)
    try:
        if limit < 14:
            raise _Short
        class_id, _weight, size, flags = _HEADER_START(payload, 0)
        if class_id != 60 or flags & 0x3:  # another class; a second flag word (none in basic)
            raise _Short
        at = 14
        values: list[Any] = [None] * 14
        for i, (bit, _name, kind) in enumerate(_ENCODED):
            if not flags & bit:
                continue
            if kind == _SHORT_STRING:
                values[i], at = _short_string(payload, at, limit)
            elif kind == _TABLE:
                values[i], at = _table(payload, at, limit)
            elif kind == _OCTET:
                if at >= limit:
                    raise _Short
                values[i], at = payload[at], at + 1
            else:
                if at + 8 > limit:
                    raise _Short
                values[i], at = _U64(payload, at)[0], at + 8
    except (_Short, FrameError, ValueError, OverflowError, OSError, struct.error) as exc:
        why = f": {exc}" if str(exc) else ""
        raise FrameError(
            f"malformed content header frame on channel {channel} ({limit} bytes{why}: {payload[:64]!r})"
        ) from None
    if at != limit:
        raise FrameError(
            f"malformed content header frame on channel {channel}: {limit - at} bytes "
            f"after its properties ({payload[:64]!r})"
        )
    return size, DeliveredProperties(values)


class Deliveries:
    """The deliveries being read off one connection: per channel, a basic.deliver taken
    (begin()) waits for its content header and body frames (content()); AMQP does not
    interleave the content of one channel with anything else of that channel."""

    def __init__(self) -> None:
        # channel -> [deliver, properties or None, body size, body pieces, bytes so far]
        self._open: dict[int, list[Any]] = {}

    def reading(self, channel: int) -> bool:
        return channel in self._open

    def begin(self, channel: int, deliver: Deliver) -> None:
        if channel in self._open:
            raise FrameError(
                f"basic.deliver frame on channel {channel} before the content of the delivery before it is complete"
            )
        self._open[channel] = [deliver, None, 0, [], 0]

    def content(
        self, frame_type: int, channel: int, payload: bytes
    ) -> tuple[Deliver, DeliveredProperties, bytes] | None:
        """Take one frame of the channel's open delivery: the whole delivery once its last
        body frame (or a header of size 0) is here, else None."""
        entry = self._open[channel]
        if entry[1] is None:
            if frame_type != FRAME_HEADER:
                raise FrameError(
                    f"frame of type {frame_type} on channel {channel} where the content "
                    "header of a basic.deliver belongs"
                )
            entry[2], entry[1] = decode_content_header(payload, channel)
        elif frame_type != FRAME_BODY:
            raise FrameError(
                f"frame of type {frame_type} on channel {channel} where a body frame "
                f"of a basic.deliver belongs ({entry[4]} of {entry[2]} bytes read)"
            )
        else:
            entry[3].append(payload)
            entry[4] += len(payload)
            if entry[4] > entry[2]:
                raise FrameError(
                    f"body frame on channel {channel} past the body size of its "
                    f"basic.deliver ({entry[4]} > {entry[2]} bytes)"
                )
        if entry[4] < entry[2]:
            return None
        del self._open[channel]
        pieces = entry[3]
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return entry[0], entry[1], body
