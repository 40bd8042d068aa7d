"""The message codec: any JMS message (or ObjectMessage body value) to bytes and back.

Wire format, version 1: ``b"IMQB" | version u8 | value``, where a value is a tag byte and
its payload: None, booleans, int64 and big ints, double, str, bytes, JavaSerialized, list,
dict, Destination, or one of the six message kinds (a fixed head read with one struct call,
then the header texts, the properties and the body). Integers are big-endian; text is UTF-8
with "surrogatepass", so every Python str round-trips (lone surrogates too). Store rows, the
wire, Spark's source log and DMQ bodies all hold this format: a change to it is a new
version byte, whose decoder keeps reading version 1.

Rule: decoding trusts nothing: no pickle, every length and count is checked against the
bytes left before anything is built, nesting stops at ``MAX_DEPTH``, and any malformed
input raises :class:`MessageCodecError`.

Design notes: docs/architecture.md#internals-jmscodecpy.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, NamedTuple

from .destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic, from_kind
from .errors import MessageCodecError, MessageFormatException
from .message import (
    BytesMessage,
    DeliveryMode,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    property_name_problem,
)

FORMAT_VERSION = 1
MAGIC = b"IMQB"
MAX_DEPTH = 100  # nested lists, dicts and messages, the outermost one included
_PREFIX = MAGIC + bytes((FORMAT_VERSION,))
NONE = 0xFFFFFFFF
_NO_DEST = 0xFF

_U32 = struct.Struct(">I")
_TAG_U32 = struct.Struct(">BI")
_TAG_I64 = struct.Struct(">Bq")
_TAG_F64 = struct.Struct(">Bd")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_HEAD = struct.Struct(">BBBBqqqiiiIIIIIII")
_HEAD_AFTER_TAG = struct.Struct(">BBBqqqiiiIIIIIII")
_INTS = struct.Struct(">qqqiii")  # the head's ints (check_headers)
_SHORT = 1 << 29  # a str this short encodes (at most 4 bytes a character) within a 32-bit length
_I32 = struct.Struct(">i")
# where fields of a message's head are in a blob (prefix, tag, flags, two kinds, 3 q): the
# redelivered flag, delivery_count, the message id's length, the head's end (the id's text)
_FLAGS_AT = len(_PREFIX) + 1
_DELIVERY_COUNT_AT = len(_PREFIX) + 4 + 3 * 8
_ID_LENGTH_AT = _DELIVERY_COUNT_AT + 3 * 4
_HEAD_END = len(_PREFIX) + _HEAD.size

(T_NONE, T_FALSE, T_TRUE, T_INT, T_BIGINT, T_FLOAT, T_STR, T_BYTES, T_JAVA, T_LIST, T_DICT, T_DEST, T_MESSAGE) = range(
    13
)
_MESSAGE_CLASSES = (Message, TextMessage, BytesMessage, MapMessage, StreamMessage, ObjectMessage)
K_TEXT, K_BYTES, K_MAP, K_STREAM, K_OBJECT = range(1, len(_MESSAGE_CLASSES))  # 0: MESSAGE
_MESSAGE_KINDS: dict[type, int] = {cls: kind for kind, cls in enumerate(_MESSAGE_CLASSES)}
_T_END = T_MESSAGE + len(_MESSAGE_CLASSES)
_DEST_KINDS = (Queue.kind, Topic.kind, TemporaryQueue.kind, TemporaryTopic.kind)
_DEST_CODES: dict[type, int] = {Queue: 0, Topic: 1, TemporaryQueue: 2, TemporaryTopic: 3}
_DELIVERY_MODES = {int(mode): mode for mode in DeliveryMode}

# Typed values (properties, map entries, stream items): the struct format of each
# PropertyType's fixed-width value (a length for STRING and BYTES, a code unit for CHAR).
_BYTES, _CHAR = int(PropertyType.BYTES), int(PropertyType.CHAR)
_VALUE_FORMATS = {
    PropertyType.BOOLEAN: "B",
    PropertyType.BYTE: "b",
    PropertyType.SHORT: "h",
    PropertyType.INT: "i",
    PropertyType.LONG: "q",
    PropertyType.FLOAT: "f",
    PropertyType.DOUBLE: "d",
    PropertyType.STRING: "I",
    PropertyType.CHAR: "H",
    PropertyType.BYTES: "I",
}
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_ALL_CODES = frozenset(int(t) for t in PropertyType)
_PROPERTY_CODES = _ALL_CODES - {_CHAR, _BYTES}


class _Layout(NamedTuple):
    """The parse of a run of type codes: one struct for their fixed-width values, and
    where those are not the values themselves."""

    ptypes: tuple[PropertyType, ...]
    fixed: struct.Struct
    plain: bool  # every value is a number as it stands
    variable: tuple[tuple[int, bool], ...]  # (index, is STRING) of STRING and BYTES values: lengths
    bools: tuple[int, ...]
    chars: tuple[int, ...]


# Caches of what recurs from message to message: layouts by type codes, the parsed
# names of properties and map entries by their encoded prefix, encoded names by the
# names, and destinations. Each is emptied when full and long keys are not kept, so
# junk input cannot grow them.
_CACHE_LIMIT = 1024
_CACHED_CODES_LIMIT = 64
_CACHED_NAMES_LIMIT = 512  # bytes
_LAYOUTS: dict[bytes, _Layout] = {}
_PROPERTY_NAMES: dict[bytes, tuple[tuple[str, ...], _Layout]] = {}
_MAP_NAMES: dict[bytes, tuple[tuple[str, ...], _Layout]] = {}
_ENCODED_NAMES: dict[tuple[str, ...], bytes] = {}
_DESTINATIONS: dict[tuple[int, bytes], Destination] = {}

_Writer = Callable[[bytearray, Any, int], None]
_Reader = Callable[[bytes, int, int], "tuple[Any, int]"]


# ---------------------------------------------------------------------------
# public API


def encode(message: Message) -> bytes:
    """``message`` as a versioned blob; MessageFormatException if a part cannot be encoded
    (an ObjectMessage body that is "not serialisable", a header of the wrong type)."""
    if type(message) not in _MESSAGE_KINDS:
        raise MessageFormatException(f"not a message: {type(message).__name__}")
    out = bytearray(_PREFIX)
    _put_message(out, message, 0)
    return bytes(out)


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The message in a blob from :func:`encode`, writable; MessageCodecError if the blob is
    corrupt, truncated, of an unknown version or followed by anything."""
    if type(data) is not bytes:
        data = _as_bytes(data)
    try:
        pos = 5 if data.startswith(_PREFIX) else _open(data)
        tag = data[pos]
        if not T_MESSAGE <= tag < _T_END:
            raise MessageCodecError(f"the blob holds a value of tag {tag}, not a message")
        message, pos = _read_message(data, pos + 1, 0)
        if pos != len(data):
            raise _trailing(data, pos)
        return message
    except MessageCodecError:
        raise
    except Exception as exc:  # struct.error, UnicodeDecodeError, IndexError, RecursionError ...
        raise _corrupt(exc) from exc


