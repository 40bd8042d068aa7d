"""Java JMS messages and destinations <-> our message model.

A Flavor is the JMS API (javax.jms or jakarta.jms) a provider implements, found per Java
class by flavor_of(); every conversion takes it, so one JVM can hold providers of both APIs.
Messages convert both ways without losing anything our model can hold: the body kind and
body (Map and Stream values with their Java types: BOXED, WRITERS), the headers, the
properties. To add a provider's raw ObjectMessage access, add it to RAW_OBJECT.

Rules: a Java ObjectMessage body is never deserialised in Python (it travels as a
JavaSerialized of its serialisation stream); going to Java only the headers an application
may set are copied.

Design notes: docs/architecture.md#internals-providersjavaconvertpy.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import MessageFormatException
from ...jms.message import (
    BytesMessage,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    property_name_problem,
)
from . import jvm

log = logging.getLogger(__name__)

API_PACKAGES = ("javax.jms", "jakarta.jms")
API_CLASSES = (
    "Message",
    "TextMessage",
    "BytesMessage",
    "MapMessage",
    "StreamMessage",
    "ObjectMessage",
    "Destination",
    "Queue",
    "Topic",
    "TemporaryQueue",
    "TemporaryTopic",
    "ConnectionFactory",
    "XAConnectionFactory",
    "ExceptionListener",
    "MessageListener",
    "MessageEOFException",
)
JAVA_TYPES = {  # PropertyType -> (Java name in setter/getter names, box class)
    PropertyType.BOOLEAN: ("Boolean", "java.lang.Boolean"),
    PropertyType.BYTE: ("Byte", "java.lang.Byte"),
    PropertyType.SHORT: ("Short", "java.lang.Short"),
    PropertyType.INT: ("Int", "java.lang.Integer"),
    PropertyType.LONG: ("Long", "java.lang.Long"),
    PropertyType.FLOAT: ("Float", "java.lang.Float"),
    PropertyType.DOUBLE: ("Double", "java.lang.Double"),
    PropertyType.STRING: ("String", "java.lang.String"),
    PropertyType.CHAR: ("Char", "java.lang.Character"),
    PropertyType.BYTES: ("Bytes", "byte[]"),
}
PY_VALUE: dict[PropertyType, Callable[[Any], Any]] = {
    PropertyType.BOOLEAN: bool,
    PropertyType.BYTE: int,
    PropertyType.SHORT: int,
    PropertyType.INT: int,
    PropertyType.LONG: int,
    PropertyType.FLOAT: float,
    PropertyType.DOUBLE: float,
    PropertyType.STRING: str,
    PropertyType.CHAR: str,
    PropertyType.BYTES: bytes,
}
# Set by the provider on delivery; never copied onto an outgoing Java message.
PROVIDER_SET = frozenset(
    {
        "JMSXDeliveryCount",
        "JMSXUserID",
        "JMSXAppID",
        "JMSXProducerTXID",
        "JMSXConsumerTXID",
        "JMSXRcvTimestamp",
        "JMSXState",
    }
)
TEMPORARY_LIMIT = 10_000


@dataclass(eq=False)
class Flavor:
    """The JMS API classes of one provider's class loader."""

    package: str
    loader: Any
    api: dict[str, Any] = field(default_factory=dict)
    jms2: bool = False

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["api"][name]
        except KeyError:
            raise AttributeError(name) from None


_flavors: dict[Any, Flavor] = {}
_by_loader: dict[tuple[str, Any], Flavor] = {}
_lock = threading.Lock()
_tables: dict[str, Any] = {}


def _interfaces(cls: Any) -> set[str]:
    names: set[str] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c is None:
            continue
        for i in c.getInterfaces():
            if str(i.getName()) not in names:
                names.add(str(i.getName()))
                todo.append(i)
        todo.append(c.getSuperclass())
    return names


def flavor_of(jobj: Any) -> Flavor:
    """The flavor of a provider object (its class implements javax.jms or jakarta.jms)."""
    cls = jobj.getClass()
    found = _flavors.get(cls)
    if found is not None:
        return found
    names = _interfaces(cls)
    for package in API_PACKAGES:
        if any(n.startswith(package + ".") for n in names):
            flavor = flavor_for(package, cls.getClassLoader())
            with _lock:
                _flavors[cls] = flavor
            return flavor
    raise MessageFormatException(f"{cls.getName()} implements neither javax.jms nor jakarta.jms")


def flavor_for(package: str, loader: Any) -> Flavor:
    """The flavor of ``package`` as ``loader`` sees it (None: JPype's class loader)."""
    key = (package, loader)
    with _lock:
        found = _by_loader.get(key)
    if found is not None:
        return found
    flavor = Flavor(package, loader)
    for name in API_CLASSES:
        flavor.api[name] = jvm.jclass(f"{package}.{name}", loader)
    flavor.jms2 = hasattr(flavor.api["Message"], "getJMSDeliveryTime")
    with _lock:
        _by_loader[key] = flavor
    return flavor


