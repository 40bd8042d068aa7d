"""The ``mq://`` client: the provider SPI over the wire to a host broker's ``jms`` service.

``RemoteConnectionFactory("mq://host:7676")`` asks the port mapper there for the ``jms``
service's port (``mqtcp://host:port`` skips the port mapper; several URLs separated by
commas are tried in turn), connects, and says HELLO with the credentials. A
:class:`RemoteConnection` then talks through one :class:`.channel.Channel` (the socket,
calls, which thread reads, heart-beats); every session, consumer, transaction and XA branch
is the service's embedded one, named by an id the client chose. Consumers prefetch (the
service pushes up to ``prefetch`` messages per consumer; ``prefetch=0`` pulls).

Rules: a PERSISTENT send outside a transaction returns once the service's store holds the
message (``send_window=N`` pipelines them instead); a ``send_async`` tells each message's
own listener how it ended, so a refusal is that message's; when the connection breaks
every waiting call raises a TransportException and nothing reconnects by itself.

Design notes: docs/embedded-broker.md#internals-providersembeddedremotepy.
"""

from __future__ import annotations

import itertools
import logging
import os
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

from ...admin.portmapper import DEFAULT_PORT
from ...jms import codec
from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import (
    BrokerMoved,
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    ResourceAllocationException,
    TransportException,
    XAException,
)
from ...jms.message import DeliveryMode, Message
from ...jms.selector import compile_selector
from ...jms.spi import (
    AckMode,
    ConnectionMetaData,
    ExceptionListener,
    MessageConsumer,
    MessageListener,
    QueueBrowser,
    Session,
    XAConnection,
    XAConnectionFactory,
    XAResource,
    XASession,
)
from ...jms.xa import XAER_PROTO, XAER_RMFAIL, Xid
from . import wire
from .channel import Address, Call, Hello, open_channel, parse_url
from .client import Answered, EmbeddedProducer

__all__ = ["Address", "RemoteConnection", "RemoteConnectionFactory", "parse_url"]

log = logging.getLogger(__name__)

_S = TypeVar("_S", bound="RemoteSession")

_NON_PERSISTENT = int(DeliveryMode.NON_PERSISTENT)
_AUTO, _CLIENT, _INDIVIDUAL = AckMode.AUTO_ACKNOWLEDGE, AckMode.CLIENT_ACKNOWLEDGE, AckMode.INDIVIDUAL_ACKNOWLEDGE


# The original's connection factory attribute for how long a client waits for the broker's
# answer (milliseconds; 0: indefinitely): here, an XA call's (a hung service is noticed).
ACK_TIMEOUT = "imqAckTimeout"
DEFAULT_ACK_TIMEOUT_MS = 10_000


def ack_timeout_seconds(ms: int) -> float | None:
    """An imqAckTimeout in milliseconds as the factory's ``xa_timeout`` (None: no limit)."""
    return ms / 1000 if ms > 0 else None