def _has_message_head(blob: bytes) -> bool:
    """Whether ``blob`` starts with this version's prefix and a whole message head (what
    message_id and with_delivery read in place; anything else goes to decode's errors)."""
    return blob[:5] == _PREFIX and len(blob) >= _HEAD_END and T_MESSAGE <= blob[5] < _T_END


def message_id(blob: bytes) -> str | None:
    """The JMSMessageID of an encoded message, read from its head without decoding the rest
    (a receiver that passes blobs on needs only that); MessageCodecError if not a message."""
    if _has_message_head(blob):
        (n_id,) = _U32.unpack_from(blob, _ID_LENGTH_AT)
        if n_id == NONE:
            return None
        if _HEAD_END + n_id <= len(blob):
            return blob[_HEAD_END : _HEAD_END + n_id].decode("utf-8", "surrogatepass")
    return decode(blob).message_id  # raises the precise error


def with_delivery(blob: bytes, delivery_count: int) -> bytes:
    """An encoded message with its delivery count and redelivered flag set as a consumer
    sees them (what encode() of the received message gives), the rest as it is. Only the
    head is checked (MessageCodecError): the body is checked where it is decoded."""
    if not _has_message_head(blob):
        decode(blob)  # raises the precise error
    out = bytearray(blob)
    out[_FLAGS_AT] = 1 if delivery_count > 1 else 0
    _I32.pack_into(out, _DELIVERY_COUNT_AT, delivery_count)
    return bytes(out)


