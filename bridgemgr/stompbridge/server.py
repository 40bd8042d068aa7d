"""The STOMP bridge service: asyncio TCP/TLS listeners and the per-socket protocol.

A thin asyncio shell around StompSession on the service's one NetLoop: StompProtocol (one per
accepted socket) feeds bytes to its session, writes what it has to send, runs its blocking
calls in the bridge's thread pool and ticks heart-beats. StompBridge listens on
imq.bridge.stomp.tcp.port and tls.port with guard.py's accept loop and lists both for the
port mapper.

Rules: a slow consumer holds only its own messages (subscribers stop while the transport's
buffer is full); a held SEND pauses reading that socket without a thread waiting; logins go
through the service's login throttle, timeout and connection caps.

Design notes: docs/stomp-bridge.md#internals-stompbridgeserverpy.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

from ..guard import Admission, Listener, ServiceGuard, listen, peer_address, refuse
from ..jms.errors import JMSException
from ..jms.hostbroker import HostBroker, Principal
from ..netloop import NetLoop
from ..props import BrokerProperties
from ..transform import TRANSFORMER_PATH_PROPERTY, load_transformer, transformer_path
from ..users import UserRepository
from .frames import ERROR, PRE_CONNECT, Frame, LocalProtocolError, encode_frame
from .host import HostConnection
from .session import PendingCall, SessionConfig, State, StompSession

log = logging.getLogger("imq.bridge.stomp.server")  # the STOMP bridge's log: bridges/stomp/log.txt

SERVICE = "stomp"
TLS_SERVICE = "sslstomp"  # as the port mapper names jms / ssljms
TLS_PROPS = "imq.bridge.stomp.tls"
WRITE_BUFFER_HIGH = 256 * 1024


class StompBridgeError(Exception):
    """The bridge cannot start (port in use, TLS files missing, transformer not loadable)."""


@dataclass(frozen=True)
class StompConfig:
    """Table 12-10 plus what the properties cannot say (TLS files, frame limits)."""

    hostname: str | None = None  # None: every interface
    tcp_enabled: bool = True
    tcp_port: int = 7672
    tls_enabled: bool = False
    tls_port: int = 7673
    tls_require_client_auth: bool = False
    tls_certfile: Path | None = None  # PEM: certificate chain (and key, unless tls_keyfile)
    tls_keyfile: Path | None = None
    tls_cafile: Path | None = None  # PEM: CAs whose client certificates are accepted
    session: SessionConfig = field(default_factory=SessionConfig)
    call_threads: int = 8  # pool for blocking calls (password checks, durable waits)

    @classmethod
    def from_props(cls, props: BrokerProperties) -> StompConfig:
        """imq.bridge.stomp.* (the TLS files: tls.certfile, tls.keyfile, tls.cafile)."""
        s = props.stomp
        transformer = None
        if s.message_transformer:
            path = s.message_transformer
            folders = transformer_path(props.get(TRANSFORMER_PATH_PROPERTY), props.instance_dir)
            try:
                load_transformer(path, folders)
            except JMSException as exc:
                raise StompBridgeError(f"imq.bridge.stomp.messageTransformer: {exc}") from exc
            transformer = lambda: load_transformer(path, folders)  # noqa: E731
        return cls(
            hostname=s.hostname,
            tcp_enabled=s.tcp_enabled,
            tcp_port=s.tcp_port,
            tls_enabled=s.tls_enabled,
            tls_port=s.tls_port,
            tls_require_client_auth=s.tls_require_client_auth,
            tls_certfile=_path(s.tls_certfile),
            tls_keyfile=_path(s.tls_keyfile),
            tls_cafile=_path(s.tls_cafile),
            session=SessionConfig(
                consumer_flow_limit=s.consumer_flow_limit,
                transformer=transformer,
                invalid_header_names=s.invalid_header_names,
            ),
        )

    def tls_context(self) -> ssl.SSLContext:
        """The TLS port's server context; StompBridgeError names the property and the file
        that cannot be used."""
        if self.tls_certfile is None:
            raise StompBridgeError(
                f"{TLS_PROPS}.enabled is true but {TLS_PROPS}.certfile is not set "
                "(imqbridgemgr keytool makes a key and certificate)"
            )
        files = [("certfile", self.tls_certfile), ("keyfile", self.tls_keyfile)]
        if self.tls_require_client_auth:
            if self.tls_cafile is None:
                raise StompBridgeError(f"{TLS_PROPS}.requireClientAuth is true but {TLS_PROPS}.cafile is not set")
            files.append(("cafile", self.tls_cafile))
        for key, path in files:
            if path is not None:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise StompBridgeError(f"{TLS_PROPS}.{key}: cannot read {path}: {exc.strerror}") from None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.tls_certfile, self.tls_keyfile)
        except ssl.SSLError as exc:
            named = f"{TLS_PROPS}.certfile {self.tls_certfile}" + (
                f" and {TLS_PROPS}.keyfile {self.tls_keyfile}" if self.tls_keyfile else ""
            )
            raise StompBridgeError(f"{named}: not a PEM certificate chain and its private key ({exc})") from None
        if self.tls_require_client_auth:
            try:
                ctx.load_verify_locations(self.tls_cafile)
            except ssl.SSLError as exc:
                raise StompBridgeError(
                    f"{TLS_PROPS}.cafile {self.tls_cafile}: no PEM CA certificates ({exc})"
                ) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


class Inbox:
    """Work posted by subscriber threads for the loop. call_soon_threadsafe writes to the
    loop's self-pipe every time; here only the first post after a drain does, so when
    the loop is busy many posts cost one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        self._items.append((fn, args))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the service is gone, nothing to deliver to
            pass

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
        items = self._items
        while items:
            fn, args = items.popleft()
            try:
                fn(*args)
            except Exception:  # one connection's bug must not strand the others' batches
                log.exception("STOMP bridge: a delivery failed")


