"""Java classes as message transformers.

A message-transformer-class may name a Java class: a subclass of the original's
MessageTransformer base class (a jar built for the original runs unchanged) or any class
with a transform() method of the same shape, duck-typed. JavaTransformer is our
MessageTransformer over it: transform() hands Java a JPype proxy (MessageView) over a copy
of our message. The finder installed below bridgemgr.providers.java.classes lets the
transformer loader load a Java class like a Python plugin.

Rule: as for Python transformers, null is a transform failure; a branch or drop counts on
a JMS bridge link only.

Design notes: docs/transformers.md#internals-providersjavatransformerpy.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from ...jms.destination import Destination, Queue, Topic
from ...jms.errors import JMSException
from ...jms.message import (
    BytesMessage,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    create_message,
)
from ...transform import STOMP, MessageTransformer
from . import baseclass, jvm
from .convert import (
    API_PACKAGES,
    JAVA_TYPES,
    Flavor,
    flavor_for,
    to_java_object,
    to_python,
    to_python_destination,
    typed,
)

PACKAGE = __name__.rpartition(".")[0] + ".classes"
SETTABLE = ("Boolean", "Byte", "Short", "Int", "Long", "Float", "Double", "String")
BY_JAVA_NAME = {name: ptype for ptype, (name, _) in JAVA_TYPES.items()}


def _py(value: Any) -> Any:
    """A value Java passed in, as Python (strings arrive as java.lang.String)."""
    if value is None or isinstance(value, (bool, int, float, bytes)):
        return value
    if type(value).__name__ == "byte[]":
        return bytes(value)
    return str(value)


def _boxed(ptype: PropertyType, value: Any) -> Any:
    """A typed value as the Java box of its type (what getObject-style methods return)."""
    import jpype

    if ptype is PropertyType.BYTES:
        return jpype.JArray(jpype.JByte)(value)
    if ptype is PropertyType.STRING:
        return jpype.JString(value)
    return jvm.jclass(JAVA_TYPES[ptype][1])(
        jpype.JChar(value)
        if ptype is PropertyType.CHAR
        else {
            PropertyType.BYTE: jpype.JByte,
            PropertyType.SHORT: jpype.JShort,
            PropertyType.INT: jpype.JInt,
            PropertyType.LONG: jpype.JLong,
            PropertyType.FLOAT: jpype.JFloat,
            PropertyType.DOUBLE: jpype.JDouble,
            PropertyType.BOOLEAN: jpype.JBoolean,
        }[ptype](value)
    )


def _java_errors(flavor: Flavor, call: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``call``; our JMSException leaves as the flavour's JMS exception of the same name."""

    def run(*args: Any) -> Any:
        try:
            return call(*args)
        except JMSException as exc:
            name = {"InvalidSelectorError": "InvalidSelectorException"}.get(type(exc).__name__, type(exc).__name__)
            try:
                cls = jvm.jclass(f"{flavor.package}.{name}", flavor.loader)
            except Exception:
                cls = jvm.jclass(f"{flavor.package}.JMSException", flavor.loader)
            raise cls(str(exc)) from None

    return run


def _destination_proxy(dest: Destination, flavor: Flavor) -> Any:
    import jpype

    kind = {"queue": "Queue", "topic": "Topic", "temp-queue": "TemporaryQueue", "temp-topic": "TemporaryTopic"}[
        dest.kind
    ]
    getter = "getTopicName" if dest.is_topic else "getQueueName"
    methods = {getter: lambda: dest.name, "toString": lambda: str(dest), "delete": lambda: None}
    return jpype.JProxy(flavor.api[kind], dict=methods)


