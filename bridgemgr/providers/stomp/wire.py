"""STOMP provider URLs, broker dialects, and frames <-> JMS messages (sans-IO).

The pure part of the STOMP provider, no sockets. parse_url() reads a provider URL
stomp://host:port[,host:port...][?option=value&...] (stomp+ssl:// for TLS) into StompOptions
(OPTIONS: heart-beats, prefetch, connect attempts, vhost, TLS files, receipt timeout,
dialect). Brokers differ where STOMP says nothing; DIALECTS (chosen by the CONNECTED frame's
server header, or dialect=) holds how each does redelivery, durable subscriptions, selectors
and prefetch.

Messages: to_frame() makes SEND headers and body, from_frame() our message from a MESSAGE
frame. A TextMessage travels as a UTF-8 body with content-type text/plain and no
content-length (ActiveMQ and our STOMP bridge make a TextMessage of that); one holding NUL
needs a content-length, and the dialect's marker keeps it text. A BytesMessage has
content-length. Map, Stream, Object and body-less messages travel as our codec's bytes with
content-type CODEC_TYPE, so they come back whole (typed properties too) from any STOMP
broker. The JMS headers map to the STOMP JMS headers; properties become STOMP headers
(strings, as Java prints them). Destinations: /queue/, /topic/, /temp-queue/, /temp-topic/
NAME; a name starting with / is a raw STOMP destination, kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...jms import codec, naming
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import NamingException
from ...jms.message import (
    BytesMessage,
    DeliveryMode,
    Message,
    TextMessage,
    java_string,
    property_name_problem,
)

CODEC_TYPE = "application/x-imqbridge-jms"
TEXT_TYPE = "text/plain;charset=utf-8"
# The property our STOMP bridge keeps a SEND's content-type in; the same name here makes a
# content-type survive a trip through it.
CONTENT_TYPE_PROPERTY = "JMS_STOMP_CONTENT_TYPE"
_TEXT_TYPES = ("text/", "application/json", "application/xml")
# Headers of a MESSAGE that are protocol or JMS headers, never properties.
_NOT_PROPERTIES = frozenset(
    {
        "subscription",
        "ack",
        "message-id",
        "destination",
        "content-length",
        "content-type",
        "expires",
        "priority",
        "persistent",
        "redelivered",
        "timestamp",
        "correlation-id",
        "type",
        "reply-to",
        "receipt",
        "amq-msg-type",
        "transaction",
    }
)
# STOMP destination prefixes -> our destination kinds (anything else is kept raw).
PREFIXES: dict[str, type[Destination]] = {
    "/queue/": Queue,
    "/topic/": Topic,
    "/temp-queue/": TemporaryQueue,
    "/temp-topic/": TemporaryTopic,
}
RAW_KINDS: dict[str, type[Destination]] = {
    "/remote-temp-queue/": TemporaryQueue,
    "/remote-temp-topic/": TemporaryTopic,
    "/reply-queue/": TemporaryQueue,
    "/exchange/": Topic,
}


# --- URL and options -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StompOptions:
    """A provider URL's hosts and options."""

    hosts: tuple[tuple[str, int], ...]
    tls: bool = False
    vhost: str = "/"
    heart_beat: tuple[int, int] = (10_000, 10_000)  # ms: we send every / we want every
    prefetch: int = 1000
    connect_attempts: int = 3
    connect_delay: float = 0.5  # s before the second attempt; grows by half each time
    receipt_timeout: float = 30.0
    dialect: str = "auto"
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


def _heart_beat(text: str) -> tuple[int, int]:
    cx, _, cy = text.partition(",")
    return int(cx), int(cy or cx)


# option name -> (StompOptions field, parser)
OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "vhost": ("vhost", str),
    "heart-beat": ("heart_beat", _heart_beat),
    "prefetch": ("prefetch", int),
    "connect-attempts": ("connect_attempts", int),
    "connect-delay": ("connect_delay", float),
    "receipt-timeout": ("receipt_timeout", float),
    "dialect": ("dialect", str.lower),
    "ca": ("ca", str),
    "cert": ("cert", str),
    "key": ("key", str),
}