class StompBridge:
    """The STOMP bridge service (name and type ``stomp``): start(), stop(), state."""

    name = SERVICE

    def __init__(
        self,
        config: StompConfig | BrokerProperties,
        broker: HostBroker,
        users: UserRepository,
        netloop: NetLoop,
        guard: ServiceGuard | None = None,
    ) -> None:
        self.config = config if isinstance(config, StompConfig) else StompConfig.from_props(config)
        self.broker = broker
        self.users = users
        self.netloop = netloop
        self.guard = guard or ServiceGuard(SERVICE)
        self.state = "STOPPED"
        self.tcp_port: int | None = None
        self.tls_port: int | None = None
        self.connections: set[StompProtocol] = set()
        self._servers: list[Listener] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.inbox: Inbox | None = None
        self._ids = itertools.count(1)

    # --- for the service manager and the port mapper ---------------------------------------
    def start(self) -> None:
        if self.state == "STARTED":
            return
        self.state = "STARTING"
        try:
            self.netloop.run(self._start())
        except BaseException:
            self.netloop.run(self._stop())
            self.state = "STOPPED"
            raise
        self.state = "STARTED"

    def stop(self) -> None:
        if self.state == "STOPPED":
            return
        self.state = "STOPPING"
        self.netloop.run(self._stop())
        self.state = "STOPPED"

    def service_entries(self) -> list[tuple[str, str, str, int]]:
        """(name, protocol, type, port) rows for the port mapper while started."""
        rows = []
        if self.tcp_port is not None:
            rows.append((SERVICE, "tcp", "NORMAL", self.tcp_port))
        if self.tls_port is not None:
            rows.append((TLS_SERVICE, "tls", "NORMAL", self.tls_port))
        return rows

    def authenticate(self, login: str, passcode: str) -> object | None:
        return self.users.authenticate(login, passcode)

    # --- on the loop -----------------------------------------------------------------------------
    async def _start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(cfg.call_threads, thread_name_prefix="stomp-call")
        self.inbox = Inbox(loop)
        listeners: list[tuple[str, int, ssl.SSLContext | None]] = []
        if cfg.tcp_enabled:
            listeners.append(("tcp", cfg.tcp_port, None))
        if cfg.tls_enabled:
            listeners.append(("tls", cfg.tls_port, cfg.tls_context()))
        for kind, port, ctx in listeners:
            try:
                server = await listen(
                    lambda admission: StompProtocol(self, admission),
                    cfg.hostname or None,
                    port,
                    name=f"STOMP bridge ({kind})",
                    pending=self.guard.unauthenticated,
                    refusal=partial(error_frame, "too many connections"),
                    ssl_context=ctx,
                    backlog=512,
                    handshake_timeout=self.guard.login_timeout,
                )
            except OSError as exc:
                raise StompBridgeError(f"the STOMP bridge cannot listen on {kind} port {port}: {exc}") from exc
            self._servers.append(server)
            bound = server.port
            if kind == "tcp":
                self.tcp_port = bound
            else:
                self.tls_port = bound
            log.info("STOMP bridge listening on %s %s:%d", kind, cfg.hostname or "*", bound)

    async def _stop(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()
        for conn in list(self.connections):
            conn.abort("the STOMP bridge is stopping")
        self.tcp_port = self.tls_port = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def call_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        assert self._pool is not None
        return self._pool


def error_frame(message: str, detail: str) -> bytes:
    """The ERROR frame that refuses a connection before CONNECT (the detail in its body)."""
    body = detail.encode()
    return encode_frame(
        Frame(
            ERROR,
            {"message": message, "content-type": "text/plain;charset=utf-8", "content-length": str(len(body))},
            body,
        ),
        PRE_CONNECT,
    )


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """From any thread; nothing when the loop has stopped (the broker closing after us)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


class StompProtocol(asyncio.Protocol):
    """One client socket: bytes in and out of its StompSession."""

    def __init__(self, bridge: StompBridge, admission: Admission) -> None:
        self.bridge = bridge
        self.admission = admission  # counted until CONNECTED (or closed)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.session: StompSession | None = None
        self._flush_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._login_timer: asyncio.TimerHandle | None = None
        self._login: asyncio.Task[None] | None = None  # a CONNECT waiting for the throttle
        self.peer = "?"  # the client's address, for the login throttle

    # --- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tcp = cast(asyncio.Transport, transport)  # a stream server's: always a Transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tcp.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        bridge = self.bridge
        self.session = StompSession(
            bridge.config.session,
            authenticate=bridge.authenticate,
            open_host=self._open_host,
            session_id=f"stomp-{next(bridge._ids)}",
            now=self.loop.time(),
        )
        self.peer = peer_address(transport)
        refusal = bridge.guard.refusal(len(bridge.connections), self.peer)
        if refusal is not None:
            self._refuse("too many connections", refusal)
            return
        bridge.connections.add(self)
        log.debug("STOMP session %s: connection from %s", self.session.session_id, self.peer)
        self._login_timer = self.loop.call_later(bridge.guard.login_timeout, self._login_expired)

    def data_received(self, data: bytes) -> None:
        assert self.session is not None
        if self.session.closed:  # refused: its ERROR frame is on the way
            return
        self.session.receive_data(data, self.loop.time())
        self._pump()

    def eof_received(self) -> bool:
        if self.session is not None:
            self.session.connection_lost()
            self._pump()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._login_timer is not None:
            self._login_timer.cancel()
        if self._login is not None:
            self._login.cancel()
        if self.session is not None:
            self.session.connection_lost()
        self.bridge.connections.discard(self)
        self.admission.release()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.set_writable(False)

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.set_writable(True)

    # --- the session's needs -------------------------------------------------------------------
    def _open_host(self, client_id: str | None, username: str) -> HostConnection:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else None
        user = self.bridge.users.get(username)  # its group decides with the access rules
        groups = frozenset({user.group}) if user is not None else frozenset()
        return HostConnection(self.bridge.broker, Principal(username, groups, address, "stomp"), self._post, client_id)

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """From a subscriber thread: run ``fn`` on the loop, then flush with the others."""
        assert self.bridge.inbox is not None
        self.bridge.inbox.post(self._run_posted, fn, args)

    def _run_posted(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self.transport is not None and self.transport.is_closing() and self.session is not None:
            self.session.connection_lost()  # nothing can be written: deliveries go back
        fn(*args)
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self._pump()

    def _pump(self) -> None:
        """Write what is ready, start the pending blocking call, close when done."""
        session, transport = self.session, self.transport
        assert session is not None and transport is not None
        while True:
            call = session.take_call()
            if call is not None and call.quick is not None and call.quick():
                self._complete_now(session, call)  # done on the loop: on with the frames read
                continue
            data = session.data_to_send(self.loop.time())
            if data and not transport.is_closing():
                transport.write(data)
            break
        if call is not None:
            if session.state is State.AUTHENTICATING:  # the password check of CONNECT/STOMP
                self._login = self.loop.create_task(self._log_in(call))
            else:
                self._run_call(call)
            if not transport.is_closing():
                transport.pause_reading()  # frames wait in the socket, not in our memory
        elif not session.waiting and not transport.is_closing():
            transport.resume_reading()  # (paused for a call whose next one was done here)
        if session.closed:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            transport.close()
        elif self._timer is None and session.tick_interval:
            self._timer = self.loop.call_later(session.tick_interval, self._tick)

    @staticmethod
    def _complete_now(session: StompSession, call: PendingCall) -> None:
        """Run a call whose ``quick`` did its work (``fn`` returns at once) on the loop."""
        try:
            result = call.fn()
        except Exception as exc:
            session.complete_call(None, exc)
        else:
            session.complete_call(result)

    def _run_call(self, call: PendingCall) -> None:
        if call.wait is not None:  # a held send: no thread waits, the broker calls back
            waiting: asyncio.Future[Any] = self.loop.create_future()
            waiting.add_done_callback(self._call_done)
            call.wait(partial(_call_soon, self.loop, _resolve, waiting))
            return
        future = self.loop.run_in_executor(self.bridge.call_pool(), call.fn)
        future.add_done_callback(self._call_done)

    async def _log_in(self, call: PendingCall) -> None:
        """Check the password when the login throttle gives this attempt its turn."""
        assert call.frame is not None
        login = call.frame.headers["login"]
        async with self.bridge.guard.throttle.attempt(self.peer, login) as attempt:
            if self.session is None or self.session.closed:
                return
            future = self.loop.run_in_executor(self.bridge.call_pool(), call.fn)
            future.add_done_callback(self._call_done)
            try:
                user = await future
            except Exception:  # _call_done has told the session
                return
            attempt.outcome(user is not None)
        self._login = None
        if not attempt.ok:
            log.warning(
                "STOMP login failed for user %r from %s (%d recent failures from there)",
                login[:80],
                self.peer,
                attempt.count,
            )

    def _call_done(self, future: asyncio.Future[Any]) -> None:
        assert self.session is not None
        if future.cancelled():
            self.session.complete_call(None, LocalProtocolError("interrupted", "the STOMP bridge is stopping"))
        elif future.exception() is not None:
            self.session.complete_call(None, future.exception())
        else:
            self.session.complete_call(future.result())
        if self.session.state is State.CONNECTED:
            self.admission.release()
        if self.transport is not None:
            if not self.session.waiting and not self.transport.is_closing():
                self.transport.resume_reading()
            self._pump()

    def _login_expired(self) -> None:
        self._login_timer = None
        session = self.session
        if session is not None and session.state in (State.AWAIT_CONNECT, State.AUTHENTICATING):
            self._refuse("login timeout", self.bridge.guard.login_timed_out(self.peer))

    def _refuse(self, message: str, detail: str) -> None:
        """Close a connection that has not logged in with an ERROR frame, logging nothing
        per connection (refusals and timeouts come in floods; the guard logs them)."""
        assert self.session is not None and self.transport is not None
        if self._login is not None:
            self._login.cancel()  # leave the throttle's line
        self.session.connection_lost()
        refuse(self.transport, error_frame(message, detail))

    def _tick(self) -> None:
        self._timer = None
        if self.session is not None and not self.session.closed:
            self.session.tick(self.loop.time())
            self._pump()

    def abort(self, reason: str) -> None:
        """Close this connection from the server side with an ERROR frame."""
        if self.session is not None and not self.session.closed:
            self.session.fail("server stopping", reason)
            self._pump()
