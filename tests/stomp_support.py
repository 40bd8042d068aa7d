"""Helpers for the STOMP bridge tests: a session driven without sockets (the test thread
plays the event loop), a running bridge, and stomp.py listeners."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import stomp

from bridgemgr.providers.embedded import Broker
from bridgemgr.stompbridge.frames import (
    MESSAGE, PRE_CONNECT, Frame, encode_frame, parse_frame,
)
from bridgemgr.stompbridge.host import HostConnection
from bridgemgr.stompbridge.session import SessionConfig, StompSession

USERS = {"admin": "secret", "guest": "guest"}


def check_login(login: str, passcode: str) -> object | None:
    """The session's authenticate hook, without the slow hash (the repository has its own tests)."""
    return login if USERS.get(login) == passcode else None


class Driver:
    """One StompSession on a real broker, no sockets: frames in, frames out."""

    def __init__(self, broker: Broker, config: SessionConfig = SessionConfig(), name: str = "s1",
                 authenticate: Any = check_login) -> None:
        self.broker = broker
        self.posted: queue.Queue[tuple[Any, tuple[Any, ...]]] = queue.Queue()
        self.session = StompSession(config, authenticate=authenticate, open_host=self._open_host,
                                    session_id=name, now=time.monotonic())
        self.version: str | None = PRE_CONNECT
        self._in = bytearray()
        self.received: list[Frame] = []
        self.now = time.monotonic()

    def _open_host(self, client_id: str | None, user: str) -> HostConnection:
        return HostConnection(self.broker, lambda fn, *args: self.posted.put((fn, args)), client_id, user)

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


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def pending(broker: Broker, queue_name: str) -> int:
    """Messages of a queue not consumed yet (waiting or delivered unacknowledged)."""
    with broker.lock:
        mq = broker.queues.get(queue_name)
        return mq.count if mq is not None else 0
