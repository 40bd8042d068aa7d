"""The management port over HTTPS (imq.console.tls.*) of a real service in this process:
the API answers through TLS with HSTS, the port mapper says https, and plain HTTP to the
port gets no answer."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl

import pytest
import trustme

from bridgemgr.admin.portmapper import find_service

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PASSWORD = "tls-adm1n-pw"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    from bridgemgr.props import load_properties
    from bridgemgr.service import BridgeServiceManager

    base = tmp_path_factory.mktemp("console-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(base / "cert.pem"))
    cert.private_key_pem.write_to_path(str(base / "key.pem"))
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    props = load_properties(
        overrides=[
            f"imq.varhome={base / 'var'}",
            "imq.portmapper.port=0",
            "imq.jms.tcp.port=0",
            "imq.bridge.enabled=true",
            "imq.bridge.admin.user=admin",
            f"imq.bridge.admin.password={PASSWORD}",
            "imq.bridge.admin.port=0",
            "imq.console.port=0",
            "imq.console.tls.enabled=true",
            f"imq.console.tls.certfile={base / 'cert.pem'}",
            f"imq.console.tls.keyfile={base / 'key.pem'}",
        ]
    )
    manager = BridgeServiceManager(props)
    manager.start()
    try:
        yield manager, ssl.create_default_context(cafile=str(base / "ca.pem"))
    finally:
        manager.stop()


def test_the_api_answers_over_https_with_hsts(secure):
    manager, ctx = secure
    conn = http.client.HTTPSConnection("127.0.0.1", manager.console.port, context=ctx, timeout=30)
    try:
        token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
        conn.request("GET", "/api/v1/bridges", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["data"] == {"bridges": []}
        assert response.getheader("strict-transport-security", "").startswith("max-age=")
    finally:
        conn.close()
    entry = find_service("127.0.0.1", manager.portmapper.port, ("console",))
    assert (entry.port, entry.protocol) == (manager.console.port, "https")


def test_plain_http_to_the_tls_port_gets_no_answer(secure):
    manager, _ = secure
    with socket.create_connection(("127.0.0.1", manager.console.port), timeout=30) as sock:
        sock.sendall(b"GET /api/v1/bridges HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    assert not data.startswith(b"HTTP/")


def test_the_session_cookie_is_secure_over_https(secure):
    manager, ctx = secure
    conn = http.client.HTTPSConnection("127.0.0.1", manager.console.port, context=ctx, timeout=30)
    try:
        body = json.dumps({"user": "admin", "password": PASSWORD})
        conn.request("POST", "/api/v1/session", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        attributes = [a.strip().lower() for a in response.getheader("set-cookie", "").split(";")]
        assert response.status == 200 and "secure" in attributes and "httponly" in attributes
    finally:
        conn.close()