class RemoteConnectionFactory(XAConnectionFactory):
    """Connections (plain and XA) to a host broker's jms service, addressed by URL."""

    def __init__(
        self,
        url: str = f"mq://127.0.0.1:{DEFAULT_PORT}",
        *,
        ssl_context: ssl.SSLContext | None = None,
        prefetch: int = 100,
        heartbeat: float = 30.0,
        connect_timeout: float = 10.0,
        sync_sends: bool = False,
        send_window: int = 0,
        client_name: str | None = None,
        xa_timeout: float | None = DEFAULT_ACK_TIMEOUT_MS / 1000,
    ) -> None:
        self.url = url
        self.addresses = parse_url(url)
        self.ssl_context = ssl_context
        if not 0 <= prefetch <= 65536:
            raise JMSException(f"prefetch must be 0 (pull) .. 65536, not {prefetch}")
        self.prefetch = prefetch
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self.sync_sends = sync_sends
        if send_window < 0:
            raise JMSException(f"send_window must be >= 0, not {send_window}")
        self.send_window = send_window
        self.client_name = client_name  # what the service logs; default: this process's pid
        self.xa_timeout = xa_timeout  # s an XA call waits for its answer (a hung service; None: no limit)
        # HA: the broker id our last connection reached; a new connection names it, and an
        # instance that does not serve that broker's store now sends us to the one that does
        self.home: str | None = None

    def create_connection(self, username: str | None = None, password: str | None = None) -> RemoteConnection:
        errors: list[JMSException] = []
        for address in self.addresses:
            try:
                return self._connect(address, username, password)
            except JMSException as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        last = errors[-1]
        raise type(last)("no broker could be reached: " + "; ".join(str(e) for e in errors))

    def _connect(self, address: Address, username: str | None, password: str | None) -> RemoteConnection:
        """A connection at ``address``, or where it says our home broker's store went (an
        address of our list: the password goes nowhere else)."""
        try:
            conn = RemoteConnection(self, address, username, password)
        except BrokerMoved as moved:
            target = next((listed for a in parse_url(moved.urls) if (listed := self._listed(a))), None)
            if target is None:  # (a list that has it, imqcf's, may go there)
                raise BrokerMoved(
                    f"{moved}; none of its addresses ({moved.urls}) is in this connection's list ({self.url})",
                    moved.urls,
                ) from None
            log.info("%s; connecting there (%s)", moved, target)
            conn = RemoteConnection(self, target, username, password)
        if conn.broker is not None:
            self.home = conn.broker
        return conn

    def _listed(self, address: Address) -> Address | None:
        """Our list's entry for ``address`` (the same host, port and kind; its TLS ours)."""
        return next(
            (
                a
                for a in self.addresses
                if (a.host, a.port, a.portmapper) == (address.host, address.port, address.portmapper)
            ),
            None,
        )

    create_xa_connection = create_connection

    def __repr__(self) -> str:
        return f"RemoteConnectionFactory({self.url!r})"


class RemoteConnection(XAConnection):
    def __init__(
        self, factory: RemoteConnectionFactory, address: Address, username: str | None, password: str | None
    ) -> None:
        self.factory = factory
        self.address = address
        self.username = username
        self.started = False
        self.closed = False
        self.client_id_value: str | None = None
        self._used = False
        self._listener: ExceptionListener | None = None
        self._session_ids = itertools.count(1)
        self._consumer_ids = itertools.count(1)
        self._sessions: dict[int, RemoteSession] = {}
        self._consumers: dict[int, RemoteConsumer] = {}
        self._id_prefix = f"ID:{uuid.uuid4().hex[:12]}-"
        self._ids = itertools.count(1)
        hello = Hello(
            username, password, factory.heartbeat, factory.client_name or f"python pid {os.getpid()}", factory.home
        )
        self.channel = open_channel(
            address, hello, factory.ssl_context, factory.connect_timeout, self._event, self._lost
        )
        welcome = self.channel.welcome
        broker = welcome.get("broker")
        self.broker = broker if isinstance(broker, str) else None  # HA: the instance's broker id
        self.where = self.channel.where
        self.instance, self.rm_id = welcome["instance"], welcome["rm_id"]
        self._metadata = ConnectionMetaData(welcome["provider"], welcome["version"])

    @property
    def broken(self) -> TransportException | None:
        return self.channel.broken

    def _check_open(self) -> None:
        if self.channel.broken is not None:
            raise self.channel.broken
        if self.closed:
            raise IllegalStateException("the connection is closed")

    def request(
        self, op: wire.Op, *args: Any, then: Callable[[], None] | None = None, timeout: float | None = None
    ) -> Any:
        self._check_open()
        return self.channel.request(op, *args, then=then, timeout=timeout)

    def flush(self) -> None:
        """Write what was kept lazily (CONSUMED reports, transacted sends)."""
        self.channel.flush()

    def next_message_id(self) -> str:
        return self._id_prefix + str(next(self._ids))

    def _event(self, event: wire.Event) -> None:
        """(The reading thread) a delivery, or an asynchronous failure of a session."""
        if event.__class__ is wire.Delivery:
            consumer = self._consumers.get(event.consumer)
            if consumer is not None:
                consumer._buf.append(event)
        elif event.__class__ is wire.Failure and event.session is not None:  # (only these two come)
            session = self._sessions.get(event.session)
            if session is not None:
                session._async_failed(event.error)

    def _lost(self, error: TransportException) -> None:
        log.warning("%s", error)
        listener = self._listener
        if listener is not None:
            try:
                listener(error)
            except Exception:
                log.exception("exception listener failed")

    # --- the Connection API -------------------------------------------------------------------
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
        self.request(wire.Op.SET_CLIENT_ID, value)
        self.client_id_value = value

    @property
    def metadata(self) -> ConnectionMetaData:
        return self._metadata

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> RemoteSession:
        return self._new_session(RemoteSession, transacted, AckMode(ack_mode), False)

    def create_xa_session(self) -> RemoteXASession:
        return self._new_session(RemoteXASession, True, AckMode.AUTO_ACKNOWLEDGE, True)

    def _new_session(self, cls: type[_S], transacted: bool, ack_mode: AckMode, xa: bool) -> _S:
        self._check_open()
        if ack_mode is AckMode.SESSION_TRANSACTED and not transacted:
            raise IllegalStateException("SESSION_TRANSACTED needs transacted=True")
        self._used = True
        sid = next(self._session_ids)
        self.request(wire.Op.SESSION, sid, transacted, int(ack_mode), xa)
        session = cls(self, sid, transacted, ack_mode)
        self._sessions[sid] = session
        return session

    def start(self) -> None:
        self._check_open()
        self._used = True
        if not self.started:
            self.request(wire.Op.START)
            self.started = True
            self.channel.wake()

    def stop(self) -> None:
        self._check_open()
        if self.started:
            self.started = False
            self.request(wire.Op.STOP)

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        self._listener = listener

    def close(self) -> None:
        if self.closed:
            return
        refused: JMSException | None = None
        for session in list(self._sessions.values()):
            try:
                if self.channel.broken is None:
                    session._settle(0)  # sends of a send window are answered first
            except JMSException as exc:
                refused = refused or exc
        self.closed = True
        self.started = False
        for session in list(self._sessions.values()):
            session._closed_locally()
        if self.channel.broken is None:
            self.channel.closing = True  # the service ends the socket after its answer: no loss
            try:
                self.channel.request(wire.Op.CLOSE)
            except JMSException:
                pass
        self.channel.close()
        if refused is not None:
            raise refused

    def __repr__(self) -> str:
        return f"RemoteConnection({self.where}, user={self.username!r})"


