"""Our provider SPI over a Java JMS provider (javax.jms or jakarta.jms) through JPype.

Thin wrappers that hold a Java provider's JMS object and its Flavor; messages cross in
convert.py at the edges. send_async() (the confirm window) batches a non-transacted
session's sends in a local transaction of the same connection, committed at flush().

Rules: every Java call runs inside jvm.java_errors(), so callers only see our JMSException
tree; a JMS 1.1 send cannot be confirmed, so a provider that sends NON_PERSISTENT messages
without waiting for its broker must be told to send synchronously when it is a
non-transacted link's target (ActiveMQ: jms.alwaysSyncSend=true).

Design notes: docs/architecture.md#internals-providersjavaclientpy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import InvalidDestinationException, JMSException, TransportException
from ...jms.message import Message
from ...jms.spi import (
    AckMode,
    CompletionListener,
    Connection,
    ConnectionFactory,
    ConnectionMetaData,
    ExceptionListener,
    MessageConsumer,
    MessageListener,
    MessageProducer,
    QueueBrowser,
    Session,
    XAConnection,
    XAConnectionFactory,
    XAResource,
    XASession,
)
from . import jvm
from .convert import (
    Flavor,
    flavor_of,
    to_java,
    to_java_destination,
    to_python,
    to_python_checked,
    to_python_destination,
)
from .jvm import java_errors
from .xa import JavaXAResource

log = logging.getLogger(__name__)


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


def _proxy(interface: Any, **methods: Any) -> Any:
    import jpype

    return jpype.JProxy(interface, dict=methods)


class JavaConnectionFactory(ConnectionFactory):
    """A Java ConnectionFactory (javax.jms or jakarta.jms)."""

    def __init__(self, jfactory: Any, flavor: Flavor | None = None) -> None:
        self.java = jfactory
        self.flavor = flavor or flavor_of(jfactory)
        self.loader = jfactory.getClass().getClassLoader()

    @property
    def client_id(self) -> str | None:
        """The client id the Java factory configures for its connections, if it says."""
        getter = getattr(self.java, "getClientID", None)
        return _s(getter()) if getter is not None else None

    def _connect(self, method: str, username: str | None, password: str | None, jfactory: Any = None) -> Any:
        with java_errors(method), jvm.context_loader(self.loader):
            create = getattr(self.java if jfactory is None else jfactory, method)
            return create(username, password) if username is not None else create()

    def create_connection(self, username: str | None = None, password: str | None = None) -> JavaConnection:
        return JavaConnection(self._connect("createConnection", username, password), self.flavor)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.java.getClass().getName()})"


class JavaXAConnectionFactory(JavaConnectionFactory, XAConnectionFactory):
    """A Java XAConnectionFactory: XA connections, and plain ones from its plain twin (see
    _plain_twin), else from itself where it also makes those."""

    def __init__(self, jfactory: Any, flavor: Flavor | None = None) -> None:
        super().__init__(jfactory, flavor)
        with jvm.context_loader(self.loader):
            self.plain = _plain_twin(jfactory, self.flavor)
        self.local_transactions = self.plain is not None

    def create_connection(self, username: str | None = None, password: str | None = None) -> JavaConnection:
        if self.plain is not None:
            return JavaConnection(self._connect("createConnection", username, password, self.plain), self.flavor)
        if isinstance(self.java, self.flavor.ConnectionFactory):
            return super().create_connection(username, password)
        return self.create_xa_connection(username, password)

    def create_xa_connection(self, username: str | None = None, password: str | None = None) -> JavaXAConnection:
        return JavaXAConnection(self._connect("createXAConnection", username, password), self.flavor)


def _plain_twin(jfactory: Any, flavor: Flavor) -> Any | None:
    """A plain ConnectionFactory configured as ``jfactory`` is, when its class extends one
    (ActiveMQ Classic's XA factory extends its ConnectionFactory, and its XA connections
    make only XA sessions): an instance of that class with every JavaBean property that
    class has copied over (broker URL, credentials, policies). None when there is no such
    class or a property would not copy; a copied String, number or boolean that does not
    read back equal also gives None (the twin must reach the same broker as the same
    user)."""
    from jpype import JArray, JClass, JObject

    try:
        plain_cf, xa_cf = flavor.ConnectionFactory.class_, flavor.XAConnectionFactory.class_
        cls = jfactory.getClass().getSuperclass()
        while cls is not None and not (plain_cf.isAssignableFrom(cls) and not xa_cf.isAssignableFrom(cls)):
            cls = cls.getSuperclass()
        if cls is None or JClass("java.lang.reflect.Modifier").isAbstract(cls.getModifiers()):
            return None
        twin = cls.getConstructor().newInstance()
        values = (JClass("java.lang.String"), JClass("java.lang.Number"), JClass("java.lang.Boolean"))
        same = JClass("java.util.Objects").equals
        for prop in JClass("java.beans.Introspector").getBeanInfo(cls).getPropertyDescriptors():
            read, write = prop.getReadMethod(), prop.getWriteMethod()
            if read is None or write is None:
                continue
            value = read.invoke(jfactory)
            write.invoke(twin, JArray(JObject)([value]))
            if isinstance(value, values) and not same(read.invoke(twin), value):
                return None
        return twin
    except Exception as exc:  # provider code: no twin, the XA factory serves alone
        log.debug("no plain twin of %s: %s", jfactory.getClass().getName(), exc)
        return None


def wrap_factory(jfactory: Any) -> JavaConnectionFactory:
    """The SPI factory for a Java (XA)ConnectionFactory."""
    flavor = flavor_of(jfactory)
    if isinstance(jfactory, flavor.XAConnectionFactory):
        return JavaXAConnectionFactory(jfactory, flavor)
    return JavaConnectionFactory(jfactory, flavor)


class JavaConnection(Connection):
    """A Java Connection; closing it is what lets the JVM exit."""

    def __init__(self, jconn: Any, flavor: Flavor) -> None:
        self.java = jconn
        self.flavor = flavor
        self.closed = False
        self._xa_ack_lock = threading.Lock()
        self._listener_proxy: Any = None
        jvm.track(jconn)

    @property
    def client_id(self) -> str | None:
        with java_errors("getClientID"):
            return _s(self.java.getClientID())

    @client_id.setter
    def client_id(self, value: str) -> None:
        with java_errors("setClientID"):
            self.java.setClientID(value)

    @property
    def metadata(self) -> ConnectionMetaData:
        with java_errors("getMetaData"):
            meta = self.java.getMetaData()
            return ConnectionMetaData(
                str(meta.getJMSProviderName()), str(meta.getProviderVersion()), str(meta.getJMSVersion())
            )

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> JavaSession:
        mode = AckMode.SESSION_TRANSACTED if transacted else AckMode(ack_mode)
        with java_errors("createSession"):
            set_xa_ack_mode = getattr(self.java, "setXaAckMode", None)
            if set_xa_ack_mode is None or transacted:
                return JavaSession(self, self.java.createSession(bool(transacted), int(mode)))
            # ActiveMQ Classic: an XAConnectionFactory's connections make XA sessions that
            # ignore createSession's ack mode and act transacted outside a transaction
            # unless xaAckMode is set; it is read when a session is made, so set it per call.
            with self._xa_ack_lock:
                set_xa_ack_mode(int(mode))
                return JavaSession(self, self.java.createSession(False, int(mode)))

    def start(self) -> None:
        with java_errors("start"):
            self.java.start()

    def stop(self) -> None:
        with java_errors("stop"):
            self.java.stop()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            with java_errors("close"):
                self.java.close()
        finally:
            jvm.untrack(self.java)

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        if listener is None:
            proxy = None
        else:

            def on_exception(jexc: Any) -> None:
                exc = jvm.translate(jexc, "connection failed")
                if not isinstance(exc, TransportException):
                    exc = TransportException(str(exc))
                try:
                    listener(exc)
                except Exception:
                    log.exception("the exception listener failed")

            proxy = _proxy(self.flavor.ExceptionListener, onException=on_exception)
        with java_errors("setExceptionListener"):
            self.java.setExceptionListener(proxy)
        self._listener_proxy = proxy  # JPype proxies must outlive Java's reference

    def __repr__(self) -> str:
        return f"JavaConnection({self.java.getClass().getName()}, closed={self.closed})"


class JavaXAConnection(JavaConnection, XAConnection):
    """A Java XAConnection."""

    def create_xa_session(self) -> JavaXASession:
        with java_errors("createXASession"):
            return JavaXASession(self, self.java.createXASession())


class JavaSession(Session):
    """A Java Session (single-threaded, as in JMS)."""

    def __init__(self, connection: JavaConnection, jsession: Any) -> None:
        self.connection = connection
        self.java = jsession
        self.flavor = connection.flavor
        with java_errors("session"):
            self.transacted = bool(jsession.getTransacted())
            mode = int(jsession.getAcknowledgeMode())
        self.ack_mode = AckMode(mode) if mode in AckMode._value2member_map_ else AckMode.CLIENT_ACKNOWLEDGE
        self._destinations: dict[Destination, Any] = {}
        self._unacked: list[Any] = []  # delivered Java messages not acknowledged yet
        # The last delivery when to_java() would rebuild it as it is: our message, the
        # Java one, and the headers to_java() copies as they were (see send()).
        self._resendable: tuple[Message, Any, tuple[Any, ...]] | None = None

    def before_work(self) -> None:
        """Called before a receive or a send (an XA session starts a held branch here)."""

    # --- destinations ------------------------------------------------------------------------
    def java_destination(self, dest: Destination) -> Any:
        jdest = self._destinations.get(dest)
        if jdest is None:
            with java_errors(f"destination {dest}"):
                jdest = to_java_destination(dest, self.java, self.flavor)
            self._destinations[dest] = jdest
        return jdest

    def _temporary(self, method: str) -> Any:
        with java_errors(method):
            jdest = getattr(self.java, method)()
            dest = to_python_destination(jdest, self.flavor)
        assert dest is not None  # (the new temporary destination)
        self._destinations[dest] = jdest
        return dest

    def create_temporary_queue(self) -> TemporaryQueue:
        return self._temporary("createTemporaryQueue")

    def create_temporary_topic(self) -> TemporaryTopic:
        return self._temporary("createTemporaryTopic")

    # --- producers and consumers -------------------------------------------------------------
    def create_producer(self, destination: Destination | None = None) -> JavaProducer:
        jdest = self.java_destination(destination) if destination is not None else None
        with java_errors("createProducer"):
            return JavaProducer(self, self.java.createProducer(jdest), destination)

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> JavaConsumer:
        jdest = self.java_destination(destination)
        with java_errors("createConsumer"):
            return JavaConsumer(self, self.java.createConsumer(jdest, selector, bool(no_local)), selector)

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> JavaConsumer:
        jdest = self.java_destination(topic)
        with java_errors("createDurableSubscriber"):
            return JavaConsumer(
                self, self.java.createDurableSubscriber(jdest, name, selector, bool(no_local)), selector
            )

    def unsubscribe(self, name: str) -> None:
        with java_errors("unsubscribe"):
            self.java.unsubscribe(name)

    def create_browser(self, queue: Queue, selector: str | None = None) -> JavaBrowser:
        jdest = self.java_destination(queue)
        with java_errors("createBrowser"):
            return JavaBrowser(self, self.java.createBrowser(jdest, selector), queue, selector)

    # --- deliveries, transactions, acknowledgement ------------------------------------------
    def delivered(self, jmsg: Any) -> Message:
        """Our message for a Java delivery of this session."""
        with java_errors("convert a received message"):
            msg, whole = to_python_checked(jmsg, self.flavor)
        self._resendable = (msg, jmsg, _rebuilt_headers(msg)) if whole else None
        if not self.transacted and self.ack_mode in (AckMode.CLIENT_ACKNOWLEDGE, AckMode.INDIVIDUAL_ACKNOWLEDGE):
            self._unacked.append(jmsg)
            msg._ack = lambda: self._acknowledge(jmsg)
        return msg

    def _acknowledge(self, jmsg: Any) -> None:
        with java_errors("acknowledge"):
            jmsg.acknowledge()
        if self.ack_mode is AckMode.INDIVIDUAL_ACKNOWLEDGE:
            self._unacked = [m for m in self._unacked if m is not jmsg]
        else:
            self._unacked.clear()

    def acknowledge(self) -> None:
        if not self._unacked:
            return
        with java_errors("acknowledge"):
            if self.ack_mode is AckMode.INDIVIDUAL_ACKNOWLEDGE:
                for jmsg in self._unacked:
                    jmsg.acknowledge()
            else:
                self._unacked[-1].acknowledge()
        self._unacked.clear()

    def commit(self) -> None:
        with java_errors("commit"):
            self.java.commit()

    def rollback(self) -> None:
        self._resendable = None
        with java_errors("rollback"):
            self.java.rollback()

    def recover(self) -> None:
        self._resendable = None
        self._unacked.clear()
        with java_errors("recover"):
            self.java.recover()

    def close(self) -> None:
        self._resendable = None
        self._unacked.clear()
        with java_errors("close session"):
            self.java.close()


class JavaXASession(JavaSession, XASession):
    """A Java XASession: its work belongs to the branch its XAResource is started on."""

    def __init__(self, connection: JavaConnection, jxasession: Any) -> None:
        with java_errors("XASession"):
            super().__init__(connection, jxasession.getSession())
            self._resource = JavaXAResource(jxasession.getXAResource())
        self.java_xa = jxasession
        self.transacted = True

    @property
    def xa_resource(self) -> XAResource:
        return self._resource

    def before_work(self) -> None:
        self._resource.flush()

    def close(self) -> None:
        with java_errors("close session"):
            self.java_xa.close()


class JavaProducer(MessageProducer):
    def __init__(self, session: JavaSession, jproducer: Any, destination: Destination | None) -> None:
        super().__init__(destination)
        self.session = session
        self.java = jproducer
        self._batch: JavaProducer | None = None  # send_async's, on a transacted session
        # send_async() calls not committed yet: message, listener, destination, QoS
        self._batched: list[tuple[Message, CompletionListener, Destination | None, dict[str, Any]]] = []

    def send_async(
        self,
        message: Message,
        listener: CompletionListener,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        """Batched in a local transaction that flush() commits (see the notes)."""
        session = self.session
        qos = {"delivery_mode": delivery_mode, "priority": priority, "time_to_live": time_to_live}
        if session.transacted or isinstance(session, XASession):
            super().send_async(message, listener, destination, **qos)
            return
        if self._batch is None:
            self._batch = session.connection.create_session(True).create_producer(None)
            for name in (
                "delivery_mode",
                "priority",
                "time_to_live",
                "disable_message_id",
                "disable_message_timestamp",
            ):
                setattr(self._batch, name, getattr(self, name))
        self._batch.send(message, destination or self.destination, **qos)
        self._batched.append((message, listener, destination or self.destination, qos))

    @property
    def answers_alone(self) -> bool:
        return False  # flush() commits the batched sends and answers them

    def flush(self) -> None:
        """Commit the batched sends; their listeners hear how it went (see the notes)."""
        batched, self._batched = self._batched, []
        if not batched:
            return
        batch = self._batch
        assert batch is not None
        try:
            batch.session.commit()
        except TransportException as exc:
            for message, listener, _, _ in batched:
                listener.on_exception(message, exc)
            return
        except JMSException:
            for message, listener, dest, qos in batched:  # one per transaction
                try:
                    batch.send(message, dest, **qos)
                    batch.session.commit()
                except JMSException as exc:
                    _roll_back(batch.session)
                    listener.on_exception(message, exc)
                else:
                    listener.on_completion(message)
            return
        for message, listener, _, _ in batched:
            listener.on_completion(message)

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        if self.destination is not None and destination not in (None, self.destination):
            raise InvalidDestinationException(
                f"this producer sends to {self.destination}; it cannot send to {destination}"
            )
        dest = destination or self.destination
        if dest is None:
            raise InvalidDestinationException("send() needs a destination (the producer has none)")
        mode = self.delivery_mode if delivery_mode is None else delivery_mode
        prio = self.priority if priority is None else priority
        ttl = self.time_to_live if time_to_live is None else time_to_live
        session = self.session
        session.before_work()
        with java_errors(f"send to {dest}"):
            jmsg = _resend(session, message)
            if jmsg is None:
                jmsg = to_java(message, session.java, session.flavor, session.java_destination)
            if self.disable_message_id:
                self.java.setDisableMessageID(True)
            if self.disable_message_timestamp:
                self.java.setDisableMessageTimestamp(True)
            if self.destination is None:
                self.java.send(session.java_destination(dest), jmsg, int(mode), int(prio), int(ttl))
            else:
                self.java.send(jmsg, int(mode), int(prio), int(ttl))
            message.message_id = _s(jmsg.getJMSMessageID())
            message.timestamp = int(jmsg.getJMSTimestamp())
            message.expiration = int(jmsg.getJMSExpiration())
        message.destination = dest
        message.delivery_mode = mode
        message.priority = prio

    def close(self) -> None:
        try:
            if self._batch is not None:
                self.flush()
                self._batch.session.close()
        finally:
            with java_errors("close producer"):
                self.java.close()


def _rebuilt_headers(msg: Message) -> tuple[Any, ...]:
    """The headers to_java() copies onto the Java message it makes."""
    return msg.correlation_id, msg.type, msg.reply_to


def _resend(session: JavaSession, message: Message) -> Any:
    """The Java message this session delivered as ``message``, when sending it is sending
    what to_java() would make of ``message``: still read-only (body and properties as
    delivered) and the headers to_java() copies unchanged. A JMS provider sends a message
    it delivered as a new message with the send's headers (ActiveMQ copies its own
    message class); skipping to_java() also makes ActiveMQ's commit of the send cheaper
    (docs/benchmarks.md). None: convert."""
    resendable = session._resendable
    if (
        resendable is None
        or resendable[0] is not message
        or not message.is_read_only
        or not message.is_body_read_only
        or resendable[2] != _rebuilt_headers(message)
    ):
        return None
    return resendable[1]


def _roll_back(session: Session) -> None:
    try:
        session.rollback()
    except JMSException:
        pass  # the connection is gone: nothing of it stays


class JavaConsumer(MessageConsumer):
    def __init__(self, session: JavaSession, jconsumer: Any, selector: str | None) -> None:
        self.session = session
        self.java = jconsumer
        self._selector = selector
        self._listener_proxy: Any = None

    @property
    def message_selector(self) -> str | None:
        return self._selector

    def receive(self, timeout: float | None = None) -> Message | None:
        self.session.before_work()
        with java_errors("receive"):
            if timeout is None:
                jmsg = self.java.receive()
            elif timeout <= 0:
                jmsg = self.java.receiveNoWait()
            else:
                jmsg = self.java.receive(max(1, int(timeout * 1000)))
        return None if jmsg is None else self.session.delivered(jmsg)

    def set_message_listener(self, listener: MessageListener | None) -> None:
        if listener is None:
            proxy = None
        else:

            def on_message(jmsg: Any) -> None:
                try:
                    listener(self.session.delivered(jmsg))
                except Exception:
                    log.exception("the message listener failed")

            proxy = _proxy(self.session.flavor.MessageListener, onMessage=on_message)
        with java_errors("setMessageListener"):
            self.java.setMessageListener(proxy)
        self._listener_proxy = proxy

    def close(self) -> None:
        with java_errors("close consumer"):
            self.java.close()


class JavaBrowser(QueueBrowser):
    def __init__(self, session: JavaSession, jbrowser: Any, queue: Queue, selector: str | None) -> None:
        self.session = session
        self.java = jbrowser
        self.queue = queue
        self.message_selector = selector

    def __iter__(self) -> Iterator[Message]:
        with java_errors("browse"):
            messages = self.java.getEnumeration()
            while messages.hasMoreElements():
                yield to_python(messages.nextElement(), self.session.flavor)

    def close(self) -> None:
        with java_errors("close browser"):
            self.java.close()
