"""The mq:// client's end of one connection: addresses, connecting, and the socket.

How it works: ``parse_url`` turns ``mq://`` URLs into :class:`Address` es;
``open_channel`` finds the service through the port mapper (unless the URL names it),
connects (TLS if asked), says HELLO and returns a :class:`Channel` around the socket.

Writing: callers write frames themselves under a lock; frames that need no answer may
be kept lazily (``write(..., lazy=True)``) and go out with the next write, when a
receive would wait (``flush``), or within a monitor tick. A request that needs an
answer is a :class:`Call` that the reading thread completes.

Reading: no thread is dedicated to it. A thread that waits (``wait_for``: for an answer
or a delivery) reads the socket itself while nobody else does (it is the "leader"), and
the others wait on the channel's condition for what it dispatches; so a round trip
needs no hand-over between threads, which costs more than the round trip on a busy
machine. While nobody waits, the monitor thread reads, so a connection the service
closes is noticed at once; a wake-up pipe interrupts whichever thread reads (a caller
wants the read role, a consumer closed, the connection broke). The monitor also writes
heart-beats when nothing else was written for an interval, and takes the service for
dead after three intervals without a byte from it.

Answers and fatal errors are handled here; deliveries and asynchronous failures go to
the ``deliver`` callback, and the first loss of the connection to ``lost``.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...admin.portmapper import DEFAULT_PORT, find_service
from ...jms.errors import BrokerMoved, JMSException, TransportException
from . import wire

log = logging.getLogger(__name__)

SCHEMES = {"mq": (True, False), "mqtcp": (False, False), "mqssl": (False, True)}  # (port mapper, tls)
LAZY_LIMIT = 256 * 1024  # bytes kept lazily before they are written anyway
MIN_HEARTBEAT = 0.05
READ_BUFFER = 262144  # bytes one read of the socket takes at most


@dataclass(frozen=True)
class Address:
    """One place to connect: through the port mapper at host:port, or straight to the service."""

    host: str
    port: int
    portmapper: bool
    tls: bool

    def __str__(self) -> str:
        scheme = next(s for s, flags in SCHEMES.items() if flags == (self.portmapper, self.tls))
        return f"{scheme}://{self.host}:{self.port}"


def parse_url(url: str) -> list[Address]:
    """``mq://host[:port]`` (port mapper, default 7676), ``mqtcp://host:port`` or
    ``mqssl://host:port`` (the service itself); several separated by commas."""
    out = []
    for part in url.split(","):
        part = part.strip()
        try:
            parts = urlsplit(part)
            port = parts.port
        except ValueError as exc:
            raise JMSException(f"bad broker URL {part!r}: {exc}") from None
        if parts.scheme not in SCHEMES or not parts.hostname or parts.path.strip("/") not in ("", "jms"):
            raise JMSException(
                f"bad broker URL {part!r}: write mq://host:port (the port mapper), "
                "mqtcp://host:port or mqssl://host:port (the jms service itself)"
            )
        portmapper, tls = SCHEMES[parts.scheme]
        if port is None and not portmapper:
            raise JMSException(f"bad broker URL {part!r}: {parts.scheme}:// needs the service's port")
        out.append(Address(parts.hostname, port if port is not None else DEFAULT_PORT, portmapper, tls))
    return out


@dataclass(frozen=True)
class Hello:
    """What the client says in HELLO."""

    user: str | None
    password: str | None = None
    heartbeat: float = 30.0
    client_name: str = "python"
    home: str | None = None  # HA: the broker id the factory's last connection reached