def _boxes() -> dict[Any, PropertyType]:
    """Java box class -> PropertyType (JPype returns boxed values typed by their class)."""
    boxes = _tables.get("boxes")
    if boxes is None:
        boxes = {jvm.jclass(box): ptype for ptype, (_, box) in JAVA_TYPES.items()}
        _tables["boxes"] = boxes
    return boxes


def _java_box(ptype: PropertyType) -> Callable[[Any], Any]:
    """Python value -> the JPype primitive/array that picks the typed Java overload."""
    boxers = _tables.get("boxers")
    if boxers is None:
        import jpype

        boxers = {
            PropertyType.BOOLEAN: jpype.JBoolean,
            PropertyType.BYTE: jpype.JByte,
            PropertyType.SHORT: jpype.JShort,
            PropertyType.INT: jpype.JInt,
            PropertyType.LONG: jpype.JLong,
            PropertyType.FLOAT: jpype.JFloat,
            PropertyType.DOUBLE: jpype.JDouble,
            PropertyType.STRING: jpype.JString,
            PropertyType.CHAR: jpype.JChar,
            PropertyType.BYTES: lambda v: jpype.JArray(jpype.JByte)(v),
        }
        _tables["boxers"] = boxers
    return boxers[ptype]


def typed(value: Any) -> tuple[PropertyType, Any] | None:
    """A value Java returned (boxed) as (PropertyType, Python value); None for null."""
    if value is None:
        return None
    ptype = _boxes().get(type(value))
    if ptype is None:
        raise MessageFormatException(f"a {type(value).__name__} is not a JMS value type")
    return ptype, PY_VALUE[ptype](value)


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


# --- destinations ----------------------------------------------------------------------------

TEMPORARY: OrderedDict[tuple[str, str, str], Any] = OrderedDict()


def remember_temporary(dest: Destination, jdest: Any, flavor: Flavor) -> None:
    with _lock:
        TEMPORARY[(flavor.package, dest.kind, dest.name)] = jdest
        TEMPORARY.move_to_end((flavor.package, dest.kind, dest.name))
        while len(TEMPORARY) > TEMPORARY_LIMIT:
            TEMPORARY.popitem(last=False)


def to_python_destination(jdest: Any, flavor: Flavor) -> Destination | None:
    if jdest is None:
        return None
    # (TemporaryQueue extends Queue, TemporaryTopic Topic: a plain queue, what a link
    # receives from, is known after two checks)
    if isinstance(jdest, flavor.Queue):
        if not isinstance(jdest, flavor.TemporaryQueue):
            return Queue(str(jdest.getQueueName()))
        dest: Destination = TemporaryQueue(str(jdest.getQueueName()))
    elif isinstance(jdest, flavor.Topic):
        if not isinstance(jdest, flavor.TemporaryTopic):
            return Topic(str(jdest.getTopicName()))
        dest = TemporaryTopic(str(jdest.getTopicName()))
    else:
        return Queue(str(jdest.toString()))
    remember_temporary(dest, jdest, flavor)
    return dest


def to_java_destination(dest: Destination, jsession: Any, flavor: Flavor) -> Any:
    """The Java destination for ``dest``, made by ``jsession`` unless it is a known temporary one."""
    if dest.is_temporary:
        with _lock:
            known = TEMPORARY.get((flavor.package, dest.kind, dest.name))
        if known is not None:
            return known
        log.warning(
            "temporary destination %s was not made by a Java provider of this process; sending to the %s of that name",
            dest,
            "topic" if dest.is_topic else "queue",
        )
    return jsession.createTopic(dest.name) if dest.is_topic else jsession.createQueue(dest.name)


# --- Java -> Python ----------------------------------------------------------------------------


def to_python(jmsg: Any, flavor: Flavor) -> Message:
    """Our read-only copy of a received Java message (its ack hook acknowledges the Java one)."""
    return to_python_checked(jmsg, flavor)[0]