class RemoteSession(Session):
    """A session; its work lives in the service (see the module notes for what waits)."""

    def __init__(self, connection: RemoteConnection, sid: int, transacted: bool, ack_mode: AckMode) -> None:
        self.connection = connection
        self.broker = connection  # EmbeddedProducer asks session.broker for message ids
        self.sid = sid
        self.transacted = transacted
        self.ack_mode = AckMode.SESSION_TRANSACTED if transacted else ack_mode
        self.closed = False
        self.consumers: list[RemoteConsumer] = []
        self.listener_lock = threading.Lock()
        self._failed: JMSException | None = None
        self._in_branch = False
        self._unconfirmed: deque[Call] = deque()  # persistent sends in the send window
        self._answering: deque[tuple[Call, Answered]] = deque()  # send_async(), oldest first
        self.prefetch = 0  # prefetch_at_least(): the consumers' floor
        self.prefetch_bytes = 0  # prefetch_at_least(): their byte bound (0: none)

    # --- state --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise IllegalStateException("the session is closed")
        self.connection._check_open()

    def _async_failed(self, error: JMSException) -> None:
        log.warning("%s: an asynchronous send of session %d failed: %s", self.connection.where, self.sid, error)
        if self._failed is None:
            self._failed = error

    def _raise_failed(self) -> None:
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def _in_transaction(self) -> bool:
        return self.transacted

    def _acks_at_once(self) -> bool:
        return not self.transacted and self.ack_mode is _AUTO

    # --- destinations -----------------------------------------------------------------------
    def create_temporary_queue(self) -> TemporaryQueue:
        self._check_open()
        return self.connection.request(wire.Op.TEMP_CREATE, self.sid, False)

    def create_temporary_topic(self) -> TemporaryTopic:
        self._check_open()
        return self.connection.request(wire.Op.TEMP_CREATE, self.sid, True)

    def delete_temporary(self, destination: Destination) -> None:
        self._check_open()
        self.connection.request(wire.Op.TEMP_DELETE, self.sid, destination)

    # --- producers, consumers, browsers -----------------------------------------------------------
    def create_producer(self, destination: Destination | None = None) -> RemoteProducer:
        self._check_open()
        return RemoteProducer(self, destination)  # type: ignore[arg-type]  # a RemoteSession has all the producer uses

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> RemoteConsumer:
        if not isinstance(destination, Destination):
            raise InvalidDestinationException(f"not a destination: {destination!r}")
        return self._new_consumer(destination, selector, no_local, None)

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> RemoteConsumer:
        if not isinstance(topic, Topic):
            raise InvalidDestinationException(f"a durable subscription needs a topic, not {topic!r}")
        return self._new_consumer(topic, selector, no_local, name)

    def create_group_consumer(
        self,
        destination: Destination,
        selector: str | None,
        durable_name: str | None,
        group: str,
        retain: bool,
        max_messages: int,
    ) -> RemoteConsumer:
        """A connection consumer's consumer (Session.create_group_consumer); the service
        shares the subscription among the group. Its window: one batch (prefetch 0: pull)."""
        if not isinstance(destination, Destination):
            raise InvalidDestinationException(f"not a destination: {destination!r}")
        self._check_open()
        compile_selector(selector)
        conn = self.connection
        cid = next(conn._consumer_ids)
        consumer = RemoteConsumer(self, cid, destination, selector)
        conn._consumers[cid] = consumer
        try:
            conn.request(
                wire.Op.GROUP_CONSUMER,
                self.sid,
                cid,
                destination,
                selector,
                durable_name,
                min(conn.factory.prefetch, max_messages),
                group,
                retain,
            )
        except BaseException:
            conn._consumers.pop(cid, None)
            raise
        self.consumers.append(consumer)
        return consumer

    def _new_consumer(
        self, destination: Destination, selector: str | None, no_local: bool, durable_name: str | None
    ) -> RemoteConsumer:
        self._check_open()
        compile_selector(selector)  # a bad selector fails here, with its position
        conn = self.connection
        cid = next(conn._consumer_ids)
        consumer = RemoteConsumer(self, cid, destination, selector)
        conn._consumers[cid] = consumer
        try:
            prefetch = conn.factory.prefetch and max(conn.factory.prefetch, self.prefetch)
            bound = (self.prefetch_bytes,) if self.prefetch_bytes and conn.channel.welcome.get("prefetch_bytes") else ()
            conn.request(
                wire.Op.CONSUMER, self.sid, cid, destination, selector, no_local, durable_name, prefetch, *bound
            )
        except BaseException:
            conn._consumers.pop(cid, None)
            raise
        self.consumers.append(consumer)
        return consumer

    def unsubscribe(self, name: str) -> None:
        self._check_open()
        self.connection.request(wire.Op.UNSUBSCRIBE, self.sid, name)

    def create_browser(self, queue: Queue, selector: str | None = None) -> RemoteBrowser:
        self._check_open()
        if not isinstance(queue, Queue):
            raise InvalidDestinationException(f"only queues can be browsed, not {queue!r}")
        compile_selector(selector)
        if self.connection.channel.welcome.get("browser"):  # a service that checks at creation
            self.connection.request(wire.Op.BROWSER, self.sid, queue, selector)
        return RemoteBrowser(self, queue, selector)

    # --- the data path -------------------------------------------------------------------------------
    def _send(self, snapshot: Message, destination: Destination, confirm: bool = False) -> None:
        """Called by the producer with the stamped copy of a message; ``confirm``: wait for
        the answer even where it is not waited for (the producer's confirm_sends)."""
        self._raise_failed()
        conn = self.connection
        blob = self._blob(snapshot)
        if self._in_transaction():
            conn._check_open()
            conn.channel.write(wire.send_request(0, self.sid, blob), lazy=True)
        elif confirm:
            conn.channel.call(lambda call_id: wire.send_request(call_id, self.sid, blob))
        elif snapshot.delivery_mode == _NON_PERSISTENT and not conn.factory.sync_sends:
            conn._check_open()
            conn.channel.write(wire.send_request(0, self.sid, blob))
        elif conn.factory.send_window:
            self._unconfirmed.append(conn.channel.start(lambda call_id: wire.send_request(call_id, self.sid, blob)))
            self._settle(conn.factory.send_window)
        else:
            conn.channel.call(lambda call_id: wire.send_request(call_id, self.sid, blob))

    def _blob(self, snapshot: Message) -> bytes:
        blob = codec.encode(snapshot)
        max_frame = self.connection.channel.max_frame
        if len(blob) + 32 > max_frame:
            raise ResourceAllocationException(
                f"a message of {len(blob)} bytes is more than the jms service takes in one frame ({max_frame} bytes)"
            )
        return blob

    def _send_async(self, snapshot: Message, destination: Destination, answered: Answered) -> None:
        """_send() for send_async(): written at once, answered in order (module notes)."""
        if self._in_transaction():
            self._send(snapshot, destination)
            answered(None)  # the commit answers for it
            return
        self._raise_failed()
        blob = self._blob(snapshot)
        # lazy: a window's sends leave in few writes (LAZY_LIMIT bytes, or when the link
        # waits: flush(), a receive that would wait), not a system call and a wake-up of the
        # service each
        call = self.connection.channel.start(lambda call_id: wire.send_request(call_id, self.sid, blob), lazy=True)
        self._answering.append((call, answered))
        self._answer(wait=False)

    def _answer(self, wait: bool = True) -> None:
        """Call the listeners of the send_async() calls answered so far, in order; ``wait``:
        of all of them (reading their answers)."""
        answering, channel = self._answering, self.connection.channel
        if wait and answering:
            try:
                channel.flush()  # the sends kept lazily go out before their answers are awaited
            except TransportException as exc:
                while answering:
                    answering.popleft()[1](exc)
                return
        while answering:
            call, answered = answering[0]
            if not call.done:
                if not wait:
                    return
                try:
                    channel.wait_for(lambda: call.done, None)  # noqa: B023  (called at once)
                except TransportException as exc:
                    while answering:
                        answering.popleft()[1](exc)
                    return
            answering.popleft()
            answered(call.error)

    def _send_confirmed(self, snapshot: Message, destination: Destination) -> None:
        """_send() for a producer's confirm_sends."""
        self._send(snapshot, destination, True)

    def _settle(self, keep: int) -> None:
        """Wait until at most ``keep`` sends of the window are unconfirmed; raise the first refusal."""
        unconfirmed, conn = self._unconfirmed, self.connection
        while unconfirmed and (len(unconfirmed) > keep or unconfirmed[0].done):
            call = unconfirmed.popleft()
            try:
                conn.channel.finish(call)
            except BaseException:
                if not isinstance(call.error, JMSException):  # the connection broke: nothing to wait for
                    unconfirmed.clear()
                raise

    def _deliver(self, consumer: RemoteConsumer, item: wire.Delivery, report: bool = True) -> Message:
        """The message of a delivery as the application sees it; reports it CONSUMED."""
        msg = codec.decode(item.blob)
        msg.delivery_count = item.dcount
        msg.redelivered = item.dcount > 1
        if not self._in_transaction():
            if self.ack_mode is _INDIVIDUAL:
                msg._ack = partial(self._ack_one, item.tag)
            elif self.ack_mode is _CLIENT:
                msg._ack = self.acknowledge
        msg.set_read_only()
        if report:
            self._report(consumer, item.tag)
        return msg

    def _deliver_blob(self, consumer: RemoteConsumer, item: wire.Delivery) -> bytes:
        """A delivery's blob as encode() of _deliver's message would give it; reports it
        CONSUMED (acknowledged as the session's mode says: acknowledge(), commit())."""
        blob = codec.with_delivery(item.blob, item.dcount)
        self._report(consumer, item.tag)
        return blob

    def _report(self, consumer: RemoteConsumer, tag: int) -> None:
        self.connection.channel.write(
            wire.consumed_request(self.sid, consumer.cid, [tag]), lazy=not self._acks_at_once()
        )

    def _ack_one(self, tag: int) -> None:
        self._check_open()
        self.connection.request(wire.Op.ACK_ONE, self.sid, tag)

    def _forget_buffered(self) -> None:
        """(Reader thread) the service took back every in-flight message of this session."""
        for consumer in self.consumers:
            consumer._clear()

    # --- completion ---------------------------------------------------------------------------------
    def commit(self) -> None:
        self._check_open()
        if not self.transacted:
            raise IllegalStateException("commit() on a session that is not transacted")
        self._failed = None  # the service knows and rolls back
        self.connection.request(wire.Op.COMMIT, self.sid)

    def rollback(self) -> None:
        self._check_open()
        if not self.transacted:
            raise IllegalStateException("rollback() on a session that is not transacted")
        self._failed = None
        self.connection.request(wire.Op.ROLLBACK, self.sid, then=self._forget_buffered)

    def recover(self) -> None:
        self._check_open()
        if self.transacted:
            raise IllegalStateException("recover() on a transacted session (use rollback())")
        self.connection.request(wire.Op.RECOVER, self.sid, then=self._forget_buffered)

    def acknowledge(self) -> None:
        if self.closed:
            raise IllegalStateException("acknowledge() after the session closed")
        self.connection.request(wire.Op.ACKNOWLEDGE, self.sid)

    acknowledges_oldest = True  # the service holds the session's deliveries in CONSUMED order

    def acknowledge_oldest(self, count: int) -> bool:
        """CLIENT_ACKNOWLEDGE of the ``count`` oldest messages received and not yet
        acknowledged (their CONSUMED reports go first, in order)."""
        if self.closed:
            raise IllegalStateException("acknowledge() after the session closed")
        if self.transacted or self.ack_mode is not _CLIENT:
            return False
        self.connection.request(wire.Op.ACK_OLDEST, self.sid, count)
        return True

    def prefetch_at_least(self, count: int, max_bytes: int = 0) -> None:
        """Consumers created afterwards hold up to ``count`` messages (not below the
        factory's prefetch; a pull factory, prefetch=0, stays pull), and no more once
        those hold ``max_bytes`` (0: no byte bound)."""
        self.prefetch = max(self.prefetch, min(count, 65536))
        self.prefetch_bytes = max(0, max_bytes)

    def _closed_locally(self) -> None:
        self.closed = True
        for consumer in list(self.consumers):
            consumer._closed_locally()
        self.connection._sessions.pop(self.sid, None)

    def close(self) -> None:
        if self.closed:
            return
        conn = self.connection
        try:
            self._answer()  # every send_async() hears how it ended
            if conn.broken is None:
                self._settle(0)  # a refused send of the window fails the close
        finally:
            self._closed_locally()
            if conn.broken is None and not conn.closed:
                conn.request(wire.Op.SESSION_CLOSE, self.sid)


