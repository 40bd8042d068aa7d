"""imqbridgemgr keytool (a key and a self-signed certificate for a TLS port) and the STOMP
bridge's TLS files from imq.bridge.stomp.tls.certfile/keyfile/cafile: a bridge started
with what keytool prints serves TLS to a client that trusts the certificate, and a file it
cannot use stops the start with the property and the file named."""

from __future__ import annotations

import json
import os
import ssl
import stat

import pytest
from click.testing import CliRunner
from cryptography import x509

from bridgemgr.cli import main
from bridgemgr.netloop import NetLoop
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.stompbridge import StompBridge, StompBridgeError, StompConfig
from stomp_support import HOST, Raw, make_users, stomp_conn, wait_until


def keytool(tmp_path, *args):
    return CliRunner().invoke(main, ["keytool", "-D", f"imq.varhome={tmp_path / 'var'}", *args])


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.slow  # an RSA key: about 1 s
def test_keytool_writes_a_private_key_and_a_certificate_and_prints_the_properties(tmp_path):
    made = keytool(tmp_path, "-cn", "mq.example.com", "-san", "10.1.2.3", "--json")
    assert made.exit_code == 0, made.output
    report = json.loads(made.output)
    etc = tmp_path / "var" / "instances" / "imqbroker" / "etc"
    assert report["certfile"] == str(etc / "stomp-cert.pem") and report["keyfile"] == str(etc / "stomp-key.pem")
    assert report["properties"] == {
        "imq.bridge.stomp.tls.enabled": "true",
        "imq.bridge.stomp.tls.certfile": str(etc / "stomp-cert.pem"),
        "imq.bridge.stomp.tls.keyfile": str(etc / "stomp-key.pem"),
    }
    assert mode(etc / "stomp-key.pem") == 0o600 and mode(etc) == 0o700
    assert mode(etc / "stomp-cert.pem") & 0o077 in (0o044, 0o004, 0o040, 0)  # public; the umask decides
    assert b"PRIVATE KEY" in (etc / "stomp-key.pem").read_bytes()
    cert = x509.load_pem_x509_certificate((etc / "stomp-cert.pem").read_bytes())
    assert cert.subject == cert.issuer and "mq.example.com" in cert.subject.rfc4514_string()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["mq.example.com", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1", "10.1.2.3"]
    assert report["fingerprint"].count(":") == 31

    again = keytool(tmp_path)
    assert again.exit_code == 1 and f"{etc / 'stomp-cert.pem'} exists; -f replaces it" in again.output
    assert x509.load_pem_x509_certificate((etc / "stomp-cert.pem").read_bytes()) == cert
    (etc / "stomp-key.pem").chmod(0o644)
    replaced = keytool(tmp_path, "-f", "-keyalg", "RSA")
    assert replaced.exit_code == 0, replaced.output
    assert "imq.bridge.stomp.tls.keyfile=" in replaced.output and mode(etc / "stomp-key.pem") == 0o600
    assert x509.load_pem_x509_certificate((etc / "stomp-cert.pem").read_bytes()) != cert


def test_keytool_writes_where_it_is_told_for_another_service(tmp_path):
    cert, key = tmp_path / "out" / "admin.crt", tmp_path / "out" / "admin.key"
    made = keytool(tmp_path, "-service", "admin", "-certfile", str(cert), "-keyfile", str(key))
    assert made.exit_code == 0, made.output
    assert f"imq.bridge.admin.tls.certfile={cert}" in made.output and mode(key) == 0o600
    assert not (tmp_path / "var" / "instances" / "imqbroker" / "etc" / "admin-key.pem").exists()
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)  # a key and its cert


@pytest.fixture(scope="module")
def netloop():
    with NetLoop("keytool-test-loop") as loop:
        yield loop


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    yield b
    b.close()