def to_python_checked(jmsg: Any, flavor: Flavor) -> tuple[Message, bool]:
    """to_python(), and whether to_java() of the result would give back the Java message's
    body and properties as they are (a text or bytes message of which nothing was
    dropped or left to the provider): then the Java message itself may be sent instead."""
    whole = True
    if isinstance(jmsg, flavor.TextMessage):
        msg: Message = TextMessage(_s(jmsg.getText()))
    elif isinstance(jmsg, flavor.BytesMessage):
        msg = BytesMessage(_read_bytes_body(jmsg))
    elif isinstance(jmsg, flavor.MapMessage):
        whole = False
        msg = MapMessage()
        for name in jmsg.getMapNames():
            entry = typed(jmsg.getObject(name))
            if entry is None:
                log.warning("map entry %s of message %s is null; dropped", name, jmsg.getJMSMessageID())
            else:
                msg.set_typed(str(name), *entry)
    elif isinstance(jmsg, flavor.StreamMessage):
        whole = False
        msg = StreamMessage()
        for entry in _read_stream_body(jmsg, flavor):
            msg.write_typed(*entry)
    elif isinstance(jmsg, flavor.ObjectMessage):
        whole = False
        msg = ObjectMessage(read_serialized(jmsg))
    else:
        whole = False
        msg = Message()
    copy_headers_from_java(jmsg, msg, flavor)
    for name in jmsg.getPropertyNames():
        name = str(name)
        if name == "JMSXDeliveryCount":
            continue
        if name in PROVIDER_SET:
            whole = False  # kept here, not sent again by to_java()
        entry = typed(jmsg.getObjectProperty(name))
        problem = property_name_problem(name)
        if entry is None or problem or entry[0] in (PropertyType.CHAR, PropertyType.BYTES):
            log.warning(
                "property %s of message %s cannot be carried (%s); dropped",
                name,
                msg.message_id,
                problem or "not a JMS property type",
            )
            whole = False
            continue
        msg.set_typed_property(name, *entry)
    msg.set_read_only()
    return msg, whole


def copy_headers_from_java(jmsg: Any, msg: Message, flavor: Flavor) -> None:
    msg.message_id = _s(jmsg.getJMSMessageID())
    msg.timestamp = int(jmsg.getJMSTimestamp())
    msg.correlation_id = _s(jmsg.getJMSCorrelationID())
    msg.reply_to = to_python_destination(jmsg.getJMSReplyTo(), flavor)
    msg.destination = to_python_destination(jmsg.getJMSDestination(), flavor)
    msg.delivery_mode = int(jmsg.getJMSDeliveryMode())
    msg.redelivered = bool(jmsg.getJMSRedelivered())
    msg.type = _s(jmsg.getJMSType())
    msg.expiration = int(jmsg.getJMSExpiration())
    msg.priority = int(jmsg.getJMSPriority())
    count = jmsg.getObjectProperty("JMSXDeliveryCount")
    msg.delivery_count = int(count) if count is not None else (2 if msg.redelivered else 1)
    if flavor.jms2:
        msg.delivery_time = int(jmsg.getJMSDeliveryTime())


def byte_array() -> Any:
    """The Java byte[] type (made once: JArray(JByte) builds the type on every call)."""
    if not _byte_array:
        import jpype

        _byte_array.append(jpype.JArray(jpype.JByte))
    return _byte_array[0]


_byte_array: list[Any] = []


def _read_bytes_body(jmsg: Any) -> bytes:
    jmsg.reset()
    buf = byte_array()(int(jmsg.getBodyLength()))
    if len(buf):
        jmsg.readBytes(buf)
    jmsg.reset()
    return bytes(buf)


def _read_stream_body(jmsg: Any, flavor: Flavor) -> list[tuple[PropertyType, Any]]:
    import jpype

    jmsg.reset()
    items = []
    while True:
        try:
            value = jmsg.readObject()
        except jpype.JException as exc:
            if isinstance(exc, flavor.MessageEOFException):
                break
            raise
        entry = typed(value)
        if entry is None:
            log.warning("a null item of stream message %s is dropped", jmsg.getJMSMessageID())
        else:
            items.append(entry)
    jmsg.reset()
    return items


# --- ObjectMessage bodies as serialisation streams ----------------------------------------------


def _amq_read(jmsg: Any) -> bytes | None:
    content = jmsg.getContent()
    if content is None:
        return None
    data = bytes(content.getData())[content.getOffset() : content.getOffset() + content.getLength()]
    return zlib.decompress(data) if jmsg.isCompressed() else data


def _amq_write(jmsg: Any, data: bytes) -> None:
    import jpype

    sequence = jvm.jclass("org.apache.activemq.util.ByteSequence", jmsg.getClass().getClassLoader())
    jmsg.setContent(sequence(jpype.JArray(jpype.JByte)(data)))


# class-name prefix -> (read the stream or None, write the stream)
RAW_OBJECT: dict[str, tuple[Callable[[Any], bytes | None], Callable[[Any, bytes], None]]] = {
    "org.apache.activemq.": (_amq_read, _amq_write),
}


def _raw_access(jmsg: Any) -> tuple[Callable[[Any], bytes | None], Callable[[Any, bytes], None]] | None:
    name = str(jmsg.getClass().getName())
    for prefix, access in RAW_OBJECT.items():
        if name.startswith(prefix):
            return access
    return None


