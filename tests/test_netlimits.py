"""Per-address limits on connections that have not logged in
(imq.<service>.max_unauthenticated_per_address) on every port, over real sockets to the
real servers (STOMP bridge, jms service, admin port, metrics port, port mapper): one
address holding its limit of idle sockets does not stop a login from another address,
its extra sockets are closed at once, and a login gives its place back. Client resets
and clients that close at once are logged at DEBUG, never ERROR with a traceback.

Every client binds a loopback source address of its own (Linux routes 127.0.0.0/8 to
the loopback), so "another address" is 127.0.0.x.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr.admin import portmapper
from bridgemgr.admin.portmapper import PortMapper, lookup_services
from bridgemgr.admin.protocol import OK, Reply
from bridgemgr.admin.server import AdminServer
from bridgemgr.guard import AddressLimit, LoginThrottle, ServiceGuard, ThrottleSettings, address_key
from bridgemgr.metricshttp import MetricsServer, Pages
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker, wire
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.providers.embedded.jmsservice import JmsService
from bridgemgr.stompbridge import StompBridge, StompConfig
from bridgemgr.users import UserRepository
from stomp_support import make_certs
from waiting import wait_for

pytestmark = pytest.mark.timeout(60)

LIMIT = 4
PASSWORD = "Secret-1"


# --- the limit on its own ---------------------------------------------------------------------------


def test_an_address_holds_its_limit_and_each_release_gives_one_place_back():
    limit = AddressLimit("stomp", 2)
    first, second = limit.admit("10.0.0.1"), limit.admit("10.0.0.1")
    third = limit.admit("10.0.0.1")
    assert first.refusal is None and second.refusal is None
    assert third.refusal is not None and "imq.stomp.max_unauthenticated_per_address=2" in third.refusal
    assert limit.admit("10.0.0.2").refusal is None  # another address has its own places
    third.release()  # a refusal holds nothing to give back
    first.release()
    first.release()  # twice: still one place
    assert limit.held("10.0.0.1") == 1
    assert limit.admit("10.0.0.1").refusal is None
    assert limit.admit("10.0.0.1").refusal is not None


def test_ipv6_counts_by_its_64_and_a_mapped_ipv4_address_as_itself():
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert address_key("fe80::1%eth0") == "fe80::/64"
    assert address_key("?") == "?"


@pytest.mark.slow
@given(st.lists(st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "::2"]), st.booleans()), max_size=60))
def test_what_is_held_is_what_was_admitted_and_not_released(steps):
    """Any sequence of connects (True) and closes of the oldest open one (False)."""
    limit = AddressLimit("jms", 3)
    open_ = {address: [] for address in ("10.0.0.1", "10.0.0.2", "::1", "::2")}
    for address, connect in steps:
        if connect:
            admission = limit.admit(address)
            group = [a for a in open_ if address_key(a) == address_key(address)]
            if sum(len(open_[a]) for a in group) < 3:
                assert admission.refusal is None
                open_[address].append(admission)
            else:
                assert admission.refusal is not None
        elif open_[address]:
            open_[address].pop(0).release()
    for address in open_:
        group = [a for a in open_ if address_key(a) == address_key(address)]
        assert limit.held(address) == sum(len(open_[a]) for a in group)
    for admissions in open_.values():
        for admission in admissions:
            admission.release()
    assert limit._held == {}  # nothing kept for addresses with nothing open


# --- every port over real sockets -------------------------------------------------------------------


def dial(port: int, source: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout bounds each read)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while end not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without {end!r}: {data[:200]!r}"
        data += chunk
    return data


@dataclass
class Port:
    """One service's port, how a client logs in on an open socket (True when it did; the
    socket stays open), what its refusal over the limit contains, and its limit."""

    port: int
    log_in: Callable[[socket.socket], bool] | None
    refusal: Callable[[bytes], bool]
    pending: AddressLimit


def stomp_log_in(sock: socket.socket) -> bool:
    sock.sendall(f"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:{PASSWORD}\n\n\0".encode())
    return read_until(sock, b"\0").startswith(b"CONNECTED\n")


def jms_log_in(sock: socket.socket) -> bool:
    reader = wire.Wire(wire.Role.CLIENT)
    sock.sendall(wire.PREAMBLE + wire.request(1, wire.Op.HELLO, "alice", PASSWORD, 30000, "raw"))
    while (event := reader.next_event()) is None:
        chunk = sock.recv(65536)
        assert chunk, "closed without an answer"
        reader.receive_data(chunk)
    return isinstance(event, wire.Reply)


def jms_refusal(data: bytes) -> bool:
    reader = wire.Wire(wire.Role.CLIENT)
    reader.receive_data(data)
    event = reader.next_event()
    return isinstance(event, wire.Failure) and "imq.jms.max_unauthenticated_per_address=4" in str(event.error)


def admin_log_in(sock: socket.socket) -> bool:
    sock.sendall(json.dumps({"op": "HELLO", "version": 1, "user": "admin", "password": PASSWORD}).encode() + b"\n")
    return json.loads(read_until(sock, b"\n"))["status"] == OK


def metrics_log_in(sock: socket.socket) -> bool:
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n\r\n".encode())
    head = read_until(sock, b"\r\n\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    body = head.split(b"\r\n\r\n", 1)[1]
    while len(body) < length:
        body += sock.recv(65536)
    return head.startswith(b"HTTP/1.1 200 ")


@pytest.fixture(scope="module")
def netloop():
    with NetLoop("netlimits-test") as loop:
        yield loop


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    repo = UserRepository(tmp_path_factory.mktemp("users") / "passwd")
    repo.add("alice", PASSWORD, "admin")
    return repo


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("broker") / "store")
    yield b
    b.close()


def guard(service: str) -> ServiceGuard:
    return ServiceGuard(
        service,
        LoginThrottle(ThrottleSettings(base_delay=0.01)),
        login_timeout=30,
        max_unauthenticated_per_address=LIMIT,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stomp(netloop, broker, users, certs):
    config = StompConfig(
        hostname="127.0.0.1",
        tcp_port=0,
        tls_enabled=True,
        tls_port=0,
        tls_certfile=certs["cert"],
        tls_keyfile=certs["key"],
    )
    bridge = StompBridge(config, EmbeddedHostBroker(broker), users, netloop, guard("stomp"))
    bridge.start()
    yield bridge
    bridge.stop()


@pytest.fixture(scope="module")
def ports(netloop, broker, users, stomp) -> Iterator[dict[str, Port]]:
    jms = JmsService(
        broker,
        netloop,
        "127.0.0.1",
        0,
        guard=guard("jms"),
        authenticator=lambda user, password: users.authenticate(user or "", password or "") is not None,
    ).start()
    admin = AdminServer(netloop, lambda command: Reply(OK, "done"), "admin", PASSWORD, guard=guard("admin")).start()
    pages = Pages(lambda: (b"imq_up 1\n", "text/plain; version=0.0.4"), lambda: [])
    metrics = MetricsServer(netloop, pages, users.authenticate, lambda user: None, guard=guard("metrics")).start()
    mapper = PortMapper(netloop, "127.0.0.1", 0, "netlimits", max_unauthenticated_per_address=LIMIT).start()
    yield {
        "stomp": Port(
            stomp.tcp_port,
            stomp_log_in,
            lambda data: (
                data.startswith(b"ERROR\n")
                and b"message:too many connections" in data
                and b"imq.stomp.max_unauthenticated_per_address=4" in data
            ),
            stomp.guard.unauthenticated,
        ),
        "jms": Port(jms.port, jms_log_in, jms_refusal, jms.guard.unauthenticated),
        "admin": Port(
            admin.port,
            admin_log_in,
            lambda data: (
                json.loads(data)["status"] == 503
                and "imq.admin.max_unauthenticated_per_address=4" in json.loads(data)["message"]
            ),
            admin.guard.unauthenticated,
        ),
        "metrics": Port(
            metrics.port,
            metrics_log_in,
            lambda data: data.startswith(b"HTTP/1.1 503 ") and b"imq.metrics.max_unauthenticated_per_address=4" in data,
            metrics.guard.unauthenticated,
        ),
        "portmapper": Port(mapper.port, None, lambda data: data == b"", mapper.pending),
    }
    for server in (jms, admin, metrics, mapper):
        server.stop()


SERVICES = ["stomp", "jms", "admin", "metrics", "portmapper"]


@pytest.mark.parametrize("service", SERVICES)
def test_one_address_at_its_limit_does_not_stop_a_login_from_another(ports, service, monkeypatch):
    port = ports[service]
    monkeypatch.setattr(portmapper, "_LINGER", 30.0)  # the port mapper's idle ones stay too
    idle = [dial(port.port, "127.0.0.11") for _ in range(LIMIT)]
    try:
        wait_for(lambda: port.pending.held("127.0.0.11") == LIMIT)
        for _ in range(3):  # more from there: refused and closed at once
            with dial(port.port, "127.0.0.11") as extra:
                data = until_closed(extra)
            assert port.refusal(data), data[:300]
        if port.log_in is None:  # the port mapper: everyone gets the table
            services = lookup_services("127.0.0.1", port.port)
            assert services[0].name == "portmapper"
        else:
            with dial(port.port, "127.0.0.12") as other:
                assert port.log_in(other)
        assert port.pending.held("127.0.0.11") == LIMIT  # the idle ones stay (the login timeout reaps them)
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: port.pending.held("127.0.0.11") == 0)


@pytest.mark.parametrize("service", ["stomp", "jms", "admin", "metrics"])
def test_a_connection_that_logs_in_gives_its_place_back(ports, service):
    port = ports[service]
    assert port.log_in is not None
    logged_in = [dial(port.port, "127.0.0.13") for _ in range(LIMIT)]
    try:
        for sock in logged_in:
            assert port.log_in(sock)
        wait_for(lambda: port.pending.held("127.0.0.13") == 0)
        with dial(port.port, "127.0.0.13") as more:  # the address may open LIMIT more
            assert port.log_in(more)
    finally:
        for sock in logged_in:
            sock.close()


def test_tls_sockets_count_before_their_handshake_and_extra_ones_are_closed_unanswered(stomp):
    pending = stomp.guard.unauthenticated
    idle = [dial(stomp.tls_port, "127.0.0.14") for _ in range(LIMIT)]  # no ClientHello
    try:
        wait_for(lambda: pending.held("127.0.0.14") == LIMIT)
        with dial(stomp.tls_port, "127.0.0.14") as extra:
            assert until_closed(extra) == b""  # closed at once: no handshake, no refusal
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with context.wrap_socket(dial(stomp.tls_port, "127.0.0.15")) as other:
            assert stomp_log_in(other)
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: pending.held("127.0.0.14") == 0)


# --- resets ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", SERVICES)
def test_clients_that_reset_or_close_at_once_are_logged_at_debug_not_error(ports, service, caplog):
    """Half the clients close at once (the server's answer meets a closed socket: a reset,
    then ENOTCONN on half-closing), half send a little and reset (SO_LINGER 0); more than
    the limit, so refusals meet resets too. Before: ERROR tracebacks from the port
    mapper's connection_made for nearly every one."""
    port = ports[service]
    caplog.set_level(logging.DEBUG)
    for n in range(100):
        sock = dial(port.port, "127.0.0.16")
        if n % 2:
            sock.sendall(b"x")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    wait_for(lambda: port.pending.held("127.0.0.16") == 0, timeout=10)
    with dial(port.port, "127.0.0.17") as other:  # the port still serves
        if port.log_in is None:
            assert until_closed(other).endswith(b"\n.\n")
        else:
            assert port.log_in(other)
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud[:3]]


