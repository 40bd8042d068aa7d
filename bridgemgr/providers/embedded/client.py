"""The provider SPI over the in-process broker: connections, sessions, producers,
consumers, browsers and the XA resource.

These objects hold client-side state only (started flag, client id, the session's
unfinished :class:`Work`, the current XA branch) and call the broker for everything shared.
A session completes its work as its mode says: AUTO/DUPS_OK acknowledge as the broker hands
a message over; CLIENT/INDIVIDUAL keep it until ``acknowledge``; transacted sessions keep
sends and receives until commit/rollback; an XA session's work belongs to the branch its
resource started, and outside a branch it behaves as AUTO_ACKNOWLEDGE.

Rules: sending copies the message and delivering hands out a read-only copy; a synchronous
send or commit of a stored message returns once its batch is written, and a ``send_async``
of one is answered once its batch is (``flush`` waits for them all at once); a send the
broker holds blocks until it may try again or the session closes.

Design notes: docs/embedded-broker.md#internals-providersembeddedclientpy.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ...jms import codec
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    ProducerFlowControl,
    SendCancelled,
    TransportException,
    XAException,
)
from ...jms.message import Message, ObjectMessage
from ...jms.spi import (
    AckMode,
    CompletionListener,
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
from ...jms.xa import XAER_PROTO, Xid
from ...version import __version__
from .broker import Broker, Sent, Work, now_ms
from .queues import Envelope, MessageQueue

log = logging.getLogger(__name__)
# the ack modes whose receive acknowledges as it takes (an enum lookup per receive is slow)
_ACKED_AS_TAKEN = (AckMode.AUTO_ACKNOWLEDGE, AckMode.DUPS_OK_ACKNOWLEDGE)

# How an asynchronous send ended: None (the broker has it) or the exception.
Answered = Callable[[JMSException | None], None]


class EmbeddedConnectionFactory(XAConnectionFactory):
    """Connections (plain and XA) to an in-process :class:`Broker`.

    Given a callable instead of a broker, it asks it for the broker at every
    connection, so a factory naming "the host broker" or "the broker of this
    directory" reaches the broker running now, also after a restart.
    """

    def __init__(self, broker: Broker | Callable[[], Broker], *, service: bool = False) -> None:
        self._broker = broker
        self._service = service  # its connections are the bridge service's own (reserve.py)

    @property
    def broker(self) -> Broker:
        return self._broker if isinstance(self._broker, Broker) else self._broker()

    def create_connection(self, username: str | None = None, password: str | None = None) -> EmbeddedConnection:
        broker = self.broker
        broker.authenticate(username, password)
        conn = EmbeddedConnection(broker, username)
        conn.service = self._service
        if self._service:
            conn.origin_service = "bridge"
        broker.attach(conn)
        return conn

    create_xa_connection = create_connection

    def __repr__(self) -> str:
        if isinstance(self._broker, Broker):
            return f"EmbeddedConnectionFactory({self._broker.instance_name}, {self._broker.data_dir})"
        return f"EmbeddedConnectionFactory({getattr(self._broker, '__name__', self._broker)})"


class EmbeddedConnection(XAConnection):
    def __init__(self, broker: Broker, username: str | None) -> None:
        self.broker = broker
        self.username = username
        self.service = False  # the bridge service's own: may use reserved client ids and durables
        self.connection_id = 0  # given by the broker as it attaches the connection (list cxn)
        self.origin_service = "embedded"  # the service it came in through (list cxn): jms, stomp, bridge
        self.origin_host: str | None = None  # ...and the client's address, when remote
        # (client id, name, operation) -> why this connection's user may use another user's
        # durable subscription, None if not (owners.py); set by the front end that logged it in
        self.durable_override: Callable[[str, str, str], str | None] | None = None
        self.started = False
        self.closed = False
        self.client_id_value: str | None = None
        self._sessions: list[EmbeddedSession] = []
        self._listener: ExceptionListener | None = None
        self._used = False

    @property
    def client_id(self) -> str | None:
        return self.client_id_value

    @client_id.setter
    def client_id(self, value: str) -> None:
        self._check_open()
        if self.client_id_value is not None or self._used:
            raise IllegalStateException("the client id must be set right after the connection is created")
        if not value:
            raise IllegalStateException("a client id must be a non-empty string")
        self.broker.claim_client_id(self, value)
        self.client_id_value = value

    @property
    def metadata(self) -> ConnectionMetaData:
        return ConnectionMetaData(Broker.provider_name, __version__)

    def _check_open(self) -> None:
        if self.closed:
            raise IllegalStateException("the connection is closed")

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> EmbeddedSession:
        self._check_open()
        self._used = True
        session = EmbeddedSession(self, transacted, AckMode(ack_mode))
        self._sessions.append(session)
        return session

    def create_xa_session(self) -> EmbeddedXASession:
        self._check_open()
        self._used = True
        session = EmbeddedXASession(self)
        self._sessions.append(session)
        return session

    def sessions_list(self) -> list[EmbeddedSession]:
        return list(self._sessions)

    def consumers(self) -> Iterator[EmbeddedConsumer]:
        for session in self._sessions:
            yield from session.consumers

    def start(self) -> None:
        self._check_open()
        self._used = True
        if not self.started:
            self.started = True
            self.broker.wake_connection(self)

    def stop(self) -> None:
        self._check_open()
        self.started = False

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        self._listener = listener

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.started = False
        for session in list(self._sessions):
            session.close()
        self.broker.detach(self)

    def broker_closed(self) -> None:
        """The broker shut down under this connection."""
        listener = self._listener
        try:
            self.close()
        except JMSException:
            pass
        if listener is not None:
            try:
                listener(TransportException("the embedded broker was shut down"))
            except Exception:  # a listener's failure must not stop the shutdown
                log.exception("exception listener failed")


class EmbeddedSession(Session):
    """A session; :class:`EmbeddedXASession` adds the XA branch association."""

    def __init__(self, connection: EmbeddedConnection, transacted: bool, ack_mode: AckMode) -> None:
        self.connection = connection
        self.broker = connection.broker
        self.transacted = transacted
        self.ack_mode = AckMode.SESSION_TRANSACTED if transacted else ack_mode
        if ack_mode is AckMode.SESSION_TRANSACTED and not transacted:
            raise IllegalStateException("SESSION_TRANSACTED needs transacted=True")
        self.closed = False
        self.consumers: list[EmbeddedConsumer] = []
        self._producers: list[EmbeddedProducer] = []
        self._sent_to = _SentTo(self.broker, self.connection)  # a remote client's or STOMP sender's sends (metrics)
        self._work = Work()
        self.branch: Work | None = None  # the XA branch this session is associated with
        self.listener_lock = threading.Lock()
        # send_async() calls not answered yet, oldest first: store ticket, answer
        self._durable: deque[tuple[Sent, Answered]] = deque()

    # --- state ------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise IllegalStateException("the session is closed")
        if self.connection.closed:
            raise IllegalStateException("the connection is closed")

    def unacked(self) -> list[Envelope]:
        return list(self._work.acks)

    def producer_count(self) -> int:
        """Its open producers, an anonymous one (or a remote client's or STOMP sender's
        sends) counted once per destination it sent to (list cxn)."""
        producers = [p for p in list(self._producers) if not p.closed]
        anonymous = sum(len(p._sent_to.destinations) for p in producers if p._sent_to is not None)
        bound = sum(1 for p in producers if p.destination is not None)
        return bound + anonymous + len(self._sent_to.destinations)

    # --- destinations -------------------------------------------------------------
    def create_temporary_queue(self) -> TemporaryQueue:
        self._check_open()
        return self.broker.create_temporary(self.connection, topic=False)

    def create_temporary_topic(self) -> TemporaryTopic:
        self._check_open()
        return self.broker.create_temporary(self.connection, topic=True)

    def delete_temporary(self, destination: Destination) -> None:
        self._check_open()
        self.broker.delete_temporary(self.connection, destination)

    # --- producers, consumers, browsers -----------------------------------------------
    def create_producer(self, destination: Destination | None = None) -> EmbeddedProducer:
        self._check_open()
        producer = EmbeddedProducer(self, destination)
        self.broker.producer_opened(destination, self.connection)  # counted per destination
        producer.counted = destination is not None
        self._producers.append(producer)
        return producer

    def producing(self, destination: Destination) -> None:
        """A send of a client that has no producer here (a remote one, a STOMP
        connection) to ``destination``: the session counts as one producer of each
        destination it has sent to, until it closes (metrics)."""
        self._sent_to.sent(destination)

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> EmbeddedConsumer:
        self._check_open()
        if not isinstance(destination, Destination):
            raise InvalidDestinationException(f"not a destination: {destination!r}")
        consumer = EmbeddedConsumer(self, destination, selector)
        consumer.queue = self.broker.queue_for_consumer(consumer, destination, selector, no_local)
        self.consumers.append(consumer)
        return consumer

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> EmbeddedConsumer:
        self._check_open()
        if not isinstance(topic, Topic):
            raise InvalidDestinationException(f"a durable subscription needs a topic, not {topic!r}")
        consumer = EmbeddedConsumer(self, topic, selector, durable_name=name)
        consumer.queue = self.broker.durable_queue(consumer, topic, name, selector, no_local)
        self.consumers.append(consumer)
        return consumer

    def create_group_consumer(
        self,
        destination: Destination,
        selector: str | None,
        durable_name: str | None,
        group: str,
        retain: bool,
        max_messages: int,
    ) -> EmbeddedConsumer:
        """A connection consumer's consumer in this session (Session.create_group_consumer)."""
        self._check_open()
        if not isinstance(destination, Destination):
            raise InvalidDestinationException(f"not a destination: {destination!r}")
        consumer = EmbeddedConsumer(self, destination, selector, durable_name=durable_name)
        consumer.retain = retain
        consumer.queue = self.broker.group_queue(consumer, destination, selector, durable_name, group)
        self.consumers.append(consumer)
        return consumer

    def unsubscribe(self, name: str) -> None:
        self._check_open()
        self.broker.unsubscribe(self.connection, name)

    def create_browser(self, queue: Queue, selector: str | None = None) -> EmbeddedBrowser:
        self._check_open()
        if not isinstance(queue, Queue):
            raise InvalidDestinationException(f"only queues can be browsed, not {queue!r}")
        browser = EmbeddedBrowser(self, queue, selector)
        self.broker.browsable(queue)
        return browser

    # --- the data path --------------------------------------------------------------------
    def _work_now(self) -> Work | None:
        """Where sends and receives go: the XA branch, the local transaction, or None."""
        if self.branch is not None:
            return self.branch
        return self._work if self.transacted else None

    def _acks_now(self) -> bool:
        return self.branch is None and not self.transacted and self.ack_mode in _ACKED_AS_TAKEN

    def _send(self, snapshot: Message, destination: Destination, blob: bytes | None = None) -> None:
        """``blob``: the snapshot as a remote client encoded it (the jms service)."""
        sent = self._route(snapshot, destination, blob, lazy=False)
        if sent is not None:
            self.broker.wait_all((sent,))

    def _route(self, snapshot: Message, destination: Destination, blob: bytes | None, lazy: bool = True) -> Sent | None:
        """Into the transaction, or to the broker (what to wait on for a stored send),
        waiting while the broker holds the producer (FLOW_CONTROL, the memory state);
        ``lazy``: see Broker.send (off for a send waited for at once)."""
        work = self._work_now()
        while True:
            try:
                if work is not None:
                    self.broker.check_room(self.connection, snapshot, destination)
                    work.sends.append((snapshot, destination, self.connection, blob))
                    return None
                return self.broker.send(self.connection, snapshot, destination, blob, lazy=lazy)
            except ProducerFlowControl as held:
                self._wait_room(held)

    def _wait_room(self, held: ProducerFlowControl) -> None:
        """Block until the broker lets a held producer try again, this session closes or
        its owner gives the send up (``cancel``: SendCancelled, nothing was sent)."""
        ready = threading.Event()
        held.on_room(ready.set)
        cancel = self.cancel
        while True:
            if cancel is not None and cancel.is_set():
                raise SendCancelled(f"the send was given up while the broker held it: {held}")
            if ready.wait(0.5 if cancel is None else 0.1):
                break
            self._check_open()
        self._check_open()

    def _send_confirmed(self, snapshot: Message, destination: Destination) -> None:
        """_send() for a producer's confirm_sends: in-process a send is answered when it returns."""
        self._send(snapshot, destination)

    def _send_async(self, snapshot: Message, destination: Destination, answered: Answered) -> None:
        """_send() for send_async(): answered now when nothing was stored (a NON_PERSISTENT
        message, a memory-only broker), else once its store batch is written: at the latest
        in _answer()."""
        sent = self._route(snapshot, destination, None)
        if sent is not None:
            self._durable.append((sent, answered))
        else:
            answered(None)

    def _answer(self) -> None:
        """Answer every send_async() so far: wait for the newest store batch, which holds
        the others (group commit), then call their listeners in order."""
        durable = self._durable
        if not durable:
            return
        try:
            self.broker.wait_all([sent for sent, _ in durable])
            error: JMSException | None = None
        except JMSException as exc:
            error = exc
        while durable:
            durable.popleft()[1](error)

    def _deliver(self, env: Envelope, acked: bool) -> Message:
        """Turn a taken envelope into the message the application sees."""
        if acked:  # a stored one's snapshot may be a lazy row the store's writer encodes now
            msg = env.message.copy() if env.stored else env.message
        else:
            msg = env.message.copy()
            work = self._work_now() or self._work
            env.owner = work
            work.acks.append(env)
            if self.ack_mode is AckMode.INDIVIDUAL_ACKNOWLEDGE and work is self._work:
                msg._ack = partial(self._acknowledge_one, env)
            elif self.ack_mode is AckMode.CLIENT_ACKNOWLEDGE and work is self._work:
                msg._ack = self.acknowledge
        msg.delivery_count = env.dcount
        msg.redelivered = env.dcount > 1
        msg.set_read_only()
        return msg

    # --- completion -------------------------------------------------------------------------
    def commit(self) -> None:
        self.broker.wait_durable(self.commit_no_wait())

    def commit_no_wait(self) -> int | None:
        """Commit, applied and visible now; the store ticket that makes it durable."""
        self._check_open()
        if not self.transacted:
            raise IllegalStateException("commit() on a session that is not transacted")
        return self.broker.commit(self._work)

    def rollback(self) -> None:
        self._check_open()
        if not self.transacted:
            raise IllegalStateException("rollback() on a session that is not transacted")
        self.broker.rollback(self._work)

    def recover(self) -> None:
        self._check_open()
        if self.transacted:
            raise IllegalStateException("recover() on a transacted session (use rollback())")
        self.broker.rollback(self._work)

    def acknowledge(self) -> None:
        if self.closed:
            raise IllegalStateException("acknowledge() after the session closed")
        self.broker.wait_durable(self.broker.acknowledge_work(self._work))

    acknowledges_oldest = True  # the session's work holds its deliveries in order

    def acknowledge_oldest(self, count: int) -> bool:
        """CLIENT_ACKNOWLEDGE of the ``count`` oldest deliveries not yet acknowledged."""
        if self.closed:
            raise IllegalStateException("acknowledge() after the session closed")
        if self.transacted or self.ack_mode is not AckMode.CLIENT_ACKNOWLEDGE:
            return False
        self.broker.wait_durable(self.broker.acknowledge_work(self._work, oldest=count))
        return True

    def _acknowledge_one(self, env: Envelope) -> None:
        self.broker.wait_durable(self.broker.acknowledge_work(self._work, env))

    def close(self) -> None:
        if self.closed:
            return
        for consumer in list(self.consumers):
            consumer.close()
        for producer in self._producers:
            producer.gone()
        self._producers.clear()
        self.closed = True
        self._sent_to.close()
        self.broker.rollback(self._work)  # transacted: roll back; CLIENT: redeliver unacked
        self.broker.xa_abandon(self)
        self.branch = None
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)


