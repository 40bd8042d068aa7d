"""STOMP frames <-> JMS messages and destinations (the chapter's processing sequences).

The chapter's two processing sequences as plain functions: SEND -> JMS (inbound) and JMS ->
MESSAGE (outbound), and the destination names of Table 12-11. A header whose name is no
valid JMS property name is handled by imq.bridge.stomp.invalidHeaderNames (encode, drop,
error); encoded names start "stomp$".

Rule: a MESSAGE's delivery headers come from the delivered message whatever the transformer
returns; a header value the subscriber's version cannot carry is refused, never written
mangled.

Design notes: docs/stomp-bridge.md#internals-stompbridgeconvertpy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ..jms.message import (
    BytesMessage,
    DeliveryMode,
    Message,
    PropertyType,
    TextMessage,
    java_string,
    property_name_problem,
)
from ..transform import STOMP, SUN_MQ, MessageTransformer
from .frames import MESSAGE, V11, V12, Frame, LocalProtocolError, encode_frame, escaper

QUEUE, TOPIC, TEMP_QUEUE, TEMP_TOPIC = "/queue/", "/topic/", "/temp-queue/", "/temp-topic/"
REPLY_QUEUE = TEMP_QUEUE + "temporary_destination://queue/"
REPLY_TOPIC = TEMP_TOPIC + "temporary_destination://topic/"
CONTENT_TYPE_PROPERTY = "JMS_STOMP_CONTENT_TYPE"

# Headers of SEND that are protocol, not message properties.
_SEND_PROTOCOL = frozenset(
    {
        "destination",
        "transaction",
        "receipt",
        "content-length",
        "content-type",
        "persistent",
        "priority",
        "expires",
        "correlation-id",
        "type",
        "reply-to",
    }
)
# Headers a client may copy from a MESSAGE it received; the broker sets them anew.
_SEND_IGNORED = frozenset({"message-id", "timestamp", "redelivered", "subscription", "ack"})
_NOT_PROPERTIES = _SEND_PROTOCOL | _SEND_IGNORED
_valid_names: set[str] = set()  # header names that are property names: the same few on every SEND
_TRUE_FALSE = {"true": True, "false": False}
_MODES = {
    None: DeliveryMode.PERSISTENT,
    "true": DeliveryMode.PERSISTENT,  # _persistent()'s usual answers
    "false": DeliveryMode.NON_PERSISTENT,
}

# imq.bridge.stomp.invalidHeaderNames: what a SEND header that is no JMS property name becomes
NAMES_ENCODE, NAMES_DROP, NAMES_ERROR = "encode", "drop", "error"
INVALID_HEADER_NAMES = (NAMES_ENCODE, NAMES_DROP, NAMES_ERROR)
ENCODED_PREFIX = "stomp$"
_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_HEX = frozenset("0123456789ABCDEF")
_decoded: dict[str, str] = {}  # property name -> header name: the same few names on every message


class NotDeliverable(Exception):
    """A JMS message that cannot become a MESSAGE frame (neither Text nor Bytes)."""


# --- destinations ------------------------------------------------------------------------


class Destinations:
    """One connection's view of destination names, including its temporary aliases.

    ``create_temporary(topic)`` makes a temporary destination owned by the connection.
    Written on the connection's loop, read by its delivery threads (plain dict reads).
    """

    def __init__(self, create_temporary: Callable[[bool], Destination]) -> None:
        self._create = create_temporary
        self._by_alias: dict[tuple[bool, str], Destination] = {}
        self._alias_of: dict[Destination, str] = {}
        self._seen: dict[str, Destination] = {}  # parsed strings (not temporary aliases)

    def to_jms(self, text: str | None, header: str = "destination") -> Destination:
        """The JMS destination a STOMP destination string names (LocalProtocolError if none)."""
        if not text:
            raise LocalProtocolError(f"missing {header}", f"the {header} header is required")
        dest = self._seen.get(text)
        if dest is not None:
            return dest
        for prefix, make in (
            (QUEUE, Queue),
            (TOPIC, Topic),
            (REPLY_QUEUE, TemporaryQueue),
            (REPLY_TOPIC, TemporaryTopic),
        ):
            if text.startswith(prefix) and len(text) > len(prefix):
                if len(self._seen) < 1000:
                    self._seen[text] = make(text[len(prefix) :])
                return make(text[len(prefix) :])
        for prefix, topic in ((TEMP_QUEUE, False), (TEMP_TOPIC, True)):
            if text.startswith(prefix) and len(text) > len(prefix):
                return self._temporary(topic, text[len(prefix) :])
        raise LocalProtocolError(
            f"invalid {header}",
            f"{header} {text[:80]!r} must start with {QUEUE}, {TOPIC}, {TEMP_QUEUE} or {TEMP_TOPIC} followed by a name",
        )

    def _temporary(self, topic: bool, alias: str) -> Destination:
        dest = self._by_alias.get((topic, alias))
        if dest is None:
            dest = self._create(topic)
            self._by_alias[(topic, alias)] = dest
            self._alias_of[dest] = (TEMP_TOPIC if topic else TEMP_QUEUE) + alias
        return dest

    def to_stomp(self, dest: Destination | None, *, alias: bool = True) -> str:
        """The STOMP string for ``dest``: this connection's alias for its own temporary
        destinations (when ``alias``), else the form any connection can use."""
        if dest is None:
            return ""
        if dest.is_temporary:
            if alias and dest in self._alias_of:
                return self._alias_of[dest]
            return (REPLY_TOPIC if dest.is_topic else REPLY_QUEUE) + dest.name
        return (TOPIC if dest.is_topic else QUEUE) + dest.name


# --- header names that are no JMS property names -----------------------------------------------


def header_to_property(name: str) -> str:
    """The property name header ``name`` travels under in encode mode: ENCODED_PREFIX, then
    the name with every character outside A-Z a-z 0-9 _ written as $HH, $uHHHH or $UHHHHHH
    (its code point in upper-case hex). A Java identifier with no JMS/JMSX prefix."""
    out = [ENCODED_PREFIX]
    for char in name:
        if char in _KEPT:
            out.append(char)
        else:
            code = ord(char)
            out.append(f"${code:02X}" if code < 0x100 else f"$u{code:04X}" if code < 0x10000 else f"$U{code:06X}")
    return "".join(out)


def property_to_header(name: str) -> str:
    """The header a property name is written as on MESSAGE in encode mode: the name a
    header_to_property encoding came from, any other name unchanged."""
    if not name.startswith(ENCODED_PREFIX):
        return name
    header = _decoded.get(name)
    if header is None:
        header = _decode(name)
        if len(_decoded) < 4096:
            _decoded[name] = header
    return header


def _decode(name: str) -> str:
    out: list[str] = []
    i, n = len(ENCODED_PREFIX), len(name)
    while i < n:
        char = name[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        width = {"u": 4, "U": 6}.get(name[i + 1 : i + 2], 2)
        start = i + 1 + (width != 2)
        digits = name[start : start + width]
        if len(digits) != width or not _HEX.issuperset(digits):
            return name  # not one of ours (a JMS client's own name): unchanged
        out.append(chr(min(int(digits, 16), 0x10FFFF)))
        i = start + width
    header = "".join(out)
    # only the one encoding header_to_property makes decodes; any other spelling is a name
    return header if header_to_property(header) == name else name


# --- inbound: SEND -> JMS ------------------------------------------------------------------


@dataclass
class Inbound:
    """A converted SEND: the message, where it goes, and the headers JMS could not take."""

    message: Message
    destination: Destination
    invalid: dict[str, str]


def from_send(
    frame: Frame, destinations: Destinations, transformer: MessageTransformer | None, invalid_names: str = NAMES_ENCODE
) -> Inbound:
    """Steps 1 and 2 of the inbound sequence (the caller sends: step 3). ``invalid`` of the
    result holds the headers that are no JMS property names (``invalid_names`` says what
    became of them)."""
    headers = frame.headers
    destination = destinations.to_jms(headers.get("destination"))
    if "content-length" in headers:
        message: Message = BytesMessage(frame.body)
    else:
        try:
            message = TextMessage(frame.body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise LocalProtocolError(
                "body is not UTF-8",
                f"a SEND without content-length is a text "
                f"message and must be UTF-8 ({exc}); send content-length for "
                "binary bodies",
            ) from None
    persistent = headers.get("persistent")
    message.delivery_mode = _MODES.get(persistent) or _persistent(persistent)
    # absent headers leave the new message's defaults: priority 4, no expiration, None
    if "priority" in headers:
        message.priority = _priority(headers["priority"])
    if "expires" in headers:
        message.expiration = _expires(headers["expires"])
    if "correlation-id" in headers:
        message.correlation_id = headers["correlation-id"]
    if "type" in headers:
        message.type = headers["type"]
    if "reply-to" in headers:
        message.reply_to = destinations.to_jms(headers["reply-to"], "reply-to")
    if "content-type" in headers:
        message.set_string_property(CONTENT_TYPE_PROPERTY, headers["content-type"])
    invalid: dict[str, str] = {}
    for name, value in headers.items():
        if name in _NOT_PROPERTIES:
            continue
        if invalid_names == NAMES_ENCODE and name.startswith(ENCODED_PREFIX):
            message.set_string_property(header_to_property(name), value)  # a valid name, escaped
            continue
        if name in _valid_names:
            message.set_string_property(name, value)
            continue
        problem = property_name_problem(name)
        if problem is None:
            if len(_valid_names) < 4096:
                _valid_names.add(name)
            message.set_string_property(name, value)
            continue
        invalid[name] = value
        if invalid_names == NAMES_ENCODE:
            message.set_string_property(header_to_property(name), value)
        elif invalid_names == NAMES_ERROR and transformer is None:
            raise LocalProtocolError(
                "invalid header name",
                f"SEND header {name[:80]!r} cannot become a JMS property: {problem}. "
                "Rename it to a Java identifier, configure "
                "imq.bridge.stomp.messageTransformer to receive it, or set "
                "imq.bridge.stomp.invalidHeaderNames to encode or drop",
            )
    if transformer is not None:
        message = _transform(transformer, message, False, "UTF-8", STOMP, SUN_MQ, invalid)
    return Inbound(message, destination, invalid)


def _persistent(text: str | None) -> DeliveryMode:
    if text is None:
        return DeliveryMode.PERSISTENT  # the JMS client's default
    value = _TRUE_FALSE.get(text.strip().lower())
    if value is None:
        raise LocalProtocolError("invalid persistent", f"persistent is {text[:40]!r}; write true or false")
    return DeliveryMode.PERSISTENT if value else DeliveryMode.NON_PERSISTENT


def _priority(text: str) -> int:
    text = text.strip()
    if not (text.isdigit() and len(text) == 1):
        raise LocalProtocolError("invalid priority", f"priority is {text[:40]!r}; write 0 to 9")
    return int(text)


def _expires(text: str) -> int:
    """expires: the absolute expiration time in ms since the epoch; 0 = never."""
    text = text.strip()
    if not text.isdigit():
        raise LocalProtocolError(
            "invalid expires",
            f"expires is {text[:40]!r}; write the expiration time in milliseconds since the epoch, or 0 for never",
        )
    return int(text)


def _transform(
    transformer: MessageTransformer,
    message: Message,
    read_only: bool,
    charset: str | None,
    source: str,
    target: str,
    properties: Mapping[str, str] | None,
) -> Message:
    transformer.reset(in_bridge_link=False)
    try:
        result = transformer.transform(message, read_only, charset, source, target, properties)
    except Exception as exc:
        raise TransformFailed(f"the message transformer {type(transformer).__name__} failed: {exc}") from exc
    if not isinstance(result, Message):
        raise TransformFailed(
            f"the message transformer {type(transformer).__name__} returned {type(result).__name__}, not a message"
        )
    return result


class TransformFailed(LocalProtocolError):
    """The configured transformer raised or returned no message."""

    def __init__(self, detail: str) -> None:
        super().__init__("message transformer failed", detail)


# --- outbound: JMS -> MESSAGE -----------------------------------------------------------------


def to_message_frame(
    message: Message,
    subscription: str,
    destinations: Destinations,
    transformer: MessageTransformer | None,
    ack: str | None = None,
    delivery_count: int = 1,
    decode_names: bool = True,
) -> Frame:
    """Steps 1 to 3 of the outbound sequence. ``message`` is the broker's snapshot (never
    changed here; ``delivery_count`` says how often it was delivered, this time included);
    ``decode_names``: encoded property names go out as the headers they came from (encode
    mode). Raises NotDeliverable or TransformFailed."""
    redelivered = delivery_count > 1
    out = message  # what the client gets: body, properties, reply-to/correlation-id/type
    if transformer is not None:
        copy = message.copy()
        copy.delivery_count, copy.redelivered = delivery_count, redelivered
        copy.set_read_only()
        out = _transform(transformer, copy, True, None, SUN_MQ, STOMP, None)
    if isinstance(out, TextMessage):
        body = (out.text or "").encode("utf-8")
    elif isinstance(out, BytesMessage):
        body = out.get_body()
    else:
        raise NotDeliverable(
            f"message {message.message_id} is a {type(out).__name__}; the STOMP "
            "bridge delivers only TextMessage and BytesMessage (configure "
            "imq.bridge.stomp.messageTransformer to convert others)"
        )
    headers = {  # the delivery's
        "subscription": subscription,
        "destination": destinations.to_stomp(message.destination),
        "message-id": message.message_id or "",
        "expires": str(message.expiration),
        "redelivered": "true" if redelivered else "false",
        "priority": str(message.priority),
        "timestamp": str(message.timestamp),
        "persistent": "true" if message.delivery_mode == DeliveryMode.PERSISTENT else "false",
        "content-length": str(len(body)),
    }
    reply_to = out.reply_to if out.reply_to is not None else message.reply_to
    if reply_to is not None:
        headers["reply-to"] = destinations.to_stomp(reply_to, alias=False)
    correlation_id = out.correlation_id if out.correlation_id is not None else message.correlation_id
    if correlation_id is not None:
        headers["correlation-id"] = correlation_id
    jms_type = out.type if out.type is not None else message.type
    if jms_type is not None:
        headers["type"] = jms_type
    if ack is not None:
        headers["ack"] = ack
    for name, ptype, value in out.typed_properties():
        if name == CONTENT_TYPE_PROPERTY:
            headers.setdefault("content-type", value)
        else:
            headers.setdefault(property_to_header(name) if decode_names else name, java_string(ptype, value))
    return Frame(MESSAGE, headers, body)


class MessageRenderer:
    """encode_frame(to_message_frame(...)) for one subscription, as the bytes of a MESSAGE
    frame; what a subscriber thread runs for every message it delivers.

    For STOMP 1.1 and 1.2 without a transformer it writes the frame's text directly: the
    subscription header is escaped once, the destination once per destination, the
    numbers and true/false never (they hold nothing to escape), a property's header line
    once per name, so only the message-id and the property values are escaped per
    message. A frame it finds no encoding for (a
    NUL, a carriage return in 1.1, an empty name) goes the general way, which refuses it
    by name; so does every other version, and a transformer's message."""

    _FIXED = (
        "subscription",
        "destination",
        "message-id",
        "expires",
        "redelivered",
        "priority",
        "timestamp",
        "persistent",
        "content-length",
    )

    def __init__(
        self,
        subscription: str,
        destinations: Destinations,
        transformer: MessageTransformer | None,
        version: str | None,
        decode_names: bool = True,
    ) -> None:
        self.subscription, self.destinations, self.transformer = subscription, destinations, transformer
        self.version, self.decode_names = version, decode_names
        self._escape = escaper(version) if version in (V11, V12) and transformer is None else None
        self._prefix = f"{MESSAGE}\nsubscription:{self._escape(subscription)}\ndestination:" if self._escape else ""
        self._destinations: dict[Destination, str] = {}  # escaped; not temporary ones (aliases)
        self._lines: dict[str, tuple[str, str, bool]] = {}  # property name -> _line(name)

    def render(self, message: Message, ack: str | None = None, delivery_count: int = 1) -> bytes:
        """The MESSAGE frame's bytes. Raises NotDeliverable, TransformFailed, HeaderNotEncodable."""
        esc = self._escape
        if esc is None or not isinstance(message, (TextMessage, BytesMessage)):
            return self._general(message, ack, delivery_count)
        body = (message.text or "").encode("utf-8") if isinstance(message, TextMessage) else message.get_body()
        destination = message.destination
        dest_text = self._destinations.get(destination) if destination is not None else None
        if dest_text is None:
            dest_text = esc(self.destinations.to_stomp(destination))
            if destination is not None and not destination.is_temporary and len(self._destinations) < 1000:
                self._destinations[destination] = dest_text
        parts = [
            self._prefix,
            dest_text,
            "\nmessage-id:",
            esc(message.message_id or ""),
            "\nexpires:",
            str(message.expiration),
            "\nredelivered:",
            "true" if delivery_count > 1 else "false",
            "\npriority:",
            str(message.priority),
            "\ntimestamp:",
            str(message.timestamp),
            "\npersistent:",
            "true" if message.delivery_mode == DeliveryMode.PERSISTENT else "false",
            "\ncontent-length:",
            str(len(body)),
        ]
        names = set(self._FIXED)
        if message.reply_to is not None:
            parts += ("\nreply-to:", esc(self.destinations.to_stomp(message.reply_to, alias=False)))
            names.add("reply-to")
        if message.correlation_id is not None:
            parts += ("\ncorrelation-id:", esc(message.correlation_id))
            names.add("correlation-id")
        if message.type is not None:
            parts += ("\ntype:", esc(message.type))
            names.add("type")
        if ack is not None:
            parts += ("\nack:", esc(ack))
            names.add("ack")
        lines = self._lines
        for name, ptype, value in message.typed_properties():
            line = lines.get(name)
            if line is None:
                line = self._line(name)
            header = line[0]
            if header not in names:  # the first value of a name wins, as with setdefault
                names.add(header)
                parts += (line[1], esc(value if line[2] or ptype is PropertyType.STRING else java_string(ptype, value)))
        parts.append("\n\n")
        head = "".join(parts)
        if "\0" in head or "" in names or (self.version == V11 and "\r" in head):
            return self._general(message, ack, delivery_count)  # refuses it, naming the header
        return b"".join((head.encode("utf-8"), body, b"\0"))  # one copy of the body, not two

    def _line(self, name: str) -> tuple[str, str, bool]:
        """What property ``name`` is written as: its header, the header line's start (the
        name escaped once per subscription, not per message) and whether its value is
        written as it is (content-type's: not through java_string)."""
        assert self._escape is not None
        if name == CONTENT_TYPE_PROPERTY:
            header, raw = "content-type", True
        else:
            header, raw = property_to_header(name) if self.decode_names else name, False
        line = (header, f"\n{self._escape(header)}:", raw)
        if len(self._lines) < 1000:
            self._lines[name] = line
        return line

    def _general(self, message: Message, ack: str | None, delivery_count: int) -> bytes:
        return encode_frame(
            to_message_frame(
                message, self.subscription, self.destinations, self.transformer, ack, delivery_count, self.decode_names
            ),
            self.version,
        )
