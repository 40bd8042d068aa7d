"""The STOMP bridge over real sockets: stomp.py 1.0/1.1/1.2 over TCP and TLS (trustme
certificates, optional required client certificates), bad input on the wire, TCP_NODELAY,
heart-beats, slow consumers, connection loss, hundreds of connections, the service's
lifecycle, and hypothesis throwing random bytes and frame sequences at the server."""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.netloop import NetLoop
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.stompbridge import StompBridge, StompBridgeError, StompConfig
from bridgemgr.stompbridge.frames import Frame, HeaderNotEncodable, encode_frame
from bridgemgr.users import open_repository
from stomp_support import (
    HOST,
    Raw,
    make_bridge,
    make_certs,
    make_users,
    pending,
    qname,
    stomp_conn,
    wait_until,
)


@pytest.fixture(scope="module")
def netloop():
    with NetLoop("stomp-test-loop") as loop:
        yield loop


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    return make_users(tmp_path_factory.mktemp("users"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("broker") / "store")
    yield b
    b.close()


@pytest.fixture(scope="module")
def bridge(netloop, broker, users, certs):
    b = make_bridge(netloop, broker, users, certs)
    yield b
    b.stop()


@pytest.fixture(autouse=True)
def no_leaks(request, broker):
    yield
    if "bridge" in request.fixturenames:
        bridge = request.getfixturevalue("bridge")
        assert wait_until(lambda: not bridge.connections), f"{len(bridge.connections)} connections left"
        assert wait_until(lambda: not broker.connections), "broker connections left"


# --- stomp.py over TCP and TLS -------------------------------------------------------------


def round_trip(conn, listener, version, queue):
    conn.connect("admin", "secret", wait=True)
    ack = {"1.0": "client", "1.1": "client", "1.2": "client-individual"}[version]
    conn.subscribe(f"/queue/{queue}", id="s1", ack=ack)
    conn.send(f"/queue/{queue}", "hello", receipt="r1")
    conn.send(f"/queue/{queue}", b"\x00bin\xff", headers={"content-length": "5"}, receipt="r2")
    listener.wait_receipt("r2")
    text, data = listener.wait_messages(2)
    assert text.body == b"hello" and data.body == b"\x00bin\xff" and text.headers["subscription"] == "s1"
    for m in (text, data):
        if version == "1.2":
            conn.ack(m.headers["ack"])
        elif version == "1.1":
            conn.ack(m.headers["message-id"], "s1")
        else:
            conn.ack(m.headers["message-id"])
    conn.disconnect()


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_over_tcp(bridge, broker, version):
    queue = qname()
    conn, listener = stomp_conn(version, bridge.tcp_port, auto_decode=False)
    round_trip(conn, listener, version, queue)
    assert wait_until(lambda: pending(broker, queue) == 0)
    assert not listener.errors


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_stomp_py_over_tls(bridge, broker, certs, version):
    queue = qname()
    conn, listener = stomp_conn(version, bridge.tls_port, ssl_args={"ca_certs": str(certs["ca"])}, auto_decode=False)
    round_trip(conn, listener, version, queue)
    assert wait_until(lambda: pending(broker, queue) == 0)


@pytest.fixture(scope="module")
def mtls_bridge(netloop, broker, users, certs):
    b = make_bridge(netloop, broker, users, certs, require_client_auth=True)
    yield b
    b.stop()


def test_tls_requiring_client_certificates(mtls_bridge, certs):
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    ctx.load_cert_chain(str(certs["client"]))
    ok = Raw(mtls_bridge.tls_port, context=ctx)
    ok.connect()
    ok.close()
    for cert in (None, certs["stranger"]):
        ctx = ssl.create_default_context(cafile=str(certs["ca"]))
        if cert:
            ctx.load_cert_chain(str(cert))
        with pytest.raises((ssl.SSLError, ConnectionError, AssertionError, OSError)):
            r = Raw(mtls_bridge.tls_port, context=ctx)
            r.connect()
    conn, _listener = stomp_conn(
        "1.2", mtls_bridge.tls_port, ssl_args={"ca_certs": str(certs["ca"]), "cert_file": str(certs["client"])}
    )
    conn.connect("guest", "guest", wait=True)
    conn.disconnect()
    assert wait_until(lambda: not mtls_bridge.connections)


def test_tcp_nodelay_on_every_accepted_socket(bridge):
    clients = [Raw(bridge.tcp_port), Raw(bridge.tls_port, context=ssl._create_unverified_context())]
    for c in clients:
        c.connect()
    assert wait_until(lambda: len(bridge.connections) == 2)
    for proto in list(bridge.connections):
        sock = proto.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    for c in clients:
        c.close()


def test_frames_ready_together_go_out_in_one_write(bridge):
    """Many small messages queued before SUBSCRIBE arrive in few TCP segments (reads)."""
    queue = qname()
    producer = Raw(bridge.tcp_port)
    producer.connect()
    for i in range(200):
        producer.frame("SEND", {"destination": f"/queue/{queue}", "persistent": "false"}, b"m%d" % i)
    producer.frame("DISCONNECT", {"receipt": "d"})
    producer.wait(lambda f: f.command == "RECEIPT")
    consumer = Raw(bridge.tcp_port)
    consumer.connect()
    consumer.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1"})
    reads = 0
    while len([f for f in consumer.frames if f.command == "MESSAGE"]) < 200:
        consumer._read(2)
        reads += 1
        assert reads < 100
    assert reads <= 20  # batches of up to 64 messages, one write each
    consumer.close()
    producer.close()


# --- bad input on the wire ------------------------------------------------------------------------


def expect_error_and_close(raw, message):
    frames = raw.until_closed()
    errors = [f for f in frames if f.command == "ERROR"]
    assert errors and errors[0].headers["message"] == message, frames
    assert errors[0].headers["content-length"] == str(len(errors[0].body))
    raw.close()


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x00\x01\x02garbage\xff\n\n\x00", "malformed frame"),
        (b"GARBAGE\n\n\x00", "unknown command"),
        (b"SEND\ndestination:/queue/x\n\nbefore connect\0", "unexpected SEND"),
        (b"CONNECT\naccept-version:1.2\n\n\0", "missing login"),
        (b"CONNECT\naccept-version:1.2\nlogin:admin\npasscode:nope\n\n\0", "authentication failed"),
        (b"CONNECT\naccept-version:9.9\nlogin:admin\npasscode:secret\n\n\0", "unsupported version"),
        (
            b"CONNECT\nlogin:admin\npasscode:secret\n\n\0SEND\ndestination:/queue/x\n\n" + b"x" * 300_000 + b"\0",
            "frame too large",
        ),
        (b"CONNECT\naccept-version:1.2\nlogin:admin\npasscode:secret\n\n\0ACK\nid:77\n\n\0", "unknown message"),
        (
            b"CONNECT\naccept-version:1.1\nlogin:admin\npasscode:secret\n\n\0ACK\nsubscription:zz\nmessage-id:m\n\n\0",
            "unknown subscription",
        ),
        (
            b"CONNECT\naccept-version:1.2\nlogin:admin\npasscode:secret\n\n\0BEGIN\ntransaction:a\n\n\0"
            b"BEGIN\ntransaction:b\n\n\0",
            "nested transaction",
        ),
    ],
)
def test_bad_input_gets_an_error_frame_and_the_connection_closes(bridge, data, message):
    raw = Raw(bridge.tcp_port)
    try:
        raw.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close before we finish writing an oversize frame
    expect_error_and_close(raw, message)