class MessageView:
    """What a Java transformer sees: our message behind the javax/jakarta Message interface."""

    interface = "Message"

    def __init__(self, message: Message, flavor: Flavor) -> None:
        self.message: Any = message
        self.flavor = flavor
        self._destinations: list[tuple[Any, Destination]] = []  # proxies handed to Java

    # headers
    def getJMSMessageID(self) -> str | None:
        return self.message.message_id

    def setJMSMessageID(self, v: Any) -> None:
        self.message.message_id = _py(v)

    def getJMSTimestamp(self) -> int:
        return self.message.timestamp

    def setJMSTimestamp(self, v: Any) -> None:
        self.message.timestamp = int(v)

    def getJMSCorrelationID(self) -> str | None:
        return self.message.correlation_id

    def setJMSCorrelationID(self, v: Any) -> None:
        self.message.correlation_id = _py(v)

    def getJMSCorrelationIDAsBytes(self) -> Any:
        cid = self.message.correlation_id
        return None if cid is None else _boxed(PropertyType.BYTES, cid.encode("utf-8"))

    def setJMSCorrelationIDAsBytes(self, v: Any) -> None:
        self.message.correlation_id = None if v is None else bytes(v).decode("utf-8", "replace")

    def getJMSDeliveryMode(self) -> int:
        return int(self.message.delivery_mode)

    def setJMSDeliveryMode(self, v: Any) -> None:
        self.message.delivery_mode = int(v)

    def getJMSRedelivered(self) -> bool:
        return self.message.redelivered

    def setJMSRedelivered(self, v: Any) -> None:
        self.message.redelivered = bool(v)

    def getJMSType(self) -> str | None:
        return self.message.type

    def setJMSType(self, v: Any) -> None:
        self.message.type = _py(v)

    def getJMSExpiration(self) -> int:
        return self.message.expiration

    def setJMSExpiration(self, v: Any) -> None:
        self.message.expiration = int(v)

    def getJMSPriority(self) -> int:
        return self.message.priority

    def setJMSPriority(self, v: Any) -> None:
        self.message.priority = int(v)

    def getJMSDeliveryTime(self) -> int:
        return self.message.delivery_time

    def setJMSDeliveryTime(self, v: Any) -> None:
        self.message.delivery_time = int(v)

    def getJMSDestination(self) -> Any:
        return self._proxy(self.message.destination)

    def setJMSDestination(self, v: Any) -> None:
        self.message.destination = self._dest(v)

    def getJMSReplyTo(self) -> Any:
        return self._proxy(self.message.reply_to)

    def setJMSReplyTo(self, v: Any) -> None:
        self.message.reply_to = self._dest(v)

    def _proxy(self, dest: Destination | None) -> Any:
        if dest is None:
            return None
        proxy = _destination_proxy(dest, self.flavor)
        self._destinations.append((proxy, dest))
        return proxy

    def _dest(self, jdest: Any) -> Destination | None:
        if jdest is None:
            return None
        for proxy, dest in self._destinations:  # one of ours comes back as the same object
            if jdest is proxy:
                return dest
        return to_python_destination(jdest, self.flavor)

    # properties
    def propertyExists(self, name: Any) -> bool:
        return self.message.property_exists(str(name))

    def clearProperties(self) -> None:
        self.message.clear_properties()

    def getPropertyNames(self) -> Any:
        names = jvm.jclass("java.util.ArrayList")()
        for name in self.message.property_names:
            names.add(name)
        return jvm.jclass("java.util.Collections").enumeration(names)

    def getObjectProperty(self, name: Any) -> Any:
        ptype = self.message.get_property_type(str(name))
        return None if ptype is None else _boxed(ptype, self.message.get_object_property(str(name)))

    def setObjectProperty(self, name: Any, value: Any) -> None:
        entry = typed(value)
        if entry is not None:
            self.message.set_typed_property(str(name), *entry)

    # body
    def clearBody(self) -> None:
        self.message.clear_body()

    def acknowledge(self) -> None:
        pass

    def getBody(self, cls: Any) -> Any:
        raise JMSException("getBody() is not available to a transformer")

    def isBodyAssignableTo(self, cls: Any) -> bool:
        return False


for _name in SETTABLE:  # get<T>Property / set<T>Property
    setattr(
        MessageView,
        f"get{_name}Property",
        (lambda p: lambda self, n: getattr(self.message, f"get_{p.name.lower()}_property")(str(n)))(
            BY_JAVA_NAME[_name]
        ),
    )
    setattr(
        MessageView,
        f"set{_name}Property",
        (lambda p: lambda self, n, v: self.message.set_typed_property(str(n), p, _py(v)))(BY_JAVA_NAME[_name]),
    )


class _Text(MessageView):
    interface = "TextMessage"

    def getText(self) -> str | None:
        return self.message.text

    def setText(self, v: Any) -> None:
        self.message.text = _py(v)