@pytest.mark.parametrize("service", ["stomp", "jms", "admin", "metrics"])
def test_refusals_over_max_connections_that_meet_clients_gone_log_no_error(netloop, broker, users, service, caplog):
    """Every connection is over max_connections (0 here) and gets the service's refusal,
    written to clients that closed at once or reset. Before: an ERROR traceback from
    connection_made (the half-close after a reset: ENOTCONN) for every other one, on STOMP
    and jms."""
    refusing = ServiceGuard(service, login_timeout=30, max_connections=0)
    if service == "stomp":
        server = StompBridge(
            StompConfig(hostname="127.0.0.1", tcp_port=0), EmbeddedHostBroker(broker), users, netloop, refusing
        )
        server.start()
        port = server.tcp_port
    elif service == "jms":
        server = JmsService(broker, netloop, "127.0.0.1", 0, guard=refusing).start()
        port = server.port
    elif service == "admin":
        server = AdminServer(netloop, lambda command: Reply(OK, "done"), "admin", PASSWORD, guard=refusing).start()
        port = server.port
    else:
        server = MetricsServer(
            netloop,
            Pages(lambda: (b"", "text/plain"), lambda: []),
            users.authenticate,
            lambda user: None,
            guard=refusing,
        ).start()
        port = server.port
    caplog.set_level(logging.DEBUG)
    try:
        for n in range(100):
            sock = dial(port, "127.0.0.18")
            if n % 2:
                sock.sendall(b"x")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        wait_for(lambda: refusing.unauthenticated.held("127.0.0.18") == 0, timeout=10)
    finally:
        server.stop()
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud[:3]]


def test_a_reset_seen_by_the_net_loop_is_one_debug_line(caplog):
    """What a front end's callback raises for a client that left goes to DEBUG; anything
    else still reaches asyncio's handler as an ERROR."""
    caplog.set_level(logging.DEBUG)

    def gone() -> None:
        raise OSError(107, "Transport endpoint is not connected")

    def bug() -> None:
        raise ValueError("a bug")

    with NetLoop() as loop:
        loop.call_soon(gone)
        loop.call_soon(bug)
        wait_for(lambda: any(r.levelno == logging.ERROR for r in caplog.records))
    gone_records = [r for r in caplog.records if "Transport endpoint" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in gone_records] == [(logging.DEBUG, None)]
    assert "\n" not in gone_records[0].getMessage()
    assert [r.exc_info[0] for r in caplog.records if r.levelno == logging.ERROR] == [ValueError]