def test_an_endless_header_line_is_cut_off(bridge):
    raw = Raw(bridge.tcp_port)
    try:
        for _ in range(40):
            raw.send(b"A" * 8192)
    except (BrokenPipeError, ConnectionResetError):
        pass
    expect_error_and_close(raw, "header too long")


# --- heart-beats -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_heart_beats_keep_an_idle_stomp_py_connection_alive(bridge):
    conn, listener = stomp_conn("1.2", bridge.tcp_port, heartbeats=(300, 300))
    conn.connect("admin", "secret", wait=True)
    time.sleep(1.5)
    assert conn.is_connected() and not listener.errors and not listener.disconnected
    conn.disconnect()


def test_a_silent_client_is_disconnected(netloop, broker, users):
    bridge = make_bridge(netloop, broker, users, heart_beat=(100, 100))
    try:
        raw = Raw(bridge.tcp_port)
        connected = raw.connect("1.2", **{"heart-beat": "100,100"})
        assert connected.headers["heart-beat"] == "100,100"
        start = time.monotonic()
        expect_error_and_close(raw, "heart-beat timeout")
        assert time.monotonic() - start < 2
        assert raw.buf.count(b"\n") or True  # server heart-beats were skipped by the parser
        assert wait_until(lambda: not bridge.connections)
    finally:
        bridge.stop()