def stomp_bridge(tmp_path, netloop, broker, *properties):
    props = load_properties(
        [],
        [
            f"imq.varhome={tmp_path / 'var'}",
            f"imq.bridge.stomp.hostname={HOST}",
            "imq.bridge.stomp.tcp.enabled=false",
            "imq.bridge.stomp.tls.port=0",
            *properties,
        ],
        environ={},
    )
    return StompBridge(StompConfig.from_props(props), EmbeddedHostBroker(broker), make_users(tmp_path), netloop)


@pytest.mark.slow
def test_a_stomp_bridge_with_keytools_properties_serves_tls_to_a_client_trusting_the_cert(tmp_path, netloop, broker):
    made = keytool(tmp_path, "-cn", "localhost")
    assert made.exit_code == 0, made.output
    properties = [line for line in made.output.splitlines() if line.startswith("imq.bridge.stomp.tls.")]
    assert len(properties) == 3
    bridge = stomp_bridge(tmp_path, netloop, broker, *properties)
    bridge.start()
    try:
        certfile = tmp_path / "var" / "instances" / "imqbroker" / "etc" / "stomp-cert.pem"
        trusting = ssl.create_default_context(cafile=str(certfile))  # verifies the chain and 127.0.0.1
        raw = Raw(bridge.tls_port, context=trusting)
        raw.connect()
        raw.close()
        conn, _listener = stomp_conn("1.2", bridge.tls_port, ssl_args={"ca_certs": str(certfile)})
        conn.connect("guest", "guest", wait=True)
        conn.disconnect()
        with pytest.raises(ssl.SSLCertVerificationError):  # a client trusting only the system CAs
            Raw(bridge.tls_port, context=ssl.create_default_context())
        assert wait_until(lambda: not bridge.connections)
    finally:
        bridge.stop()


@pytest.mark.parametrize(
    "setting, message",
    [
        ((), "imq.bridge.stomp.tls.enabled is true but imq.bridge.stomp.tls.certfile is not set"),
        (("certfile=missing.pem",), "imq.bridge.stomp.tls.certfile: cannot read {d}/missing.pem: No such file"),
        (("certfile=cert.pem", "keyfile=missing.key"), "imq.bridge.stomp.tls.keyfile: cannot read {d}/missing.key"),
        (
            ("certfile=cert.pem", "keyfile=folder"),
            "imq.bridge.stomp.tls.keyfile: cannot read {d}/folder: Is a directory",
        ),
        (("certfile=junk.pem",), "imq.bridge.stomp.tls.certfile {d}/junk.pem: not a PEM certificate chain"),
        (
            ("certfile=cert.pem", "keyfile=key.pem", "requireClientAuth=true"),
            "imq.bridge.stomp.tls.requireClientAuth is true but imq.bridge.stomp.tls.cafile is not set",
        ),
        (
            ("certfile=cert.pem", "keyfile=key.pem", "requireClientAuth=true", "cafile=missing-ca.pem"),
            "imq.bridge.stomp.tls.cafile: cannot read {d}/missing-ca.pem",
        ),
    ],
)
def test_a_tls_file_the_stomp_bridge_cannot_use_stops_its_start_naming_the_property_and_file(
    tmp_path, netloop, broker, setting, message
):
    d = tmp_path / "tls"
    made = keytool(tmp_path, "-certfile", str(d / "cert.pem"), "-keyfile", str(d / "key.pem"))
    assert made.exit_code == 0, made.output
    (d / "junk.pem").write_text("not a certificate\n")
    (d / "folder").mkdir()
    bridge = stomp_bridge(
        tmp_path,
        netloop,
        broker,
        "imq.bridge.stomp.tls.enabled=true",
        *(
            f"imq.bridge.stomp.tls.{s.split('=')[0]}={d / s.split('=')[1]}"
            if "file" in s
            else f"imq.bridge.stomp.tls.{s}"
            for s in setting
        ),
    )
    with pytest.raises(StompBridgeError) as failed:
        bridge.start()
    assert message.format(d=d) in str(failed.value)
    assert bridge.state == "STOPPED"