def encode_value(obj: Any) -> bytes:
    """An ObjectMessage body value as a versioned blob; MessageFormatException ("not
    serialisable") for anything but None, bool, int, float, str, bytes, JavaSerialized,
    list, str-keyed dict, Destination and Message (exact types, nested to ``MAX_DEPTH``)."""
    out = bytearray(_PREFIX)
    _put_value(out, obj, 0)
    return bytes(out)


def decode_value(data: bytes | bytearray | memoryview) -> Any:
    """The value in a blob from :func:`encode_value` (or :func:`encode`); MessageCodecError if corrupt."""
    data = _as_bytes(data)
    try:
        value, pos = _read_value(data, _open(data), 0)
        if pos != len(data):
            raise _trailing(data, pos)
        return value
    except MessageCodecError:
        raise
    except Exception as exc:
        raise _corrupt(exc) from exc


def is_serialisable(obj: Any) -> bool:
    """Whether ``obj`` can be an ObjectMessage body (the codec round-trips it exactly)."""
    try:
        encode_value(obj)
    except MessageFormatException:
        return False
    return True


# ---------------------------------------------------------------------------
# encoding


def _not_serialisable(what: str) -> MessageFormatException:
    return MessageFormatException(
        f"not serialisable: {what} (an ObjectMessage body may hold None, bool, int, float, "
        "str, bytes, JavaSerialized, list, dict with str keys, Destination and Message values)"
    )


def _too_deep() -> MessageFormatException:
    return _not_serialisable(f"nested deeper than {MAX_DEPTH} levels")


def _bad_headers(m: Message) -> MessageFormatException:
    texts = (("message_id", m.message_id), ("correlation_id", m.correlation_id), ("type", m.type))
    dests = (("reply_to", m.reply_to), ("destination", m.destination))
    wrong = [f"{name}={value!r}" for name, value in texts if value is not None and not isinstance(value, str)]
    wrong += [f"{name}={value!r}" for name, value in dests if value is not None and _dest_code(value) is None]
    if wrong:
        return MessageFormatException(
            f"cannot encode headers of the wrong type: {', '.join(wrong)} (texts must be str, "
            "destinations a Queue, Topic, TemporaryQueue or TemporaryTopic with a str name)"
        )
    return MessageFormatException(
        "cannot encode the headers: timestamp, expiration and delivery_time must be int64, "
        "delivery_count, delivery_mode and priority int32; got "
        f"{m.timestamp!r}, {m.expiration!r}, {m.delivery_time!r}, "
        f"{m.delivery_count!r}, {m.delivery_mode!r}, {m.priority!r}"
    )


def _dest_code(dest: Destination) -> int | None:
    """The wire kind of a destination the codec can rebuild exactly, else None."""
    code = _DEST_CODES.get(type(dest))
    return code if code is not None and type(dest.name) is str else None


def check_headers(message: Message) -> None:
    """MessageFormatException when :func:`encode` would refuse ``message``'s headers (a
    wrong type, an int out of range): for a caller that encodes it later, off its thread.
    A text or bytes message whose texts are short str (or None), whose destinations the
    codec knows and whose ints fit is checked without encoding anything (the broker checks
    every persistent one it routes; measured 0.8 -> 0.5 us a message); any other goes
    through the encoder's own head, as encode would."""
    kind = _MESSAGE_KINDS.get(type(message))
    if kind is None:
        raise MessageFormatException(f"not a message: {type(message).__name__}")
    m = message
    if kind in (K_TEXT, K_BYTES):
        body = m._text if kind == K_TEXT else ""  # type: ignore[attr-defined]
        mid, corr, jms_type, reply_to, dest = m.message_id, m.correlation_id, m.type, m.reply_to, m.destination
        if (
            (mid is None or (type(mid) is str and len(mid) < _SHORT))
            and (corr is None or (type(corr) is str and len(corr) < _SHORT))
            and (jms_type is None or (type(jms_type) is str and len(jms_type) < _SHORT))
            and (body is None or (type(body) is str and len(body) < _SHORT))
            and (
                reply_to is None
                or (type(reply_to) in _DEST_CODES and type(reply_to.name) is str and len(reply_to.name) < _SHORT)
            )
            and (dest is None or (type(dest) in _DEST_CODES and type(dest.name) is str and len(dest.name) < _SHORT))
            and (kind == K_TEXT or len(m._buf) < NONE)  # type: ignore[attr-defined]
        ):
            try:
                _INTS.pack(m.timestamp, m.expiration, m.delivery_time, m.delivery_count, m.delivery_mode, m.priority)
                return
            except struct.error:
                pass
    _head(m, kind)  # the full check: raises what encode would


