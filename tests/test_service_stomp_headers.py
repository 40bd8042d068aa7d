"""STOMP header values through a real `imqbridgemgr serve`, over plain sockets.

A NUL byte, or a carriage return, written raw inside a header of a SEND was stored and
then written raw into every subscriber's MESSAGE frame: a client that ends frames at the
NUL (STOMP 1.0's framing; content-length is optional there) then read a second MESSAGE
whose headers and body the sender chose. Now the SEND is refused with an ERROR naming the
header and the frame, and nothing reaches the subscribers. A line feed that a 1.1/1.2
sender wrote as the legal escape \\n reaches a 1.2 subscriber escaped (one frame, the
value intact) and is refused to a 1.0 subscriber, which has no escapes (it used to get
the value with the line feed turned into a space).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from bridgemgr.stompbridge.frames import parse_frame
from service_support import Daemon, one_bridge_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PASSWORD = "Secret-1"


@pytest.fixture(scope="module")
def stomp_port(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("stomphdr")
    props, _ = one_bridge_files(base, "stomphdr", "", PASSWORD, "imq.bridge.stomp.tcp.port=0", activelist="stomp")
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"stomp": "STARTED"}, daemon.lines
        from bridgemgr.admin.portmapper import find_service

        host, port = daemon.address.split(":")
        yield find_service(host, int(port), ("stomp",)).port
    finally:
        daemon.stop()


class Wire:
    """A STOMP client on a socket that keeps every byte it receives, so a test can read
    the stream the way a 1.0 client does (a frame ends at the first NUL)."""

    def __init__(self, port: int, version: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.data = bytearray()
        self.version = version
        self.write(
            f"CONNECT\naccept-version:{version}\nlogin:admin\npasscode:{PASSWORD}\n\n\0".encode()
            if version != "1.0"
            else f"CONNECT\nlogin:admin\npasscode:{PASSWORD}\n\n\0".encode()
        )
        self.until(b"CONNECTED")

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def until(self, needle: bytes, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.data:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not received; got {bytes(self.data)!r}")
            self.read(0.2)

    def read(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return True
        self.data += chunk
        return bool(chunk)

    def nul_frames(self) -> list[bytes]:
        """The received stream cut at each NUL (heart-beat EOLs dropped)."""
        return [part.lstrip(b"\r\n") for part in bytes(self.data).split(b"\0")[:-1]]

    def subscribe(self, destination: str) -> None:
        self.write(f"SUBSCRIBE\ndestination:{destination}\nid:s1\nreceipt:subscribed\n\n\0".encode())
        self.until(b"receipt-id:subscribed")

    def close(self) -> None:
        self.sock.close()


def messages(wire: Wire) -> list[bytes]:
    return [f for f in wire.nul_frames() if f.startswith(b"MESSAGE\n")]


RAW_VALUES = [("1.0", b"a\0MESSAGE"), ("1.2", b"a\0MESSAGE"), ("1.1", b"a\rb"), ("1.2", b"a\rb")]


@pytest.mark.parametrize(("version", "raw"), RAW_VALUES)
def test_a_raw_nul_or_cr_in_a_send_header_is_refused_and_never_forwarded(stomp_port, version, raw):
    topic = f"/topic/raw{version.replace('.', '')}{raw[1]}"
    receivers = [Wire(stomp_port, "1.0"), Wire(stomp_port, "1.2")]
    for r in receivers:
        r.subscribe(topic)
    sender = Wire(stomp_port, version)
    sender.write(f"SEND\ndestination:{topic}\nx:".encode() + raw + b"\nforged:yes\n\nforged body\0")
    sender.until(b"ERROR")
    error = bytes(sender.data[sender.data.index(b"ERROR") :])
    assert b"SEND" in error and b"'x'" in error, error
    assert b"NUL" in error if b"\0" in raw else b"carriage return" in error, error
    sender.close()

    clean = Wire(stomp_port, "1.2")
    clean.write(f"SEND\ndestination:{topic}\nreceipt:sent\n\nafter\0".encode())
    clean.until(b"receipt-id:sent")
    clean.close()
    for r in receivers:
        r.until(b"after")
        r.read(0.3)
        got = messages(r)
        assert len(got) == 1 and got[0].endswith(b"\n\nafter"), (r.version, got)
        r.close()


def test_an_escaped_line_feed_reaches_1_2_escaped_and_is_refused_to_1_0(stomp_port):
    topic = "/topic/escapedlf"
    old, new = Wire(stomp_port, "1.0"), Wire(stomp_port, "1.2")
    for r in (old, new):
        r.subscribe(topic)
    sender = Wire(stomp_port, "1.2")
    sender.write(f"SEND\ndestination:{topic}\nx:a\\nMESSAGE\\nforged\\cyes\nreceipt:sent\n\nbody\0".encode())
    sender.until(b"receipt-id:sent")
    sender.close()

    new.until(b"body")
    frames = messages(new)
    assert len(frames) == 1, frames
    frame, _ = parse_frame(frames[0] + b"\0", 0, "1.2")
    assert frame is not None and frame.headers["x"] == "a\nMESSAGE\nforged:yes"
    assert frame.body == b"body"

    old.until(b"ERROR")
    old.read(0.3)
    assert messages(old) == [], old.data
    error = bytes(old.data[old.data.index(b"ERROR") :])
    assert b"'x'" in error and b"line feed" in error and b"1.0" in error, error
    for r in (old, new):
        r.close()
