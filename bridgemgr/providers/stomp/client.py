"""JMS connections, sessions, producers and consumers over stomp.py.

A StompConnection is one stomp.py connection; its listener (stomp.py's receiver thread)
routes MESSAGE frames to the consumers, RECEIPT and ERROR frames to whoever waits, and a
lost connection to the exception listener. Every subscription is ack:client-individual;
the JMS acknowledge modes, transactions and recover() are built on it. Not XA: a
transacted link on it is refused.

Rules: a lost connection makes every blocked call raise TransportException (the link
reconnects; a connection never silently resumes half its state); outside a transaction a
PERSISTENT send, or any send of a producer with confirm_sends, waits for its receipt, so a
refusal is that message's failure.

Design notes: docs/architecture.md#internals-providersstompclientpy.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import stomp

from ...jms import naming
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import (
    IllegalStateException,
    InvalidSelectorError,
    JMSException,
    JMSSecurityException,
    RetriableTransportException,
    TransportException,
)
from ...jms.message import DeliveryMode, Message
from ...jms.selector import Selector, compile_selector
from ...jms.spi import (
    AckMode,
    CompletionListener,
    Connection,
    ConnectionFactory,
    ConnectionMetaData,
    ExceptionListener,
    MessageProducer,
    PollingConsumer,
    QueueBrowser,
    Session,
)
from ...version import __version__
from .wire import (
    DIALECTS,
    StompOptions,
    dialect_for,
    from_frame,
    parse_url,
    to_frame,
    to_stomp_destination,
)

log = logging.getLogger(__name__)

PROVIDER_NAME = "STOMP"

# How a frame sent without waiting learned its fate: None (its RECEIPT) or the exception.
Answered = Callable[[JMSException | None], None]


@dataclass
class _Delivery:
    """A MESSAGE frame handed to a consumer, until it is acknowledged."""

    subscription: _Subscription
    ack_id: str
    headers: dict[str, str]
    body: bytes


class _Listener(stomp.ConnectionListener):
    """stomp.py's callbacks (its receiver thread) -> the connection."""

    def __init__(self, connection: StompConnection, client: stomp.Connection12) -> None:
        self.connection = connection
        self.client = client

    def on_connected(self, frame: Any) -> None:
        self.connection.server = frame.headers.get("server")

    def on_message(self, frame: Any) -> None:
        self.connection._deliver(frame.headers, frame.body)

    def on_receipt(self, frame: Any) -> None:
        self.connection._receipt(frame.headers.get("receipt-id"), None)

    def on_error(self, frame: Any) -> None:
        message = frame.headers.get("message", "")
        body = frame.body.decode("utf-8", "replace") if isinstance(frame.body, bytes) else str(frame.body)
        text = f"{message}: {body.strip()}" if body.strip() else message
        self.connection._error(frame.headers.get("receipt-id"), text)

    def on_disconnected(self) -> None:
        # stomp.py reports a heart-beat timeout only after the disconnect: tell it apart here.
        beats = self.client.get_listener("protocol-listener")
        last = getattr(beats, "received_heartbeat", None)
        wait = getattr(beats, "receive_sleep", 0)
        if last is not None and wait and time.monotonic() - last > wait:
            silent = time.monotonic() - last
            self.connection.last_error = f"heart-beat timeout (nothing received for {silent:.1f} s)"
        self.connection._lost()


class StompConnectionFactory(ConnectionFactory):
    """Connections to the STOMP broker at a provider URL (not XA-capable)."""

    def __init__(self, url: str, username: str | None = None, password: str | None = None) -> None:
        self.url = url
        self.options = parse_url(url)
        self.username = username
        self._password = password

    def create_connection(self, username: str | None = None, password: str | None = None) -> StompConnection:
        if username is None:
            username, password = self.username, self._password
        return StompConnection(self.options, username, password)

    def __repr__(self) -> str:
        return f"StompConnectionFactory({naming.without_password(self.url)})"