class _Bytes(MessageView):
    interface = "BytesMessage"

    def getBodyLength(self) -> int:
        return self.message.get_body_length()

    def reset(self) -> None:
        self.message.reset()

    def readUnsignedByte(self) -> int:
        return self.message.read_unsigned_byte()

    def readUnsignedShort(self) -> int:
        return self.message.read_unsigned_short()

    def readUTF(self) -> str:
        return self.message.read_utf()

    def writeUTF(self, v: Any) -> None:
        self.message.write_utf(str(v))

    def readBytes(self, buf: Any, length: Any = None) -> int:
        n = len(buf) if length is None else min(int(length), len(buf))
        data = self.message.read_bytes(n)
        if not data and n:
            return -1
        buf[: len(data)] = data
        return len(data)

    def writeBytes(self, buf: Any, offset: Any = 0, length: Any = None) -> None:
        self.message.write_bytes(bytes(buf), int(offset), None if length is None else int(length))

    def writeObject(self, v: Any) -> None:
        self.message.write_object(_py(v))


for _name in ("Boolean", "Byte", "Short", "Char", "Int", "Long", "Float", "Double"):
    setattr(
        _Bytes,
        f"read{_name}",
        (lambda p: lambda self: getattr(self.message, f"read_{p.name.lower()}")())(BY_JAVA_NAME[_name]),
    )
    setattr(
        _Bytes,
        f"write{_name}",
        (lambda p: lambda self, v: getattr(self.message, f"write_{p.name.lower()}")(_py(v)))(BY_JAVA_NAME[_name]),
    )


class _Map(MessageView):
    interface = "MapMessage"

    def getMapNames(self) -> Any:
        names = jvm.jclass("java.util.ArrayList")()
        for name in self.message.map_names:
            names.add(name)
        return jvm.jclass("java.util.Collections").enumeration(names)

    def itemExists(self, name: Any) -> bool:
        return self.message.item_exists(str(name))

    def getObject(self, name: Any) -> Any:
        for item, ptype, value in self.message.typed_items():
            if item == str(name):
                return _boxed(ptype, value)
        return None

    def setObject(self, name: Any, value: Any) -> None:
        entry = typed(value)
        if entry is not None:
            self.message.set_typed(str(name), *entry)

    def setBytes(self, name: Any, value: Any, offset: Any = 0, length: Any = None) -> None:
        data = bytes(value)
        end = len(data) if length is None else int(offset) + int(length)
        self.message.set_bytes(str(name), data[int(offset) : end])


for _name, _ptype in BY_JAVA_NAME.items():
    setattr(
        _Map, f"get{_name}", (lambda p: lambda self, n: getattr(self.message, f"get_{p.name.lower()}")(str(n)))(_ptype)
    )
    if _name != "Bytes":
        setattr(_Map, f"set{_name}", (lambda p: lambda self, n, v: self.message.set_typed(str(n), p, _py(v)))(_ptype))


class _Stream(MessageView):
    interface = "StreamMessage"

    def reset(self) -> None:
        self.message.reset()

    def readObject(self) -> Any:
        message = self.message
        position = message._pos  # the item's type is needed, not only its value
        message.read_object()
        return _boxed(*message.typed_items()[position])

    def writeObject(self, value: Any) -> None:
        entry = typed(value)
        if entry is not None:
            self.message.write_typed(*entry)

    def readBytes(self, buf: Any) -> int:
        data = self.message.read_bytes()
        buf[: len(data)] = data
        return len(data)

    def writeBytes(self, buf: Any, offset: Any = 0, length: Any = None) -> None:
        data = bytes(buf)
        end = len(data) if length is None else int(offset) + int(length)
        self.message.write_bytes(data[int(offset) : end])


for _name, _ptype in BY_JAVA_NAME.items():
    if _name != "Bytes":
        setattr(
            _Stream, f"read{_name}", (lambda p: lambda self: getattr(self.message, f"read_{p.name.lower()}")())(_ptype)
        )
        setattr(_Stream, f"write{_name}", (lambda p: lambda self, v: self.message.write_typed(p, _py(v)))(_ptype))


class _Object(MessageView):
    interface = "ObjectMessage"

    def getObject(self) -> Any:
        body = self.message.object
        if isinstance(body, JavaSerialized):
            import jpype

            data = jvm.jclass("java.io.ByteArrayInputStream")(jpype.JArray(jpype.JByte)(bytes(body)))
            return jvm.jclass("java.io.ObjectInputStream")(data).readObject()
        return to_java_object(body)

    def setObject(self, value: Any) -> None:
        if value is None:
            self.message.object = None
            return
        out = jvm.jclass("java.io.ByteArrayOutputStream")()
        stream = jvm.jclass("java.io.ObjectOutputStream")(out)
        stream.writeObject(value)
        stream.close()
        self.message.object = JavaSerialized(bytes(out.toByteArray()))


