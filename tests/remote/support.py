"""Helpers for the jms service tests: a service on a real socket in this process, raw
protocol clients, and subprocess launchers (imported by tests/test_jmsservice_*,
tests/test_remote_* and tests/remote/)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bridgemgr.admin.portmapper import PortMapper
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker, wire
from bridgemgr.providers.embedded.jmsservice import JmsService
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


class Harness:
    """A broker's jms service and port mapper on their own NetLoop, on 127.0.0.1."""

    def __init__(self, broker: Broker, **options) -> None:
        self.broker = broker
        self.netloop = NetLoop().start()
        self.service = JmsService(broker, self.netloop, "127.0.0.1", 0, **options).start()
        self.portmapper = PortMapper(self.netloop, "127.0.0.1", 0, broker.instance_name).start()
        self.portmapper.register(self.service.service_entry())

    @property
    def url(self) -> str:
        return f"mq://127.0.0.1:{self.portmapper.port}"

    def factory(self, **options) -> RemoteConnectionFactory:
        return RemoteConnectionFactory(self.url, **options)

    def close(self) -> None:
        self.service.stop()
        self.portmapper.stop()
        self.netloop.stop()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RawClient:
    """A protocol client without the SPI: writes any bytes, reads events."""

    def __init__(self, port: int, preamble: bytes | None = wire.PREAMBLE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.wire = wire.Wire(wire.Role.CLIENT)
        if preamble:
            self.sock.sendall(preamble)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, user=None, password=None, heartbeat_ms=30000):
        self.send(wire.request(1, wire.Op.HELLO, user, password, heartbeat_ms, "raw"))
        event = self.next_event()
        if isinstance(event, wire.Reply):
            self.wire.open()
        return event

    def next_event(self, timeout: float = 5.0):
        """The next event, or None when the server closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.wire.next_event()
            if event is not None:
                return event
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.wire.receive_data(data)

    def call(self, op, *args, call=7):
        self.send(wire.request(call, op, *args))
        while True:
            event = self.next_event()
            if not isinstance(event, wire.Heartbeat | wire.Delivery):
                return event

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """True once the server has closed (after any events it sent first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.next_event(deadline - time.monotonic())
            except wire.ProtocolError:
                continue
            if event is None:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    return env


def spawn(script: str, *args: str) -> subprocess.Popen:
    """A Python child running tests/remote/<script> with line-buffered stdout."""
    return subprocess.Popen(
        [sys.executable, "-u", str(HERE / script), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def expect_line(proc: subprocess.Popen, prefix: str, timeout: float = 20.0) -> str:
    """Read the child's stdout up to a line starting with ``prefix`` (its rest)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited ({proc.poll()}) before {prefix!r}: {proc.stderr.read()}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise AssertionError(f"no {prefix!r} line within {timeout} s")
