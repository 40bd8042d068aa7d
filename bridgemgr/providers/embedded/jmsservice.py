"""The host broker's ``jms`` connection service: remote clients reach the embedded broker.

How it works: a TCP (or TLS) server on the service's :class:`NetLoop`. Each accepted
socket is a :class:`_Link`, a thin asyncio protocol around a sans-IO
:class:`wire.Wire`: bytes in, events out, one handler per op (``_Link.HANDLERS``). After
HELLO is authenticated the link owns one :class:`EmbeddedConnection` of the broker, and
every remote session, consumer, transaction and XA branch is the embedded one, so the
broker's rules hold over the wire unchanged. When the socket closes for any reason,
closing that embedded connection gives back what the client held: unacknowledged
messages return to their queues (redelivered), open transactions roll back, unprepared
XA branches roll back, prepared ones stay in doubt for ``recover``, temporary
destinations go away.

Deliveries are pushed. A remote consumer (:class:`_RemoteConsumer`) takes messages from
its queue on the loop thread while it has room in its prefetch window, and otherwise
waits in the queue's ``waiters`` like an in-process consumer; the broker's wake-up
(``notify``, called under the broker lock from any thread) schedules another ``pump``
on the loop. Taken messages stay with the consumer ("in flight") until the client
reports them CONSUMED, which moves them into the session's work (or acknowledges them,
in AUTO/DUPS_OK) and frees room in the window; the window is refilled once a quarter of
it is free, so deliveries leave in batches (one write, one wake-up of the client for
many messages), while a message arriving for a waiting consumer goes out at once. A
clean close gives in-flight messages back as never delivered; a lost connection gives
them back as redelivered.

Requests run on the loop thread, except those that may wait for the store (XA
prepare/commit/rollback, unsubscribe): their handlers return a :class:`_Deferred`, run in
the service's thread pool and answered when done. Sends and commits when the store fsyncs
are applied on the loop thread and answered once their store batch is on disk: their
handlers return a :class:`_Durable` ticket, and one pool job per read waits for the
newest ticket (batches commit in order) and answers them all. Clients send nothing on a
session while such a request is pending, so a session's requests stay in order.

Security: nothing but HELLO is accepted before authentication, and frames are limited
to 64 KiB until then; a failed login is answered after ``auth_failure_delay`` and the
connection closes. With an ``authorizer(user, action, destination) -> bool`` the
service checks each destination a client produces to, consumes from or browses
(actions ``produce``, ``consume``, ``browse``; temporary destinations are the client's
own and always allowed). Passwords are never logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, cast

from ... import __version__
from ...admin.portmapper import ServiceEntry
from ...jms import codec, xa
from ...jms.destination import Destination, Topic
from ...jms.errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    JMSSecurityException,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from ...jms.selector import compile_selector
from ...jms.spi import AckMode
from ...netloop import NetLoop
from . import wire
from .broker import Broker
from .client import EmbeddedConnection, EmbeddedConsumer, EmbeddedSession, EmbeddedXASession
from .queues import Envelope

log = logging.getLogger(__name__)

Authenticator = Callable[[str | None, str | None], bool]
Authorizer = Callable[[str | None, str, Destination], bool]

MIN_HEARTBEAT = 0.05
READ_BUFFER = 65536   # bytes one read of a connection takes at most
BROWSE_PAGE_MESSAGES = 500
BROWSE_PAGE_BYTES = 1 << 20
MAX_PREFETCH = 65536
_HELLO, _INDIVIDUAL = wire.Op.HELLO, AckMode.INDIVIDUAL_ACKNOWLEDGE


class JmsService:
    """The ``jms`` service: ``start()``, ``port``, ``stop()``; one broker, one loop."""

    def __init__(self, broker: Broker, netloop: NetLoop, host: str | None = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None, authenticator: Authenticator | None = None,
                 authorizer: Authorizer | None = None, *, heartbeat: float = 30.0,
                 max_frame: int = wire.DEFAULT_MAX_FRAME, handshake_timeout: float = 10.0,
                 auth_failure_delay: float = 0.5, threads: int = 8) -> None:
        self.broker = broker
        self.netloop = netloop
        self.host = host
        self.ssl_context = ssl_context
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.heartbeat = heartbeat
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self.auth_failure_delay = auth_failure_delay
        self.links: set[_Link] = set()
        self._port = port
        self._server: asyncio.Server | None = None
        self._threads = threads
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.loop_thread: int | None = None

    @property
    def port(self) -> int:
        return self._port

    def service_entry(self) -> ServiceEntry:
        """This service's port mapper line (``jms tcp`` or ``ssljms tls``)."""
        if self.ssl_context is not None:
            return ServiceEntry("ssljms", "tls", "NORMAL", self._port)
        return ServiceEntry("jms", "tcp", "NORMAL", self._port)

    def start(self) -> JmsService:
        self.executor = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="imq-jms")

        async def listen() -> asyncio.Server:
            self.loop_thread = threading.get_ident()
            return await asyncio.get_running_loop().create_server(
                lambda: _Link(self), self.host, self._port, ssl=self.ssl_context, reuse_address=True)
        self._server = self.netloop.run(listen())
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("jms service listening on %s:%d (%s)", self.host or "*", self._port,
                 "tls" if self.ssl_context else "tcp")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening and close every client connection (each gives back what it held)."""
        server, self._server = self._server, None
        if server is None:
            return

        async def close() -> None:
            server.close()
            for link in list(self.links):
                link.fail(TransportException("the jms service is stopping"))
            deadline = time.monotonic() + timeout
            while self.links and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        try:
            self.netloop.run(close(), timeout=timeout + 1)
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True, cancel_futures=True)

    def authenticate(self, user: str | None, password: str | None) -> bool:
        if self.authenticator is not None:
            return bool(self.authenticator(user, password))
        try:
            self.broker.authenticate(user, password)
        except JMSSecurityException:
            return False
        return True


class _Session:
    """Service-side state of a remote session beside its embedded session."""

    __slots__ = ("by_tag", "failed", "s", "sid", "tags")

    def __init__(self, sid: int, session: EmbeddedSession) -> None:
        self.sid = sid
        self.s = session
        self.tags = itertools.count(1)
        self.by_tag: dict[int, Envelope] = {}      # INDIVIDUAL_ACKNOWLEDGE: consumed, unacked
        self.failed: JMSException | None = None    # an asynchronous send of the transaction failed


class _RemoteConsumer(EmbeddedConsumer):
    """An embedded consumer whose messages go to a remote client (see the module notes)."""

    def __init__(self, link: _Link, session: _Session, cid: int, destination: Destination,
                 selector: str | None, prefetch: int, durable_name: str | None) -> None:
        super().__init__(session.s, destination, selector, durable_name)
        self.link = link
        self.remote = session
        self.cid = cid
        self.prefetch = prefetch          # 0: a pull consumer (see wire's notes)
        self.refill = max(1, prefetch // 4)  # CONSUMED refills the window in batches this big
        self.credit = 0                   # PULL credits of a pull consumer
        self.inflight: dict[int, Envelope] = {}
        self._scheduled = False

    def room(self) -> int:
        return self.prefetch - len(self.inflight) if self.prefetch else self.credit

    # called by the broker under its lock, from any thread
    def can_take(self, message: Any) -> bool:
        return self.room() > 0 and not self.link.paused and super().can_take(message)

    def notify(self) -> None:
        self.schedule()

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self.link.call_soon(self.pump)

    def pump(self) -> None:
        """Deliver while the window has room; then wait in the queue for the next message."""
        self._scheduled = False
        link = self.link
        if self.closed or link.closed:
            return
        out = []
        broker, inflight, tags = self.broker, self.inflight, self.remote.tags
        while self.room() > 0 and not link.paused:
            env = broker.receive(self, 0, False)
            if env is None:
                with broker.lock:  # park, then look once more: no wake-up can be missed
                    if self not in self.queue.waiters:
                        self.queue.waiters.append(self)
                env = broker.receive(self, 0, False)
                if env is None:
                    break
            tag = next(tags)
            inflight[tag] = env
            if not self.prefetch:
                self.credit -= 1
            blob = env.wire if env.wire is not None else codec.encode(env.message)
            out.append(wire.delivery(self.cid, tag, env.dcount, blob))
        if out:
            link.write(b"".join(out))

    def give_back(self, seen: bool) -> None:
        """Return in-flight messages to the queue; ``seen=False``: as never delivered."""
        envs = list(self.inflight.values())
        self.inflight.clear()
        self.credit = 0
        if not seen:
            for env in envs:
                env.dcount -= 1
        if envs:
            self.broker.redeliver(envs)

    def close(self) -> None:
        if not self.closed:
            self.give_back(seen=True)
            with self.broker.lock:  # unpark: the queue keeps waiters that cannot take
                waiters = self.queue.waiters
                while self in waiters:
                    waiters.remove(self)
        super().close()


class _Deferred:
    """A handler's answer that must wait: run ``fn`` in the thread pool, reply its result."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class _Durable:
    """A handler's answer once store batch ``ticket`` is durable (see the module notes)."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket


class _Link(asyncio.BufferedProtocol):
    """One remote connection. It reads into a buffer of its own (BufferedProtocol): a plain
    Protocol gets a fresh 256 KiB bytes object per read, which costs more than the read."""

    def __init__(self, service: JmsService) -> None:
        self.service = service
        self.broker = service.broker
        self.loop = asyncio.get_running_loop()
        self.wire = wire.Wire(wire.Role.SERVER, service.max_frame)
        self._rbuf = memoryview(bytearray(READ_BUFFER))
        self.transport: asyncio.Transport | None = None
        self.conn: EmbeddedConnection | None = None
        self.user: str | None = None
        self.peer = "?"
        self.closed = False
        self.paused = False
        self.sessions: dict[int, _Session] = {}
        self.consumers: dict[int, _RemoteConsumer] = {}
        self.browsers: dict[int, list[Any]] = {}
        self._browser_ids = itertools.count(1)
        self._allowed: dict[tuple[str, Destination], bool] = {}
        self._outq: list[bytes] = []
        self._flush_scheduled = False
        self._draining = False                  # handling what one read brought
        self._after_drain: list[Callable[[], None]] = []  # ... and what runs at its end
        self._durable: list[tuple[int, int | None, int]] = []  # (call, sid, ticket) answered once durable
        self.closing = False                    # CLOSE answered: close once written
        self.halted = False                     # login refused: read nothing more
        self.interval = 0.0
        self.last_read = self.last_write = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    # --- transport events --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream server's: always a Transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.service.links.add(self)
        self.write(wire.PREAMBLE)
        self._timer = self.loop.call_later(self.service.handshake_timeout, self._handshake_expired)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        """Handle what arrived, then run what it woke on this connection (deliveries) and
        write all the answers in one send, in this loop iteration."""
        self.last_read = time.monotonic()
        self.wire.receive_data(self._rbuf[:nbytes])
        self._draining = True
        try:
            self._drain()
            while self._after_drain:
                after, self._after_drain = self._after_drain, []
                for fn in after:
                    fn()
        finally:
            self._draining = False
            self._after_drain.clear()
        if self._durable:
            self._answer_when_durable()
        if self._outq and not self.closed:
            self._flush()

    def _answer_when_durable(self) -> None:
        """One pool job waits for the newest ticket of this read, then answers them all."""
        waiting, self._durable = self._durable, []
        ticket = max(t for _, _, t in waiting)
        future = self.loop.run_in_executor(self.service.executor, self.broker.wait_durable, ticket)

        def done(f: asyncio.Future) -> None:
            exc = f.exception()
            for call, sid, _ in waiting:
                if exc is None:
                    if call:
                        self.write(wire.reply(call, None))
                elif isinstance(exc, JMSException):
                    self._answer_error(call, sid, exc)
                else:
                    log.error("jms client %s: waiting for the store failed", self.peer, exc_info=exc)
                    self._answer_error(call, sid, JMSException(f"internal error: {exc}"))
            self._flush()  # now, not in another loop iteration: the clients wait for these
        future.add_done_callback(done)

    def _drain(self) -> None:
        """Handle every complete request received."""
        try:
            while not (self.closed or self.closing or self.halted) and (event := self.wire.next_event()) is not None:
                if event.__class__ is wire.Request:
                    self._request(event)
        except wire.ProtocolError as exc:
            log.warning("jms client %s broke the protocol: %s", self.peer, exc)
            self.fail(exc)
            return
        if self.closing and self.transport is not None:
            self._flush()
            self.closed = True
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.service.links.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()  # gives back everything this client held (module notes)
            except Exception:
                log.exception("jms client %s: releasing its connection failed", self.peer)
            log.info("jms client %s (user %s) disconnected%s", self.peer, self.user,
                     f": {exc}" if exc else "")

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for consumer in self.consumers.values():
            consumer.schedule()

    # --- writing -----------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue ``data``; what one loop iteration writes goes out in one send (a system
        call wakes the client, which costs more than the bytes)."""
        if self.closed or self.transport is None:
            return
        self._outq.append(data)
        if not (self._flush_scheduled or self._draining):  # draining: written at its end
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._outq and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._outq) if len(self._outq) > 1 else self._outq[0])
            self.last_write = time.monotonic()
        self._outq.clear()

    def call_soon(self, fn: Callable[[], None]) -> None:
        if threading.get_ident() == self.service.loop_thread:
            if self._draining:
                self._after_drain.append(fn)
            else:
                self.loop.call_soon(fn)
        else:
            self.loop.call_soon_threadsafe(fn)

    def fail(self, exc: JMSException) -> None:
        """Tell the client why (an ERROR frame) and close the connection."""
        if self.closed or self.transport is None:
            return
        self.write(wire.failure(0, exc, fatal=True))
        self._flush()
        self.closed = True
        self.transport.close()

    # --- timers ------------------------------------------------------------------------------------
    def _handshake_expired(self) -> None:
        if self.conn is None and not self.closed:
            self.fail(wire.ProtocolError(f"no HELLO within {self.service.handshake_timeout:g} s"))

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self.last_read > 3 * self.interval:
            log.warning("jms client %s sent nothing for %.1f s; taking it for dead", self.peer,
                        now - self.last_read)
            self.fail(TransportException(f"no heart-beat from the client for {now - self.last_read:.1f} s"))
            return
        if now - self.last_write >= self.interval * 0.9:
            self.write(wire.HEARTBEAT)
        self._timer = self.loop.call_later(self.interval / 2, self._beat)

    # --- requests -------------------------------------------------------------------------------------
    def _request(self, req: wire.Request) -> None:
        op = req.op
        if op is _HELLO:
            self._hello(req)
            return
        sid = req.args[0] if op in _SESSION_OPS else None
        try:
            result = self.HANDLERS[op](self, *req.args)
        except JMSException as exc:
            self._answer_error(req.call, sid, exc)
            return
        except Exception as exc:  # a bug here must not take the service down
            log.exception("jms client %s: %s failed", self.peer, op.name)
            self._answer_error(req.call, sid, JMSException(f"internal error in {op.name}: {exc}"))
            return
        if result.__class__ is _Durable:
            self._durable.append((req.call, sid, result.ticket))
        elif result.__class__ is _Deferred:
            self._defer(req.call, sid, result.fn)
        elif req.call:
            self.write(wire.reply(req.call, result))

    def _answer_error(self, call: int, sid: int | None, exc: JMSException) -> None:
        if call:
            self.write(wire.failure(call, exc))
            return
        session = self.sessions.get(sid) if sid is not None else None
        if session is not None and session.s._work_now() is not None:
            session.failed = session.failed or exc  # its commit (or XA end) fails with it
            return
        self.write(wire.failure(0, exc, session=sid))

    def _defer(self, call: int, sid: int | None, fn: Callable[[], Any]) -> None:
        future = self.loop.run_in_executor(self.service.executor, fn)

        def done(f: asyncio.Future) -> None:
            exc = f.exception()
            if exc is None:
                if call:
                    self.write(wire.reply(call, f.result()))
            elif isinstance(exc, JMSException):
                self._answer_error(call, sid, exc)
            else:
                log.error("jms client %s: request failed", self.peer, exc_info=exc)
                self._answer_error(call, sid, JMSException(f"internal error: {exc}"))
            self._flush()  # now, not in another loop iteration: the client waits for it
        future.add_done_callback(done)

    def _hello(self, req: wire.Request) -> None:
        """Authenticate in the pool (checking a password may be slow on purpose); read
        nothing more until that is done."""
        user, password = req.args[:2]
        self.halted = True
        future = self.loop.run_in_executor(self.service.executor, self.service.authenticate, user, password)
        future.add_done_callback(partial(self._hello_done, req))

    def _hello_done(self, req: wire.Request, future: asyncio.Future) -> None:
        user, _, heartbeat_ms, client = req.args
        if self.closed:
            return
        if future.exception() is not None:
            log.error("jms client %s: the authenticator failed", self.peer, exc_info=future.exception())
        if future.exception() is not None or not future.result():
            log.warning("jms client %s (%s): authentication failed for user %r", self.peer, client, user)
            self.loop.call_later(self.service.auth_failure_delay, self.fail,
                                 JMSSecurityException(f"authentication failed for user {user!r}"))
            return
        try:
            conn = EmbeddedConnection(self.broker, user)
            self.broker.attach(conn)
        except JMSException as exc:
            self.fail(exc)
            return
        conn.set_exception_listener(self._broker_gone)
        self.conn, self.user = conn, user
        self.wire.open()
        mine, theirs = self.service.heartbeat, heartbeat_ms / 1000
        self.interval = max(MIN_HEARTBEAT, min(x for x in (mine, theirs, 3600.0) if x > 0))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.interval / 2, self._beat)
        log.info("jms client %s (%s) connected as %r", self.peer, client, user)
        self.write(wire.reply(req.call, {
            "instance": self.broker.instance_name, "rm_id": self.broker.rm_id,
            "provider": Broker.provider_name, "version": __version__, "protocol": wire.VERSION,
            "heartbeat_ms": int(self.interval * 1000), "max_frame": self.service.max_frame}))
        self.halted = False
        self._drain()

    def _broker_gone(self, exc: JMSException) -> None:
        self.loop.call_soon_threadsafe(self.fail, exc)

    # --- lookups and checks ---------------------------------------------------------------------
    def _session(self, sid: int) -> _Session:
        session = self.sessions.get(sid)
        if session is None:
            raise IllegalStateException(f"session {sid} does not exist (closed?)")
        return session

    def _check(self, action: str, dest: Destination) -> None:
        authorizer = self.service.authorizer
        if authorizer is None or dest.is_temporary:
            return
        key = (action, dest)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = self._allowed[key] = bool(authorizer(self.user, action, dest))
        if not allowed:
            raise JMSSecurityException(f"user {self.user!r} may not {action} {dest}")

    def _give_back_unseen(self, consumers: Any) -> None:
        for consumer in list(consumers):
            consumer.give_back(seen=False)

    # --- handlers (one per op; arguments as wire.ARGS lists them) ---------------------------------
    def _close(self) -> None:
        conn, self.conn = self.conn, None
        assert conn is not None
        self._give_back_unseen(self.consumers.values())
        self.consumers.clear()
        conn.close()
        self.closing = True

    def _set_client_id(self, client_id: str) -> None:
        assert self.conn is not None  # (requests come after HELLO)
        self.conn.client_id = client_id

    def _start(self) -> None:
        assert self.conn is not None
        self.conn.start()
        for consumer in self.consumers.values():
            consumer.schedule()

    def _stop(self) -> None:
        assert self.conn is not None
        self.conn.stop()

    def _new_session(self, sid: int, transacted: bool, ack_mode: int, xa: bool) -> None:
        if sid in self.sessions:
            raise IllegalStateException(f"session {sid} already exists")
        conn = self.conn
        assert conn is not None
        try:
            mode = AckMode(ack_mode)
        except ValueError:
            raise IllegalStateException(f"unknown acknowledge mode {ack_mode}") from None
        session = conn.create_xa_session() if xa else conn.create_session(transacted, mode)
        self.sessions[sid] = _Session(sid, session)

    def _close_session(self, sid: int) -> None:
        session = self.sessions.pop(sid, None)
        if session is None:
            return
        mine = [c for c in self.consumers.values() if c.remote is session]
        self._give_back_unseen(mine)
        for consumer in mine:
            del self.consumers[consumer.cid]
        session.s.close()

    def _new_consumer(self, sid: int, cid: int, dest: Destination, selector: str | None, no_local: bool,
                      durable_name: str | None, prefetch: int) -> None:
        session = self._session(sid)
        if cid in self.consumers:
            raise IllegalStateException(f"consumer {cid} already exists")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise IllegalStateException(f"prefetch {prefetch} is outside 0..{MAX_PREFETCH}")
        session.s._check_open()
        self._check("consume", dest)
        consumer = _RemoteConsumer(self, session, cid, dest, selector, prefetch, durable_name)
        if durable_name is not None:
            if not isinstance(dest, Topic):
                raise InvalidDestinationException(f"a durable subscription needs a topic, not {dest}")
            consumer.queue = self.broker.durable_queue(consumer, dest, durable_name, selector, no_local)
        else:
            consumer.queue = self.broker.queue_for_consumer(consumer, dest, selector, no_local)
        session.s.consumers.append(consumer)
        self.consumers[cid] = consumer
        consumer.schedule()

    def _close_consumer(self, sid: int, cid: int) -> None:
        consumer = self.consumers.pop(cid, None)
        if consumer is not None:
            consumer.give_back(seen=False)
            consumer.close()

    def _unsubscribe(self, sid: int, name: str) -> _Deferred:
        session = self._session(sid)
        return _Deferred(partial(session.s.unsubscribe, name))

    def _temp_create(self, sid: int, topic: bool) -> Destination:
        session = self._session(sid).s
        return session.create_temporary_topic() if topic else session.create_temporary_queue()

    def _temp_delete(self, sid: int, dest: Destination) -> None:
        self._session(sid).s.delete_temporary(dest)

    def _send(self, sid: int, blob: bytes) -> Any:
        session = self._session(sid)
        s = session.s
        s._check_open()
        message = codec.decode(blob)
        dest = message.destination
        if dest is None:
            raise InvalidDestinationException("a SEND without a destination header")
        self._check("produce", dest)
        if s._work_now() is None and self.broker.sync:
            ticket = self.broker.send(s.connection, message, dest, blob)
            return None if ticket is None else _Durable(ticket)
        s._send(message, dest, blob)  # into the transaction, or to the broker without waiting
        return None

    def _consumed(self, sid: int, cid: int, tags: list[int]) -> None:
        session = self._session(sid)
        consumer = self.consumers.get(cid)
        if consumer is None:
            return  # closed meanwhile: what it had in flight went back already
        inflight = consumer.inflight
        envs = [inflight.pop(t) for t in tags if t in inflight]
        s = session.s
        if s._acks_now():
            self.broker.acknowledge(envs)
        else:
            work = s._work_now() or s._work
            individual = s.ack_mode is _INDIVIDUAL and work is s._work
            for tag, env in zip(tags, envs):
                env.owner = work
                work.acks.append(env)
                if individual:
                    session.by_tag[tag] = env
        if consumer.room() >= consumer.refill:
            consumer.schedule()

    def _return(self, sid: int, cid: int, tags: list[int], seen: bool) -> None:
        consumer = self.consumers.get(cid)
        if consumer is None:
            return
        envs = [consumer.inflight.pop(t) for t in tags if t in consumer.inflight]
        if not seen:
            for env in envs:
                env.dcount -= 1
        self.broker.redeliver(envs)
        consumer.schedule()

    def _pull(self, sid: int, cid: int, n: int) -> None:
        consumer = self.consumers.get(cid)
        if consumer is None:
            return
        if n < 0:
            consumer.credit = 0
        elif n > 0:
            consumer.credit += n if not consumer.prefetch else 0
            consumer.schedule()
        elif consumer.prefetch:  # n == 0: deliver now, before this request's reply
            consumer.pump()
        else:
            consumer.credit = 1
            consumer.pump()
            consumer.credit = 0

    def _acknowledge(self, sid: int) -> None:
        session = self._session(sid)
        session.by_tag.clear()
        session.s.acknowledge()

    def _ack_one(self, sid: int, tag: int) -> None:
        session = self._session(sid)
        env = session.by_tag.pop(tag, None)
        if env is not None:
            self.broker.acknowledge_work(session.s._work, env)

    def _restart_session(self, session: _Session, undo: Callable[[], None]) -> None:
        """recover/rollback: in-flight messages go back unseen, then the session's work is undone."""
        mine = [c for c in self.consumers.values() if c.remote is session]
        self._give_back_unseen(mine)
        session.by_tag.clear()
        session.failed = None
        undo()
        for consumer in mine:
            consumer.schedule()

    def _recover(self, sid: int) -> None:
        session = self._session(sid)
        self._restart_session(session, session.s.recover)

    def _rollback(self, sid: int) -> None:
        session = self._session(sid)
        self._restart_session(session, session.s.rollback)

    def _commit(self, sid: int) -> Any:
        session = self._session(sid)
        if session.failed is not None:
            failed = session.failed
            self._rollback(sid)
            raise TransactionRolledBackException(
                f"the transaction was rolled back because a send in it failed: {failed}")
        ticket = session.s.commit_no_wait()
        return _Durable(ticket) if ticket is not None and self.broker.sync else None

    def _browse(self, sid: int, queue: Any, selector: str | None) -> list[Any]:
        self._session(sid).s._check_open()
        self._check("browse", queue)
        messages = self.broker.browse(queue, compile_selector(selector))
        bid = next(self._browser_ids)
        self.browsers[bid] = messages
        return [bid, *self._browse_more(bid)]

    def _browse_more(self, bid: int) -> list[Any]:
        messages = self.browsers.get(bid)
        if messages is None:
            raise IllegalStateException(f"browser {bid} is closed")
        page: list[bytes] = []
        size = 0
        while messages and len(page) < BROWSE_PAGE_MESSAGES and size < BROWSE_PAGE_BYTES:
            blob = codec.encode(messages.pop(0))
            page.append(blob)
            size += len(blob)
        if not messages:
            del self.browsers[bid]
        return [page, not messages]

    def _browse_close(self, bid: int) -> None:
        self.browsers.pop(bid, None)

    def _xa_session(self, sid: int) -> EmbeddedXASession:
        s = self._session(sid).s
        if not isinstance(s, EmbeddedXASession):
            raise IllegalStateException(f"session {sid} is not an XA session")
        return s

    def _xa_start(self, sid: int, xid: Any, flags: int) -> None:
        self._xa_session(sid).xa_resource.start(xid, flags)

    def _xa_end(self, sid: int, xid: Any, flags: int) -> None:
        s = self._xa_session(sid)
        session = self.sessions[sid]
        failed, session.failed = session.failed, None
        if failed is not None and not flags & xa.TMFAIL:
            s.xa_resource.end(xid, xa.TMFAIL)
            raise XAException(f"end: branch {xid} is rollback-only because a send in it failed: {failed}",
                              xa.XA_RBROLLBACK)
        s.xa_resource.end(xid, flags)

    def _xa_prepare(self, xid: Any) -> Any:
        return _Deferred(partial(self.broker.xa_prepare, xid))

    def _xa_commit(self, xid: Any, one_phase: bool) -> Any:
        return _Deferred(partial(self.broker.xa_commit, xid, one_phase))

    def _xa_rollback(self, xid: Any) -> Any:
        return _Deferred(partial(self.broker.xa_rollback, xid))

    def _xa_recover(self, flags: int) -> list[list[Any]]:
        return [[x.format_id, x.gtrid, x.bqual] for x in self.broker.xa_recover()]

    def _xa_forget(self, xid: Any) -> None:
        self.broker.xa_forget(xid)

    HANDLERS: ClassVar[dict[wire.Op, Callable[..., Any]]] = {
        wire.Op.CLOSE: _close,
        wire.Op.SET_CLIENT_ID: _set_client_id,
        wire.Op.START: _start,
        wire.Op.STOP: _stop,
        wire.Op.SESSION: _new_session,
        wire.Op.SESSION_CLOSE: _close_session,
        wire.Op.CONSUMER: _new_consumer,
        wire.Op.CONSUMER_CLOSE: _close_consumer,
        wire.Op.UNSUBSCRIBE: _unsubscribe,
        wire.Op.TEMP_CREATE: _temp_create,
        wire.Op.TEMP_DELETE: _temp_delete,
        wire.Op.SEND: _send,
        wire.Op.CONSUMED: _consumed,
        wire.Op.RETURN: _return,
        wire.Op.PULL: _pull,
        wire.Op.ACKNOWLEDGE: _acknowledge,
        wire.Op.ACK_ONE: _ack_one,
        wire.Op.RECOVER: _recover,
        wire.Op.COMMIT: _commit,
        wire.Op.ROLLBACK: _rollback,
        wire.Op.BROWSE: _browse,
        wire.Op.BROWSE_MORE: _browse_more,
        wire.Op.BROWSE_CLOSE: _browse_close,
        wire.Op.XA_START: _xa_start,
        wire.Op.XA_END: _xa_end,
        wire.Op.XA_PREPARE: _xa_prepare,
        wire.Op.XA_COMMIT: _xa_commit,
        wire.Op.XA_ROLLBACK: _xa_rollback,
        wire.Op.XA_RECOVER: _xa_recover,
        wire.Op.XA_FORGET: _xa_forget,
    }


# Ops whose first argument is a session id (an asynchronous failure names it).
_SESSION_OPS = frozenset({wire.Op.SEND, wire.Op.CONSUMED, wire.Op.RETURN, wire.Op.SESSION_CLOSE,
                          wire.Op.CONSUMER, wire.Op.CONSUMER_CLOSE, wire.Op.ACKNOWLEDGE, wire.Op.ACK_ONE,
                          wire.Op.COMMIT, wire.Op.ROLLBACK, wire.Op.RECOVER})
