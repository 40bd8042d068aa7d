"""The provider SPI: the JMS API as abstract Python classes.

Every provider (the embedded host broker, the mq:// client, STOMP brokers, Java
providers through JPype) implements these, and bridges use nothing else. Names are
the JMS ones in snake_case; timeouts are seconds. Connections and sessions are
context managers: a connection closes on exit, a transacted session commits on a
clean exit and rolls back on an exception.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol, TypeGuard

from .destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from .errors import IllegalStateException, JMSException, TransactionInProgressException
from .message import (
    DEFAULT_DELIVERY_MODE,
    DEFAULT_PRIORITY,
    DEFAULT_TIME_TO_LIVE,
    BytesMessage,
    MapMessage,
    Message,
    ObjectMessage,
    StreamMessage,
    TextMessage,
)
from .selector import compile_selector
from .xa import Xid

_log = logging.getLogger(__name__)


class AckMode(IntEnum):
    SESSION_TRANSACTED = 0
    AUTO_ACKNOWLEDGE = 1
    CLIENT_ACKNOWLEDGE = 2
    DUPS_OK_ACKNOWLEDGE = 3
    INDIVIDUAL_ACKNOWLEDGE = 4  # acknowledge() acks only that message (where supported)


AUTO_ACKNOWLEDGE = AckMode.AUTO_ACKNOWLEDGE
CLIENT_ACKNOWLEDGE = AckMode.CLIENT_ACKNOWLEDGE
DUPS_OK_ACKNOWLEDGE = AckMode.DUPS_OK_ACKNOWLEDGE
INDIVIDUAL_ACKNOWLEDGE = AckMode.INDIVIDUAL_ACKNOWLEDGE
SESSION_TRANSACTED = AckMode.SESSION_TRANSACTED

ExceptionListener = Callable[[JMSException], None]
MessageListener = Callable[[Message], None]


@dataclass(frozen=True)
class ConnectionMetaData:
    provider_name: str
    provider_version: str
    jms_version: str = "1.1"


class CompletionListener(Protocol):
    """JMS 2.0's CompletionListener: how an asynchronous send (send_async) ended."""

    def on_completion(self, message: Message) -> None:
        """The provider has the message (as a confirmed send would have returned)."""

    def on_exception(self, message: Message, exception: JMSException) -> None:
        """The send failed: a refusal of this message, or a lost connection."""


