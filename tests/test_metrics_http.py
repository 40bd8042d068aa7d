"""The metrics port's HTTP shell (metricshttp.py) in this process: HTTPS, keep-alive, and
what it does with requests it does not serve (other methods, bodies, oversize heads,
unknown paths, malformed credentials). The pages themselves are stubs here;
test_metrics_e2e.py scrapes a real service."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl

import pytest

from bridgemgr.guard import LoginThrottle, ServiceGuard, ThrottleSettings
from bridgemgr.metricshttp import MAX_HEAD, MetricsServer, Pages
from bridgemgr.netloop import NetLoop
from bridgemgr.users import User

ADMIN = ("admin", "s3cret")
AUTH = {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}


def authenticate(name: str, password: str) -> User | None:
    return User(name, "admin") if (name, password) == ADMIN else None


@pytest.fixture(scope="module")
def netloop():
    with NetLoop() as n:
        yield n


def start(netloop: NetLoop, ssl_context: ssl.SSLContext | None = None) -> MetricsServer:
    pages = Pages(lambda: (b"imq_up 1\n", "text/plain; version=0.0.4"), lambda: [])
    guard = ServiceGuard("metrics", LoginThrottle(ThrottleSettings(base_delay=0.01)), login_timeout=2)
    return MetricsServer(netloop, pages, authenticate, lambda user: None, ssl_context=ssl_context, guard=guard).start()


@pytest.fixture
def server(netloop):
    srv = start(netloop)
    yield srv
    srv.stop()


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_keep_alive_serves_several_requests_on_one_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for path, body in (("/metrics", b"imq_up 1\n"), ("/healthz", b"ok\n"), ("/readyz", b'{"ready": true')):
            conn.request("GET", path, headers=AUTH)
            response = conn.getresponse()
            assert response.status == 200 and response.read().startswith(body)
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", b"400"),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"400"),
        (b"GET /metrics SPDY/3\r\n\r\n", b"400"),
        (b"nonsense\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * MAX_HEAD + b"\r\n\r\n", b"431"),
        (b"GET /admin HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /metrics HTTP/1.1\r\nAuthorization: Basic !!!\r\n\r\n", b"401"),
        (b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer abc\r\n\r\n", b"401"),
    ],
)
def test_requests_it_does_not_serve_get_a_clear_status_and_the_connection_closes(server, request_bytes, status):
    answer = raw(server.port, request_bytes)
    assert answer.split(b" ")[1] == status, answer
    assert b"Connection: close" in answer and b"imq_up" not in answer


def test_https(netloop):
    trustme = pytest.importorskip("trustme", reason="trustme is a test dependency (pip install -e .[test])")
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    srv = start(netloop, server_ctx)
    try:
        assert srv.secure
        conn = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=10, context=client_ctx)
        conn.request("GET", "/metrics", headers=AUTH)
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b"imq_up 1\n"
        conn.close()
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            plain.request("GET", "/metrics", headers=AUTH)  # plain HTTP to the TLS port
            plain.getresponse()
    finally:
        srv.stop()