# --- slow consumers, connection loss, many connections ------------------------------------------------


@pytest.mark.slow
def test_a_slow_consumer_never_blocks_others(bridge, broker):
    slow_q, fast_q = qname("slow"), qname("fast")
    body = b"x" * 65536
    loader = Raw(bridge.tcp_port)
    loader.connect()
    for _ in range(200):
        loader.frame(
            "SEND", {"destination": f"/queue/{slow_q}", "persistent": "false", "content-length": str(len(body))}, body
        )
    loader.frame("DISCONNECT", {"receipt": "x"})
    loader.wait(lambda f: f.command == "RECEIPT")
    loader.close()
    slow = Raw(bridge.tcp_port, rcvbuf=4096)
    slow.connect()
    slow.frame("SUBSCRIBE", {"destination": f"/queue/{slow_q}", "id": "1"})  # and never reads
    time.sleep(0.5)
    fast, listener = stomp_conn("1.2", bridge.tcp_port)
    fast.connect("guest", "guest", wait=True)
    fast.subscribe(f"/queue/{fast_q}", id="1")
    start = time.monotonic()
    for i in range(50):
        fast.send(f"/queue/{fast_q}", f"m{i}")
    listener.wait_messages(50, timeout=5)
    assert time.monotonic() - start < 3
    # the slow one holds only what the socket buffers and one batch take; the rest waits in the queue
    assert broker.queue_depth(slow_q) > 50
    slow_proto = [
        p for p in bridge.connections if p.session.subscriptions.get("1") and p.transport.get_write_buffer_size() > 0
    ]
    assert slow_proto and slow_proto[0].transport.get_write_buffer_size() < 1024 * 1024
    fast.disconnect()
    slow.close()
    assert wait_until(lambda: broker.queue_depth(slow_q) + 0 == pending(broker, slow_q))


def test_connection_loss_returns_unacknowledged_messages(bridge, broker):
    queue = qname()
    raw = Raw(bridge.tcp_port)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "client-individual"})
    for i in range(5):
        raw.frame("SEND", {"destination": f"/queue/{queue}"}, b"m%d" % i)
    raw.wait(lambda f: f.command == "MESSAGE" and f.body == b"m4")
    assert broker.queue_depth(queue) == 0 and pending(broker, queue) == 5
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    raw.close()  # RST, no DISCONNECT
    assert wait_until(lambda: broker.queue_depth(queue) == 5)


@pytest.mark.slow
def test_hundreds_of_concurrent_connections(bridge, broker):
    queue = qname()
    # 50 from each of 4 addresses: all 200 are open before any logs in, and one address
    # may hold 64 (imq.stomp.max_unauthenticated_per_address)
    clients = [Raw(bridge.tcp_port, source=f"127.0.0.{1 + n % 4}") for n in range(200)]
    for c in clients:
        c.frame("CONNECT", {"accept-version": "1.2", "login": "guest", "passcode": "guest"})
    for c in clients:
        c.version = c.wait(lambda f: f.command == "CONNECTED").headers["version"]
    assert len(bridge.connections) == 200
    for c in clients[:100]:
        c.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1"})
    for i, c in enumerate(clients[100:]):
        c.frame("SEND", {"destination": f"/queue/{queue}", "receipt": "r"}, b"%d" % i)
    for c in clients[100:]:
        c.wait(lambda f: f.command == "RECEIPT")
    assert wait_until(lambda: pending(broker, queue) == 0)
    got = 0
    for c in clients[:100]:
        c._read(0.05)
        got += sum(1 for f in c.frames if f.command == "MESSAGE")
    deadline = time.monotonic() + 5
    while got < 100 and time.monotonic() < deadline:
        got = 0
        for c in clients[:100]:
            c._read(0.01)
            got += sum(1 for f in c.frames if f.command == "MESSAGE")
    assert got == 100
    for c in clients:
        c.close()