class MessageProducer(ABC):
    """Sends messages; defaults for delivery mode, priority and time to live.

    The confirm window: send_async() is JMS 2.0's send(message, CompletionListener) (a
    separate method, Python having no overloads), flush() waits for what it started. A
    provider that can pipeline returns from send_async() before the provider answered and
    calls the listener once the answer comes, on its own thread or the caller's (within a
    later send_async() or flush()); the rest send synchronously and call it at once. What
    a caller relies on: send_async() either raises (the message did not leave: a bad
    argument, a closed producer, a connection already lost; the listener is never called)
    or returns, and then the listener is called exactly once, at the latest when flush()
    returns; a refusal goes to on_exception() of the message refused, never to another's.
    Listeners of one producer are called in the order of the sends where the protocol
    answers in order (every provider here); a caller that must not depend on it, a
    bridge link, orders the outcomes itself (jmsbridge/window.py)."""

    def __init__(self, destination: Destination | None) -> None:
        self.destination = destination
        self.delivery_mode = DEFAULT_DELIVERY_MODE
        self.priority = DEFAULT_PRIORITY
        self.time_to_live = DEFAULT_TIME_TO_LIVE  # milliseconds; 0 = never expires
        self.disable_message_id = False
        self.disable_message_timestamp = False
        # True: send() returns only once the provider has answered for this message, and
        # raises its refusal, also where it would return before (a NON_PERSISTENT send over
        # the wire, whose refusal would otherwise fail a later send, as if that message had
        # failed). A caller that must know which message was refused sets it: a bridge link,
        # which may consume a source message only once its send succeeded. Sends inside a
        # transaction are answered for by the commit.
        self.confirm_sends = False

    @abstractmethod
    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        """Send; sets message_id, timestamp, destination, delivery_mode, priority, expiration."""

    def stamp(
        self,
        message: Message,
        destination: Destination,
        message_id: str,
        *,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> None:
        """Set the headers a send sets: ``destination``, ``message_id``, now as the
        timestamp, and the delivery mode, priority and expiration that the send's
        arguments give, else this producer's defaults (for a provider to call)."""
        message.delivery_mode = self.delivery_mode if delivery_mode is None else delivery_mode
        message.priority = self.priority if priority is None else priority
        ttl = self.time_to_live if time_to_live is None else time_to_live
        message.timestamp = int(time.time() * 1000)
        message.expiration = message.timestamp + ttl if ttl else 0
        message.destination = destination
        message.message_id = message_id

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
        """Send without waiting for the provider's answer; ``listener`` hears it (see the
        class notes). By default a confirmed send, the listener called before returning."""
        confirm, self.confirm_sends = self.confirm_sends, True
        try:
            self.send(message, destination, delivery_mode=delivery_mode, priority=priority, time_to_live=time_to_live)
        finally:
            self.confirm_sends = confirm
        listener.on_completion(message)

    def flush(self) -> None:
        """Wait until every send_async() of this producer has called its listener."""

    @property
    def answers_alone(self) -> bool:
        """Whether send_async()'s listeners hear their answers while nobody waits in
        flush() (a provider thread reads them, or, by default, each is answered before
        send_async() returns): a link may then wait for its oldest send alone."""
        return True

    @property
    def answers_when_sent(self) -> bool:
        """Whether a send() of this producer is confirmed when it returns and send_async()
        would have nothing to wait for (right now): a link then sends plainly, without the
        confirm window's bookkeeping, and still acknowledges once per window."""
        return False

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> MessageProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MessageConsumer(ABC):
    """Receives from a destination, optionally filtered by a selector."""

    @property
    @abstractmethod
    def message_selector(self) -> str | None: ...

    @abstractmethod
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds (None = wait until closed)."""

    def receive_no_wait(self) -> Message | None:
        return self.receive(0)

    def receive_blob(self, timeout: float | None = None) -> bytes | None:
        """receive(), the message encoded (jms/codec.py) as this consumer gave it: for a
        receiver that only stores messages. A provider that gets messages encoded
        (the host broker's jms service) hands them over without decoding them."""
        from . import codec

        message = self.receive(timeout)
        return None if message is None else codec.encode(message)

    def backlog(self) -> int | None:
        """Messages waiting for this consumer at the provider, where the provider can
        tell (metrics, ``list link -v``); None where it cannot."""
        return None

    @abstractmethod
    def set_message_listener(self, listener: MessageListener | None) -> None:
        """Deliver asynchronously to ``listener`` on the session's thread."""

    def deliver_to(self, listener: MessageListener, timeout: float) -> bool:
        """Receive one message within ``timeout`` seconds and call ``listener`` with it,
        as a message listener is called (Session.run for a connection consumer); False
        when none came. A listener's exception is raised; where the provider can, an
        AUTO/DUPS_OK message is then given back for redelivery (a backout), as after a
        failing message listener. By default: receive(), then the listener."""
        message = self.receive(timeout)
        if message is None:
            return False
        listener(message)
        return True

    @abstractmethod
    def close(self) -> None: ...

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer is closed."""
        while True:
            msg = self.receive()
            if msg is None:
                return
            yield msg

    def __enter__(self) -> MessageConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PollingConsumer(MessageConsumer):
    """A consumer whose provider has no delivery thread of its own to call a listener
    on (STOMP, AMQP): set_message_listener() starts one that receives (polling, so it
    sees an unset listener or a closed consumer within half a second) and hands each
    message to the listener, until the consumer closes or the connection fails."""

    closed: bool
    listener_log: logging.Logger  # the provider's: where a failing listener is logged
    _listener: MessageListener | None = None
    _thread: threading.Thread | None = None

    @abstractmethod
    def listener_thread_name(self) -> str:
        """The name of the listener thread (which provider, which subscription)."""

    def set_message_listener(self, listener: MessageListener | None) -> None:
        self._listener = listener
        if listener is not None and self._thread is None:
            self._thread = threading.Thread(target=self._dispatch, daemon=True, name=self.listener_thread_name())
            self._thread.start()

    def _dispatch(self) -> None:
        while not self.closed and self._listener is not None:
            try:
                message = self.receive(0.5)
            except JMSException:
                return
            if message is not None and self._listener is not None:
                try:
                    self._listener(message)
                except Exception:
                    self.listener_log.exception("the message listener failed")


class QueueBrowser(ABC):
    """Looks at the messages of a queue without consuming them."""

    queue: Queue
    message_selector: str | None

    @abstractmethod
    def __iter__(self) -> Iterator[Message]: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> QueueBrowser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session(ABC):
    """A single-threaded context for producing and consuming messages."""

    transacted: bool
    ack_mode: AckMode
    # Set by the session's owner (a bridge link: its stop event) so that a send the
    # provider holds in this process while the broker has no room (FLOW_CONTROL, the
    # memory state) gives up with SendCancelled once it is set, instead of waiting for
    # room that may never come; where the provider holds no send here, unused.
    cancel: threading.Event | None = None

    # --- destinations -----------------------------------------------------
    def create_queue(self, name: str) -> Queue:
        return Queue(name)

    def create_topic(self, name: str) -> Topic:
        return Topic(name)

    @abstractmethod
    def create_temporary_queue(self) -> TemporaryQueue: ...

    @abstractmethod
    def create_temporary_topic(self) -> TemporaryTopic: ...

    # --- messages ---------------------------------------------------------
    def create_message(self) -> Message:
        return Message()

    def create_text_message(self, text: str | None = None) -> TextMessage:
        return TextMessage(text)

    def create_bytes_message(self, body: bytes | None = None) -> BytesMessage:
        return BytesMessage(body)

    def create_map_message(self, values: dict[str, Any] | None = None) -> MapMessage:
        return MapMessage(values)

    def create_stream_message(self, items: list[Any] | None = None) -> StreamMessage:
        return StreamMessage(items)

    def create_object_message(self, obj: Any = None) -> ObjectMessage:
        return ObjectMessage(obj)

    # --- producers and consumers -----------------------------------------
    @abstractmethod
    def create_producer(self, destination: Destination | None = None) -> MessageProducer: ...

    @abstractmethod
    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer: ...

    @abstractmethod
    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer:
        """A consumer of a durable subscription (connection client id + ``name``)."""

    @abstractmethod
    def unsubscribe(self, name: str) -> None:
        """Delete the durable subscription ``name`` of this connection's client id."""

    @abstractmethod
    def create_browser(self, queue: Queue, selector: str | None = None) -> QueueBrowser: ...

    # --- transactions and acknowledgement -------------------------------
    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def recover(self) -> None:
        """Redeliver every unacknowledged message, from the oldest, marked redelivered."""

    @abstractmethod
    def acknowledge(self) -> None:
        """Acknowledge every message delivered so far (CLIENT_ACKNOWLEDGE)."""

    # Whether acknowledge_oldest() can work here (CLIENT_ACKNOWLEDGE).
    acknowledges_oldest: bool = False

    def acknowledge_oldest(self, count: int) -> bool:
        """CLIENT_ACKNOWLEDGE of only the ``count`` oldest messages delivered and not yet
        acknowledged, not the later ones (a link acknowledging the confirmed head of its
        window while later sends are out). False when the provider cannot: nothing was
        acknowledged, the caller acknowledges all at once later."""
        return False

    def prefetch_at_least(self, count: int, max_bytes: int = 0) -> None:
        """A hint before this session's consumers are created: they will hold up to
        ``count`` messages unacknowledged (a link's confirm windows), so a provider whose
        deliveries stop at a prefetch limit raises it to at least ``count``; where it can
        also stop delivering while its prefetched messages hold ``max_bytes`` (> 0), it
        does (mq://). Providers without such limits ignore it."""

    # Whether prefetch_at_most() reaches the consumers already open (AMQP's basic.qos global).
    prefetch_adjustable: bool = False

    def prefetch_at_most(self, count: int) -> None:
        """This session's consumers hold at most ``count`` (>= 1) messages unacknowledged,
        whatever the provider URL's prefetch and prefetch_at_least() said: a link that
        knows its messages' size asks for the count that holds its byte bound. It may be
        asked again, higher or lower. It reaches the consumers created afterwards, and
        the open ones too where ``prefetch_adjustable``; a provider whose prefetch is not
        a count it sets (mq://, which bounds bytes; Java clients) ignores it."""

    @abstractmethod
    def close(self) -> None: ...

    # --- application server facilities (ServerSession, ConnectionConsumer) ---------
    _run_listener: MessageListener | None = None
    _loads: list[tuple[ConnectionConsumer, int]] | None = None

    def set_message_listener(self, listener: MessageListener | None) -> None:
        """The session's own listener (JMS Session.setMessageListener): run() hands it
        the messages connection consumers loaded into this session."""
        self._run_listener = listener

    def get_message_listener(self) -> MessageListener | None:
        return self._run_listener

    def load(self, connection_consumer: ConnectionConsumer, max_messages: int) -> None:
        """(A connection consumer) the next run() takes up to ``max_messages`` of its messages."""
        if self._loads is None:
            self._loads = []
        self._loads.append((connection_consumer, max_messages))

    def run(self) -> None:
        """Deliver what connection consumers loaded to the session's listener, on the
        calling thread (a ServerSession's start() runs it on an application server's
        thread). Messages are taken as the listener is called, so they belong to the
        session's transaction, acknowledgement or the XA branch started on it. A
        listener's exception ends the run and is raised: in AUTO/DUPS_OK the message is
        given back (MessageConsumer.deliver_to); otherwise the caller rolls back or
        recovers; either way a backout, which the broker counts."""
        loads, self._loads = self._loads, None
        listener = self._run_listener
        if listener is None:
            raise IllegalStateException("Session.run() needs the session's message listener set")
        for connection_consumer, count in loads or ():
            consumer = connection_consumer.consumer_in(self)
            if consumer is None:
                continue
            for i in range(count):
                if not consumer.deliver_to(listener, connection_consumer.wait if i == 0 else 0):
                    break

    def create_group_consumer(
        self,
        destination: Destination,
        selector: str | None,
        durable_name: str | None,
        group: str,
        retain: bool,
        max_messages: int,
    ) -> MessageConsumer:
        """A consumer of connection consumer ``group`` in this session: for a topic the
        group's sessions share one subscription (durable when ``durable_name``), so each
        message reaches one of them; ``retain`` False: the provider removes messages of
        the queue that no active consumer selects (message retention off). A provider
        that prefetches holds at most ``max_messages`` (a batch) for the session. By
        default a plain consumer: a queue with retention on."""
        if destination.is_topic or not retain:
            raise JMSException(
                f"{type(self).__name__}: this provider cannot share a topic subscription "
                "among a connection consumer's sessions, nor turn message retention off"
            )
        return self.create_consumer(destination, selector)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if self.transacted:
                if exc_type is None:
                    self.commit()
                else:
                    self.rollback()
        finally:
            self.close()


class Connection(ABC):
    """A client's link to a provider: creates sessions, owns temporary destinations."""

    @property
    @abstractmethod
    def client_id(self) -> str | None: ...

    @client_id.setter
    @abstractmethod
    def client_id(self, value: str) -> None:
        """Set before anything else is done with the connection (JMS rule)."""

    @property
    @abstractmethod
    def metadata(self) -> ConnectionMetaData: ...

    @abstractmethod
    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> Session: ...

    @abstractmethod
    def start(self) -> None:
        """Start (or restart) delivery of incoming messages."""

    @abstractmethod
    def stop(self) -> None:
        """Pause delivery; receives block until start()."""

    @abstractmethod
    def close(self) -> None:
        """Release everything: unacknowledged messages return to their queues."""

    @abstractmethod
    def set_exception_listener(self, listener: ExceptionListener | None) -> None: ...

    # True: messages no connection consumer selects stay on the queue (the default);
    # False: they are removed by the queue's disposition rule (MRET(NO)). Set it before
    # creating connection consumers.
    message_retention: bool = True

    def create_connection_consumer(
        self, destination: Destination, selector: str | None, session_pool: ServerSessionPool, max_messages: int
    ) -> ConnectionConsumer:
        """Deliver the messages of ``destination`` (that ``selector`` selects) to sessions
        of ``session_pool``, up to ``max_messages`` per session at a time, concurrently."""
        return ConnectionConsumer(self, destination, selector, session_pool, max_messages)

    def create_durable_connection_consumer(
        self,
        topic: Topic,
        subscription_name: str,
        selector: str | None,
        session_pool: ServerSessionPool,
        max_messages: int,
    ) -> ConnectionConsumer:
        """create_connection_consumer() for the durable subscription ``subscription_name``
        of this connection's client id."""
        if not isinstance(topic, Topic):
            raise JMSException(f"a durable connection consumer needs a topic, not {topic!r}")
        return ConnectionConsumer(self, topic, selector, session_pool, max_messages, subscription_name)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServerSession(ABC):
    """An application server's session (JMS ServerSession): a connection consumer loads
    messages into get_session() and calls start(), which has the server run the session
    (Session.run) on one of its threads, inside whatever transaction it chooses."""

    @abstractmethod
    def get_session(self) -> Session: ...

    @abstractmethod
    def start(self) -> None: ...


class ServerSessionPool(ABC):
    """The server sessions a connection consumer may use (JMS ServerSessionPool)."""

    @abstractmethod
    def get_server_session(self) -> ServerSession | None:
        """A free server session, waiting until one is; None once the pool is closed."""


class ConnectionConsumer:
    """Delivers a destination's messages concurrently to the sessions of a server session
    pool (JMS ConnectionConsumer), for any provider whose sessions can share a
    subscription (Session.create_group_consumer).

    How it works: a dispatcher thread takes a free server session from the pool, loads
    ``max_messages`` into its session and starts it; the session's run() takes them
    through a consumer of this connection consumer in that session (made once per
    session), waiting up to ``wait`` seconds for the first. Messages are taken by the
    session that delivers them, so its transaction, acknowledgement mode or XA branch
    owns them, and a backout counts on the message, at the broker."""

    wait = 0.5  # seconds a loaded session waits for its first message before going back

    def __init__(
        self,
        connection: Connection,
        destination: Destination,
        selector: str | None,
        pool: ServerSessionPool,
        max_messages: int,
        subscription_name: str | None = None,
    ) -> None:
        if max_messages < 1:
            raise JMSException(f"max_messages must be at least 1, not {max_messages}")
        self.connection = connection
        self.destination = destination
        self.selector = selector
        self.pool = pool
        self.max_messages = max_messages
        self.subscription_name = subscription_name
        self.retain = connection.message_retention
        self.group = f"cc-{id(self):x}-{time.monotonic_ns():x}"
        self.closed = False
        self._lock = threading.Lock()
        self._consumers: dict[int, tuple[Session, MessageConsumer]] = {}
        compile_selector(selector)  # a bad selector fails here, not on the dispatcher's thread
        self._thread = threading.Thread(target=self._dispatch, daemon=True, name=f"connection-consumer:{destination}")
        self._thread.start()

    def get_server_session_pool(self) -> ServerSessionPool:
        return self.pool

    def consumer_in(self, session: Session) -> MessageConsumer | None:
        """This connection consumer's consumer in ``session`` (made on first use; one at a
        time, so the sessions join one shared subscription); None once closed."""
        with self._lock:
            if self.closed:
                return None
            found = self._consumers.get(id(session))
            if found is None:
                try:
                    consumer = session.create_group_consumer(
                        self.destination,
                        self.selector,
                        self.subscription_name,
                        self.group,
                        self.retain,
                        self.max_messages,
                    )
                except JMSException as exc:
                    _log.error("connection consumer of %s stopped: %s", self.destination, exc)
                    self.closed = True
                    raise
                found = self._consumers[id(session)] = (session, consumer)
            return found[1]

    def _dispatch(self) -> None:
        while not self.closed:
            try:
                server_session = self.pool.get_server_session()
                if server_session is None:
                    return
                if not self.closed:
                    server_session.get_session().load(self, self.max_messages)
                server_session.start()  # (closed: nothing loaded; it goes back to its pool)
            except JMSException as exc:
                _log.error("connection consumer of %s stopped: %s", self.destination, exc)
                return

    def close(self) -> None:
        """Stop loading sessions and close this connection consumer's consumers (their
        unacknowledged messages go back as their sessions say)."""
        with self._lock:
            self.closed = True
            consumers = list(self._consumers.values())
            self._consumers.clear()
        for _, consumer in consumers:
            try:
                consumer.close()
            except JMSException:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> ConnectionConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class XAResource(ABC):
    """The XA branch interface of one resource manager (javax.transaction.xa.XAResource)."""

    # Its calls run in this process with no network round trip (an embedded broker): a
    # coordinator gains nothing by running them in another thread, and pays a hand-off.
    in_process: bool = False

    @abstractmethod
    def start(self, xid: Xid, flags: int = 0) -> None: ...

    @abstractmethod
    def end(self, xid: Xid, flags: int) -> None: ...

    @abstractmethod
    def prepare(self, xid: Xid) -> int:
        """XA_OK, or XA_RDONLY when the branch did no work (and is then forgotten)."""

    @abstractmethod
    def commit(self, xid: Xid, one_phase: bool) -> None: ...

    def commit_logged(self, xid: Xid) -> Callable[[], None]:
        """Second phase of a commit whose decision the coordinator has logged: the RM may
        return before its own record of the commit is durable (the coordinator's log would
        redo it) and gives a wait for that, which the coordinator calls before it forgets
        its log record. By default a full commit, and nothing to wait for."""
        self.commit(xid, False)
        return _nothing_to_wait_for

    @abstractmethod
    def rollback(self, xid: Xid) -> None: ...

    @abstractmethod
    def recover(self, flags: int) -> list[Xid]:
        """The prepared (in-doubt) branches of this resource manager."""

    @abstractmethod
    def forget(self, xid: Xid) -> None: ...

    @abstractmethod
    def is_same_rm(self, other: XAResource) -> bool: ...

    def get_transaction_timeout(self) -> int:
        return 0

    def set_transaction_timeout(self, seconds: int) -> bool:
        return False


def _nothing_to_wait_for() -> None:
    pass


class XASession(Session):
    """A session whose work belongs to the XA branch its resource is started on; the
    branch, not the session, commits (JMS: TransactionInProgressException)."""

    @property
    @abstractmethod
    def xa_resource(self) -> XAResource: ...

    @property
    def session(self) -> Session:
        return self

    def commit(self) -> None:
        raise TransactionInProgressException("an XA session commits through its XA resource")

    def rollback(self) -> None:
        raise TransactionInProgressException("an XA session rolls back through its XA resource")

    def recover(self) -> None:
        raise IllegalStateException("recover() on an XA session")

    def __exit__(self, *exc: object) -> None:
        self.close()


class XAConnection(Connection):
    @abstractmethod
    def create_xa_session(self) -> XASession: ...


class ConnectionFactory(ABC):
    #: create_connection()'s connections make locally transacted sessions that consume and
    #: produce in one transaction: a transacted link whose two ends are this one resource
    #: manager may then commit locally instead of with XA (providers that have been
    #: checked say so)
    local_transactions: bool = False

    @abstractmethod
    def create_connection(self, username: str | None = None, password: str | None = None) -> Connection: ...


class XAConnectionFactory(ConnectionFactory):
    @abstractmethod
    def create_xa_connection(self, username: str | None = None, password: str | None = None) -> XAConnection: ...


def is_xa_capable(factory: object) -> TypeGuard[XAConnectionFactory]:
    """True when ``factory`` can take part in XA transactions (a transacted link needs it)."""
    return isinstance(factory, XAConnectionFactory)