class RemoteXASession(XASession, RemoteSession):  # XASession's commit/rollback win
    """An XA session: its work belongs to the branch started on ``xa_resource``."""

    def __init__(self, connection: RemoteConnection, sid: int, transacted: bool, ack_mode: AckMode) -> None:
        super().__init__(connection, sid, False, AckMode.AUTO_ACKNOWLEDGE)
        self.transacted = True  # as javax.jms.XASession.getTransacted() says
        self._resource = RemoteXAResource(self)

    @property
    def xa_resource(self) -> RemoteXAResource:
        return self._resource

    def _in_transaction(self) -> bool:
        return self._in_branch

    def _acks_at_once(self) -> bool:
        return not self._in_branch


class RemoteXAResource(XAResource):
    """The XA resource of a remote session; branches live in the broker (same RM per broker)."""

    def __init__(self, session: RemoteXASession) -> None:
        self.session = session
        self.connection = session.connection
        self.rm_id = session.connection.rm_id
        self._timeout = 0

    def _request(self, op: wire.Op, *args: Any) -> Any:
        """An XA call, answered within the factory's xa_timeout or the connection is lost
        (XAER_RMFAIL: the coordinator treats the RM as unreachable, recovery finishes)."""
        try:
            return self.connection.request(op, *args, timeout=self.connection.factory.xa_timeout)
        except TransportException as exc:
            raise XAException(f"{op.name.lower()}: {exc}", XAER_RMFAIL) from exc

    def start(self, xid: Xid, flags: int = 0) -> None:
        if self.session._in_branch:
            raise XAException("start: the session is already associated with a branch", XAER_PROTO)
        self._request(wire.Op.XA_START, self.session.sid, xid, flags)
        self.session._in_branch = True

    def end(self, xid: Xid, flags: int) -> None:
        try:
            self._request(wire.Op.XA_END, self.session.sid, xid, flags)
        finally:  # also when the branch ends rolled back (XA_RB*): the session is free again
            self.session._in_branch = False

    def prepare(self, xid: Xid) -> int:
        return self._request(wire.Op.XA_PREPARE, xid)

    def commit(self, xid: Xid, one_phase: bool) -> None:
        self._request(wire.Op.XA_COMMIT, xid, one_phase)

    def rollback(self, xid: Xid) -> None:
        self._request(wire.Op.XA_ROLLBACK, xid)

    def recover(self, flags: int) -> list[Xid]:
        return [Xid(f, g, b) for f, g, b in self._request(wire.Op.XA_RECOVER, flags)]

    def forget(self, xid: Xid) -> None:
        self._request(wire.Op.XA_FORGET, xid)

    def is_same_rm(self, other: XAResource) -> bool:
        return isinstance(other, RemoteXAResource) and other.rm_id == self.rm_id

    def get_transaction_timeout(self) -> int:
        return self._timeout

    def set_transaction_timeout(self, seconds: int) -> bool:
        self._timeout = seconds
        return False  # branches do not time out in the embedded broker