class StompConnection(Connection):
    def __init__(self, options: StompOptions, username: str | None, password: str | None) -> None:
        self.options = options
        self._credentials = (username, password)
        self._client_id: str | None = None
        self.server: str | None = None
        self.dialect = DIALECTS["generic"]
        self.last_error: str | None = None
        self.broken = threading.Event()
        self.closed = False
        self._lock = threading.Lock()
        self._waiting: dict[str, list[Any]] = {}  # receipt id -> [event, error, named, answered]
        self._subscriptions: dict[str, _Subscription] = {}
        self._sessions: list[StompSession] = []
        self._started = threading.Event()
        self._listener: ExceptionListener | None = None
        self._ids = itertools.count(1)
        self._stomp = self._connect()

    # --- connecting ------------------------------------------------------------------------------
    def _connect(self) -> stomp.Connection12:
        opts = self.options
        conn = stomp.Connection12(
            list(opts.hosts),
            heartbeats=opts.heart_beat,
            vhost=opts.vhost,
            auto_content_length=False,
            auto_decode=False,
            try_loopback_connect=False,
            reconnect_attempts_max=max(1, opts.connect_attempts),
            reconnect_sleep_initial=opts.connect_delay,
            timeout=opts.receipt_timeout,
        )
        if opts.tls:
            conn.set_ssl(for_hosts=list(opts.hosts), key_file=opts.key, cert_file=opts.cert, ca_certs=opts.ca)
        conn.set_listener("imq", _Listener(self, conn))
        headers = {"client-id": self._client_id} if self._client_id else {}
        username, password = self._credentials
        try:
            conn.connect(username, password, wait=True, headers=headers)
        except Exception as exc:
            reason = self.last_error or f"{type(exc).__name__} {exc}".strip()
            if conn.is_connected():
                conn.disconnect()
            where = ", ".join(f"{h}:{p}" for h, p in opts.hosts)
            error = (
                JMSSecurityException if self.last_error and _looks_like_auth(self.last_error) else TransportException
            )
            raise error(f"cannot connect to the STOMP broker at {where}: {reason}") from None
        sock = getattr(conn.transport, "socket", None)
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.dialect = dialect_for(self.server, opts.dialect)
        return conn

    # --- Connection API -------------------------------------------------------------------------------
    @property
    def client_id(self) -> str | None:
        return self._client_id

    @client_id.setter
    def client_id(self, value: str) -> None:
        """STOMP sends the client id in CONNECT: connect again with it."""
        if self._sessions or self._client_id is not None:
            raise IllegalStateException("the client id must be set right after the connection is created")
        self._client_id = value
        old, self._stomp = self._stomp, None
        old.remove_listener("imq")
        old.disconnect()
        self._stomp = self._connect()

    @property
    def metadata(self) -> ConnectionMetaData:
        return ConnectionMetaData(PROVIDER_NAME, __version__, "1.1")

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> StompSession:
        self._check()
        session = StompSession(self, transacted, AckMode.SESSION_TRANSACTED if transacted else AckMode(ack_mode))
        self._sessions.append(session)
        return session

    def start(self) -> None:
        self._started.set()

    def stop(self) -> None:
        self._started.clear()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for session in list(self._sessions):
            session.close()
        if not self.broken.is_set():
            try:
                self._stomp.disconnect(receipt=self._next_id("bye"))
            except Exception as exc:
                log.debug("disconnecting: %s", exc)
        self._lost()

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        self._listener = listener

    # --- frames and receipts ------------------------------------------------------------------------
    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the connection is closed")
        if self.broken.is_set():
            raise TransportException(f"the STOMP connection is lost: {self.last_error or 'closed by the broker'}")

    def _next_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    def frame(self, command: str, headers: dict[str, str], body: bytes = b"", wait: bool = False) -> None:
        """Send one frame; with ``wait``, until its RECEIPT (JMSException on an ERROR)."""
        self._check()
        slot: list[Any] | None = None  # answered (Event), error text, named by an ERROR, None
        if wait:
            receipt = headers["receipt"] = self._next_id("r")
            slot = [threading.Event(), None, False, None]
            self._expect(receipt, slot, command)
        try:
            self._stomp.send_frame(command, headers, body)
        except Exception as exc:
            raise TransportException(f"{command}: {exc}") from None
        if slot is None:
            return
        if not slot[0].wait(self.options.receipt_timeout):
            with self._lock:
                self._waiting.pop(headers["receipt"], None)
            raise TransportException(f"{command}: no receipt within {self.options.receipt_timeout} s")
        if slot[1] is not None:
            # An ERROR naming this frame refused it (the broker may close the connection
            # next: that is the following call's failure); otherwise the connection failed.
            refused = slot[2] or not self.broken.is_set()
            raise (JMSException if refused else TransportException)(f"{command}: {slot[1]}")

    def frame_async(self, command: str, headers: dict[str, str], body: bytes, answered: Answered) -> None:
        """Send one frame with a receipt, without waiting: ``answered`` is called once
        (receiver thread) with None for its RECEIPT, else the exception that failed it."""
        self._check()
        receipt = headers["receipt"] = self._next_id("r")
        self._expect(receipt, [threading.Event(), None, False, answered], command)
        try:
            self._stomp.send_frame(command, headers, body)
        except Exception as exc:
            with self._lock:
                mine = self._waiting.pop(receipt, None) is not None
            if mine:  # else _lost() answered it (as lost) meanwhile: answered once only
                raise TransportException(f"{command}: {exc}") from None

    def _expect(self, receipt: str, slot: list[Any], command: str) -> None:
        """Wait for ``receipt`` in ``slot``; TransportException when the connection is lost
        already (_lost() sets `broken` before it fails the waiting frames, under the lock:
        a slot added after that would wait out the receipt timeout)."""
        with self._lock:
            if self.broken.is_set():
                raise TransportException(
                    f"{command}: the STOMP connection is lost: {self.last_error or 'closed by the broker'}"
                )
            self._waiting[receipt] = slot

    def forget_all(self, why: str) -> None:
        """Fail every frame sent without waiting whose receipt did not come (as lost)."""
        with self._lock:
            late = [k for k, slot in self._waiting.items() if slot[3] is not None]
            slots = [self._waiting.pop(k) for k in late]
        for slot in slots:
            self._answer(slot, why, named=False, lost=True)

    @staticmethod
    def _answer(slot: list[Any], error: str | None, named: bool, lost: bool = False) -> None:
        slot[1], slot[2] = error, named
        slot[0].set()
        answered: Answered | None = slot[3]
        if answered is None:
            return
        if error is None:
            answered(None)
        elif named:
            answered(JMSException(error))
        elif lost:
            answered(TransportException(error))
        else:  # an ERROR naming no frame: which send it refused is unknown
            answered(RetriableTransportException(error))

    def _receipt(self, receipt: str | None, error: str | None) -> None:
        """The RECEIPT of a frame, or (``error``) an ERROR naming it."""
        with self._lock:
            slot = self._waiting.pop(receipt, None) if receipt is not None else None
        if slot is not None:
            self._answer(slot, error, error is not None)

    def _error(self, receipt: str | None, text: str) -> None:
        """An ERROR frame: it fails the frame it names, else every frame awaiting a receipt
        (brokers that keep the connection open after an ERROR rarely name the frame)."""
        if receipt is not None:
            self._receipt(receipt, text)
            return
        self.last_error = text
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            self._answer(slot, text, named=False)

    def _lost(self) -> None:
        """The connection ended (closed, dropped, or an ERROR): wake everyone waiting."""
        if self.broken.is_set():
            return
        self.broken.set()
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            self._answer(slot, self.last_error or "the connection was lost", named=False, lost=True)
        for sub in list(self._subscriptions.values()):
            sub.inbox.put(None)
        if not self.closed and self._listener is not None:
            try:
                self._listener(TransportException(f"STOMP connection lost: {self.last_error or 'socket closed'}"))
            except Exception:
                log.exception("the exception listener failed")

    def _deliver(self, headers: dict[str, str], body: bytes) -> None:
        sub = self._subscriptions.get(headers.get("subscription", ""))
        if sub is None:
            return  # a subscription closed meanwhile: the broker redelivers it
        sub.inbox.put(_Delivery(sub, headers.get("ack") or headers.get("message-id", ""), headers, body))