VIEWS: dict[type[Message], type[MessageView]] = {
    TextMessage: _Text,
    BytesMessage: _Bytes,
    MapMessage: _Map,
    StreamMessage: _Stream,
    ObjectMessage: _Object,
    Message: MessageView,
}


def view_of(message: Message, flavor: Flavor) -> tuple[Any, MessageView]:
    """A Java proxy implementing the message's JMS interface, and the view behind it."""
    import jpype

    view = VIEWS[type(message)](message, flavor)
    methods = {
        name: _java_errors(flavor, getattr(view, name))
        for name in dir(view)
        if name[:1].islower() and callable(getattr(view, name))
    }
    interface = jvm.jclass(f"{flavor.package}.{view.interface}", flavor.loader)
    return jpype.JProxy(interface, dict=methods), view


# --- the transformer ---------------------------------------------------------------------------


class TargetSession:
    """The session init() hands a subclass of the base class: createJMSMessage(),
    createQueue() and createTopic() make our messages and destinations behind Java proxies,
    remembered (with the message given to transform()) so what Java returns maps back."""

    def __init__(self, flavor: Flavor, given: tuple[Any, MessageView]) -> None:
        self.flavor = flavor
        self.views: list[tuple[Any, MessageView]] = [given]
        self.destinations: list[tuple[Any, Destination]] = []

    def proxy(self) -> Any:
        import jpype

        methods: dict[str, Callable[..., Any]] = {
            "createMessage": lambda: self._message("MESSAGE"),
            "createTextMessage": lambda *text: self._message("TEXT", *text),
            "createBytesMessage": lambda: self._message("BYTES"),
            "createMapMessage": lambda: self._message("MAP"),
            "createStreamMessage": lambda: self._message("STREAM"),
            "createObjectMessage": lambda *body: self._message("OBJECT", *body),
            "createQueue": lambda name: self._destination(Queue(str(name))),
            "createTopic": lambda name: self._destination(Topic(str(name))),
        }
        session = jvm.jclass(f"{self.flavor.package}.Session", self.flavor.loader)
        return jpype.JProxy(session, dict={k: _java_errors(self.flavor, f) for k, f in methods.items()})

    def _message(self, kind: str, *body: Any) -> Any:
        proxy, view = view_of(create_message(kind), self.flavor)
        if body and body[0] is not None:  # createTextMessage(text), createObjectMessage(object)
            getattr(view, "setText" if kind == "TEXT" else "setObject")(body[0])
        self.views.append((proxy, view))
        return proxy

    def _destination(self, dest: Destination) -> Any:
        proxy = _destination_proxy(dest, self.flavor)
        self.destinations.append((proxy, dest))
        return proxy

    def message(self, result: Any) -> Message | None:
        """What transform() returned, as our message."""
        if result is None:
            return None
        for proxy, view in self.views:
            if result is proxy:
                return view.message
        return to_python(result, self.flavor)

    def branch(self, branch: Any) -> Destination | str | None:
        """What getBranchTo() returned: a ref-name, or a destination (ours or the provider's)."""
        if branch is None:
            return None
        if isinstance(branch, jvm.jclass("java.lang.String")):
            return str(branch)
        for proxy, dest in self.destinations + [d for _, v in self.views for d in v._destinations]:
            if branch is proxy:
                return dest
        if isinstance(branch, self.flavor.Destination):
            return to_python_destination(branch, self.flavor)
        raise JMSException(f"getBranchTo() returned a {type(branch).__name__}, not a String or a Destination")


