"""The host broker's ``jms`` connection service: remote clients reach the embedded broker.

A TCP (or TLS) server on the service's :class:`NetLoop`, with guard.py's accept loop. Each
accepted socket is a :class:`ClientProtocol`, a thin asyncio shell around a sans-IO
:class:`clientconn.ClientConnection` (the client's protocol state, sessions and consumers,
its request handlers): the shell feeds it what each read brings, writes what it has to send,
runs its blocking calls in the service's thread pool, keeps the login and heart-beat timers,
and closes the socket once the connection is closed, which gives back what the client held.

Rules: the service's :class:`ServiceGuard` applies (imq.jms.max_connections,
imq.jms.login.timeout, imq.jms.max_unauthenticated_per_address, the shared login throttle);
nothing but HELLO is accepted before authentication, the access controls decide the rest,
and passwords are never logged; no thread waits on a send the broker holds (it calls back).

Design notes: docs/embedded-broker.md#internals-providersembeddedjmsservicepy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from ...admin.portmapper import ServiceEntry
from ...guard import Admission, Listener, ServiceGuard, listen, peer_address, refuse
from ...jms.errors import JMSException, JMSSecurityException, ResourceAllocationException, TransportException
from ...netloop import NetLoop
from . import wire
from .broker import Broker
from .clientconn import Authenticate, BlockingCall, ClientConnection, Locate, State

if TYPE_CHECKING:
    from ...accesscontrol import AccessControls
    from ...jms.hostbroker import Principal

log = logging.getLogger(__name__)

READ_BUFFER = 65536  # bytes one read of a connection takes at most


class JmsService:
    """The ``jms`` service: ``start()``, ``port``, ``stop()``; one broker, one loop."""

    def __init__(
        self,
        broker: Broker,
        netloop: NetLoop,
        host: str | None = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        authenticator: Authenticate | None = None,
        access: AccessControls | None = None,
        *,
        heartbeat: float = 30.0,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        guard: ServiceGuard | None = None,
        threads: int = 8,
        brokerid: str | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.broker = broker
        self.netloop = netloop
        self.host = host
        self.ssl_context = ssl_context
        self.authenticator = authenticator
        self.access = access
        self.brokerid, self.locate = brokerid, locate  # an HA instance's (clientconn.Locate)
        self.heartbeat = heartbeat
        self.max_frame = max_frame
        self.guard = guard or ServiceGuard("jms")
        self.connections: set[ClientProtocol] = set()
        self._port = port
        self._server: Listener | None = None
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

        async def start() -> Listener:
            self.loop_thread = threading.get_ident()
            return await listen(
                lambda admission: ClientProtocol(self, admission),
                self.host,
                self._port,
                name=f"{self.service_entry().name} service",
                pending=self.guard.unauthenticated,
                refusal=_refusal,
                ssl_context=self.ssl_context,
                handshake_timeout=self.guard.login_timeout,
            )

        self._server = self.netloop.run(start())
        self._port = self._server.port
        log.info(
            "jms service listening on %s:%d (%s)", self.host or "*", self._port, "tls" if self.ssl_context else "tcp"
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening and close every client connection (each gives back what it held)."""
        server, self._server = self._server, None
        if server is None:
            return

        async def close() -> None:
            server.close()
            for conn in list(self.connections):
                conn.fail(TransportException("the jms service is stopping"))
            deadline = time.monotonic() + timeout
            while self.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        try:
            self.netloop.run(close(), timeout=timeout + 1)
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True, cancel_futures=True)

    def authenticate(self, user: str | None, password: str | None) -> Principal | bool | None:
        if self.authenticator is not None:
            return self.authenticator(user, password)
        try:
            self.broker.authenticate(user, password)
        except JMSSecurityException:
            return False
        return True