def _looks_like_auth(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in ("denied", "refused", "auth", "login", "password", "credential", "security"))


# --- sessions ------------------------------------------------------------------------------------------


class _Subscription:
    def __init__(
        self, session: StompSession, destination: Destination, selector: str | None, durable: str | None
    ) -> None:
        self.session = session
        self.destination = destination
        self.selector = selector
        self.durable = durable
        self.local_filter: Selector | None = None
        self.inbox: queue.Queue[_Delivery | None] = queue.Queue()
        self.id = ""

    def headers(self) -> dict[str, str]:
        session = self.session
        dialect = session.connection.dialect
        headers = {
            "destination": to_stomp_destination(self.destination),
            "id": self.id,
            "ack": "client-individual",
            **dialect.prefetch(session.prefetch_count()),
        }
        if self.selector:
            if dialect.selectors:
                headers["selector"] = self.selector
            elif self.destination.is_topic:
                self.local_filter = compile_selector(self.selector)
            else:
                raise InvalidSelectorError(
                    f"the {dialect.name} STOMP broker cannot select messages "
                    "of a queue; a selector works on a topic only"
                )
        if self.durable:
            headers.update(dialect.durable(self.durable))
        if session.transacted and dialect.transacted_subscribe:
            headers["transaction"] = session.tx
        return headers

    def subscribe(self) -> None:
        connection = self.session.connection
        self.id = self.durable or connection._next_id("sub")
        headers = self.headers()
        connection._subscriptions[self.id] = self
        try:
            connection.frame("SUBSCRIBE", headers, wait=True)
        except BaseException:
            connection._subscriptions.pop(self.id, None)
            raise

    def unsubscribe(self, extra: Mapping[str, str] = {}) -> None:
        connection = self.session.connection
        connection._subscriptions.pop(self.id, None)
        if not connection.broken.is_set():
            connection.frame("UNSUBSCRIBE", {"id": self.id, **extra}, wait=True)
        self.inbox = queue.Queue()  # what was buffered comes back from the broker