class JavaTransformer(MessageTransformer):
    """A MessageTransformer whose transform() is a Java class's (see the module comment)."""

    def __init__(self, class_name: str, loader: Any = None) -> None:
        super().__init__()
        jvm.start()
        self.class_name = class_name
        try:
            cls = baseclass.load_class(class_name, loader or jvm.default_loader())
        except JMSException:
            raise
        except Exception as exc:  # ClassNotFoundException, NoClassDefFoundError, bad bytecode
            raise JMSException(
                f"Java class {class_name} cannot be loaded ({type(exc).__name__}: "
                f"{exc}); the JVM classpath is {', '.join(jvm.classpath()) or 'empty'} "
                f"(set {jvm.CLASSPATH_PROPERTY})"
            ) from None
        with jvm.java_errors(f"Java transformer {class_name}"):
            self.base = _base_class(cls.class_)
            methods = [m for m in cls.class_.getMethods() if m.getName() == "transform" and m.getParameterCount() == 6]
            method = next((m for m in methods if not m.isBridge()), None)
            if method is None:
                raise JMSException(
                    f"{class_name} has no public transform(Message, boolean, String, String, String, Properties) method"
                )
            api = str(method.getParameterTypes()[0].getName()).rpartition(".")[0]
            if api not in API_PACKAGES and self.base is not None:  # MessageTransformer<Object, Object>
                api = _api_of_base(self.base)
            if api not in API_PACKAGES:
                raise JMSException(
                    f"{class_name}.transform() takes a {api} type, not a javax.jms or jakarta.jms Message"
                )
            self.flavor = flavor_for(api, cls.class_.getClassLoader())
            self.java = cls()
        self._java_branch = getattr(self.java, "getBranchTo", None)
        self._java_no_transfer = getattr(self.java, "isNoTransfer", None)

    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message | None:
        copy = message.copy()
        if read_only:
            copy.set_read_only()
        proxy, view = view_of(copy, self.flavor)
        session = TargetSession(self.flavor, (proxy, view))
        jprops = jvm.jclass("java.util.Properties")()
        for key, value in (properties or {}).items():
            jprops.setProperty(str(key), str(value))
        with jvm.java_errors(f"{self.class_name}.transform"):
            if self.base is not None:  # the original's reset before each call
                stomp = not self._in_bridge_link and STOMP in (source, target)
                self.java.init(session.proxy(), "STOMP" if stomp else "JMS")
            result = self.java.transform(proxy, bool(read_only), charset_name, source, target, jprops)
            branch = self._java_branch() if self._java_branch is not None else None
            no_transfer = bool(self._java_no_transfer()) if self._java_no_transfer is not None else False
            out = session.message(result)
            destination = session.branch(branch)
        if self._in_bridge_link:
            if destination is not None:
                self.branch_to(destination)
            if no_transfer:
                self.no_transfer()
        return out


def _base_class(jclass_: Any) -> Any:
    """The original's base class among the superclasses of ``jclass_``, or None."""
    cls = jclass_.getSuperclass()
    while cls is not None:
        if str(cls.getName()) in baseclass.BASE_CLASSES:
            return cls
        cls = cls.getSuperclass()
    return None


def _api_of_base(base: Any) -> str:
    """The JMS API package of a base class (the type createQueue() returns)."""
    for method in base.getDeclaredMethods():
        if method.getName() == "createQueue":
            return str(method.getReturnType().getName()).rpartition(".")[0]
    return ""


def load(class_name: str) -> JavaTransformer:
    """A JavaTransformer of the Java class ``class_name`` (on the JVM's classpath)."""
    return JavaTransformer(class_name)


def load_if_configured(class_name: str) -> JavaTransformer | None:
    """load_transformer's loader for a name that is no Python module: a JavaTransformer when
    Java is configured (a JVM runs or a classpath is set), else None (not meant for Java)."""
    if not (jvm.is_started() or jvm.classpath()):
        return None
    return JavaTransformer(class_name)


# --- bridgemgr.providers.java.classes.<Java class name> ---------------------------------------------


class _ClassesFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every module below PACKAGE is a namespace whose attributes are Java transformers."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == PACKAGE or fullname.startswith(PACKAGE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        java_package = spec.name[len(PACKAGE) + 1 :]

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            class_name = f"{java_package}.{name}" if java_package else name

            # A subclass per Java class, so load_transformer() can instantiate it without arguments.
            def init(self: JavaTransformer) -> None:
                JavaTransformer.__init__(self, class_name)

            return type(name, (JavaTransformer,), {"__init__": init, "__module__": spec.name})

        module.__getattr__ = attribute  # type: ignore[method-assign]  # PEP 562: a module's __getattr__
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_finder() -> None:
    if not any(isinstance(f, _ClassesFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ClassesFinder())


__all__ = [
    "PACKAGE",
    "JavaTransformer",
    "MessageView",
    "TargetSession",
    "install_finder",
    "load",
    "load_if_configured",
    "view_of",
]