def _refusal(reason: str) -> bytes:
    """The preamble and the fatal ERROR that refuse a connection before HELLO."""
    return wire.PREAMBLE + wire.failure(0, ResourceAllocationException(reason), fatal=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """From any thread; nothing when the loop has stopped (the broker closing after us)."""
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:
        pass


class ClientProtocol(asyncio.BufferedProtocol):
    """One client socket: bytes in and out of its :class:`ClientConnection`. It reads into
    a buffer of its own (BufferedProtocol): a plain Protocol gets a fresh 256 KiB bytes
    object per read, which costs more than the read."""

    def __init__(self, service: JmsService, admission: Admission) -> None:
        self.service = service
        self.admission = admission  # counted until its HELLO is accepted (or it closes)
        self.loop = asyncio.get_running_loop()
        self.client = ClientConnection(
            service.broker,
            authenticate=service.authenticate,
            post=self.post,
            access=service.access,
            locate=service.locate,
            brokerid=service.brokerid,
            heartbeat=service.heartbeat,
            max_frame=service.max_frame,
            now=time.monotonic(),
        )
        self.transport: asyncio.Transport | None = None
        self._rbuf = memoryview(bytearray(READ_BUFFER))
        self._flush_scheduled = False
        self._draining = False  # handling what one read brought
        self._after_drain: list[Callable[[], None]] = []  # ... and what runs at its end
        self._timer: asyncio.TimerHandle | None = None
        self._beating = False  # the timer is the heart-beat's, not the login's
        self._login: asyncio.Task[None] | None = None  # a HELLO waiting for the login throttle
        self.peer = "?"  # the client's address, for the login throttle

    # --- transport events --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.client.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.peer = peer_address(transport)
        guard = self.service.guard
        refusal = guard.refusal(len(self.service.connections), self.peer)
        if refusal is not None:
            self.client.fail(ResourceAllocationException(refusal))
            refuse(cast(asyncio.Transport, transport), self.client.data_to_send(time.monotonic()))  # with the preamble
            return
        self.service.connections.add(self)
        self._flush()  # the preamble
        self._timer = self.loop.call_later(guard.login_timeout, self._login_expired)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        """Handle what arrived, then run what it woke on this connection (deliveries) and
        write all the answers in one send, in this loop iteration."""
        if self.client.closed:  # refused or failed: nothing more is read
            return
        self._draining = True
        try:
            self.client.receive_data(self._rbuf[:nbytes], time.monotonic())
            while self._after_drain:
                after, self._after_drain = self._after_drain, []
                for fn in after:
                    fn()
        finally:
            self._draining = False
            self._after_drain.clear()
        self._settle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._login is not None:
            self._login.cancel()
        self.admission.release()
        self.client.connection_lost(exc)

    def pause_writing(self) -> None:
        self.client.set_writable(False)

    def resume_writing(self) -> None:
        self.client.set_writable(True)

    # --- what the client connection needs ----------------------------------------------------
    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop (from any thread); on the loop while a read is handled,
        at the end of that read, so its output leaves with the read's answers."""
        if threading.get_ident() == self.service.loop_thread:
            if self._draining:
                self._after_drain.append(fn)
            else:
                self.loop.call_soon(self._run, fn)
        else:
            self.loop.call_soon_threadsafe(self._run, fn)

    def _run(self, fn: Callable[[], None]) -> None:
        fn()
        if self.client.closed:
            self._close()
        elif not self._flush_scheduled and self.client.has_output:
            self._flush_scheduled = True  # what this loop iteration writes goes out in one send
            self.loop.call_soon(self._flush)

    def _settle(self) -> None:
        """Start the client's blocking calls, write what it has, close when it is done."""
        client = self.client
        hold = client.take_hold()
        if hold is not None and self.transport is not None:  # the broker holds a send
            self.transport.pause_reading()  # what the client sends next waits in its socket
            hold(partial(_call_soon, self.loop, self._resume_held))
        for call in client.take_calls():
            if client.state is State.AUTHENTICATING:  # HELLO's password check
                self._login = self.loop.create_task(self._log_in(call))
            else:
                self._run_call(call)
        if client.closed:
            self._close()
        else:
            self._flush()

    def _resume_held(self) -> None:
        client = self.client
        client.resume_held(time.monotonic())
        if not client.held and not client.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self._settle()

    def _run_call(self, call: BlockingCall) -> None:
        if call.quick is not None and call.quick():  # done on the loop: fn returns at once
            future = self.loop.create_future()
            try:
                future.set_result(call.fn())
            except Exception as exc:
                future.set_exception(exc)
            self._call_done(call, future)
            return
        future = self.loop.run_in_executor(self.service.executor, call.fn)
        future.add_done_callback(partial(self._call_done, call))

    async def _log_in(self, call: BlockingCall) -> None:
        """Check HELLO's password when the login throttle gives this attempt its turn."""
        async with self.service.guard.throttle.attempt(self.peer, self.client.login_user) as attempt:
            if self.client.closed:
                return
            future = self.loop.run_in_executor(self.service.executor, call.fn)
            future.add_done_callback(partial(self._call_done, call))
            try:
                ok = await future
            except Exception:  # _call_done has told the client
                return
            attempt.outcome(bool(ok))
        self._login = None

    def _call_done(self, call: BlockingCall, future: asyncio.Future[Any]) -> None:
        client = self.client
        if future.cancelled():
            client.complete(call, None, TransportException("the jms service is stopping"))
        else:
            client.complete(call, None if future.exception() else future.result(), future.exception())
        refusal = client.refusal
        if refusal is not None and client.state is State.REFUSED:
            self.fail(refusal)
            return
        if client.state is State.OPEN and not self._beating:
            self.admission.release()
            self._beating = True
            self._restart_timer(client.interval / 2, self._beat)
        self._settle()  # now, not in another loop iteration: the client waits for it

    # --- writing -----------------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is not None and self.client.has_output:
            data = self.client.data_to_send(time.monotonic())
            if not transport.is_closing():
                transport.write(data)

    def _close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def fail(self, exc: JMSException) -> None:
        """Tell the client why (an ERROR frame) and close the connection."""
        self.client.fail(exc)
        self._settle()

    # --- timers ------------------------------------------------------------------------------------
    def _restart_timer(self, delay: float, fn: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, fn)

    def _login_expired(self) -> None:
        if self.client.embedded is None and not self.client.closed:
            self.service.guard.login_timed_out(self.peer)
            self.client.handshake_expired(self.service.guard.login_timeout)
            self._settle()

    def _beat(self) -> None:
        client = self.client
        client.tick(time.monotonic())
        self._settle()
        if not client.closed:
            self._timer = self.loop.call_later(client.interval / 2, self._beat)