class StompSession(Session):
    """A JMS session over one STOMP connection (single-threaded, as in JMS)."""

    def __init__(self, connection: StompConnection, transacted: bool, ack_mode: AckMode) -> None:
        self.connection = connection
        self.transacted = transacted
        self.ack_mode = ack_mode
        self.tx = ""
        self.closed = False
        self._unacked: list[_Delivery] = []  # delivered, not acknowledged (or, transacted: not committed)
        self._consumers: list[StompConsumer] = []
        self.prefetch = 0  # prefetch_at_least(): the subscriptions' floor
        self.prefetch_most = 0  # prefetch_at_most(): their ceiling (0: none)
        if transacted:
            self._begin()

    def prefetch_at_least(self, count: int, max_bytes: int = 0) -> None:
        self.prefetch = count  # (STOMP's prefetch headers count messages: no byte bound)

    def prefetch_at_most(self, count: int) -> None:
        """The ceiling of the subscriptions made afterwards. An open subscription keeps
        its prefetch: STOMP has no frame that changes it, and subscribing again would
        take what the broker already delivered back from the link's open unit."""
        self.prefetch_most = max(1, count)

    def prefetch_count(self) -> int:
        """A new subscription's prefetch: the URL's or prefetch_at_least()'s, whichever is
        more, but not over prefetch_at_most()'s."""
        count = max(self.connection.options.prefetch, self.prefetch)
        return min(count, self.prefetch_most) if self.prefetch_most else count

    def _begin(self) -> None:
        self.tx = f"tx-{uuid.uuid4().hex}"
        self.connection.frame("BEGIN", {"transaction": self.tx})

    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the session is closed")
        self.connection._check()

    def create_temporary_queue(self) -> TemporaryQueue:
        return TemporaryQueue(uuid.uuid4().hex)

    def create_temporary_topic(self) -> TemporaryTopic:
        return TemporaryTopic(uuid.uuid4().hex)

    def create_producer(self, destination: Destination | None = None) -> StompProducer:
        self._check()
        return StompProducer(self, destination)

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> StompConsumer:
        return self._consumer(destination, selector, None)

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> StompConsumer:
        if self.connection.client_id is None:
            raise IllegalStateException("a durable subscription needs the connection's client id")
        return self._consumer(topic, selector, name)

    def _consumer(self, destination: Destination, selector: str | None, durable: str | None) -> StompConsumer:
        self._check()
        sub = _Subscription(self, destination, selector, durable)
        sub.subscribe()
        consumer = StompConsumer(self, sub)
        self._consumers.append(consumer)
        return consumer

    def unsubscribe(self, name: str) -> None:
        """Delete durable subscription ``name`` (the broker's way, see DIALECTS)."""
        self._check()
        dialect = self.connection.dialect
        if dialect.delete_needs_subscription and name not in self.connection._subscriptions:
            sub = _Subscription(self, Topic(name), None, name)  # RabbitMQ finds it by id alone
            sub.subscribe()
            self.connection._subscriptions.pop(name, None)
        self.connection.frame("UNSUBSCRIBE", {"id": name, **dialect.durable(name)}, wait=True)

    def create_browser(self, queue: Queue, selector: str | None = None) -> QueueBrowser:
        raise JMSException("STOMP cannot browse a queue")

    # --- deliveries ------------------------------------------------------------------------------
    def _ack(self, deliveries: list[_Delivery], wait: bool) -> None:
        for i, delivery in enumerate(deliveries):
            headers = {"id": delivery.ack_id}
            if self.transacted:
                headers["transaction"] = self.tx
            self.connection.frame("ACK", headers, wait=wait and i == len(deliveries) - 1)

    def delivered(self, delivery: _Delivery) -> Message:
        msg = from_frame(delivery.headers, delivery.body)
        mode = self.ack_mode
        if self.transacted:
            self._ack([delivery], wait=False)
            self._unacked.append(delivery)
        elif mode in (AckMode.AUTO_ACKNOWLEDGE, AckMode.DUPS_OK_ACKNOWLEDGE):
            self._ack([delivery], wait=False)
        elif mode is AckMode.INDIVIDUAL_ACKNOWLEDGE:
            self._unacked.append(delivery)
            msg._ack = lambda: self._ack_one(delivery)
        else:
            self._unacked.append(delivery)
            msg._ack = self.acknowledge
        return msg

    def _ack_one(self, delivery: _Delivery) -> None:
        if delivery in self._unacked:
            self._ack([delivery], wait=True)
            self._unacked.remove(delivery)

    def acknowledge(self) -> None:
        if self.transacted or not self._unacked:
            return
        pending, self._unacked = self._unacked, []
        self._ack(pending, wait=True)

    def _redeliver(self, deliveries: list[_Delivery]) -> None:
        """Have the broker deliver these again (recover, rollback)."""
        if not deliveries or self.connection.broken.is_set():
            return
        if self.connection.dialect.redeliver == "nack":
            for i, delivery in enumerate(deliveries):
                self.connection.frame("NACK", {"id": delivery.ack_id}, wait=i == len(deliveries) - 1)
            return
        for sub in {d.subscription for d in deliveries}:  # resubscribe: the broker takes them back
            sub.unsubscribe()
            sub.subscribe()

    def recover(self) -> None:
        self._check()
        pending, self._unacked = self._unacked, []
        self._redeliver(pending)

    def commit(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("commit() on a session that is not transacted")
        self.connection.frame("COMMIT", {"transaction": self.tx}, wait=True)
        self._unacked = []
        self._begin()

    def rollback(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("rollback() on a session that is not transacted")
        self.connection.frame("ABORT", {"transaction": self.tx}, wait=True)
        pending, self._unacked = self._unacked, []
        if not self.connection.dialect.abort_redelivers:
            self._redeliver(pending)
        self._begin()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        connection = self.connection
        try:
            if not connection.broken.is_set() and not connection.closed:
                for consumer in list(self._consumers):
                    consumer.close()
                if self.transacted:
                    connection.frame("ABORT", {"transaction": self.tx}, wait=True)
        except JMSException as exc:
            log.debug("closing a STOMP session: %s", exc)
        finally:
            if self in connection._sessions:
                connection._sessions.remove(self)


class StompProducer(MessageProducer):
    def __init__(self, session: StompSession, destination: Destination | None) -> None:
        super().__init__(destination)
        self.session = session
        self._cond = threading.Condition()
        self._outstanding = 0  # send_async() calls whose listener was not called yet

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        session = self.session
        headers, body = self._frame(message, destination, delivery_mode, priority, time_to_live)
        confirm = message.delivery_mode == DeliveryMode.PERSISTENT or self.confirm_sends
        session.connection.frame("SEND", headers, body, wait=confirm and not session.transacted)

    def _frame(
        self,
        message: Message,
        destination: Destination | None,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> tuple[dict[str, str], bytes]:
        """Stamp ``message`` (JMS headers) and encode it as a SEND frame."""
        dest = destination or self.destination
        if dest is None:
            raise JMSException("send() needs a destination (the producer has none)")
        session = self.session
        session._check()
        self.stamp(
            message,
            dest,
            f"ID:{uuid.uuid4()}",
            delivery_mode=delivery_mode,
            priority=priority,
            time_to_live=time_to_live,
        )
        headers, body = to_frame(message, session.connection.dialect)
        headers["destination"] = to_stomp_destination(dest)
        if session.transacted:
            headers["transaction"] = session.tx
        return headers, body

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
        """A SEND with a receipt, not waited for (pipelined receipts; see the notes)."""
        session = self.session
        if session.transacted:  # the commit answers for it
            super().send_async(
                message,
                listener,
                destination,
                delivery_mode=delivery_mode,
                priority=priority,
                time_to_live=time_to_live,
            )
            return
        headers, body = self._frame(message, destination, delivery_mode, priority, time_to_live)
        with self._cond:
            self._outstanding += 1

        def answered(error: JMSException | None) -> None:
            try:
                if error is None:
                    listener.on_completion(message)
                else:
                    listener.on_exception(message, error)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

        try:
            session.connection.frame_async("SEND", headers, body, answered)
        except BaseException:
            with self._cond:
                self._outstanding -= 1
            raise

    def flush(self) -> None:
        """Wait for the receipts of every send_async(); those that do not come within the
        receipt timeout (of the last answer) fail with a TransportException."""
        timeout = self.session.connection.options.receipt_timeout
        with self._cond:
            while self._outstanding:
                seen = self._outstanding
                self._cond.wait(timeout)
                if self._outstanding >= seen:  # nothing answered within the timeout
                    break
            if not self._outstanding:
                return
        self.session.connection.forget_all(f"no receipt within {timeout} s")

    def close(self) -> None:
        pass


class StompConsumer(PollingConsumer):
    listener_log = log

    def __init__(self, session: StompSession, subscription: _Subscription) -> None:
        self.session = session
        self.subscription = subscription
        self.closed = False

    @property
    def message_selector(self) -> str | None:
        return self.subscription.selector

    def receive(self, timeout: float | None = None) -> Message | None:
        connection = self.session.connection
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            if self.closed:
                return None
            connection._check()
            if not connection._started.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                connection._started.wait(left if left is not None else 0.5)
                continue
            try:
                if deadline is None:
                    delivery = self.subscription.inbox.get(timeout=0.5)
                else:
                    delivery = self.subscription.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if delivery is None:  # the connection ended
                continue
            message = self.session.delivered(delivery)
            selector = self.subscription.local_filter
            if selector is not None and not selector.matches(message):
                self.session._ack([delivery], wait=False)  # a topic copy nobody here wants
                if delivery in self.session._unacked:
                    self.session._unacked.remove(delivery)
                continue
            return message

    def listener_thread_name(self) -> str:
        return f"stomp listener {self.subscription.id}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        session = self.session
        session._unacked = [
            d for d in session._unacked if d.subscription is not self.subscription or session.transacted
        ]
        if self in session._consumers:
            session._consumers.remove(self)
        if not session.connection.broken.is_set():
            self.subscription.unsubscribe()