class EmbeddedXASession(XASession, EmbeddedSession):  # XASession's commit/rollback win
    """An XA session: its work belongs to the branch started on ``xa_resource``."""

    def __init__(self, connection: EmbeddedConnection) -> None:
        super().__init__(connection, False, AckMode.AUTO_ACKNOWLEDGE)
        self.transacted = True  # as javax.jms.XASession.getTransacted() says
        self._resource = EmbeddedXAResource(self)

    @property
    def xa_resource(self) -> EmbeddedXAResource:
        return self._resource

    def _work_now(self) -> Work | None:
        return self.branch

    def _acks_now(self) -> bool:
        return self.branch is None


class EmbeddedXAResource(XAResource):
    in_process = True

    def __init__(self, session: EmbeddedSession) -> None:
        self.session = session
        self.broker = session.broker
        self._timeout = 0

    def start(self, xid: Xid, flags: int = 0) -> None:
        if self.session.branch is not None:
            raise_xa_proto("start: the session is already associated with a branch")
        self.session.branch = self.broker.xa_start(self.session, xid, flags)

    def end(self, xid: Xid, flags: int) -> None:
        self.broker.xa_end(self.session, xid, flags)
        self.session.branch = None

    def prepare(self, xid: Xid) -> int:
        return self.broker.xa_prepare(xid)

    def commit(self, xid: Xid, one_phase: bool) -> None:
        self.broker.xa_commit(xid, one_phase)

    def commit_logged(self, xid: Xid) -> Callable[[], None]:
        """Committed in memory and recorded for the store; the wait writes it (with the
        other commits recorded meanwhile: one store batch for a completer's group)."""
        return partial(self.broker.xa_commit_written, xid, self.broker.xa_commit(xid, False, wait=False))

    def rollback(self, xid: Xid) -> None:
        self.broker.xa_rollback(xid)

    def recover(self, flags: int) -> list[Xid]:
        return self.broker.xa_recover()

    def forget(self, xid: Xid) -> None:
        self.broker.xa_forget(xid)

    def is_same_rm(self, other: XAResource) -> bool:
        return isinstance(other, EmbeddedXAResource) and other.broker is self.broker

    def get_transaction_timeout(self) -> int:
        return self._timeout

    def set_transaction_timeout(self, seconds: int) -> bool:
        self._timeout = seconds
        return False  # branches do not time out in the embedded broker


