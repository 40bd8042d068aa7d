"""Guards of the network front ends: a shared failed-login throttle, per-service login
timeouts and connection caps, and an accept loop that survives running out of files.

Every listening front end (jms service, STOMP bridge, admin port, port mapper, metrics)
uses these, on the one asyncio loop: LoginThrottle (one for the whole service, given to
every front end: failed logins per source address and per user name), ServiceGuard (one service's
throttle, login timeout and connection cap), AddressLimit (connections not yet logged in,
per address) and Listener (the accept loop).

Rules: a throttled user is slowed by at most max_delay, never locked out, and a success
resets the user's count, not the address's; no table may grow with the number of
addresses or names an attacker cycles through (decay, max_entries).

Design notes: docs/operations.md#internals-guardpy.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import errno
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .backoff import backoff_delay
from .netloop import NetLoop, client_gone
from .props import BrokerProperties

log = logging.getLogger(__name__)

USER_KEY_CHARS = 256  # a longer user name counts as its first 256 characters


@dataclass(frozen=True)
class ThrottleSettings:
    base_delay: float = 0.25  # the wait after one failure ...
    max_delay: float = 5.0  # ... doubling per failure, up to this
    decay: float = 60.0  # seconds without a failure after which one is forgotten
    max_entries: int = 10_000  # addresses and user names tracked, each

    @property
    def max_count(self) -> int:
        """The count at which the delay reaches its cap: counting further only delays decay."""
        count = 1
        while backoff_delay(self.base_delay, count, self.max_delay) < self.max_delay and count < 64:
            count += 1
        return count


@dataclass(eq=False)
class _Record:
    failures: int
    since: float  # decay is counted from here (the last failure, moved on by each decay)
    ready: float  # when the next check may start
    busy: bool = False  # an address's check is in progress (its turn is taken)
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


class Attempt:
    """One login attempt inside :meth:`LoginThrottle.attempt`: report how it went."""

    def __init__(self) -> None:
        self.ok: bool | None = None  # None: no verdict (the check failed, or gave up)
        self.count = 0  # after a failure: the address's recent failures

    def outcome(self, ok: bool) -> None:
        self.ok = ok


class LoginThrottle:
    """Failed logins per source address and per user, shared by every front end (see the
    module notes). Not thread-safe: every front end uses it on the service's loop."""

    def __init__(
        self, settings: ThrottleSettings = ThrottleSettings(), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._max_count = settings.max_count
        self._addresses: collections.OrderedDict[str, _Record] = collections.OrderedDict()
        self._users: collections.OrderedDict[str, _Record] = collections.OrderedDict()

    @contextlib.asynccontextmanager
    async def attempt(self, address: str, user: object) -> AsyncIterator[Attempt]:
        """Wait for this attempt's turn, let the caller check the password and report
        ``outcome``, then count it and give the address's turn to the next."""
        wait = self.user_delay(user)
        if wait > 0:
            await asyncio.sleep(wait)
        record = await self._take_turn(address)
        attempt = Attempt()
        try:
            wait = record.ready - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            yield attempt
        finally:
            if attempt.ok is True:
                self._users.pop(_user_key(user), None)
            elif attempt.ok is False:
                attempt.count = self.failed(address, user)
            self._give_turn(address, record)

    def user_delay(self, user: object) -> float:
        """Seconds an attempt for ``user`` waits first (at most max_delay)."""
        now = self._clock()
        record = self._current(self._users, _user_key(user), now)
        return max(0.0, record.ready - now) if record is not None else 0.0

    async def _take_turn(self, address: str) -> _Record:
        now = self._clock()
        record = self._current(self._addresses, address, now)
        if record is None:
            record = self._add(self._addresses, address, now)
        if not record.busy:
            record.busy = True
            return record
        turn = asyncio.get_running_loop().create_future()
        record.waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._give_turn(address, record)  # handed the turn as it gave up: pass it on
            else:
                record.waiters.remove(turn)
            raise
        return record

    def _give_turn(self, address: str, record: _Record) -> None:
        while record.waiters:
            turn = record.waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the turn passes on: busy stays
                return
        record.busy = False
        if record.failures == 0 and self._addresses.get(address) is record:
            del self._addresses[address]

    def failed(self, address: str, user: object) -> int:
        """Count a failed login; returns the address's count of recent failures."""
        now = self._clock()
        count = 0
        for table, key in ((self._addresses, address), (self._users, _user_key(user))):
            record = self._current(table, key, now) or self._add(table, key, now)
            record.failures = min(record.failures + 1, self._max_count)
            record.since = now
            record.ready = max(record.ready, now + self._delay(record.failures))
            table.move_to_end(key)
            count = count or record.failures
        return count

    def _add(self, table: collections.OrderedDict[str, _Record], key: str, now: float) -> _Record:
        record = table[key] = _Record(0, now, now)
        if len(table) > self.settings.max_entries:
            table.popitem(last=False)  # its holders still give their turns back to it
        return record

    def _delay(self, failures: int) -> float:
        return backoff_delay(self.settings.base_delay, failures, self.settings.max_delay)

    def _current(self, table: collections.OrderedDict[str, _Record], key: str, now: float) -> _Record | None:
        """``key``'s record with its decay applied; None (and dropped) once forgotten."""
        record = table.get(key)
        if record is None:
            return None
        forgotten = int((now - record.since) // self.settings.decay)
        if forgotten > 0:
            record.failures = max(0, record.failures - forgotten)
            record.since += forgotten * self.settings.decay
            if record.failures == 0 and record.ready <= now and not record.busy:
                del table[key]
                return None
        return record

    def __len__(self) -> int:
        """Records held (addresses and user names): bounded by 2 * max_entries."""
        return len(self._addresses) + len(self._users)


def _user_key(user: object) -> str:
    return ("" if user is None else str(user))[:USER_KEY_CHARS]


class LogEvery:
    """Log a recurring condition at most once per ``seconds``, saying how often it came
    meanwhile: a flood must not write a flood of log."""

    def __init__(self, seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._next = float("-inf")
        self._held = 0

    def __call__(self, logger: logging.Logger, level: int, message: str, *args: Any) -> None:
        now = self._clock()
        if now < self._next:
            self._held += 1
            return
        self._next = now + self.seconds
        held, self._held = self._held, 0
        if held:
            message += " (and %d more times in the last %d s)"
            args = (*args, held, int(self.seconds))
        logger.log(level, message, *args)


DEFAULT_LOGIN_TIMEOUT = 10  # seconds an unauthenticated connection may stay
DEFAULT_MAX_CONNECTIONS = 1000  # open connections per service
DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS = 64  # connections of one address not logged in yet


def address_key(address: str) -> str:
    """What :class:`AddressLimit` counts ``address`` as: an IPv4 address (also one mapped
    into IPv6) itself, an IPv6 address its /64, anything else its text."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Admission:
    """A connection's place under its address's :class:`AddressLimit`, or why it has none
    (``refusal``). ``release()`` once it has logged in or closed (again: nothing)."""

    __slots__ = ("_key", "_limit", "address", "refusal")

    def __init__(
        self, address: str, refusal: str | None = None, limit: AddressLimit | None = None, key: str = ""
    ) -> None:
        self.address = address
        self.refusal = refusal
        self._limit = limit
        self._key = key

    def release(self) -> None:
        limit, self._limit = self._limit, None
        if limit is not None:
            limit._release(self._key)


class AddressLimit:
    """The connections of one service that have not logged in yet, per source address
    (imq.<service>.max_unauthenticated_per_address; see the module notes). Not
    thread-safe: used on the service's loop."""

    def __init__(self, service: str, limit: int = DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS) -> None:
        self.service = service
        self.limit = limit
        self._held: dict[str, int] = {}
        self._refusals = LogEvery()

    @property
    def property_name(self) -> str:
        return f"imq.{self.service}.max_unauthenticated_per_address"

    def admit(self, address: str) -> Admission:
        """Count a new connection from ``address``; over the limit it is not counted and
        its Admission says why (logged at most once a minute)."""
        key = address_key(address)
        held = self._held.get(key, 0)
        if held >= self.limit:
            self._refusals(
                log,
                logging.WARNING,
                "%s service: refused a connection from %s: %d connections from there have not logged in, %s is %d",
                self.service,
                address,
                held,
                self.property_name,
                self.limit,
            )
            return Admission(
                address,
                f"too many connections from {address} that have not logged in "
                f"({self.property_name}={self.limit}); try again later",
            )
        self._held[key] = held + 1
        return Admission(address, None, self, key)

    def _release(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, address: str) -> int:
        """Connections from ``address`` (its /64 for IPv6) counted now."""
        return self._held.get(address_key(address), 0)


@dataclass
class ServiceGuard:
    """One service's limits (``service`` names its imq.<service>.* properties) and the
    login throttle every service shares."""

    service: str
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    login_timeout: float = DEFAULT_LOGIN_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_unauthenticated_per_address: int = DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS
    unauthenticated: AddressLimit = field(init=False, repr=False)
    _refusals: LogEvery = field(default_factory=LogEvery, init=False, repr=False)
    _timeouts: LogEvery = field(default_factory=LogEvery, init=False, repr=False)

    def __post_init__(self) -> None:
        self.unauthenticated = AddressLimit(self.service, self.max_unauthenticated_per_address)

    @classmethod
    def from_props(cls, props: BrokerProperties, service: str, throttle: LoginThrottle) -> ServiceGuard:
        """imq.<service>.login.timeout, .max_connections and
        .max_unauthenticated_per_address of ``props``."""
        return cls(
            service,
            throttle,
            props.get(f"imq.{service}.login.timeout"),
            props.get(f"imq.{service}.max_connections"),
            props.get(f"imq.{service}.max_unauthenticated_per_address"),
        )

    def refusal(self, open_connections: int, peer: str) -> str | None:
        """Why a new connection from ``peer`` is refused (None: it is not), logged at
        most once a minute."""
        if open_connections < self.max_connections:
            return None
        self._refusals(
            log,
            logging.WARNING,
            "%s service: refused a connection from %s: %d connections open, imq.%s.max_connections is %d",
            self.service,
            peer,
            open_connections,
            self.service,
            self.max_connections,
        )
        return (
            f"the {self.service} service has reached its connection limit "
            f"(imq.{self.service}.max_connections={self.max_connections}); try again later"
        )

    def login_timed_out(self, peer: str) -> str:
        """Why a connection from ``peer`` that did not log in in time is closed, logged at
        most once a minute (idle sockets come in floods)."""
        reason = f"no login within {self.login_timeout:g} s of connecting (imq.{self.service}.login.timeout)"
        self._timeouts(log, logging.INFO, "%s service: closed a connection from %s: %s", self.service, peer, reason)
        return reason


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's address (no port): what the login throttle counts by."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


def refuse(transport: asyncio.Transport, data: bytes, linger: float = 1.0) -> None:
    """Write a refusal, half-close, and close after ``linger`` seconds: closing at once
    would reset a connection whose client is still sending, and lose the refusal."""
    transport.write(data)
    write_eof(transport)
    asyncio.get_running_loop().call_later(linger, transport.close)


def write_eof(transport: asyncio.WriteTransport) -> None:
    """Half-close; a client already gone (reset: ENOTCONN from shutdown) is not an error."""
    if transport.is_closing() or not transport.can_write_eof():
        return
    try:
        transport.write_eof()
    except OSError as exc:
        if not client_gone(exc):
            raise
        log.debug("a client left before its answer was written: %s", exc)
        transport.close()


def basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) of an HTTP Basic Authorization header (the metrics and management
    ports); None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep and user else None


# --- the accept loop ----------------------------------------------------------------------------

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ACCEPT_ERRORS_LOG = LogEvery()  # one for the process: the descriptor table is the process's
ACCEPT_RETRY_BASE = 0.1
ACCEPT_RETRY_MAX = 2.0


ProtocolFactory = Callable[[Admission], asyncio.BaseProtocol]
REFUSAL_DRAIN = 4 * 65536  # bytes of a turned-away client's input read before closing


class Listener:
    """The listening sockets of one service port and their accept loop (see the module
    notes); ``port`` (the first socket's), ``close()``. Each accepted socket is counted
    in ``pending`` (its Admission goes to the protocol, which releases it on login);
    one over the limit is closed at once, after ``refusal(reason)``'s bytes on plain TCP."""

    def __init__(
        self,
        socks: list[socket.socket],
        protocol_factory: ProtocolFactory,
        ssl_context: ssl.SSLContext | None,
        name: str,
        backlog: int,
        handshake_timeout: float,
        pending: AddressLimit,
        refusal: Callable[[str], bytes] | None,
    ) -> None:
        self.sockets = socks
        self.name = name
        self.pending = pending
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._backlog = backlog
        self._handshake_timeout = handshake_timeout
        self._refusal = refusal
        self._loop = asyncio.get_running_loop()
        self._pauses = 0
        self._retry: asyncio.TimerHandle | None = None
        self._starting: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._watch()

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def _watch(self) -> None:
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch(self) -> None:
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(exc)
                else:
                    _ACCEPT_ERRORS_LOG(log, logging.WARNING, "%s: accepting a connection failed: %s", self.name, exc)
                return
            self._pauses = 0
            conn.setblocking(False)
            admission = self.pending.admit(str(address[0]) if isinstance(address, tuple) else "?")
            if admission.refusal is not None:
                self._turn_away(conn, admission.refusal)
                continue
            task = self._loop.create_task(self._start(conn, admission))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    def _turn_away(self, conn: socket.socket, reason: str) -> None:
        """Close a connection over its address's limit now: on plain TCP after the
        service's refusal, having read what the client sent (so the close is no reset
        that could lose the refusal); on TLS at once (no handshake is worth it)."""
        try:
            if self._ssl is None and self._refusal is not None:
                conn.send(self._refusal(reason))  # a new socket's buffer takes it whole
                conn.shutdown(socket.SHUT_WR)
                read = 0
                while read < REFUSAL_DRAIN and (chunk := conn.recv(65536)):
                    read += len(chunk)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            log.debug("%s: a refused client left before its refusal was written: %s", self.name, exc)
        conn.close()

    def _pause(self, exc: OSError) -> None:
        self._pauses += 1
        delay = backoff_delay(ACCEPT_RETRY_BASE, self._pauses, ACCEPT_RETRY_MAX)
        _ACCEPT_ERRORS_LOG(
            log,
            logging.ERROR,
            "%s: cannot accept connections: %s; pausing its accept "
            "loop (retrying every %.1f s at most) until connections close",
            self.name,
            exc.strerror or exc,
            ACCEPT_RETRY_MAX,
        )
        self._unwatch()
        self._retry = self._loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self._watch()

    async def _start(self, conn: socket.socket, admission: Admission) -> None:
        try:
            await self._loop.connect_accepted_socket(
                lambda: self._factory(admission),
                conn,
                ssl=self._ssl,
                ssl_handshake_timeout=self._handshake_timeout if self._ssl is not None else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:  # a failed TLS handshake, a reset
            log.debug("%s: a connection failed before it started: %s", self.name, exc)
            admission.release()
            conn.close()

    def close(self) -> None:
        """Stop listening; connections already open are their service's to close."""
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        else:
            self._unwatch()
        for sock in self.sockets:
            sock.close()


async def listen(
    protocol_factory: ProtocolFactory,
    host: str | None,
    port: int,
    *,
    name: str,
    pending: AddressLimit,
    refusal: Callable[[str], bytes] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    backlog: int = 100,
    handshake_timeout: float = DEFAULT_LOGIN_TIMEOUT,
) -> Listener:
    """Listen on ``host:port`` (None: every interface, IPv4 and IPv6, as asyncio's
    create_server) with :class:`Listener`'s accept loop, counting connections not yet
    logged in in ``pending``; a TLS handshake not done within ``handshake_timeout``
    seconds closes the socket (asyncio's default: 60 s). OSError when it cannot bind."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"{host}:{port} resolves to no address")
    return Listener(socks, protocol_factory, ssl_context, name, backlog, handshake_timeout, pending, refusal)


class StreamServer:
    """A guarded stream server on the net loop (the admin port, the metrics port): listening,
    its port, and closing it with its connections; a subclass serves one connection in
    ``_serve`` and keeps it in ``_writers`` while it lasts."""

    def __init__(
        self, netloop: NetLoop, host: str, port: int, ssl_context: ssl.SSLContext | None, guard: ServiceGuard
    ) -> None:
        self.netloop = netloop
        self.host = host
        self.requested_port = port
        self.ssl_context = ssl_context
        self.guard = guard
        self._server: Listener | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.port

    @property
    def secure(self) -> bool:
        return self.ssl_context is not None

    def _listen(self, limit: int, name: str) -> None:
        """Listen, reading each connection through a StreamReader of ``limit`` bytes."""

        async def start() -> Listener:
            def connection(admission: Admission) -> asyncio.StreamReaderProtocol:
                async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                    try:
                        await self._serve(reader, writer, admission)
                    except OSError as exc:
                        if not client_gone(exc):
                            raise
                        log.debug("%s: a client left: %s", name, exc)
                    finally:
                        admission.release()
                        writer.close()

                return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit), serve)

            return await listen(
                connection,
                self.host,
                self.requested_port,
                name=name,
                pending=self.guard.unauthenticated,
                refusal=self._refusal,
                ssl_context=self.ssl_context,
                handshake_timeout=self.guard.login_timeout,
            )

        self._server = self.netloop.run(start())

    def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None

        async def close() -> None:
            server.close()
            for writer in list(self._writers):
                writer.close()

        self.netloop.run(close(), timeout=10)

    def _refusal(self, reason: str) -> bytes:
        """The bytes that tell a plain-TCP client over its address's limit why it is closed."""
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, admission: Admission) -> None:
        """Serve one connection; ``admission.release()`` once it has logged in."""
        raise NotImplementedError
