"""The scenarios of a well-known STOMP client's own test suite (stomp.py 8/9: tests/test_basic,
test_s10, test_s11, test_s12, test_nonascii, test_misc, test_ssl, test_threading,
test_context, test_activemq), rewritten against the bridge, with the record of which pass.

Record (stomp.py 9.0.0 against this bridge):

=====================================================  ======  ==========================================
scenario (stomp.py test)                               result  note
=====================================================  ======  ==========================================
basic: subscribe and send, content-type kept           PASS    content-type rides as JMS_STOMP_CONTENT_TYPE
basic: commit (3 sends in a transaction)               PASS
basic: abort                                           PASS
basic: client ack (message-id + subscription)          PASS
basic: client nack                                     PASS    the message is redelivered
basic: special characters in header values             PASS    with header names that are JMS names
basic: special characters, names like "special-1"      PASS    invalidHeaderNames=encode (the default):
                                                               an encoded JMS property, the name comes
                                                               back unchanged; =error is the chapter's
                                                               ERROR "invalid header name"
basic: bind to a local host/port                       PASS
basic: connect with a wrong password (wait / no wait)  PASS    ConnectFailedException / not connected
basic: timeout connecting to an unroutable address     N/A     no server involved
basic: SIGCHLD during a subscription                   PASS
1.0: send; client ack by message-id only               PASS    default-id subscription found (Table 12-11)
1.1: send, unsubscribe, DISCONNECT with receipt        PASS
1.1: heart-beats (2000, 3000)                          PASS    no heart-beat timeouts
1.1: heart-beat timeout / shutdown of a stub server    N/A     tests the client against a stub server
1.2: send; client-individual ack and nack by ack id    PASS
1.2: nack with an extra header (requeue:false)         PASS    extra header ignored; message redelivered
1.2: special characters incl. \\r                      PASS    with header names that are JMS names
1.2: no content-length (auto_content_length=False)     PASS    becomes a TextMessage
nonascii: UTF-8 text, raw bytes, binary (gzip) body    PASS
nonascii: UTF-16 body with content-length              PASS    a BytesMessage, bytes unchanged
misc: jms-map-xml "transformation" header              PASS    header kept as a property, client decodes
misc: listener rewrites headers (original_headers)     PASS
ssl: TLS; TLS with client certificate; wrong CA        PASS    refused when the client does not trust us
threading: many threads sending, none wedged           PASS    shortened: 10 threads x 100 sends
context: connection as a context manager               PASS
activemq: send with content_type text/blah             PASS
=====================================================  ======  ==========================================
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import threading
import time
import xml.dom.minidom

import pytest
import stomp
from stomp.exception import ConnectFailedException

from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker
from stomp_support import HOST, make_bridge, make_certs, make_users, pending, qname, stomp_conn, wait_until


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("broker") / "store")
    yield b
    b.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def bridge(tmp_path_factory, broker, certs):
    with NetLoop("stomp-scenarios") as loop:
        b = make_bridge(loop, broker, make_users(tmp_path_factory.mktemp("users")), certs)
        yield b
        b.stop()


@pytest.fixture
def conn11(bridge):
    conn, listener = stomp_conn("1.1", bridge.tcp_port)
    conn.connect("admin", "secret", wait=True)
    yield conn, listener
    if conn.is_connected():
        conn.disconnect()


def queue():
    return f"/queue/{qname('scn')}"


# --- test_basic ------------------------------------------------------------------------------


@pytest.mark.slow
def test_subscribe_and_send_keeps_content_type(conn11):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    conn.send(q, '{"val": "this is a test"}', content_type="application/json", receipt="123")
    message = listener.wait_messages(1)[0]
    assert message.headers["content-type"] == "application/json"
    assert message.body == '{"val": "this is a test"}'


def test_commit(conn11):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    tx = conn.begin()
    for i in range(3):
        conn.send(q, f"this is a test{i}", transaction=tx)
    conn.send("/queue/other", "x", receipt="sent")
    listener.wait_receipt("sent")
    assert listener.messages == []
    conn.commit(transaction=tx)
    assert len(listener.wait_messages(3)) == 3 and not listener.errors


@pytest.mark.slow
def test_abort(conn11, broker):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    tx = conn.begin()
    for i in range(3):
        conn.send(q, f"this is a test{i}", transaction=tx)
    conn.abort(transaction=tx)
    conn.send("/queue/other", "x", receipt="after")
    listener.wait_receipt("after")
    time.sleep(0.2)
    assert listener.messages == [] and not listener.errors


def test_client_ack_and_nack(conn11, broker):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="client")
    conn.send(q, "ack me", receipt="r")
    m = listener.wait_messages(1)[0]
    conn.ack(m.headers["message-id"], m.headers["subscription"])
    conn.send(q, "nack me")
    n = listener.wait_messages(2)[1]
    conn.nack(n.headers["message-id"], n.headers["subscription"])
    again = listener.wait_messages(3)[2]
    assert again.body == "nack me" and again.headers["redelivered"] == "true"
    conn.ack(again.headers["message-id"], again.headers["subscription"], receipt="done")
    listener.wait_receipt("done")
    assert pending(broker, q.split("/")[-1]) == 0


SPECIAL = {
    "special1": "test with colon : test",
    "special2": "test with backslash \\ test",
    "special3": "test with newline \n",
}


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_special_characters_in_header_values(bridge, version):
    conn, listener = stomp_conn(version, bridge.tcp_port)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1, ack="client")
    headers = dict(SPECIAL)
    if version == "1.2":
        headers["special4"] = "test with carriage return \r"
    conn.send(q, "this is a test", headers=headers, receipt="123")
    got = listener.wait_messages(1)[0].headers
    for name, value in headers.items():
        assert got[name] == value
    conn.disconnect()


def test_special_header_names_come_back_unchanged(conn11):
    """ "special-1" is no JMS property name: it travels encoded and comes back as sent."""
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    headers = {"special-1": "v1", "special-2": "test with colon : test"}
    conn.send(q, "x", headers=headers, receipt="r")
    got = listener.wait_messages(1)[0].headers
    assert {name: got[name] for name in headers} == headers


def test_bind_to_a_local_port(bridge):
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    conn = stomp.Connection([(HOST, bridge.tcp_port)], bind_host_port=(HOST, port))
    conn.connect("admin", "secret", wait=True)
    conn.send(queue(), "this is a test using local bind port", receipt="981")
    conn.disconnect()


def test_connect_with_wrong_credentials(bridge):
    conn = stomp.Connection([(HOST, bridge.tcp_port)])
    with pytest.raises(ConnectFailedException):
        conn.connect("invalid", "user", wait=True)
    conn = stomp.Connection([(HOST, bridge.tcp_port)])
    conn.connect("invalid", "user", wait=False)
    assert wait_until(lambda: not conn.is_connected())


def test_child_signal_during_a_subscription(conn11):
    conn, listener = conn11
    q = queue()
    previous = signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        conn.subscribe(q, id=1, ack="auto", receipt="sub")
        listener.wait_receipt("sub")
        conn.send(q, "this is an interrupt test 1")
        os.system("true")
        conn.send(q, "this is an interrupt test 2", receipt="123")
        listener.wait_messages(2)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert conn.is_connected() and not listener.errors


# --- test_s10, test_s11, test_s12 -------------------------------------------------------------


def test_1_0_send_and_ack_by_message_id(bridge, broker):
    conn, listener = stomp_conn("1.0", bridge.tcp_port)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, ack="client")
    conn.send(q, "this is a test using protocol 1.0")
    m = listener.wait_messages(1)[0]
    conn.ack(m.headers["message-id"])
    conn.disconnect()
    assert wait_until(lambda: pending(broker, q.split("/")[-1]) == 0)


def test_1_1_unsubscribe_and_disconnect_with_receipt(conn11):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, ack="auto", id=1)
    conn.send(q, "this is a test", receipt="123")
    listener.wait_messages(1)
    conn.unsubscribe(id=1)
    conn.disconnect(receipt="DISCONNECT1")
    listener.wait_receipt("DISCONNECT1")


@pytest.mark.slow
def test_1_1_heart_beats(bridge):
    conn, listener = stomp_conn("1.1", bridge.tcp_port, heartbeats=(2000, 3000))
    conn.connect("admin", "secret", wait=True)
    assert conn.heartbeats[0] > 0
    conn.subscribe(queue(), ack="auto", id=1)
    time.sleep(0.5)
    conn.disconnect()
    assert not listener.errors


def test_1_2_client_individual_ack_and_nack(bridge, broker):
    conn, listener = stomp_conn("1.2", bridge.tcp_port)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1, ack="client-individual")
    conn.send(q, "one", receipt="123")
    conn.ack(listener.wait_messages(1)[0].headers["ack"])
    conn.send(q, "two")
    conn.nack(listener.wait_messages(2)[1].headers["ack"], requeue="false")
    again = listener.wait_messages(3)[2]
    assert again.body == "two" and again.headers["redelivered"] == "true"
    conn.ack(again.headers["ack"])
    conn.disconnect()
    assert wait_until(lambda: pending(broker, q.split("/")[-1]) == 0)


def test_1_2_without_content_length(bridge):
    conn, listener = stomp_conn("1.2", bridge.tcp_port, auto_content_length=False)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1)
    conn.send(q, "test", receipt="123")
    m = listener.wait_messages(1)[0]
    assert m.body == "test" and m.headers["content-length"] == "4"
    conn.disconnect()


# --- test_nonascii ---------------------------------------------------------------------------------

TEXT = "Příliš žluťoučký kůň úpěl ďábelské ódy. 世界 🌍"


@pytest.mark.parametrize("auto_decode,encoding", [(False, "utf-8"), (True, "utf-8"), (True, "utf-16")])
def test_non_ascii_bodies(bridge, auto_decode, encoding):
    conn, listener = stomp_conn("1.1", bridge.tcp_port, auto_decode=auto_decode, encoding=encoding)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, ack="auto", id="1")
    conn.send(q, TEXT, receipt="123")
    body = listener.wait_messages(1)[0].body
    assert body == (TEXT if auto_decode else TEXT.encode(encoding))
    conn.disconnect()


def test_binary_image_body(bridge):
    conn, listener = stomp_conn("1.1", bridge.tcp_port, auto_decode=False)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, ack="auto", id="1")
    image = gzip.compress(bytes(range(256)) * 40)
    conn.send(q, image, receipt="123")
    assert listener.wait_messages(1)[0].body == image
    conn.disconnect()


# --- test_misc ----------------------------------------------------------------------------------------


class MapXmlListener(stomp.ConnectionListener):
    """As stomp.py's TransformationListener: decode jms-map-xml bodies in on_before_message."""

    def __init__(self):
        self.event = threading.Event()
        self.frame = None

    def on_before_message(self, frame):
        if frame.headers.get("transformation") == "jms-map-xml":
            doc = xml.dom.minidom.parseString(frame.body)
            entries = {}
            for entry in doc.documentElement.getElementsByTagName("entry"):
                key, value = [
                    n.firstChild.nodeValue for n in entry.childNodes if isinstance(n, xml.dom.minidom.Element)
                ]
                entries[key] = value
            frame.body = entries

    def on_message(self, frame):
        self.frame = frame
        self.event.set()