def parse_url(url: str) -> StompOptions:
    """stomp://host:port[,host:port...][?opt=value&...] or stomp+ssl://...; NamingException if bad."""
    parts = urlsplit(url)
    shown = naming.without_password(url)  # a password in the user info never reaches a message
    if parts.scheme not in ("stomp", "stomp+ssl", "stomp+tls", "stomps"):
        raise NamingException(f"{naming.PROVIDER_URL}={shown!r}: use stomp://host:port or stomp+ssl://host:port")
    hosts = []
    for item in unquote(parts.netloc.rpartition("@")[2]).split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise NamingException(f"{naming.PROVIDER_URL}={shown!r}: {item!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    values: dict[str, Any] = {}
    for name, text in parse_qsl(parts.query, keep_blank_values=True):
        if name not in OPTIONS:
            raise NamingException(
                f"{naming.PROVIDER_URL}={shown!r}: unknown option {name!r} (known: {', '.join(sorted(OPTIONS))})"
            )
        attr, parse = OPTIONS[name]
        try:
            values[attr] = parse(text)
        except ValueError:
            raise NamingException(f"{naming.PROVIDER_URL}={shown!r}: option {name}={text!r} is not valid") from None
    if values.get("dialect", "auto") not in ("auto", *DIALECTS):
        raise NamingException(f"{naming.PROVIDER_URL}={shown!r}: dialect must be auto or one of {', '.join(DIALECTS)}")
    return StompOptions(tuple(hosts), tls=parts.scheme != "stomp", **values)


# --- broker dialects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """What a broker does where STOMP 1.2 leaves it open."""

    name: str
    redeliver: str = "nack"  # how recover()/rollback() get deliveries back: nack | resubscribe
    abort_redelivers: bool = False  # ABORT alone returns what the transaction ACKed
    selectors: bool = True  # the broker filters with the selector header
    transacted_subscribe: bool = False  # a transacted session's SUBSCRIBE names its transaction
    delete_needs_subscription: bool = False  # a durable subscription is deleted while subscribed
    prefetch: Callable[[int], dict[str, str]] = lambda n: {}
    durable: Callable[[str], dict[str, str]] = lambda name: {}
    text_marker: dict[str, str] = field(default_factory=dict)  # a TextMessage with content-length


DIALECTS: dict[str, Dialect] = {
    "activemq": Dialect(
        "activemq",
        redeliver="resubscribe",
        prefetch=lambda n: {"activemq.prefetchSize": str(n)},
        durable=lambda name: {"activemq.subscriptionName": name},
        text_marker={"amq-msg-type": "text"},
    ),
    "rabbitmq": Dialect(
        "rabbitmq",
        selectors=False,
        prefetch=lambda n: {"prefetch-count": str(n)},
        durable=lambda name: {"durable": "true", "auto-delete": "false"},
        delete_needs_subscription=True,
    ),
    "imqbridge": Dialect(
        "imqbridge",
        abort_redelivers=True,
        transacted_subscribe=True,
        durable=lambda name: {"durable-subscriber-name": name},
    ),
    "generic": Dialect("generic", durable=lambda name: {"durable-subscriber-name": name}),
}


def dialect_for(server: str | None, wanted: str = "auto") -> Dialect:
    """The dialect named by ``wanted``, else the one of the CONNECTED server header."""
    if wanted != "auto":
        return DIALECTS[wanted]
    product = (server or "").partition("/")[0].lower()
    return DIALECTS.get(product, DIALECTS["generic"])


# --- destinations and messages -------------------------------------------------------------------------


def to_stomp_destination(dest: Destination) -> str:
    """The STOMP destination string: a name starting with / is used as it is."""
    if dest.name.startswith("/"):
        return dest.name
    prefix = {"queue": "/queue/", "topic": "/topic/", "temp-queue": "/temp-queue/", "temp-topic": "/temp-topic/"}[
        dest.kind
    ]
    return prefix + dest.name


def to_jms_destination(text: str | None) -> Destination | None:
    if not text:
        return None
    for prefix, kind in PREFIXES.items():
        if text.startswith(prefix) and len(text) > len(prefix):
            return kind(text[len(prefix) :])
    for prefix, kind in RAW_KINDS.items():
        if text.startswith(prefix):
            return kind(text)
    return Queue(text)


def to_frame(msg: Message, dialect: Dialect) -> tuple[dict[str, str], bytes]:
    """SEND headers (without destination) and body for ``msg``."""
    headers = {
        "persistent": "true" if msg.delivery_mode == DeliveryMode.PERSISTENT else "false",
        "priority": str(msg.priority),
        "expires": str(msg.expiration),
    }
    if msg.correlation_id is not None:
        headers["correlation-id"] = msg.correlation_id
    if msg.type is not None:
        headers["type"] = msg.type
    if msg.reply_to is not None:
        headers["reply-to"] = to_stomp_destination(msg.reply_to)
    for name, ptype, value in msg.typed_properties():
        if name == CONTENT_TYPE_PROPERTY:
            headers["content-type"] = value
        else:
            headers[name] = java_string(ptype, value)
    if type(msg) is TextMessage:
        body = (msg.text or "").encode("utf-8")
        headers.setdefault("content-type", TEXT_TYPE)
        if b"\0" in body:  # only then a text body needs its length
            headers["content-length"] = str(len(body))
            headers.update(dialect.text_marker)
    elif type(msg) is BytesMessage:
        body = msg.get_body()
        headers["content-length"] = str(len(body))
    else:
        body = codec.encode(msg)
        headers["content-type"] = CODEC_TYPE
        headers["content-length"] = str(len(body))
    return headers, body


def _is_text(headers: Mapping[str, str]) -> bool:
    ctype = headers.get("content-type", "").lower()
    return (
        ctype.startswith(_TEXT_TYPES)
        or headers.get("amq-msg-type") == "text"
        or ("content-length" not in headers and ctype != CODEC_TYPE and not ctype)
    )


def _int(headers: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(headers[name])
    except (KeyError, ValueError):
        return default


def from_frame(headers: Mapping[str, str], body: bytes) -> Message:
    """Our read-only message for a MESSAGE frame."""
    ctype = headers.get("content-type")
    if ctype == CODEC_TYPE:
        msg = codec.decode(body)
    elif _is_text(headers):
        try:
            msg = TextMessage(body.decode("utf-8"))
        except UnicodeDecodeError:
            msg = BytesMessage(body)
    else:
        msg = BytesMessage(body)
    if ctype != CODEC_TYPE:
        msg.timestamp = _int(headers, "timestamp", 0)
        msg.expiration = _int(headers, "expires", 0)
        msg.priority = min(9, max(0, _int(headers, "priority", 4)))
        msg.delivery_mode = (
            DeliveryMode.PERSISTENT if headers.get("persistent") == "true" else DeliveryMode.NON_PERSISTENT
        )
        msg.correlation_id = headers.get("correlation-id")
        msg.type = headers.get("type")
        msg.reply_to = to_jms_destination(headers.get("reply-to"))
        if ctype and not (isinstance(msg, TextMessage) and ctype.lower() == TEXT_TYPE):
            msg.set_string_property(CONTENT_TYPE_PROPERTY, ctype)
        for name, value in headers.items():
            if name not in _NOT_PROPERTIES and property_name_problem(name) is None:
                msg.set_string_property(name, value)
    msg.message_id = headers.get("message-id")
    msg.destination = to_jms_destination(headers.get("destination")) or msg.destination
    msg.redelivered = headers.get("redelivered") == "true"
    msg.delivery_count = 2 if msg.redelivered else 1
    msg.set_read_only()
    return msg