def _put_message(out: bytearray, m: Message, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _too_deep()
    kind = _MESSAGE_KINDS[type(m)]
    head, raw_id, raw_corr, raw_type, raw_reply, raw_dest, body = _head(m, kind)
    out += head
    out += raw_id
    out += raw_corr
    out += raw_type
    out += raw_reply
    out += raw_dest
    try:
        if m._props:
            _put_entries(out, m._props)
        if kind in (K_TEXT, K_BYTES):
            out += body
        elif type(m) is MapMessage:
            if m._map:
                _put_entries(out, m._map)
        elif type(m) is StreamMessage:
            _put_values(out, m._items)
        elif type(m) is ObjectMessage:
            _put_value(out, m._object, depth + 1)
    except (struct.error, OverflowError) as exc:
        raise MessageFormatException(f"cannot encode a value of the message: {exc}") from None


def _head(m: Message, kind: int) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | bytearray]:
    """A message's fixed head and its header texts encoded, and a text or bytes body."""
    message_id, correlation_id, jms_type = m.message_id, m.correlation_id, m.type
    reply_to, destination = m.reply_to, m.destination
    body: bytes | bytearray = b""
    try:
        raw_id = b"" if message_id is None else message_id.encode("utf-8", "surrogatepass")
        raw_corr = b"" if correlation_id is None else correlation_id.encode("utf-8", "surrogatepass")
        raw_type = b"" if jms_type is None else jms_type.encode("utf-8", "surrogatepass")
        reply_kind = _NO_DEST if reply_to is None else _dest_code(reply_to)
        dest_kind = _NO_DEST if destination is None else _dest_code(destination)
        raw_reply = b"" if reply_to is None else reply_to.name.encode("utf-8", "surrogatepass")
        raw_dest = b"" if destination is None else destination.name.encode("utf-8", "surrogatepass")
        if type(m) is TextMessage:
            text = m._text
            body_size = NONE if text is None else len(body := text.encode("utf-8", "surrogatepass"))
        elif type(m) is BytesMessage:
            body = m._buf
            body_size = len(body)
        elif type(m) is MapMessage:
            body_size = len(m._map)
        elif type(m) is StreamMessage:
            body_size = len(m._items)
        else:
            body_size = 0
        head = _HEAD.pack(
            T_MESSAGE + kind,
            1 if m.redelivered else 0,
            reply_kind,
            dest_kind,
            m.timestamp,
            m.expiration,
            m.delivery_time,
            m.delivery_count,
            m.delivery_mode,
            m.priority,
            NONE if message_id is None else len(raw_id),
            NONE if correlation_id is None else len(raw_corr),
            NONE if jms_type is None else len(raw_type),
            len(raw_reply),
            len(raw_dest),
            len(m._props),
            body_size,
        )
    except (AttributeError, struct.error):  # a wrong type, an int out of range, a kind of None
        raise _bad_headers(m) from None
    return head, raw_id, raw_corr, raw_type, raw_reply, raw_dest, body


def _put_entries(out: bytearray, entries: dict[str, tuple[PropertyType, Any]]) -> None:
    names = tuple(entries)
    encoded = _ENCODED_NAMES.get(names)
    if encoded is None:
        raw_names = [name.encode("utf-8", "surrogatepass") for name in names]
        joined = b"".join(raw_names)
        encoded = _U32.pack(len(joined)) + struct.pack(f">{len(names)}I", *map(len, raw_names)) + joined
        if len(encoded) <= _CACHED_NAMES_LIMIT:
            _remember(_ENCODED_NAMES, names, encoded)
    out += encoded
    _put_values(out, entries.values())