def test_jms_map_xml_transformation_header(bridge):
    conn = stomp.Connection11([(HOST, bridge.tcp_port)])
    listener = MapXmlListener()
    conn.set_listener("t", listener)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    conn.send(
        q,
        "<map><entry><string>name</string><string>Dejan</string></entry>"
        "<entry><string>city</string><string>Belgrade</string></entry></map>",
        headers={"transformation": "jms-map-xml"},
        receipt="123",
    )
    assert listener.event.wait(5)
    assert listener.frame.body == {"name": "Dejan", "city": "Belgrade"}
    conn.disconnect()


class HeaderModListener(stomp.ConnectionListener):
    def __init__(self):
        self.event = threading.Event()
        self.frame = None

    def on_before_message(self, frame):
        frame.headers["testheader"] = "modifiedheader"

    def on_message(self, frame):
        self.frame = frame
        self.event.set()


def test_original_headers(bridge):
    conn = stomp.Connection11([(HOST, bridge.tcp_port)])
    listener = HeaderModListener()
    conn.set_listener("h", listener)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    conn.send(q, "test message", headers={"testheader": "originalheader"}, receipt="123")
    assert listener.event.wait(5)
    assert listener.frame.headers["testheader"] == "modifiedheader"
    assert listener.frame.original_headers["testheader"] == "originalheader"
    conn.disconnect()