# --- the service ---------------------------------------------------------------------------------------


def test_lifecycle_and_port_mapper_rows(netloop, broker, users, certs):
    bridge = make_bridge(netloop, broker, users, certs)
    assert bridge.state == "STARTED"
    assert bridge.service_entries() == [
        ("stomp", "tcp", "NORMAL", bridge.tcp_port),
        ("sslstomp", "tls", "NORMAL", bridge.tls_port),
    ]
    port = bridge.tcp_port
    raw = Raw(port)
    raw.connect()
    bridge.stop()
    assert bridge.state == "STOPPED" and bridge.service_entries() == []
    assert raw.until_closed()[-1].headers["message"] == "server stopping"
    with pytest.raises(OSError):
        Raw(port)
    second = StompBridge(StompConfig(hostname=HOST, tcp_port=port), EmbeddedHostBroker(broker), users, netloop)
    second.start()  # the port is free again
    with pytest.raises(StompBridgeError, match="cannot listen"):
        StompBridge(StompConfig(hostname=HOST, tcp_port=port), EmbeddedHostBroker(broker), users, netloop).start()
    second.stop()


def test_config_from_broker_properties(tmp_path):
    props = load_properties(
        [],
        [
            f"imq.varhome={tmp_path}",
            "imq.bridge.stomp.consumerFlowLimit=7",
            "imq.bridge.stomp.tls.enabled=true",
            "imq.bridge.stomp.tls.certfile=/c.pem",
            "imq.bridge.stomp.tls.keyfile=/k.pem",
            "imq.bridge.stomp.tls.cafile=/ca.pem",
        ],
        environ={},
    )
    config = StompConfig.from_props(props)
    assert (config.tcp_port, config.tls_port, config.tls_enabled) == (7672, 7673, True)
    assert config.session.consumer_flow_limit == 7
    assert (config.tls_certfile, config.tls_keyfile, config.tls_cafile) == (
        Path("/c.pem"),
        Path("/k.pem"),
        Path("/ca.pem"),
    )
    unset = StompConfig.from_props(load_properties([], [f"imq.varhome={tmp_path}"], environ={}))
    assert (unset.tls_certfile, unset.tls_keyfile, unset.tls_cafile) == (None, None, None)
    bad = load_properties([], ["imq.bridge.stomp.messageTransformer=no.such.Transformer"], environ={})
    with pytest.raises(StompBridgeError, match="messageTransformer"):
        StompConfig.from_props(bad)


def test_a_fresh_service_accepts_the_admin_credentials(tmp_path, netloop, broker):
    props = load_properties(
        [],
        [
            f"imq.varhome={tmp_path}",
            "imq.bridge.admin.user=boss",
            "imq.bridge.admin.password=s3cret",
            "imq.bridge.stomp.tcp.port=0",
            f"imq.bridge.stomp.hostname={HOST}",
        ],
        environ={},
    )
    repo = open_repository(props)
    assert [u.name for u in repo.users()] == ["boss"]
    bridge = StompBridge(props, EmbeddedHostBroker(broker), repo, netloop)
    bridge.start()
    try:
        conn, _ = stomp_conn("1.2", bridge.tcp_port)
        conn.connect("boss", "s3cret", wait=True)
        conn.disconnect()
    finally:
        bridge.stop()


# --- hypothesis: random bytes and frame sequences ---------------------------------------------------

INTENTS = (
    ["send"] * 12
    + ["subscribe"] * 4
    + ["begin"] * 2
    + ["commit"] * 2
    + ["abort", "unsubscribe", "ack", "nack", "garbage"]
)
garbage_frames = st.tuples(
    st.sampled_from(
        ["CONNECT", "SEND", "SUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT", "MESSAGE", "ERROR"]
    ),
    st.dictionaries(
        st.sampled_from(
            ["destination", "id", "ack", "transaction", "message-id", "subscription", "content-length", "selector"]
        ),
        st.text(max_size=6),
        max_size=4,
    ),
    st.binary(max_size=8),
)


