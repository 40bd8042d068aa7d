"""JMS connections, sessions, producers and consumers over AMQP 0-9-1 (pika).

An AmqpConnection is one pika SelectConnection with its I/O loop in a thread of its own;
each session is one channel. Producing uses publisher confirms (send() waits for a
PERSISTENT message's, send_async() pipelines them); consuming maps the JMS acknowledge
modes onto basic.ack, basic.recover and tx.*. Not XA: a transacted link on it is refused.

Rules: every pika call is made on the loop thread (other threads hand work over with
hand_over() and wait on a Future); a lost connection fails every waiting call with
TransportException and goes to the exception listener, so the link reconnects and the
broker redelivers what was not acked.

Design notes: docs/architecture.md#internals-providersamqpclientpy.
"""

from __future__ import annotations

import copy
import itertools
import logging
import queue
import socket
import struct
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport
from pika.frame import decode_frame
from pika.spec import Basic

from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from ...jms.errors import (
    IllegalStateException,
    InvalidSelectorError,
    JMSException,
    JMSSecurityException,
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
    DELIVER_ID,
    FRAME_METHOD,
    AmqpOptions,
    Deliveries,
    FrameError,
    decode_deliver,
    from_amqp,
    parse_url,
    route,
    to_amqp,
)

log = logging.getLogger(__name__)

PROVIDER_NAME = "AMQP 0-9-1"
BACKLOG_EVERY = 5.0  # s: a consumer asks its queue's depth at most this often
PREFETCH_MOST = 65535  # basic.qos prefetch-count is a short: a larger one fails the call


class AmqpConnectionFactory(ConnectionFactory):
    """Connections to the AMQP 0-9-1 broker of a provider URL (not XA-capable)."""

    def __init__(self, url: str, username: str | None = None, password: str | None = None) -> None:
        self.options = parse_url(url)
        self.username = username
        self._password = password

    def create_connection(self, username: str | None = None, password: str | None = None) -> AmqpConnection:
        if username is None:
            username, password = self.username, self._password
        return AmqpConnection(self.options, username, password)

    def __repr__(self) -> str:
        return f"AmqpConnectionFactory({self.options.url})"


# Socket reads of up to this many bytes (pika reads 4 KiB: a recv per four 1 KiB messages).
RECV_BYTES = 256 * 1024
_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # basic.publish, reserved-1
_FRAME_END = b"\xce"