# --- test_ssl --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("client_cert", [False, True])
def test_ssl_connection(bridge, certs, client_cert):
    args = {"ca_certs": str(certs["ca"])}
    if client_cert:
        args["cert_file"] = str(certs["client"])
    conn, listener = stomp_conn("1.1", bridge.tls_port, ssl_args=args)
    conn.connect("admin", "secret", wait=True)
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    conn.send(q, "this is a test", receipt="123")
    listener.wait_receipt("123")
    listener.wait_messages(1)
    assert conn.get_ssl() is not None
    conn.disconnect()


def test_ssl_with_an_untrusted_broker_certificate(bridge, certs):
    conn, listener = stomp_conn(
        "1.1", bridge.tls_port, ssl_args={"ca_certs": str(certs["stranger"])}, reconnect_attempts_max=1
    )
    with pytest.raises(Exception):  # noqa: B017  (any failure to connect will do)
        conn.connect("admin", "secret", wait=True)
    assert listener.messages == [] and listener.errors == []


# --- test_threading, test_context, test_activemq -------------------------------------------------------------


def test_threads_do_not_wedge(bridge):
    conn = stomp.Connection([(HOST, bridge.tcp_port)])
    conn.connect("admin", "secret", wait=True)
    sent = [0] * 10

    def sender(i):
        for n in range(100):
            conn.send(destination="/topic/testclientwedge", body=f"Message {i}:{n}", persistent="true")
            sent[i] += 1

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sent == [100] * 10
    conn.disconnect()


def test_connection_as_a_context_manager(bridge):
    with stomp.Connection11([(HOST, bridge.tcp_port)]) as conn:
        conn.connect("admin", "secret", wait=True)
        conn.send(queue(), "inside", receipt="x")
    assert not conn.is_connected()


def test_send_with_a_content_type(conn11):
    conn, listener = conn11
    q = queue()
    conn.subscribe(q, id=1, ack="auto")
    conn.send(q, "this is a test", content_type="text/blah", receipt="123")
    assert listener.wait_messages(1)[0].headers["content-type"] == "text/blah"