def open_channel(
    address: Address,
    hello: Hello,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    deliver: Callable[[wire.Event], None],
    lost: Callable[[TransportException], None],
) -> Channel:
    """Connect to the jms service at ``address`` and log in."""
    host, port = address.host, address.port
    tls = address.tls or ssl_context is not None
    if address.portmapper:
        port = find_service(host, port, ("ssljms",) if tls else ("jms",), timeout).port
    where = f"{address} (jms service at {host}:{port})"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise TransportException(f"cannot connect to {where}: {exc.strerror or exc}") from None
    reader = wire.Wire(wire.Role.CLIENT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            sock = (ssl_context or ssl.create_default_context()).wrap_socket(sock, server_hostname=host)
        sock.sendall(
            wire.PREAMBLE
            + wire.request(
                1,
                wire.Op.HELLO,
                hello.user,
                hello.password,
                int(hello.heartbeat * 1000),
                hello.client_name,
                *((hello.home,) if hello.home else ()),
            )
        )
        welcome = _handshake(sock, reader, where)
        moved = welcome.get("moved")
        if isinstance(moved, dict):
            home, broker = moved.get("home"), moved.get("broker")
            raise BrokerMoved(
                f"{where}: broker {home}'s store is served by broker {broker}", str(moved.get("urls") or "")
            )
    except BaseException as exc:
        sock.close()
        if isinstance(exc, OSError):
            raise TransportException(f"{where}: handshake failed: {exc}") from None
        raise
    sock.settimeout(None)
    return Channel(sock, reader, where, welcome, deliver, lost)


def _handshake(sock: socket.socket, reader: wire.Wire, where: str) -> dict[str, Any]:
    while True:
        data = sock.recv(65536)
        if not data:
            raise TransportException(f"{where} closed the connection during the handshake")
        reader.receive_data(data)
        event = reader.next_event()
        if isinstance(event, wire.Failure):
            raise event.error
        if isinstance(event, wire.Reply):
            if not isinstance(event.value, dict) or "rm_id" not in event.value:
                raise wire.ProtocolError(f"{where}: a HELLO answer without broker details")
            reader.open()
            return event.value


class Call:
    """A request waiting for its answer; whichever thread reads the answer completes it."""

    __slots__ = ("done", "error", "then", "value")

    def __init__(self, then: Callable[[], None] | None = None) -> None:
        self.done = False
        self.value: Any = None
        self.error: JMSException | None = None
        self.then = then  # run by the reader as the answer arrives (before later frames)

    def complete(self, value: Any = None, error: JMSException | None = None) -> None:
        self.value, self.error = value, error
        if error is None and self.then is not None:
            self.then()
        self.done = True


class Channel:
    def __init__(
        self,
        sock: socket.socket,
        reader: wire.Wire,
        where: str,
        welcome: dict[str, Any],
        deliver: Callable[[wire.Event], None],
        lost: Callable[[TransportException], None],
    ) -> None:
        self.where = where
        self.welcome = welcome
        self.interval = max(MIN_HEARTBEAT, welcome["heartbeat_ms"] / 1000)
        self.max_frame = reader.max_frame = welcome["max_frame"]
        self.broken: TransportException | None = None
        self.closing = False
        self._sock = sock
        self._tls = sock if isinstance(sock, ssl.SSLSocket) else None
        self._wire = reader
        self._rbuf = memoryview(bytearray(READ_BUFFER))  # reused: a fresh one per read costs more
        self._deliver = deliver
        self._on_lost = lost
        self._calls: dict[int, Call] = {}
        self._call_ids = itertools.count(2)
        self._wlock = threading.Lock()
        self._state_lock = threading.Lock()
        self._lazy: list[bytes] = []
        self._lazy_size = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()  # waiting for answers and deliveries, the read role
        self._read_lock = threading.Lock()  # held by the thread reading the socket
        self._idle_reading = False  # ... which is the monitor, until a caller wants it
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)
        self.last_read = self.last_write = self._last_lead = time.monotonic()
        self._monitor_thread = threading.Thread(target=self._monitor, name=f"mq-monitor {where}", daemon=True)
        self._monitor_thread.start()

    # --- writing and calling -----------------------------------------------------------------
    def write(self, data: bytes | None, lazy: bool = False) -> None:
        """Write ``data`` (after anything kept lazily); ``lazy``: keep it for the next write."""
        with self._wlock:
            if lazy:
                assert data is not None  # only a frame is kept for later
                self._lazy.append(data)
                self._lazy_size += len(data)
                if self._lazy_size < LAZY_LIMIT:
                    return
                data = None
            if self._lazy:
                if data is not None:
                    self._lazy.append(data)
                data = b"".join(self._lazy)
                self._lazy.clear()
                self._lazy_size = 0
            if data is None:
                return
            if self.broken is not None:
                raise self.broken
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise self._lost(f"writing failed: {exc}") from None
            self.last_write = time.monotonic()

    def flush(self) -> None:
        """Write what was kept lazily."""
        if self._lazy:
            self.write(None)

    def start(self, frame: Callable[[int], bytes], then: Callable[[], None] | None = None, lazy: bool = False) -> Call:
        """Write a request (``frame(call id)``); its answer completes the returned call.
        ``lazy``: kept for the next write (whoever waits for the answer flushes first)."""
        if self.broken is not None:
            raise self.broken
        call_id = next(self._call_ids)
        call = Call(then)
        self._calls[call_id] = call
        try:
            self.write(frame(call_id), lazy)
        except TransportException:
            self._calls.pop(call_id, None)
            raise
        return call

    def finish(self, call: Call, timeout: float | None = None, what: str = "a request") -> Any:
        """The answer of ``call`` (waiting for it); its error raised. No answer within
        ``timeout`` seconds: the service is hung (or stopped), and the connection is taken
        for lost (the call's outcome is unknown), however alive its socket looks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.wait_for(lambda: call.done, deadline):
            raise self._lost(f"no answer to {what} within {timeout:g} s (the service does not respond)")
        if call.error is not None:
            raise call.error
        return call.value

    def call(
        self,
        frame: Callable[[int], bytes],
        then: Callable[[], None] | None = None,
        timeout: float | None = None,
        what: str = "a request",
    ) -> Any:
        return self.finish(self.start(frame, then), timeout, what)

    def request(
        self, op: wire.Op, *args: Any, then: Callable[[], None] | None = None, timeout: float | None = None
    ) -> Any:
        return self.call(lambda call_id: wire.request(call_id, op, *args), then, timeout, op.name.lower())

    # --- reading ------------------------------------------------------------------------------
    def wait_for(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Wait until ``ready()`` (True) or ``deadline`` (False); raise if the connection broke."""
        while True:
            if ready():
                return True
            if self.broken is not None:
                raise self.broken
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if self._read_lock.acquire(False):
                try:
                    while not ready() and self.broken is None:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            break
                        self._read_some(remaining)
                    self._last_lead = time.monotonic()
                finally:
                    self._resign()
                continue
            with self._cond:
                if ready() or self.broken is not None:
                    continue
                if self._idle_reading:
                    self.interrupt()
                if self._read_lock.locked():
                    self._cond.wait(remaining)

    def wake(self) -> None:
        """Something a waiter waits for changed outside the socket (started, closed)."""
        with self._cond:
            self._cond.notify_all()
        self.interrupt()

    def interrupt(self) -> None:
        """Make the reading thread look up from the socket."""
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # already signalled (or closed)

    def _resign(self) -> None:
        with self._cond:
            self._read_lock.release()
            self._cond.notify_all()

    def _read_some(self, timeout: float | None) -> bool:
        """(With the read role) read what arrives within ``timeout`` and dispatch it; False
        when nothing came (timeout or interrupt)."""
        sock = self._sock
        if not (self._tls and self._tls.pending()):
            readable = False
            for fd, _ in self._poller.poll(None if timeout is None else max(0.0, timeout * 1000)):
                if fd != self._wake_r:
                    readable = True
                    continue
                try:
                    os.read(self._wake_r, 64)
                except OSError:
                    pass
            if not readable:
                return False
        try:
            nbytes = sock.recv_into(self._rbuf)
        except ssl.SSLWantReadError:
            return True
        except (OSError, ValueError) as exc:  # ValueError: the socket was closed under us
            self._lost(f"reading failed: {exc}")
            return True
        if not nbytes:
            self._lost("the service closed the connection")
            return True
        self.last_read = time.monotonic()
        self._wire.receive_data(self._rbuf[:nbytes])
        try:
            while (event := self._wire.next_event()) is not None:
                self._dispatch(event)
        except wire.ProtocolError as exc:
            self._lost(f"protocol error: {exc}")
        except JMSException as exc:  # a fatal ERROR from the service
            self._lost(str(exc))
        with self._cond:
            self._cond.notify_all()
        return True

    def _dispatch(self, event: wire.Event) -> None:
        if event.__class__ is wire.Reply:
            call = self._calls.pop(event.call, None)
            if call is not None:
                call.complete(event.value)
        elif event.__class__ is wire.Failure:
            if event.fatal:
                raise event.error
            call = self._calls.pop(event.call, None) if event.call else None
            if call is not None:
                call.complete(error=event.error)
            else:
                self._deliver(event)
        elif event.__class__ is wire.Delivery:
            self._deliver(event)

    def _monitor(self) -> None:
        """Heart-beats, what was kept lazily, a silent service, and reading while idle."""
        tick = min(self.interval / 4, 0.05)
        while not self._stop.wait(tick):
            now = time.monotonic()
            if now - self.last_read > 3 * self.interval:
                self._lost(f"no heart-beat from the service for {now - self.last_read:.1f} s")
                return
            try:
                if self._lazy and now - self.last_write >= tick:
                    self.flush()
                elif now - self.last_write >= self.interval * 0.9:
                    self.write(wire.HEARTBEAT)
            except JMSException:
                return
            if now - self._last_lead < tick or not self._read_lock.acquire(False):
                continue
            self._idle_reading = True
            try:  # read until a caller wants to (or the duties above are due)
                while self.broken is None and not self._stop.is_set() and self._read_some(self.interval / 4):
                    pass
            finally:
                self._idle_reading = False
                self._resign()

    # --- the end ------------------------------------------------------------------------------
    def _lost(self, reason: str) -> TransportException:
        """The connection broke (or closed): fail everything waiting, tell ``lost`` once;
        the connection's error (``broken``)."""
        with self._state_lock:
            broken = self.broken
            first = broken is None
            if broken is None:
                broken = self.broken = TransportException(
                    f"the connection to {self.where} is closed"
                    if self.closing
                    else f"the connection to {self.where} was lost: {reason}"
                )
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._cond:
            calls, self._calls = self._calls, {}
            for call in calls.values():
                call.complete(error=self.broken)
            self._cond.notify_all()
        self.interrupt()
        if first and not self.closing:
            self._on_lost(broken)
        return broken

    def close(self) -> None:
        """Close the socket (after whatever the caller said last)."""
        self.closing = True
        self._lost("closed")
        if threading.current_thread() is not self._monitor_thread:
            self._monitor_thread.join(5)
        self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