def _put_values(out: bytearray, typed: Iterable[tuple[PropertyType, Any]]) -> None:
    """Type codes, fixed values, texts: the part of entries after the names, or items."""
    codes = bytes(map(_FIRST, typed))
    layout = _layout(codes)
    values = list(map(_SECOND, typed))
    texts = []
    for i, is_text in layout.variable:
        raw = values[i].encode("utf-8", "surrogatepass") if is_text else values[i]
        values[i] = len(raw)
        texts.append(raw)
    for i in layout.chars:
        values[i] = ord(values[i])
    out += codes
    out += layout.fixed.pack(*values)
    for raw in texts:
        out += raw


def _put_str(out: bytearray, text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    out += _U32.pack(len(raw))
    out += raw


def _put_value(out: bytearray, obj: Any, depth: int) -> None:
    writer = _VALUE_WRITERS.get(type(obj))
    if writer is None:
        raise _not_serialisable(f"a {type(obj).__qualname__} value")
    writer(out, obj, depth)


def _put_none(out: bytearray, obj: None, depth: int) -> None:
    out.append(T_NONE)


def _put_bool(out: bytearray, obj: bool, depth: int) -> None:
    out.append(T_TRUE if obj else T_FALSE)


def _put_int(out: bytearray, obj: int, depth: int) -> None:
    if -(2**63) <= obj < 2**63:
        out += _TAG_I64.pack(T_INT, obj)
    else:
        raw = obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
        out += _TAG_U32.pack(T_BIGINT, len(raw))
        out += raw


def _put_float(out: bytearray, obj: float, depth: int) -> None:
    out += _TAG_F64.pack(T_FLOAT, obj)


def _put_str_value(out: bytearray, obj: str, depth: int) -> None:
    out.append(T_STR)
    _put_str(out, obj)


def _put_bytes_value(out: bytearray, obj: bytes, depth: int) -> None:
    out += _TAG_U32.pack(T_JAVA if type(obj) is JavaSerialized else T_BYTES, len(obj))
    out += obj


def _put_list(out: bytearray, obj: list[Any], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _too_deep()
    out += _TAG_U32.pack(T_LIST, len(obj))
    for item in obj:
        _put_value(out, item, depth + 1)


def _put_dict(out: bytearray, obj: dict[Any, Any], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _too_deep()
    out += _TAG_U32.pack(T_DICT, len(obj))
    for key, item in obj.items():
        if type(key) is not str:
            raise _not_serialisable(f"a dict with a {type(key).__qualname__} key ({key!r}); keys must be str")
        _put_str(out, key)
        _put_value(out, item, depth + 1)


def _put_destination(out: bytearray, obj: Destination, depth: int) -> None:
    code = _dest_code(obj)
    if code is None:
        raise _not_serialisable(f"destination {obj!r} (its name must be a str)")
    out += bytes((T_DEST, code))
    _put_str(out, obj.name)


_VALUE_WRITERS: dict[type, _Writer] = {
    type(None): _put_none,
    bool: _put_bool,
    int: _put_int,
    float: _put_float,
    str: _put_str_value,
    bytes: _put_bytes_value,
    JavaSerialized: _put_bytes_value,
    list: _put_list,
    dict: _put_dict,
    **dict.fromkeys(_DEST_CODES, _put_destination),
    **dict.fromkeys(_MESSAGE_CLASSES, _put_message),
}


# ---------------------------------------------------------------------------
# decoding


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"a message blob must be bytes, bytearray or memoryview, not {type(data).__name__}")


def _corrupt(exc: BaseException) -> MessageCodecError:
    if isinstance(exc, RecursionError):
        return MessageCodecError("corrupt message blob: nested too deeply")
    if isinstance(exc, (struct.error, IndexError)):
        return MessageCodecError(f"truncated message blob ({exc})")
    return MessageCodecError(f"corrupt message blob: {type(exc).__name__}: {exc}")


def _bad(what: str) -> MessageCodecError:
    return MessageCodecError(f"corrupt message blob: {what}")


def _truncated(data: bytes, pos: int, n: int) -> MessageCodecError:
    return MessageCodecError(
        f"truncated message blob: a length of {n} at byte {pos} exceeds the {len(data) - pos} bytes left"
    )


def _trailing(data: bytes, pos: int) -> MessageCodecError:
    return _bad(f"{len(data) - pos} bytes of trailing garbage after byte {pos}")


def _open(data: bytes) -> int:
    """Check the magic and version; the position of the value."""
    if data[:4] != MAGIC:
        if MAGIC.startswith(data):
            raise MessageCodecError(f"truncated message blob ({len(data)} bytes)")
        raise MessageCodecError(f"not a message blob: it starts {data[:4]!r}, not {MAGIC!r}")
    if len(data) > 4 and data[4] != FORMAT_VERSION:
        raise MessageCodecError(
            f"unknown message blob format version {data[4]} (this codec reads version {FORMAT_VERSION})"
        )
    if len(data) < 6:
        raise MessageCodecError(f"truncated message blob ({len(data)} bytes)")
    return 5


def _check_count(data: bytes, pos: int, count: int, what: str) -> None:
    if count > len(data) - pos:  # every item takes at least one byte
        raise _bad(f"{what} count {count} exceeds the {len(data) - pos} bytes left")


def _read_header_dest(data: bytes, pos: int, kind: int, n: int) -> tuple[Destination | None, int]:
    if kind == _NO_DEST:
        if n:
            raise _bad(f"an absent destination has a name of {n} bytes")
        return None, pos
    end = pos + n
    if end > len(data):
        raise _truncated(data, pos, n)
    key = (kind, data[pos:end])
    dest = _DESTINATIONS.get(key)
    if dest is None:
        if kind >= len(_DEST_KINDS):
            raise _bad(f"unknown destination kind {kind}")
        dest = from_kind(_DEST_KINDS[kind], key[1].decode("utf-8", "surrogatepass"))
        if n <= _CACHED_NAMES_LIMIT:
            _remember(_DESTINATIONS, key, dest)
    return dest, end


def _read_message(data: bytes, pos: int, depth: int) -> tuple[Message, int]:
    """The message whose tag is at ``pos - 1``."""
    if depth >= MAX_DEPTH:
        raise _bad(f"nested deeper than {MAX_DEPTH} levels")
    kind = data[pos - 1] - T_MESSAGE
    (
        flags,
        reply_kind,
        dest_kind,
        timestamp,
        expiration,
        delivery_time,
        delivery_count,
        delivery_mode,
        priority,
        n_id,
        n_corr,
        n_type,
        n_reply,
        n_dest,
        n_props,
        body_size,
    ) = _HEAD_AFTER_TAG.unpack_from(data, pos)
    pos += _HEAD_AFTER_TAG.size
    if flags > 1:
        raise _bad(f"reserved header flags 0x{flags:02x} are set")
    size = len(data)
    m = _MESSAGE_CLASSES[kind]()
    m.timestamp = timestamp
    m.expiration = expiration
    m.delivery_time = delivery_time
    m.delivery_count = delivery_count
    m.delivery_mode = _DELIVERY_MODES.get(delivery_mode, delivery_mode)
    m.priority = priority
    m.redelivered = flags == 1
    if n_id != NONE:
        if pos + n_id > size:
            raise _truncated(data, pos, n_id)
        m.message_id = data[pos : pos + n_id].decode("utf-8", "surrogatepass")
        pos += n_id
    if n_corr != NONE:
        if pos + n_corr > size:
            raise _truncated(data, pos, n_corr)
        m.correlation_id = data[pos : pos + n_corr].decode("utf-8", "surrogatepass")
        pos += n_corr
    if n_type != NONE:
        if pos + n_type > size:
            raise _truncated(data, pos, n_type)
        m.type = data[pos : pos + n_type].decode("utf-8", "surrogatepass")
        pos += n_type
    if reply_kind != _NO_DEST or n_reply:
        m.reply_to, pos = _read_header_dest(data, pos, reply_kind, n_reply)
    if dest_kind != _NO_DEST or n_dest:
        m.destination, pos = _read_header_dest(data, pos, dest_kind, n_dest)
    if n_props:
        pos = _read_entries(data, pos, n_props, m._props, _PROPERTY_NAMES)
    if type(m) is TextMessage:
        if body_size != NONE:
            if pos + body_size > size:
                raise _truncated(data, pos, body_size)
            m._text = data[pos : pos + body_size].decode("utf-8", "surrogatepass")
            pos += body_size
        return m, pos
    if type(m) is BytesMessage:
        if pos + body_size > size:
            raise _truncated(data, pos, body_size)
        m._buf = bytearray(data[pos : pos + body_size])
        return m, pos + body_size
    if type(m) is MapMessage:
        return m, _read_entries(data, pos, body_size, m._map, _MAP_NAMES) if body_size else pos
    if type(m) is StreamMessage:
        return m, _read_items(data, pos, body_size, m._items) if body_size else pos
    if body_size:
        raise _bad(f"a {m.message_type} message has a body size of {body_size}")
    if type(m) is ObjectMessage:
        m._object, pos = _read_value(data, pos, depth + 1)
    return m, pos


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def _layout(codes: bytes) -> _Layout:
    """The layout of a run of type codes, from the cache or checked and built."""
    layout = _LAYOUTS.get(codes)
    if layout is None:
        for code in codes:
            if code not in _ALL_CODES:
                raise _bad(f"unknown value type code {code}")
        ptypes = tuple(map(PropertyType, codes))

        def at(*kinds: PropertyType) -> tuple[int, ...]:
            return tuple(i for i, t in enumerate(ptypes) if t in kinds)

        layout = _Layout(
            ptypes,
            struct.Struct(">" + "".join(_VALUE_FORMATS[t] for t in ptypes)),
            not at(PropertyType.STRING, PropertyType.BYTES, PropertyType.BOOLEAN, PropertyType.CHAR),
            tuple((i, ptypes[i] is PropertyType.STRING) for i in at(PropertyType.STRING, PropertyType.BYTES)),
            at(PropertyType.BOOLEAN),
            at(PropertyType.CHAR),
        )
        if len(codes) <= _CACHED_CODES_LIMIT:
            _remember(_LAYOUTS, codes, layout)
    return layout


def _read_fixed(data: bytes, pos: int, layout: _Layout) -> tuple[Any, int]:
    """The values of a layout at ``pos``, and the position after their texts."""
    fixed = layout.fixed.unpack_from(data, pos)
    pos += layout.fixed.size
    if layout.plain:
        return fixed, pos
    values = list(fixed)
    size = len(data)
    for i, is_text in layout.variable:
        end = pos + values[i]
        if end > size:
            raise _truncated(data, pos, values[i])
        values[i] = data[pos:end].decode("utf-8", "surrogatepass") if is_text else data[pos:end]
        pos = end
    for i in layout.bools:
        if values[i] > 1:
            raise _bad(f"boolean byte {values[i]}")
        values[i] = values[i] == 1
    for i in layout.chars:
        values[i] = chr(values[i])
    return values, pos


def _read_entries(
    data: bytes,
    pos: int,
    count: int,
    entries: dict[str, tuple[PropertyType, Any]],
    cache: dict[bytes, tuple[tuple[str, ...], _Layout]],
) -> int:
    """Read ``count`` named typed values into ``entries``: properties (``cache`` is
    ``_PROPERTY_NAMES``) or map entries (``_MAP_NAMES``)."""
    (names_size,) = _U32.unpack_from(data, pos)
    end = pos + 4 + 5 * count + names_size
    if end > len(data):
        raise MessageCodecError(
            f"truncated message blob: {count} entries with {names_size} bytes of "
            f"names exceed the {len(data) - pos} bytes left"
        )
    key = data[pos:end]
    parsed = cache.get(key)
    if parsed is None:
        parsed = _parse_names(key, count, cache is _PROPERTY_NAMES)
        if len(key) <= _CACHED_NAMES_LIMIT:
            _remember(cache, key, parsed)
    names, layout = parsed
    values, pos = _read_fixed(data, end, layout)
    entries.update(zip(names, zip(layout.ptypes, values)))
    return pos


def _parse_names(key: bytes, count: int, properties: bool) -> tuple[tuple[str, ...], _Layout]:
    """Check and parse a names length, name lengths, names and type codes (all of ``key``)."""
    codes = key[len(key) - count :]
    layout = _layout(codes)
    if properties:
        for code in codes:
            if code not in _PROPERTY_CODES:
                raise _bad(f"value type code {code} is not valid for a property")
    lengths = struct.unpack_from(f">{count}I", key, 4)
    pos = 4 + 4 * count
    if sum(lengths) != len(key) - count - pos:
        raise _bad("the name lengths do not add up to the names length")
    names = []
    for n in lengths:
        name = key[pos : pos + n].decode("utf-8", "surrogatepass")
        pos += n
        if properties:
            problem = property_name_problem(name)
            if problem:
                raise _bad(problem)
        elif not name:
            raise _bad("a map entry has an empty name")
        names.append(name)
    if len(set(names)) != count:
        raise _bad(f"a {'property' if properties else 'map entry'} name is repeated")
    return tuple(names), layout


def _read_items(data: bytes, pos: int, count: int, items: list[tuple[PropertyType, Any]]) -> int:
    _check_count(data, pos, count, "stream item")
    layout = _layout(data[pos : pos + count])
    values, pos = _read_fixed(data, pos + count, layout)
    items.extend(zip(layout.ptypes, values))
    return pos


def _read_len(data: bytes, pos: int) -> tuple[int, int]:
    """A u32 length at ``pos``: the start and end of the bytes it counts."""
    (n,) = _U32.unpack_from(data, pos)
    if pos + 4 + n > len(data):
        raise _truncated(data, pos + 4, n)
    return pos + 4, pos + 4 + n


def _read_str(data: bytes, pos: int) -> tuple[str, int]:
    pos, end = _read_len(data, pos)
    return data[pos:end].decode("utf-8", "surrogatepass"), end


def _read_value(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    tag = data[pos]
    if tag >= len(_VALUE_READERS):
        raise _bad(f"unknown value tag {tag}")
    return _VALUE_READERS[tag](data, pos + 1, depth)


def _read_int(data: bytes, pos: int, depth: int) -> tuple[int, int]:
    return _I64.unpack_from(data, pos)[0], pos + 8


def _read_bigint(data: bytes, pos: int, depth: int) -> tuple[int, int]:
    pos, end = _read_len(data, pos)
    return int.from_bytes(data[pos:end], "big", signed=True), end


def _read_float(data: bytes, pos: int, depth: int) -> tuple[float, int]:
    return _F64.unpack_from(data, pos)[0], pos + 8


def _read_str_value(data: bytes, pos: int, depth: int) -> tuple[str, int]:
    return _read_str(data, pos)


def _read_bytes_value(data: bytes, pos: int, depth: int) -> tuple[bytes, int]:
    pos, end = _read_len(data, pos)
    return data[pos:end], end


def _read_java(data: bytes, pos: int, depth: int) -> tuple[JavaSerialized, int]:
    pos, end = _read_len(data, pos)
    return JavaSerialized(data[pos:end]), end


def _read_list(data: bytes, pos: int, depth: int) -> tuple[list[Any], int]:
    if depth >= MAX_DEPTH:
        raise _bad(f"nested deeper than {MAX_DEPTH} levels")
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    _check_count(data, pos, count, "list item")
    items = []
    for _ in range(count):
        item, pos = _read_value(data, pos, depth + 1)
        items.append(item)
    return items, pos


def _read_dict(data: bytes, pos: int, depth: int) -> tuple[dict[Any, Any], int]:
    if depth >= MAX_DEPTH:
        raise _bad(f"nested deeper than {MAX_DEPTH} levels")
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    _check_count(data, pos, count, "dict entry")
    entries = {}
    for _ in range(count):
        key, pos = _read_str(data, pos)
        entries[key], pos = _read_value(data, pos, depth + 1)
    if len(entries) != count:
        raise _bad("a dict key is repeated")
    return entries, pos


def _read_destination(data: bytes, pos: int, depth: int) -> tuple[Destination, int]:
    kind = data[pos]
    if kind >= len(_DEST_KINDS):
        raise _bad(f"unknown destination kind {kind}")
    name, pos = _read_str(data, pos + 1)
    return from_kind(_DEST_KINDS[kind], name), pos


def _constant(value: Any) -> _Reader:
    return lambda data, pos, depth: (value, pos)


_VALUE_READERS: tuple[_Reader, ...] = (
    _constant(None),
    _constant(False),
    _constant(True),
    _read_int,
    _read_bigint,
    _read_float,
    _read_str_value,
    _read_bytes_value,
    _read_java,
    _read_list,
    _read_dict,
    _read_destination,
    *(_read_message for _ in _MESSAGE_CLASSES),
)
