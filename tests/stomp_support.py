"""Helpers for the STOMP bridge tests: a session driven without sockets (the test thread
plays the event loop), a running bridge, and stomp.py listeners."""

from __future__ import annotations

import itertools
import queue
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import stomp
import trustme

from bridgemgr.jms.hostbroker import Principal
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.stompbridge import StompBridge, StompConfig
from bridgemgr.stompbridge.frames import (
    MESSAGE,
    PRE_CONNECT,
    Frame,
    Limits,
    encode_frame,
    parse_frame,
)
from bridgemgr.stompbridge.host import HostConnection
from bridgemgr.stompbridge.session import SessionConfig, StompSession
from bridgemgr.users import UserRepository
from waiting import wait_for

HOST = "127.0.0.1"

USERS = {"admin": "secret", "guest": "guest"}


def check_login(login: str, passcode: str) -> object | None:
    """The session's authenticate hook, without the slow hash (the repository has its own tests)."""
    return login if USERS.get(login) == passcode else None


class Driver:
    """One StompSession on a real broker, no sockets: frames in, frames out."""

    def __init__(
        self, broker: Broker, config: SessionConfig = SessionConfig(), name: str = "s1", authenticate: Any = check_login
    ) -> None:
        self.broker = broker
        self.posted: queue.Queue[tuple[Any, tuple[Any, ...]]] = queue.Queue()
        self.session = StompSession(
            config, authenticate=authenticate, open_host=self._open_host, session_id=name, now=time.monotonic()
        )
        self.version: str | None = PRE_CONNECT
        self._in = bytearray()
        self.received: list[Frame] = []
        self.now = time.monotonic()

    def _open_host(self, client_id: str | None, user: str) -> HostConnection:
        return HostConnection(
            EmbeddedHostBroker(self.broker), Principal(user), lambda fn, *args: self.posted.put((fn, args)), client_id
        )

    def feed(self, data: bytes) -> list[Frame]:
        self.session.receive_data(data, self.now)
        return self._drain()

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> list[Frame]:
        return self.feed(encode_frame(Frame(command, headers or {}, body), self.version))

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        hdrs = {"accept-version": version, "login": "admin", "passcode": "secret", **headers}
        frames = self.send("CONNECT", hdrs)
        assert frames and frames[0].command == "CONNECTED", frames
        self.version = frames[0].headers["version"]
        return frames[0]

    def _drain(self) -> list[Frame]:
        """Run pending blocking calls inline, then parse what the session wrote."""
        while (call := self.session.take_call()) is not None:
            try:
                result = call.fn()
            except Exception as exc:
                self.session.complete_call(None, exc)
            else:
                self.session.complete_call(result)
        data = self.session.data_to_send(self.now)
        self._in += data
        out, pos = [], 0
        while True:
            frame, pos = parse_frame(self._in, pos, self.version)
            if frame is None:
                break
            out.append(frame)
        del self._in[:pos]
        self.received += out
        return out

    def pump(self, timeout: float = 0.05) -> list[Frame]:
        """Run subscriber batches posted within ``timeout`` seconds (the loop's job)."""
        out: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                fn, args = self.posted.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return out
            fn(*args)
            out += self._drain()

    def messages(self, n: int, timeout: float = 5.0) -> list[Frame]:
        """Exactly ``n`` MESSAGE frames (fails after ``timeout`` seconds)."""
        got: list[Frame] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got += [f for f in self.pump(0.05) if f.command == MESSAGE]
        assert len(got) >= n, f"got {len(got)} of {n} messages"
        return got

    def close(self) -> None:
        self.session.connection_lost()
        self.pump(0.05)  # batches in flight go back to their queues