def read_serialized(jmsg: Any) -> JavaSerialized | None:
    """The Java serialisation stream of an ObjectMessage body (None for a null object)."""
    access = _raw_access(jmsg)
    data = access[0](jmsg) if access is not None else None
    if data is not None:
        return JavaSerialized(data)
    obj = jmsg.getObject()  # deserialises in Java (only when the provider has no raw access)
    if obj is None:
        return None
    out = jvm.jclass("java.io.ByteArrayOutputStream")()
    stream = jvm.jclass("java.io.ObjectOutputStream")(out)
    stream.writeObject(obj)
    stream.close()
    return JavaSerialized(bytes(out.toByteArray()))


def write_serialized(jmsg: Any, data: JavaSerialized) -> None:
    access = _raw_access(jmsg)
    if access is not None:
        access[1](jmsg, bytes(data))
        return
    import jpype

    source = jvm.jclass("java.io.ByteArrayInputStream")(jpype.JArray(jpype.JByte)(bytes(data)))
    jmsg.setObject(jvm.jclass("java.io.ObjectInputStream")(source).readObject())


def to_java_object(value: Any) -> Any:
    """A plain Python object body as java.lang / java.util objects."""
    import jpype

    if value is None:
        return None
    if isinstance(value, bool):
        return jvm.jclass("java.lang.Boolean")(value)
    if isinstance(value, int):
        return (
            jvm.jclass("java.lang.Integer")(value) if -(2**31) <= value < 2**31 else jvm.jclass("java.lang.Long")(value)
        )
    if isinstance(value, float):
        return jvm.jclass("java.lang.Double")(value)
    if isinstance(value, str):
        return jpype.JString(value)
    if isinstance(value, (bytes, bytearray)):
        return jpype.JArray(jpype.JByte)(bytes(value))
    if isinstance(value, list):
        out = jvm.jclass("java.util.ArrayList")()
        for item in value:
            out.add(to_java_object(item))
        return out
    if isinstance(value, dict):
        out = jvm.jclass("java.util.HashMap")()
        for key, item in value.items():
            out.put(jpype.JString(str(key)), to_java_object(item))
        return out
    raise MessageFormatException(f"an ObjectMessage body of type {type(value).__name__} has no Java equivalent")


# --- Python -> Java -----------------------------------------------------------------------------


def to_java(msg: Message, jsession: Any, flavor: Flavor, destination: Callable[[Destination], Any]) -> Any:
    """A new Java message made by ``jsession`` with the body, properties and the
    application-set headers of ``msg`` (``destination`` converts a reply-to)."""
    if isinstance(msg, TextMessage):
        jmsg = jsession.createTextMessage()
        if msg.text is not None:
            jmsg.setText(msg.text)
    elif isinstance(msg, BytesMessage):
        jmsg = jsession.createBytesMessage()
        body = msg.get_body()
        if body:
            jmsg.writeBytes(byte_array()(body))
    elif isinstance(msg, MapMessage):
        jmsg = jsession.createMapMessage()
        for name, ptype, value in msg.typed_items():
            getattr(jmsg, "set" + JAVA_TYPES[ptype][0])(name, _java_box(ptype)(value))
    elif isinstance(msg, StreamMessage):
        jmsg = jsession.createStreamMessage()
        for ptype, value in msg.typed_items():
            getattr(jmsg, "write" + JAVA_TYPES[ptype][0])(_java_box(ptype)(value))
    elif isinstance(msg, ObjectMessage):
        jmsg = jsession.createObjectMessage()
        body = msg.object
        if isinstance(body, JavaSerialized):
            write_serialized(jmsg, body)
        elif body is not None:
            jmsg.setObject(to_java_object(body))
    else:
        jmsg = jsession.createMessage()
    copy_headers_to_java(msg, jmsg, destination)
    return jmsg


def copy_headers_to_java(msg: Message, jmsg: Any, destination: Callable[[Destination], Any]) -> None:
    if msg.correlation_id is not None:
        jmsg.setJMSCorrelationID(msg.correlation_id)
    if msg.type is not None:
        jmsg.setJMSType(msg.type)
    if msg.reply_to is not None:
        jmsg.setJMSReplyTo(destination(msg.reply_to))
    for name, ptype, value in msg.typed_properties():
        if name not in PROVIDER_SET:
            getattr(jmsg, f"set{JAVA_TYPES[ptype][0]}Property")(name, _java_box(ptype)(value))


__all__ = [
    "Flavor",
    "flavor_for",
    "flavor_of",
    "read_serialized",
    "to_java",
    "to_java_destination",
    "to_python",
    "to_python_destination",
    "typed",
    "write_serialized",
]