class _SelectConnection(pika.SelectConnection):
    """pika's SelectConnection with the I/O a busy link needs. pika writes each frame
    alone (three socket writes per message), sends only when the next pass of the loop
    finds the socket writable, reads 4 KiB at a time, and copies the rest of its buffer
    after every frame it takes. Here the frames made while a read or a drain of handed-over
    calls runs (corked) leave in one write at its end, sent at once when the socket takes
    them (the rest waits in pika's transport as before); reads take up to RECV_BYTES,
    parsed in place."""

    _corked: list[bytes] | None = None
    _deliveries: Deliveries

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._deliveries = Deliveries()
        super().__init__(*args, **kwargs)

    def _proto_connection_made(self, transport: Any) -> None:
        transport._MAX_RECV_BYTES = RECV_BYTES
        transport._MAX_CONSUME_BYTES = 4 * RECV_BYTES
        super()._proto_connection_made(transport)

    def _output_marshaled_frames(self, marshaled_frames: Any) -> None:
        self.frames_sent += len(marshaled_frames)
        self.bytes_sent += sum(len(f) for f in marshaled_frames)
        if self._corked is not None:
            self._corked.extend(marshaled_frames)
        else:
            self._write(b"".join(marshaled_frames))

    def corked(self, run: Callable[[], None]) -> None:
        """``run()`` with the frames it makes held, then written in one go."""
        if self._corked is not None:
            run()
            return
        self._corked = []
        try:
            run()
        finally:
            frames, self._corked = self._corked, None
            if frames:
                self._write(b"".join(frames))

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        if type(transport) is _AsyncPlaintextTransport and not transport.get_write_buffer_size():
            data = send_now(transport._sock, data)
            if not data:
                return
        self._adapter_emit_data(data)

    def publish_frames(
        self, channel: int, exchange: str, key: str, properties: Any, body: bytes, mandatory: bool
    ) -> None:
        """basic.publish, its content header and body, encoded here (pika builds a frame
        object per frame and a method object per publish: most of a send's cost)."""
        ex, rk = exchange.encode(), key.encode()
        if len(ex) > 255 or len(rk) > 255:
            raise JMSException(f"exchange {exchange!r} or routing key {key!r} is longer than 255 bytes")
        method = b"".join(
            (_PUBLISH, struct.pack("B", len(ex)), ex, struct.pack("B", len(rk)), rk, b"\x01" if mandatory else b"\x00")
        )
        header = b"".join((struct.pack(">HHQ", 60, 0, len(body)), *properties.encode()))
        frames = [
            struct.pack(">BHI", 1, channel, len(method)),
            method,
            _FRAME_END,
            struct.pack(">BHI", 2, channel, len(header)),
            header,
            _FRAME_END,
        ]
        step = self._body_max_length
        for at in range(0, len(body), step):
            chunk = body[at : at + step]
            frames += (struct.pack(">BHI", 3, channel, len(chunk)), chunk, _FRAME_END)
        self._output_marshaled_frames([b"".join(frames)])

    def _on_data_available(self, data_in: bytes) -> None:
        self.corked(lambda: self._take_frames(data_in))

    def _take_frames(self, data_in: bytes) -> None:
        held: bytes = self._frame_buffer  # type: ignore[has-type]
        buf = held + data_in if held else data_in
        at, size = 0, len(buf)
        deliveries = self._deliveries
        while size - at >= 8:
            if buf[at : at + 4] == b"AMQP":  # a protocol header: the broker refuses our version
                end = at + 8
            else:
                end = at + 8 + struct.unpack_from(">L", buf, at + 3)[0]
                if end > size:
                    break
                kind = buf[at]
                channel = struct.unpack_from(">H", buf, at + 1)[0]
                if deliveries.reading(channel) or (kind == FRAME_METHOD and buf[at + 7 : at + 11] == DELIVER_ID):
                    try:
                        if buf[end - 1] != 0xCE:
                            raise FrameError(f"frame of type {kind} on channel {channel} without its frame end")
                        taken = self._take_delivery(kind, channel, buf[at + 7 : end - 1])
                    except FrameError as exc:  # a protocol error: the connection cannot go on
                        log.error("the AMQP broker at %s:%s sent a %s", self.params.host, self.params.port, exc)
                        self._frame_buffer = b""
                        self._terminate_stream(exc)
                        return
                    if taken:
                        self.bytes_received += end - at
                        at = end
                        self.frames_received += 1
                        continue
            consumed, frame_value = decode_frame(buf[at:end])
            if frame_value is None:
                break
            at += consumed
            self.bytes_received += consumed
            self._process_frame(frame_value)
        self._frame_buffer = buf[at:]

    def _take_delivery(self, kind: int, channel: int, payload: bytes) -> bool:
        """A frame of a delivery, read here (wire.Deliveries) and handed on as pika's
        Channel._on_deliver would; False for a basic.deliver on a channel pika does not
        know (pika reports it)."""
        deliveries = self._deliveries
        if kind == FRAME_METHOD and not deliveries.reading(channel):
            deliver = decode_deliver(payload, channel)
            if channel not in self._channels:
                return False
            deliveries.begin(channel, deliver)
            return True
        done = deliveries.content(kind, channel, payload)
        if done is None:
            return True
        ch = self._channels.get(channel)
        if ch is None:
            return True
        deliver = done[0]
        tag = deliver.consumer_tag
        if tag in ch._cancelled:  # pika hands it back
            if ch.is_open and tag not in ch._consumers_with_noack:
                ch.basic_reject(deliver.delivery_tag)
            return True
        consumer = ch._consumers.get(tag)
        if consumer is None:
            log.error("a delivery for no consumer of channel %d: %r", channel, tag)
            return True
        consumer(ch, deliver, done[1], done[2])
        return True


def send_now(sock: socket.socket, data: bytes) -> bytes:
    """Send what a non-blocking socket takes of ``data`` now; the rest (all of it when
    the socket fails: the transport then meets the error and closes the connection)."""
    try:
        sent = sock.send(data)
    except OSError:  # EAGAIN, EINTR, or the connection failed
        return data
    return data[sent:]


# A send's outcome: None when the broker confirmed it, else why it failed.
Settle = Callable[[BaseException | None], None]


@dataclass
class _Delivery:
    consumer: AmqpConsumer
    tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Any
    body: bytes