class Collector(stomp.ConnectionListener):
    """A stomp.py listener that keeps frames and lets a test wait for them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: list[Any] = []
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.disconnected = False

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.append(frame.headers.get("receipt-id"))
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    def wait(self, predicate: Any, timeout: float = 5.0) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), "timed out waiting"

    def wait_messages(self, n: int, timeout: float = 5.0) -> list[Any]:
        self.wait(lambda: len(self.messages) >= n, timeout)
        return self.messages[:n]

    def wait_receipt(self, receipt: str, timeout: float = 5.0) -> None:
        self.wait(lambda: receipt in self.receipts, timeout)

    def wait_error(self, timeout: float = 5.0) -> Any:
        self.wait(lambda: bool(self.errors), timeout)
        return self.errors[0]


# The suite's one wait (tests/waiting.py), by the name the STOMP tests import.
wait_until = wait_for


def pending(broker: Broker, queue_name: str) -> int:
    """Messages of a queue not consumed yet (waiting or delivered unacknowledged)."""
    with broker.lock:
        mq = broker.queues.get(queue_name)
        return mq.count if mq is not None else 0


# --- a running bridge, certificates and clients ------------------------------------------------


def make_users(directory: Path) -> UserRepository:
    repo = UserRepository(directory / "passwd")
    for name, password in USERS.items():
        repo.add(name, password, "admin" if name == "admin" else "user")
    return repo


def make_certs(d: Path) -> dict[str, Path]:
    """A CA (trustme), a server certificate for 127.0.0.1, a client certificate of the same
    CA and one of a stranger CA."""
    ca = trustme.CA()
    server = ca.issue_cert(HOST)
    paths = {
        "ca": d / "ca.pem",
        "cert": d / "server.pem",
        "key": d / "server.key",
        "client": d / "client.pem",
        "stranger": d / "stranger.pem",
    }
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(paths["cert"], append=True)
    server.private_key_pem.write_to_path(paths["key"])
    ca.issue_cert("client@example.com").private_key_and_cert_chain_pem.write_to_path(paths["client"])
    trustme.CA().issue_cert("intruder@example.com").private_key_and_cert_chain_pem.write_to_path(paths["stranger"])
    return paths


def make_bridge(
    netloop: NetLoop,
    broker: Broker,
    users: UserRepository,
    certs: dict[str, Path] | None = None,
    require_client_auth: bool = False,
    **session: Any,
) -> StompBridge:
    """A started bridge on free ports of 127.0.0.1 (TLS too when given certificates)."""
    config = StompConfig(
        hostname=HOST,
        tcp_port=0,
        tls_enabled=certs is not None,
        tls_port=0,
        tls_require_client_auth=require_client_auth,
        tls_certfile=certs and certs["cert"],
        tls_keyfile=certs and certs["key"],
        tls_cafile=certs and certs["ca"],
        session=SessionConfig(limits=Limits(max_frame_size=256 * 1024), **session),
    )
    bridge = StompBridge(config, EmbeddedHostBroker(broker), users, netloop)
    bridge.start()
    return bridge


_names = itertools.count(1)


def qname(prefix: str = "q") -> str:
    """A destination name no other test uses."""
    return f"{prefix}{next(_names)}"


class Raw:
    """A plain socket speaking STOMP by hand (for what stomp.py refuses to send)."""

    def __init__(self, port, version=None, context=None, rcvbuf=None, source=HOST):
        """``source``: the local address (any of 127.0.0.0/8) the server sees."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(5)
        sock.bind((source, 0))
        sock.connect((HOST, port))
        self.sock = context.wrap_socket(sock, server_hostname=HOST) if context else sock
        self.version = version
        self.buf = bytearray()
        self.frames: list[Frame] = []
        self.closed = False

    def send(self, data: bytes) -> Raw:
        self.sock.sendall(data)
        return self

    def frame(self, command, headers=None, body=b"") -> Raw:
        return self.send(encode_frame(Frame(command, headers or {}, body), self.version))

    def connect(self, version="1.2", **headers) -> Frame:
        self.frame("CONNECT", {"accept-version": version, "login": "admin", "passcode": "secret", **headers})
        connected = self.wait(lambda f: f.command == "CONNECTED")
        self.version = connected.headers["version"]
        return connected

    def _read(self, timeout) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except (ConnectionResetError, ssl.SSLError, OSError):
            data = b""
        if not data:
            self.closed = True
            return
        self.buf += data
        pos = 0
        while True:
            frame, pos = parse_frame(self.buf, pos, self.version)
            if frame is None:
                break
            self.frames.append(frame)
        del self.buf[:pos]

    def wait(self, predicate, timeout=5.0) -> Frame:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for f in self.frames[seen:]:
                if predicate(f):
                    return f
            seen = len(self.frames)
            if self.closed or time.monotonic() > deadline:
                raise AssertionError(f"not seen; got {self.frames}, closed={self.closed}")
            self._read(min(0.2, max(0.01, deadline - time.monotonic())))

    def until_closed(self, timeout=5.0) -> list[Frame]:
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self._read(0.2)
        assert self.closed, "the server did not close the connection"
        return self.frames

    def close(self):
        self.sock.close()


def stomp_conn(version, port, heartbeats=(0, 0), ssl_args=None, **kw):
    cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[version]
    conn = cls([(HOST, port)], heartbeats=heartbeats, **kw) if version != "1.0" else cls([(HOST, port)], **kw)
    if ssl_args is not None:
        conn.set_ssl(for_hosts=[(HOST, port)], **ssl_args)
    listener = Collector()
    conn.set_listener("c", listener)
    return conn, listener