def raise_xa_proto(text: str) -> None:
    raise XAException(text, XAER_PROTO)


class _SentTo:
    """The destinations an anonymous sender has sent to, each counted by the broker as
    one more producer of it from the first send until close() (metrics: imqcmd's
    Producers of a destination). The last one is remembered by identity, so a sender
    that keeps sending to one destination object pays an ``is`` test per send."""

    __slots__ = ("broker", "connection", "destinations", "last")

    def __init__(self, broker: Broker, connection: EmbeddedConnection) -> None:
        self.broker = broker
        self.connection = connection
        self.destinations: set[Destination] = set()
        self.last: Destination | None = None

    def sent(self, destination: Destination) -> None:
        if destination is not self.last:
            if destination not in self.destinations:
                self.broker.producer_opened(destination, self.connection)  # (maxNumProducers: may refuse)
                self.destinations.add(destination)
            self.last = destination

    def close(self) -> None:
        destinations, self.destinations, self.last = self.destinations, set(), None
        for destination in destinations:
            self.broker.producer_closed(destination)


class EmbeddedProducer(MessageProducer):
    counted_here = True  # the broker counts it (not a remote client's: the service counts those)

    def __init__(self, session: EmbeddedSession, destination: Destination | None) -> None:
        super().__init__(destination)
        self.session = session
        self.closed = False
        self.counted = False  # counted by the broker as a producer of its destination (metrics)
        # an anonymous producer: counted as a producer of each destination it sent to
        self._sent_to = (
            _SentTo(session.broker, session.connection) if destination is None and self.counted_here else None
        )

    def _stamp(
        self,
        message: Message,
        destination: Destination | None,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> tuple[Message, Destination]:
        """Check the send, stamp ``message``'s JMS headers; the copy to send and where."""
        if self.closed:
            raise IllegalStateException("the producer is closed")
        session = self.session
        session._check_open()
        dest = self.destination
        if destination is not None:
            if dest is not None and destination != dest:
                raise InvalidDestinationException(
                    f"this producer sends to {dest}; create one without a destination to choose per send"
                )
            dest = destination
        if dest is None:
            raise InvalidDestinationException("no destination: give one to the producer or to send()")
        sent_to = self._sent_to
        if sent_to is not None and dest is not sent_to.last:  # (an anonymous producer's first
            sent_to.sent(dest)  # send there, or another one)
        if not isinstance(message, Message):
            raise JMSException(f"not a message: {message!r}")
        mode = self.delivery_mode if delivery_mode is None else delivery_mode
        if mode != 2 and mode != 1:
            raise JMSException(f"delivery mode must be PERSISTENT (2) or NON_PERSISTENT (1), not {mode!r}")
        prio = self.priority if priority is None else priority
        if prio.__class__ is not int or not 0 <= prio <= 9:
            raise JMSException(f"priority must be an int 0..9, not {prio!r}")
        ttl = self.time_to_live if time_to_live is None else time_to_live
        if ttl < 0:
            raise JMSException(f"time to live must be >= 0 milliseconds, not {ttl}")
        now = now_ms()
        message.destination = dest
        message.delivery_mode = mode
        message.priority = prio
        message.timestamp = 0 if self.disable_message_timestamp else now
        message.expiration = now + ttl if ttl else 0
        message.message_id = None if self.disable_message_id else session.broker.next_message_id()
        if isinstance(message, ObjectMessage):  # deep, safe copy; refuses what cannot be serialised
            snapshot = codec.decode(codec.encode(message))
        else:
            snapshot = message.copy()
        snapshot.redelivered = False
        snapshot.delivery_count = 0
        return snapshot, dest

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        snapshot, dest = self._stamp(message, destination, delivery_mode, priority, time_to_live)
        if self.confirm_sends:
            self.session._send_confirmed(snapshot, dest)
        else:
            self.session._send(snapshot, dest)

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
        """The session answers (see the module notes); the listener hears it."""
        snapshot, dest = self._stamp(message, destination, delivery_mode, priority, time_to_live)

        def answered(error: JMSException | None) -> None:
            if error is None:
                listener.on_completion(message)
            else:
                listener.on_exception(message, error)

        self.session._send_async(snapshot, dest, answered)

    def flush(self) -> None:
        self.session._answer()

    @property
    def answers_alone(self) -> bool:
        return False  # a send waiting for the store (or the wire: mq://) is answered in flush()

    @property
    def answers_when_sent(self) -> bool:
        """In-process, a send is answered when it returns only on a broker without a store:
        a stored one is answered once its batch is written (send_async, flush)."""
        return self.session.broker.store is None

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.gone()

    def gone(self) -> None:
        """Closed, or its session is: no longer counted as a producer."""
        self.closed = True
        if self.counted:
            self.counted = False
            self.session.broker.producer_closed(self.destination)
        if self._sent_to is not None:
            self._sent_to.close()


class EmbeddedConsumer(MessageConsumer):
    def __init__(
        self, session: EmbeddedSession, destination: Destination, selector: str | None, durable_name: str | None = None
    ) -> None:
        self.session = session
        self.connection = session.connection
        self.broker = session.broker
        self.destination = destination
        self.durable_name = durable_name
        self._selector_text = selector
        compiled = self.broker.compile_selector(selector)
        # Topic subscriptions filter when a message is published; queues when it is taken.
        self.selector = None if destination.is_topic else compiled
        self.closed = False
        self.group: str | None = None  # the connection consumer this consumer serves (broker.group_queue)
        self.retain = True  # False: unwanted messages of its queue are removed (ibid.)
        self.scan: tuple[int, Any] | None = None  # selector scan position (MessageQueue.take)
        self.cond = threading.Condition(self.broker.lock)
        self.queue: MessageQueue = None  # type: ignore[assignment]  # None only until the session sets it (create_consumer)
        self._listener: MessageListener | None = None
        self._thread: threading.Thread | None = None

    @property
    def message_selector(self) -> str | None:
        return self._selector_text

    def backlog(self) -> int | None:
        with self.broker.lock:
            queue = self.queue
            return None if queue is None or self.closed else len(queue)

    # called by the broker, under its lock
    def can_take(self, message: Message | None) -> bool:
        if self.closed or not self.connection.started:
            return False
        return message is None or self.selector is None or self.selector.matches(message)

    def notify(self) -> None:
        self.cond.notify()

    def receive(self, timeout: float | None = None) -> Message | None:
        if self.closed:
            raise IllegalStateException("the consumer is closed")
        if self._listener is not None:
            raise IllegalStateException("receive() on a consumer that has a message listener")
        self.session._check_open()
        acks_now = self.session._acks_now()
        env = self.broker.receive(self, timeout, acks_now)
        if env is None:
            return None
        return self.session._deliver(env, acks_now)

    def deliver_to(self, listener: MessageListener, timeout: float) -> bool:
        """One message to ``listener`` (Session.run); in AUTO/DUPS_OK acknowledged once
        the listener returns, given back for redelivery when it raises (then re-raised)."""
        if self.closed:
            return False
        session = self.session
        session._check_open()
        env = self.broker.receive(self, timeout, False)
        if env is None:
            return False
        auto = session._acks_now()
        if auto:
            msg = env.message.copy()
            msg.delivery_count = env.dcount
            msg.redelivered = env.dcount > 1
            msg.set_read_only()
        else:
            msg = session._deliver(env, False)
        try:
            listener(msg)
        except BaseException:
            if auto:
                self.broker.redeliver([env])
            raise
        if auto:
            self.broker.acknowledge([env])
        return True

    def set_message_listener(self, listener: MessageListener | None) -> None:
        if self.closed:
            raise IllegalStateException("the consumer is closed")
        self._listener = listener
        if listener is not None and self._thread is None:
            self._thread = threading.Thread(target=self._listen, daemon=True, name=f"listener:{self.destination}")
            self._thread.start()

    def _listen(self) -> None:
        """Deliver to the listener on its own thread, one message at a time per session."""
        session = self.session
        while not self.closed:
            listener = self._listener
            if listener is None:
                return
            env = self.broker.receive(self, None, False)
            if env is None:
                continue
            with session.listener_lock:
                auto = session._acks_now()
                if auto:
                    msg = env.message.copy()
                    msg.delivery_count = env.dcount
                    msg.redelivered = env.dcount > 1
                    msg.set_read_only()
                else:
                    msg = session._deliver(env, False)
                try:
                    listener(msg)
                except Exception:
                    log.exception("message listener of %s failed; the message will be redelivered", self.destination)
                    if auto:
                        self.broker.redeliver([env])
                    continue
                if auto:
                    self.broker.acknowledge([env])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._listener = None
        self.broker.remove_consumer(self)
        if self in self.session.consumers:
            self.session.consumers.remove(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


class EmbeddedBrowser(QueueBrowser):
    def __init__(self, session: EmbeddedSession, queue: Queue, selector: str | None) -> None:
        self.session = session
        self.queue = queue
        self.message_selector = selector
        self._selector = session.broker.compile_selector(selector)
        self.closed = False

    def __iter__(self) -> Iterator[Message]:
        if self.closed:
            raise IllegalStateException("the browser is closed")
        return iter(self.session.broker.browse(self.queue, self._selector))

    def close(self) -> None:
        self.closed = True