class AmqpConnection(Connection):
    def __init__(self, options: AmqpOptions, username: str | None, password: str | None) -> None:
        self.options = options
        params = options.parameters
        if username is not None:
            params = copy.copy(params)
            params.credentials = pika.PlainCredentials(username, password or "")
        self._client_id: str | None = None
        self.closed = False
        self.broken = threading.Event()
        self.last_error: str | None = None
        self._started = threading.Event()
        self._listener: ExceptionListener | None = None
        self._sessions: list[AmqpSession] = []
        self._declared: set[str] = set()
        self._handoff: deque[Callable[[], None]] = deque()  # for the I/O thread, in order
        self._handoff_lock = threading.Lock()
        self._drain_scheduled = False
        opened: Future[None] = Future()

        def open_error(_conn: Any, exc: BaseException) -> None:
            opened.set_exception(exc) if not opened.done() else None

        self._pika = _SelectConnection(
            params,
            on_open_callback=lambda _c: opened.set_result(None),
            on_open_error_callback=open_error,
            on_close_callback=self._on_closed,
        )
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"amqp {params.host}:{params.port}")
        self._thread.start()
        where = f"{params.host}:{params.port}"
        try:
            opened.result(options.timeout)
        except FutureTimeout:
            self._stop_loop()
            raise TransportException(
                f"cannot connect to the AMQP broker at {where}: no answer within {options.timeout:g} s"
            ) from None
        except Exception as exc:
            self._stop_loop()
            error = (
                JMSSecurityException
                if isinstance(exc, pika.exceptions.ProbableAuthenticationError)
                else TransportException
            )
            raise error(f"cannot connect to the AMQP broker at {where}: {type(exc).__name__} {exc}".strip()) from None

    def _run(self) -> None:
        try:
            self._pika.ioloop.start()
        except Exception:
            log.exception("the AMQP I/O loop failed")
            self._lost("the I/O loop failed")

    def _stop_loop(self) -> None:
        try:
            self._pika.ioloop.add_callback_threadsafe(self._pika.ioloop.stop)
        except Exception:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _on_closed(self, _conn: Any, reason: BaseException) -> None:
        self._lost(str(reason) or type(reason).__name__)
        self._pika.ioloop.stop()

    def _lost(self, reason: str) -> None:
        if self.broken.is_set():
            return
        self.last_error = reason
        self.broken.set()
        for session in list(self._sessions):
            session.channel_lost(f"the AMQP connection is lost: {reason}")
        if not self.closed and self._listener is not None:
            try:
                self._listener(TransportException(f"AMQP connection lost: {reason}"))
            except Exception:
                log.exception("the exception listener failed")

    # --- the loop -----------------------------------------------------------------------------------
    def in_loop(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the I/O thread; its result (or exception) as a Future."""
        fut: Future[Any] = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        if threading.current_thread() is self._thread:
            run()
        else:
            self.hand_over(run)
        return fut

    def hand_over(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread, after what was handed over before it. One wake-up
        of the loop takes every call queued meanwhile (a busy producer's publishes and
        acks cost a pipe write each otherwise)."""
        self._check()
        with self._handoff_lock:
            self._handoff.append(fn)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._pika.ioloop.add_callback_threadsafe(lambda: self._pika.corked(self._drain))

    def _drain(self) -> None:
        while True:
            with self._handoff_lock:
                if not self._handoff:
                    self._drain_scheduled = False
                    return
                batch = list(self._handoff)
                self._handoff.clear()
            for fn in batch:
                try:
                    fn()
                except Exception:
                    log.exception("a call on the AMQP I/O thread failed")

    def wait(self, fut: Future[Any], what: str) -> Any:
        """``fut``'s result; TransportException when the connection is lost meanwhile (the
        loop then never runs what was handed to it) or the broker does not answer in time."""
        deadline = time.monotonic() + self.options.timeout
        while True:
            try:
                return fut.result(min(0.5, max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                if self.broken.is_set() and not fut.done():
                    raise TransportException(f"{what}: the AMQP connection is lost: {self.last_error}") from None
                if time.monotonic() >= deadline:
                    raise TransportException(
                        f"{what}: no answer from the AMQP broker within {self.options.timeout:g} s"
                    ) from None

    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the connection is closed")
        if self.broken.is_set():
            raise TransportException(f"the AMQP connection is lost: {self.last_error}")

    def declare(self, name: str) -> None:
        """Make sure queue ``name`` exists (declare-queues): a durable queue is declared on
        a channel of its own (the broker closes the channel of a refused declare); one that
        exists with other arguments (406) or another's exclusive queue (405) is there."""
        if not self.options.declare_queues or name in self._declared or name.startswith("amq.gen-"):
            return
        channel = _Channel(self)
        try:
            channel.call(
                lambda ch, done: ch.queue_declare(name, durable=True, callback=done), f"declaring queue {name}"
            )
        except JMSException:
            if channel.reply_code not in (405, 406):
                raise
        finally:
            channel.close()
        self._declared.add(name)

    # --- Connection API -----------------------------------------------------------------------------
    @property
    def client_id(self) -> str | None:
        return self._client_id

    @client_id.setter
    def client_id(self, value: str) -> None:
        if self._sessions or self._client_id is not None:
            raise IllegalStateException("the client id must be set right after the connection is created")
        self._client_id = value

    @property
    def metadata(self) -> ConnectionMetaData:
        return ConnectionMetaData(PROVIDER_NAME, __version__, "1.1")

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> AmqpSession:
        self._check()
        session = AmqpSession(self, transacted, AckMode.SESSION_TRANSACTED if transacted else AckMode(ack_mode))
        self._sessions.append(session)
        return session

    def start(self) -> None:
        self._started.set()

    def stop(self) -> None:
        self._started.clear()

    def close(self) -> None:
        if self.closed:
            return
        for session in list(self._sessions):
            session.close()
        self.closed = True
        if not self.broken.is_set():
            try:
                self._pika.ioloop.add_callback_threadsafe(self._pika.close)
            except Exception as exc:
                log.debug("closing: %s", exc)
        self._thread.join(self.options.timeout)
        self._lost("closed")

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        self._listener = listener


class _Channel:
    """One pika channel; call() runs a command on the I/O thread and waits for its answer.
    A channel the broker closes (an error) fails every command waiting on it."""

    def __init__(self, connection: AmqpConnection) -> None:
        self.connection = connection
        self.closed: str | None = None
        self.reply_code = 0  # of the broker's channel.close
        self._waiting: set[Future[Any]] = set()
        opened: Future[Any] = Future()

        def open_channel() -> None:
            ch = connection._pika.channel(on_open_callback=opened.set_result)
            ch.add_on_close_callback(self._on_close)

        connection.wait(connection.in_loop(open_channel), "opening a channel")
        self.pika = connection.wait(opened, "opening a channel")

    def _on_close(self, _ch: Any, reason: BaseException) -> None:
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self.reply_code = reason.reply_code
            self.closed = f"the broker closed the channel: {reason.reply_code} {reason.reply_text}"
        else:
            self.closed = str(reason) or "the channel is closed"
        waiting, self._waiting = self._waiting, set()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(JMSException(self.closed))

    def call(self, command: Callable[[Any, Callable[..., None]], Any], what: str) -> Any:
        """``command(channel, done)`` on the I/O thread; waits until it calls ``done``."""
        fut: Future[Any] = Future()

        def run() -> None:
            if self.closed:
                raise JMSException(self.closed)
            self._waiting.add(fut)

            def done(frame: Any = None) -> None:
                self._waiting.discard(fut)
                if not fut.done():
                    fut.set_result(frame)

            command(self.pika, done)

        self.connection.wait(self.connection.in_loop(run), what)
        try:
            return self.connection.wait(fut, what)
        except JMSException as exc:
            raise type(exc)(f"{what}: {exc}") from None

    def soon(self, command: Callable[[Any], Any]) -> None:
        """``command(channel)`` on the I/O thread, without waiting (acks)."""

        def run() -> None:
            if not self.closed:
                command(self.pika)

        self.connection.hand_over(run)

    def close(self) -> None:
        if self.closed or self.connection.broken.is_set():
            return
        try:
            self.call(lambda ch, done: (ch.add_on_close_callback(lambda *_: done()), ch.close()), "closing a channel")
        except JMSException as exc:
            log.debug("closing a channel: %s", exc)


# --- sessions ------------------------------------------------------------------------------------


class AmqpSession(Session):
    """A JMS session: one AMQP channel."""

    acknowledges_oldest = True  # basic.ack multiple up to a delivery

    def __init__(self, connection: AmqpConnection, transacted: bool, ack_mode: AckMode) -> None:
        self.connection = connection
        self.transacted = transacted
        self.ack_mode = ack_mode
        self.closed = False
        self._consumers: list[AmqpConsumer] = []
        self._unacked: list[_Delivery] = []  # handed over, not acknowledged (or not committed)
        self._ack_written: Future[None] | None = None  # the last paced basic.ack, once written
        self.recovering = False  # basic.recover sent, recover-ok not yet here (I/O thread)
        # confirms (I/O thread): delivery tag -> (settle, message id); message id -> tag
        self._unconfirmed: OrderedDict[int, tuple[Settle, str | None]] = OrderedDict()
        self._by_id: dict[str, int] = {}
        self._returned: dict[int, str] = {}
        self._answered: dict[int, str | None] = {}  # tag -> refusal (None: confirmed), not yet completed
        self._next_tag = 1
        self.channel = _Channel(connection)
        ch = self.channel
        ch.call(lambda c, done: c.basic_qos(prefetch_count=connection.options.prefetch, callback=done), "basic.qos")
        if transacted:
            ch.call(lambda c, done: c.tx_select(callback=done), "tx.select")
        else:
            ch.call(lambda c, done: c.confirm_delivery(self._confirmed, callback=done), "confirm.select")
            ch.soon(lambda c: c.add_on_return_callback(self._returned_message))

    # --- confirms (I/O thread) --------------------------------------------------------------------
    def publish(self, exchange: str, key: str, properties: Any, body: bytes, mandatory: bool, settle: Settle) -> None:
        """basic.publish on the I/O thread, without waiting for it: ``settle`` is called
        there with None on the broker's confirm (transacted: once published), or with
        the JMSException of the refusal or failure."""

        def run() -> None:
            if self.channel.closed:
                settle(JMSException(f"message {properties.message_id}: {self.channel.closed}"))
                return
            try:
                self.connection._pika.publish_frames(
                    self.channel.pika.channel_number, exchange, key, properties, body, mandatory
                )
            except Exception as exc:
                settle(
                    exc
                    if isinstance(exc, JMSException)
                    else TransportException(f"message {properties.message_id}: {exc}")
                )
                return
            if self.transacted:
                settle(None)
                return
            tag, self._next_tag = self._next_tag, self._next_tag + 1
            self._unconfirmed[tag] = (settle, properties.message_id)
            if properties.message_id:
                self._by_id[properties.message_id] = tag

        self.connection.hand_over(run)

    def _returned_message(self, _ch: Any, method: Any, properties: Any, _body: bytes) -> None:
        tag = self._by_id.get(properties.message_id or "")
        if tag is not None:
            self._returned[tag] = (
                f"returned by the broker: {method.reply_code} {method.reply_text} "
                f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
            )

    def _confirmed(self, frame: Any) -> None:
        """basic.ack / basic.nack (multiple: every tag up to it). RabbitMQ may answer out
        of order (a nack at once, the acks before it after their fsync): the outcomes are
        noted, and the Futures completed from the oldest on while the oldest is answered,
        so confirms complete in delivery-tag order."""
        method = frame.method
        nack = isinstance(method, Basic.Nack)
        upto = method.delivery_tag
        tags = (
            list(itertools.takewhile(lambda t: t <= upto, self._unconfirmed)) if method.multiple else [upto]
        )  # the tags are in ascending order
        for tag in tags:
            entry = self._unconfirmed.get(tag)
            if entry is None or tag in self._answered:
                continue
            returned = self._returned.pop(tag, None)
            if entry[1]:
                self._by_id.pop(entry[1], None)
            self._answered[tag] = (returned or "refused by the broker (basic.nack)") if nack or returned else None
        while self._unconfirmed:
            oldest = next(iter(self._unconfirmed))
            if oldest not in self._answered:
                return
            settle, message_id = self._unconfirmed.pop(oldest)
            why = self._answered.pop(oldest)
            settle(None if why is None else JMSException(f"message {message_id}: {why}"))

    def channel_lost(self, reason: str) -> None:
        """The connection is gone: fail what waits for a confirm, wake the receivers."""

        def run() -> None:
            waiting, self._unconfirmed = self._unconfirmed, OrderedDict()
            self._answered.clear()
            for settle, message_id in waiting.values():
                settle(TransportException(f"message {message_id}: {reason}"))

        try:
            self.connection.in_loop(run)
        except JMSException:
            run()
        for consumer in self._consumers:
            consumer.inbox.put(None)

    # --- Session API --------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the session is closed")
        self.connection._check()
        if self.channel.closed:
            raise JMSException(f"the session's channel is closed: {self.channel.closed}")

    def prefetch_at_least(self, count: int, max_bytes: int = 0) -> None:
        """basic.qos prefetch-count max(the URL's prefetch, ``count``) for the consumers
        created after it; prefetch-size stays 0 (RabbitMQ refuses any other: no byte bound)."""
        self._check()
        prefetch = min(max(self.connection.options.prefetch, count), PREFETCH_MOST)
        self.channel.call(lambda c, done: c.basic_qos(prefetch_count=prefetch, callback=done), "basic.qos")

    prefetch_adjustable = True  # basic.qos global reaches the open consumers

    def prefetch_at_most(self, count: int) -> None:
        """basic.qos global prefetch-count ``count``: the channel's consumers together, open
        or later, hold at most that many unacknowledged, over their own prefetch-count
        (RabbitMQ keeps both limits; a quorum queue ignores the global one). Sent without
        waiting, as an ack is: a link calls it between messages."""
        self._check()
        most = min(max(1, count), PREFETCH_MOST)
        self.channel.soon(lambda c: c.basic_qos(prefetch_count=most, global_qos=True))

    def create_temporary_queue(self) -> TemporaryQueue:
        self._check()
        frame = self.channel.call(
            lambda c, done: c.queue_declare("", exclusive=True, callback=done), "declaring a temporary queue"
        )
        return TemporaryQueue(frame.method.queue)

    def create_temporary_topic(self) -> TemporaryTopic:
        return TemporaryTopic(uuid.uuid4().hex)

    def create_producer(self, destination: Destination | None = None) -> AmqpProducer:
        self._check()
        return AmqpProducer(self, destination)

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> AmqpConsumer:
        return self._consumer(destination, selector, None)

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> AmqpConsumer:
        if self.connection.client_id is None:
            raise IllegalStateException("a durable subscription needs the connection's client id")
        return self._consumer(topic, selector, name)

    def _durable_queue(self, name: str) -> str:
        return f"{self.connection.client_id}.{name}"

    def _consumer(self, destination: Destination, selector: str | None, durable: str | None) -> AmqpConsumer:
        self._check()
        local = None
        if selector:
            if not destination.is_topic:
                raise InvalidSelectorError(
                    "an AMQP broker cannot select messages of a queue; a selector works on a topic only"
                )
            local = compile_selector(selector)
        ch = self.channel
        if destination.is_topic:
            exchange, key = route(destination)
            name = self._durable_queue(durable) if durable else ""
            frame = ch.call(
                lambda c, done: c.queue_declare(
                    name, durable=bool(durable), exclusive=not durable, auto_delete=not durable, callback=done
                ),
                f"declaring the queue of {destination}",
            )
            queue_name = frame.method.queue
            ch.call(lambda c, done: c.queue_bind(queue_name, exchange, key, callback=done), f"binding to {destination}")
        else:
            queue_name = destination.name
            self.connection.declare(queue_name)
        consumer = AmqpConsumer(self, destination, selector, local)
        frame = ch.call(
            lambda c, done: c.basic_consume(queue_name, consumer.deliver, callback=done),
            f"consuming from {destination}",
        )
        consumer.tag = frame.method.consumer_tag
        consumer.queue_name = queue_name
        self._consumers.append(consumer)
        return consumer

    def unsubscribe(self, name: str) -> None:
        self._check()
        queue_name = self._durable_queue(name)
        self.channel.call(
            lambda c, done: c.queue_delete(queue_name, callback=done), f"deleting durable subscription {name}"
        )

    def create_browser(self, queue: Queue, selector: str | None = None) -> QueueBrowser:
        raise JMSException("AMQP 0-9-1 cannot browse a queue")

    # --- acknowledgement ----------------------------------------------------------------------------
    def delivered(self, delivery: _Delivery) -> Message:
        consumer = delivery.consumer
        msg = from_amqp(
            delivery.properties,
            delivery.body,
            exchange=delivery.exchange,
            routing_key=delivery.routing_key,
            redelivered=delivery.redelivered,
            fallback=consumer.destination,
        )
        mode = self.ack_mode
        if mode in (AckMode.AUTO_ACKNOWLEDGE, AckMode.DUPS_OK_ACKNOWLEDGE) and not self.transacted:
            self._ack([delivery])
        else:
            self._unacked.append(delivery)
            if mode is AckMode.INDIVIDUAL_ACKNOWLEDGE:
                msg._ack = lambda: self._ack_one(delivery)
            elif mode is AckMode.CLIENT_ACKNOWLEDGE:
                msg._ack = self.acknowledge
        return msg

    def _ack(self, deliveries: list[_Delivery], paced: bool = False) -> None:
        """basic.ack on the I/O thread. ``paced`` (a client's acknowledge): first wait
        until the one before has been written, so at most one waits in this process: a
        crash then repeats what the broker never saw acknowledged, under two of a link's
        windows (a busy machine let the I/O thread fall three runs behind)."""
        if not deliveries:
            return
        if paced and self._ack_written is not None and not self._ack_written.done():
            self.connection.wait(self._ack_written, "an acknowledgement")
        if len(deliveries) > 1 and len(self._consumers) == 1:
            last = deliveries[-1].tag
            self.channel.soon(lambda c: c.basic_ack(last, multiple=True))
        else:
            tags = [d.tag for d in deliveries]
            self.channel.soon(lambda c: [c.basic_ack(t) for t in tags])
        if paced:  # (the I/O thread runs what it is handed in order: after the ack)
            written: Future[None] = Future()
            self._ack_written = written
            self.connection.hand_over(lambda: written.set_result(None))

    def _ack_one(self, delivery: _Delivery) -> None:
        if delivery in self._unacked:
            self._check()
            self._unacked.remove(delivery)
            self._ack([delivery])

    def acknowledge(self) -> None:
        if self.transacted or not self._unacked:
            return
        self._check()
        pending, self._unacked = self._unacked, []
        self._ack(pending, paced=True)

    def acknowledge_oldest(self, count: int) -> bool:
        """basic.ack (multiple) of the ``count`` oldest unacknowledged deliveries."""
        if self.transacted or self.ack_mode is not AckMode.CLIENT_ACKNOWLEDGE:
            return False
        self._check()
        done, self._unacked = self._unacked[:count], self._unacked[count:]
        self._ack(done, paced=True)
        return True

    def _requeue(self) -> None:
        """Every delivery of the channel not acknowledged goes back to its queue, marked
        redelivered: basic.recover requeue. What the inboxes hold, and what arrives until
        recover-ok (sent before the broker took them back), is dropped: it comes again,
        so the redelivery starts from the oldest."""

        def command(ch: Any, done: Callable[..., None]) -> None:
            self.recovering = True
            for consumer in self._consumers:
                consumer.inbox = queue.Queue()

            def recovered(frame: Any) -> None:
                self.recovering = False
                done(frame)

            ch.basic_recover(requeue=True, callback=recovered)

        self.channel.call(command, "basic.recover")
        self._unacked = []

    def recover(self) -> None:
        self._check()
        if self.transacted:
            raise IllegalStateException("recover() on a transacted session")
        self._requeue()

    def commit(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("commit() on a session that is not transacted")
        pending, self._unacked = self._unacked, []
        self._ack(pending)
        self.channel.call(lambda c, done: c.tx_commit(callback=done), "tx.commit")

    def rollback(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("rollback() on a session that is not transacted")
        self.channel.call(lambda c, done: c.tx_rollback(callback=done), "tx.rollback")
        self._requeue()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for consumer in list(self._consumers):
            consumer.closed = True
            consumer.inbox.put(None)
        self._consumers = []
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)
        self.channel.close()  # the broker requeues what the channel did not ack


class AmqpProducer(MessageProducer):
    def __init__(self, session: AmqpSession, destination: Destination | None) -> None:
        super().__init__(destination)
        self.session = session
        self._lock = threading.Condition()
        # published, their outcome not yet handed on: key -> what to tell (send order)
        self._outstanding: dict[int, Settle] = {}
        self._telling = 0  # outcomes being handed on right now
        self._keys = itertools.count()
        # Message ids: a random prefix per producer and a counter. A uuid4 per message
        # reads os.urandom, which gives the GIL away and waits to get it back from the
        # I/O thread: the largest cost of a send under load.
        self._id_prefix = f"ID:{uuid.uuid4()}:"
        self._ids = itertools.count(1)

    def _publish(
        self,
        message: Message,
        destination: Destination | None,
        tell: Settle,
        *,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> None:
        """Stamp and publish ``message``; ``tell`` gets its outcome once (see _settle)."""
        dest = destination or self.destination
        if dest is None:
            raise JMSException("send() needs a destination (the producer has none)")
        session = self.session
        session._check()
        self.stamp(
            message,
            dest,
            f"{self._id_prefix}{next(self._ids)}",
            delivery_mode=delivery_mode,
            priority=priority,
            time_to_live=time_to_live,
        )
        exchange, key = route(dest)
        if not dest.is_topic:
            session.connection.declare(dest.name)
        properties, body = to_amqp(message)
        number = next(self._keys)
        with self._lock:
            self._outstanding[number] = tell
        try:
            session.publish(
                exchange, key, properties, body, not dest.is_topic, lambda error: self._settle(number, error)
            )
        except BaseException:
            with self._lock:  # it never left: the caller hears of it, not ``tell``
                self._outstanding.pop(number, None)
                self._lock.notify_all()
            raise

    def _settle(self, number: int, error: BaseException | None) -> None:
        """Hand one send's outcome on, once: a confirm that comes after flush() gave up on
        it (or the other way round) changes nothing."""
        with self._lock:
            tell = self._outstanding.pop(number, None)
            if tell is None:
                return
            self._telling += 1
        try:
            tell(error)
        except Exception:
            log.exception("a completion listener failed")
        finally:
            with self._lock:
                self._telling -= 1
                if not self._outstanding and not self._telling:
                    self._lock.notify_all()

    def publish(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> Future[None]:
        """Send without waiting: the Future completes when the broker confirms this
        message (a JMSException naming it when refused or returned); confirms come in
        delivery-tag order, so many may be outstanding (pipelined publisher confirms)."""
        fut: Future[None] = Future()

        def tell(error: BaseException | None) -> None:
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

        self._publish(
            message, destination, tell, delivery_mode=delivery_mode, priority=priority, time_to_live=time_to_live
        )
        return fut

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        fut = self.publish(
            message, destination, delivery_mode=delivery_mode, priority=priority, time_to_live=time_to_live
        )
        if message.delivery_mode == DeliveryMode.PERSISTENT or self.confirm_sends:
            self.session.connection.wait(fut, f"the confirm of message {message.message_id}")

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
        """publish(), the confirm's outcome to ``listener`` (on the connection's I/O thread,
        or at once when it is known already), in send order; flush() waits for it. No
        Future per message: a busy link's sends are told their outcome directly."""

        def tell(error: BaseException | None) -> None:
            if error is None:
                listener.on_completion(message)
            else:
                listener.on_exception(
                    message,
                    error
                    if isinstance(error, JMSException)
                    else JMSException(f"message {message.message_id}: {error}"),
                )

        self._publish(
            message, destination, tell, delivery_mode=delivery_mode, priority=priority, time_to_live=time_to_live
        )

    def flush(self) -> None:
        """Wait until every message published so far is confirmed or refused and every
        send_async() listener was called; a refusal is not raised here (it is the
        message's Future's, or its listener's). Sends still unanswered after the
        connection's timeout, or when it is lost, fail with TransportException."""
        connection = self.session.connection
        deadline = time.monotonic() + connection.options.timeout
        with self._lock:
            while self._outstanding or self._telling:
                left = deadline - time.monotonic()
                if left <= 0 or connection.broken.is_set():
                    break
                self._lock.wait(min(left, 0.5))
            stuck = list(self._outstanding)
        reason = (
            f"the AMQP connection is lost: {connection.last_error}"
            if connection.broken.is_set()
            else f"no confirm from the AMQP broker within {connection.options.timeout:g} s"
        )
        for number in stuck:
            self._settle(number, TransportException(reason))

    def close(self) -> None:
        pass


class AmqpConsumer(PollingConsumer):
    listener_log = log

    def __init__(
        self, session: AmqpSession, destination: Destination, selector: str | None, local: Selector | None
    ) -> None:
        self.session = session
        self.destination = destination
        self._selector = selector
        self._local = local
        self.tag = ""
        self.queue_name = ""
        self.closed = False
        self.inbox: queue.Queue[_Delivery | None] = queue.Queue()
        self._backlog: tuple[float, int | None] = (-BACKLOG_EVERY, None)  # (asked at, answer)
        self._backlog_lock = threading.Lock()

    def backlog(self) -> int | None:
        """Messages waiting for this consumer: its queue's ready ones (queue.declare
        passive's message-count, on a channel of its own, since a refused passive declare
        closes its channel) plus those prefetched here and not handed over. Asked at most
        every BACKLOG_EVERY s (metrics, `list link -v`), the last answer meanwhile; None
        when the broker cannot be asked."""
        with self._backlog_lock:
            asked, answer = self._backlog
            if time.monotonic() - asked < BACKLOG_EVERY or self.closed or not self.queue_name:
                return answer
            name = self.queue_name
            try:
                channel = _Channel(self.session.connection)
                try:
                    frame = channel.call(
                        lambda c, done: c.queue_declare(name, passive=True, callback=done),
                        f"asking the depth of queue {name}",
                    )
                finally:
                    channel.close()
                answer = frame.method.message_count + self.inbox.qsize()
            except JMSException as exc:
                log.debug("backlog of %s: %s", name, exc)
                answer = None
            self._backlog = (time.monotonic(), answer)
            return answer

    def deliver(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        """pika's on_message_callback (I/O thread)."""
        if self.session.recovering:
            return  # requeued by the recover under way: it comes again
        self.inbox.put(
            _Delivery(
                self, method.delivery_tag, method.redelivered, method.exchange, method.routing_key, properties, body
            )
        )

    @property
    def message_selector(self) -> str | None:
        return self._selector

    def receive(self, timeout: float | None = None) -> Message | None:
        connection = self.session.connection
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            if self.closed:
                return None
            connection._check()
            left = None if deadline is None else deadline - time.monotonic()
            if not connection._started.is_set():
                if left is not None and left <= 0:
                    return None
                connection._started.wait(0.5 if left is None else min(left, 0.5))
                continue
            try:
                delivery = self.inbox.get(timeout=0.5 if left is None else max(0.0, min(left, 0.5)))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if delivery is None:
                continue
            message = self.session.delivered(delivery)
            if self._local is not None and not self._local.matches(message):
                if delivery in self.session._unacked:
                    self.session._unacked.remove(delivery)
                self.session._ack([delivery])  # a topic copy nobody here wants
                continue
            return message

    def listener_thread_name(self) -> str:
        return f"amqp listener {self.tag}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        session = self.session
        if self in session._consumers:
            session._consumers.remove(self)
        if not session.transacted:
            session._unacked = [d for d in session._unacked if d.consumer is not self]
        if session.connection.broken.is_set() or session.channel.closed:
            return
        tag = self.tag
        session.channel.call(lambda c, done: c.basic_cancel(tag, callback=done), "basic.cancel")

        def requeue() -> None:  # what was prefetched and not handed over
            while True:
                try:
                    delivery = self.inbox.get_nowait()
                except queue.Empty:
                    return
                if delivery is not None:
                    session.channel.pika.basic_nack(delivery.tag, requeue=True)

        session.connection.wait(session.connection.in_loop(requeue), "basic.nack")
        self.inbox.put(None)