def raw_frame(command: str, headers: dict[str, str], body: bytes, version: str) -> bytes:
    """The frame encoded, or, when the version cannot carry a header (a NUL, CR or LF in
    it), written raw as a careless client would: garbage the server must refuse."""
    try:
        return encode_frame(Frame(command, headers, body), version)
    except HeaderNotEncodable:
        lines = "".join(f"{name}:{value}\n" for name, value in headers.items())
        return f"{command}\n{lines}\n".encode() + body + b"\x00"


def build_stream(data, queue: str, version: str) -> tuple[list[bytes], dict[str, list[bytes]]]:
    """A frame sequence that is mostly valid in context (so it gets far), with some
    garbage; and which receipt confirms which message bodies."""
    wire: list[bytes] = []
    confirmed: dict[str, list[bytes]] = {}
    tx: tuple[str, list[bytes]] | None = None
    subs: list[str] = []
    for i, intent in enumerate(data.draw(st.lists(st.sampled_from(INTENTS), max_size=20), label="intents")):
        receipt = f"r{i}"
        headers: dict[str, str] = {}
        body = b""
        if intent == "send":
            command, body = "SEND", b"b%d" % i
            headers = {
                "destination": f"/queue/{queue}",
                "receipt": receipt,
                "persistent": data.draw(st.sampled_from(["true", "false"])),
            }
            if tx is not None and data.draw(st.booleans()):
                headers["transaction"] = tx[0]
                tx[1].append(body)
            else:
                confirmed[receipt] = [body]
        elif intent == "subscribe":
            command, sub_id = "SUBSCRIBE", f"s{i}"
            headers = {
                "destination": f"/queue/{queue}",
                "id": sub_id,
                "ack": data.draw(st.sampled_from(["auto", "client", "client-individual"])),
            }
            if tx is not None and data.draw(st.booleans()):
                headers["transaction"] = tx[0]
            subs.append(sub_id)
        elif intent == "unsubscribe" and subs:
            command, headers = "UNSUBSCRIBE", {"id": subs.pop(data.draw(st.integers(0, len(subs) - 1)))}
        elif intent == "begin" and tx is None:
            tx = (f"t{i}", [])
            command, headers = "BEGIN", {"transaction": tx[0]}
        elif intent == "commit" and tx is not None:
            command, headers = "COMMIT", {"transaction": tx[0], "receipt": receipt}
            confirmed[receipt] = tx[1]
            tx = None
        elif intent == "abort" and tx is not None:
            command, headers, tx = "ABORT", {"transaction": tx[0]}, None
        elif intent in ("ack", "nack") and version != "1.0":
            command = intent.upper()
            if version == "1.2":
                headers = {"id": str(data.draw(st.integers(1, 6)))}
            else:
                headers = {"subscription": subs[-1] if subs else "none", "message-id": "ID:unknown"}
        else:
            command, headers, body = data.draw(garbage_frames, label="garbage")
            wire.append(raw_frame(command, headers, body, version))
            continue
        wire.append(encode_frame(Frame(command, headers, body), version))
    return wire, confirmed


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    connect=st.sampled_from(["1.2", "1.2", "1.1", "1.0", None]),
    noise=st.one_of(st.just(b""), st.just(b""), st.just(b""), st.binary(min_size=1, max_size=64)),
    disconnect=st.booleans(),
)
def test_random_streams_never_crash_leak_or_lose_committed_messages(bridge, broker, data, connect, noise, disconnect):
    """Whatever arrives, the server answers or closes, frees the connection and keeps every
    message it confirmed (a RECEIPT of a SEND, or of the COMMIT of its transaction)."""
    queue = qname("H")
    wire, confirmed = build_stream(data, queue, connect or "1.2")
    if noise:
        wire.insert(data.draw(st.integers(0, len(wire)), label="noise at"), noise)
    if connect:
        wire.insert(
            0, encode_frame(Frame("CONNECT", {"accept-version": connect, "login": "admin", "passcode": "secret"}), None)
        )
    raw = Raw(bridge.tcp_port)
    raw.version = connect
    try:
        for piece in wire:  # one by one, so deliveries interleave with the frames
            raw.send(piece)
            time.sleep(0.002)
        time.sleep(0.03)
        if disconnect:
            raw.send(b"DISCONNECT\nreceipt:bye\n\n\0")
        else:
            raw.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    try:
        back = raw.until_closed(timeout=10)
    finally:
        raw.close()
    delivered = {f.body for f in back if f.command == "MESSAGE"}
    kept = [b for f in back if f.command == "RECEIPT" for b in confirmed.get(f.headers.get("receipt-id"), [])]
    assert wait_until(lambda: not bridge.connections), "connection leaked"
    assert wait_until(lambda: not broker.connections), "broker connection leaked"
    with broker.lock:
        mq = broker.queues.get(queue)
        left = {env.message.text.encode() for env in mq.browse()} if mq is not None else set()
    lost = [b for b in kept if b not in left and b not in delivered]
    assert not lost, f"confirmed but lost: {lost}"
    probe = Raw(bridge.tcp_port)  # and the server still works
    probe.connect()
    probe.close()