class RemoteProducer(EmbeddedProducer):
    """The embedded producer's checks and header stamping; its session sends over the wire."""

    counted_here = False  # the service counts its session's sends (clientconn.py)

    @property
    def answers_when_sent(self) -> bool:
        return False  # the answer comes over the wire: the window pipelines them


class RemoteConsumer(MessageConsumer):
    def __init__(self, session: RemoteSession, cid: int, destination: Destination, selector: str | None) -> None:
        self.session = session
        self.connection = session.connection
        self.cid = cid
        self.destination = destination
        self._selector_text = selector
        self.closed = False
        self._buf: deque[wire.Delivery] = deque()  # filled by whichever thread reads
        self._listener: MessageListener | None = None
        self._thread: threading.Thread | None = None
        self._pull = session.connection.factory.prefetch == 0  # a pull consumer (wire's notes)
        self._pulled = False  # a PULL credit is outstanding

    @property
    def message_selector(self) -> str | None:
        return self._selector_text

    # --- from the reading thread --------------------------------------------------------------
    def _clear(self) -> None:
        self._buf.clear()
        self._pulled = False

    # --- receiving -------------------------------------------------------------------------------
    def _ready(self) -> bool:
        return self.closed or (bool(self._buf) and self.connection.started)

    def _next(self, timeout: float | None) -> wire.Delivery | None:
        """The next delivery within ``timeout`` seconds (0: what the broker holds now)."""
        conn, sid = self.connection, self.session.sid
        if timeout is not None and timeout <= 0:
            if not self._buf and conn.started and not self.closed:
                conn.request(wire.Op.PULL, sid, self.cid, 0)
            return self._take()
        if not self._buf:
            if self._pull and not self._pulled:
                self._pulled = True
                conn.channel.write(wire.request(0, wire.Op.PULL, sid, self.cid, 1))
            else:
                conn.channel.flush()  # the kept reports refill the window
        deadline = None if timeout is None else time.monotonic() + timeout
        if conn.channel.wait_for(self._ready, deadline) or not self._pulled:
            return self._take()
        conn.request(wire.Op.PULL, sid, self.cid, -1)  # nothing comes for the credit after the answer
        self._pulled = False
        return self._take()

    def _take(self) -> wire.Delivery | None:
        if self._buf and self.connection.started and not self.closed:
            self._pulled = False
            return self._buf.popleft()
        return None

    def _delivery(self, timeout: float | None) -> wire.Delivery | None:
        """The next delivery for a receive call (None after ``timeout``)."""
        if self.closed:
            raise IllegalStateException("the consumer is closed")
        if self._listener is not None:
            raise IllegalStateException("receive() on a consumer that has a message listener")
        self.session._check_open()
        return self._next(timeout)

    def receive(self, timeout: float | None = None) -> Message | None:
        item = self._delivery(timeout)
        return None if item is None else self.session._deliver(self, item)

    def receive_blob(self, timeout: float | None = None) -> bytes | None:
        """receive() without decoding: the delivered blob, its delivery count set."""
        item = self._delivery(timeout)
        return None if item is None else self.session._deliver_blob(self, item)

    def deliver_to(self, listener: MessageListener, timeout: float) -> bool:
        """One message to ``listener`` (Session.run); in AUTO/DUPS_OK reported consumed
        once the listener returns, given back for redelivery when it raises (then re-raised)."""
        if self.closed:
            return False
        item = self._delivery(timeout)
        if item is None:
            return False
        session = self.session
        auto = session._acks_at_once()
        msg = session._deliver(self, item, report=not auto)
        try:
            listener(msg)
        except BaseException:
            if auto:
                self._give_back([item.tag], seen=True)
            raise
        if auto:
            session._report(self, item.tag)
        return True

    def set_message_listener(self, listener: MessageListener | None) -> None:
        if self.closed:
            raise IllegalStateException("the consumer is closed")
        self._listener = listener
        if listener is not None and self._thread is None:
            self._thread = threading.Thread(target=self._listen, daemon=True, name=f"listener:{self.destination}")
            self._thread.start()

    def _listen(self) -> None:
        """Deliver to the listener, one message at a time per session; a failure in
        AUTO_ACKNOWLEDGE gives the message back for redelivery."""
        session = self.session
        while not self.closed and self._listener is not None:
            try:
                item = self._next(None)
            except JMSException:
                return
            listener = self._listener
            if item is None or listener is None:
                continue
            with session.listener_lock:
                auto = session._acks_at_once()
                msg = session._deliver(self, item, report=not auto)
                try:
                    listener(msg)
                except Exception:
                    log.exception("message listener of %s failed; the message will be redelivered", self.destination)
                    if auto:
                        self._give_back([item.tag], seen=True)
                    continue
                if auto:
                    session._report(self, item.tag)

    def _give_back(self, tags: list[int], seen: bool) -> None:
        try:
            self.connection.channel.write(wire.request(0, wire.Op.RETURN, self.session.sid, self.cid, tags, seen))
        except JMSException:
            pass  # the connection is gone: the broker takes everything back anyway

    def _closed_locally(self) -> None:
        self.closed = True
        self._listener = None
        self._buf.clear()
        self.connection.channel.wake()  # its receive may be the one reading the socket
        self.connection._consumers.pop(self.cid, None)
        if self in self.session.consumers:
            self.session.consumers.remove(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def close(self) -> None:
        if self.closed:
            return
        self._closed_locally()
        conn = self.connection
        if conn.broken is None and not conn.closed and not self.session.closed:
            conn.request(wire.Op.CONSUMER_CLOSE, self.session.sid, self.cid)


class RemoteBrowser(QueueBrowser):
    def __init__(self, session: RemoteSession, queue: Queue, selector: str | None) -> None:
        self.session = session
        self.queue = queue
        self.message_selector = selector
        self.closed = False
        self._open: set[int] = set()

    def __iter__(self) -> Iterator[Message]:
        if self.closed:
            raise IllegalStateException("the browser is closed")
        self.session._check_open()
        conn = self.session.connection
        bid, page, done = conn.request(wire.Op.BROWSE, self.session.sid, self.queue, self.message_selector)
        self._open.add(bid)
        try:
            while True:
                for blob in page:
                    msg = codec.decode(blob)
                    msg.set_read_only()
                    yield msg
                if done:
                    return
                page, done = conn.request(wire.Op.BROWSE_MORE, bid)
        finally:
            if not done and not conn.broken:
                conn.request(wire.Op.BROWSE_CLOSE, bid)
            self._open.discard(bid)

    def close(self) -> None:
        self.closed = True