@pytest.mark.parametrize("sync", [False, True])
def test_a_receipt_is_written_on_the_loop_unless_the_store_fsyncs(netloop, users, tmp_path, sync):
    """Without fsync the store write a RECEIPT waits for is a copy into the page cache:
    the loop writes it itself when nobody else is writing, rather than hand the wait to
    the bridge's pool and the receipt back. With fsync the pool waits, so the loop goes
    on serving the other connections. Either way the RECEIPT comes once it is written."""
    broker = Broker(tmp_path / "store", sync=sync)
    bridge = make_bridge(netloop, broker, users)
    queue = qname()
    try:
        jobs: list[object] = []
        pool = bridge.call_pool()
        submit = pool.submit
        pool.submit = lambda fn, *a, **k: jobs.append(fn) or submit(fn, *a, **k)  # type: ignore[method-assign]
        conn, listener = stomp_conn("1.2", bridge.tcp_port)
        conn.connect("admin", "secret", wait=True)
        jobs.clear()  # (the password check)
        for i in range(10):
            conn.send(f"/queue/{queue}", f"m{i}", headers={"persistent": "true"}, receipt=f"r{i}")
            listener.wait_receipt(f"r{i}")
            assert broker.store.stats()["rows"] >= i + 1  # written before its RECEIPT
        conn.disconnect()
        assert (len(jobs) >= 10) if sync else not jobs
    finally:
        bridge.stop()
        broker.close()
    broker = Broker(tmp_path / "store")
    try:
        assert broker.queue_depth(queue) == 10
    finally:
        broker.close()


def test_pipelined_receipts_written_now_on_the_loop_now_in_the_pool_all_arrive(netloop, users, tmp_path):
    """A connection stops reading while its store wait runs in the pool. When the wait of
    the next SEND of that read is written on the loop, reading must go on: it once stayed
    stopped, and the producer's next frames were never read."""
    broker = Broker(tmp_path / "store")
    bridge = make_bridge(netloop, broker, users)
    queue = qname()
    turns = itertools.count()  # the pool, the loop, the pool, ...
    write_now = bridge.broker.write_now
    bridge.broker.write_now = lambda principal, ticket: next(turns) % 2 == 1 and write_now(principal, ticket)
    raw = Raw(bridge.tcp_port)
    try:
        raw.connect()
        for wave in range(3):
            send = [
                Frame("SEND", {"destination": f"/queue/{queue}", "persistent": "true", "receipt": f"r{wave}-{i}"})
                for i in range(2)
            ]
            between = [Frame("BEGIN", {"transaction": f"t{wave}"}), Frame("ABORT", {"transaction": f"t{wave}"})]
            # one read: the first SEND waits in the pool, the frames after it wait for it,
            # and the second SEND's wait is written on the loop
            two = b"".join(encode_frame(frame, raw.version) for frame in [send[0], *between, send[1]])
            raw.send(two)
            raw.wait(lambda f, wave=wave: f.command == "RECEIPT" and f.headers["receipt-id"] == f"r{wave}-1")
        assert broker.queue_depth(queue) == 6
    finally:
        raw.sock.close()
        bridge.stop()
        broker.close()
