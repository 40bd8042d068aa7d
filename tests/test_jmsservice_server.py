"""The jms service on a real socket: bad frames, authentication and authorization,
heart-beats, many clients at once, and stopping under connected clients."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.accesscontrol import AccessControl, AccessControls
from bridgemgr.guard import LoginThrottle, ServiceGuard, ThrottleSettings
from bridgemgr.jms import AckMode, DeliveryMode, Queue, TextMessage, Topic, xa
from bridgemgr.jms.errors import (
    JMSSecurityException,
    ResourceAllocationException,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import wire
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory
from bridgemgr.providers.embedded.wire import Op
from remote.support import Harness, RawClient
from waiting import wait_for

Q = Queue("orders")
USERS = {"alice": "wonder", "reader": "r", "writer": "w"}


def check_password(user, password):
    return user in USERS and USERS[user] == password


# alice: everything; reader: consume and browse "public.*"; writer: produce to "public.*"
RULES = """version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
queue.*.produce.allow.user=alice
queue.*.consume.allow.user=alice
queue.*.browse.allow.user=alice
topic.*.produce.allow.user=alice
topic.*.consume.allow.user=alice
queue.public.*.consume.allow.user=reader
queue.public.*.browse.allow.user=reader
queue.public.*.produce.allow.user=writer
topic.public.*.produce.allow.user=writer
queue.create.allow.user=*
topic.create.allow.user=*
"""


@pytest.fixture
def harness(broker, tmp_path):
    (tmp_path / "acl.properties").write_text(RULES)
    access = AccessControls(jms=AccessControl("jms", tmp_path / "acl.properties"))
    h = Harness(
        broker,
        heartbeat=5.0,
        authenticator=check_password,
        access=access,
        guard=ServiceGuard("jms", LoginThrottle(ThrottleSettings(base_delay=0.05)), login_timeout=2),
    )
    yield h
    h.close()


@pytest.fixture
def alice(harness):
    conn = harness.factory().create_connection("alice", "wonder")
    conn.start()
    yield conn
    conn.close()


def roundtrip(conn, dest=Q, text="ping"):
    session = conn.create_session()
    session.create_producer(dest).send(TextMessage(text))
    got = session.create_consumer(dest).receive(2)
    session.close()
    return got.text if got else None


# --- bad frames ---------------------------------------------------------------------------


def authenticated_raw(harness):
    raw = RawClient(harness.service.port)
    assert isinstance(raw.hello("alice", "wonder"), wire.Reply)
    return raw


@pytest.mark.parametrize(
    "name, data, match",
    [
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "does not speak the imqbridge jms protocol"),
        ("wrong version", b"IMQJ\x07", "protocol version 7 is not supported"),
        ("oversize", wire.PREAMBLE + b"\x7f\xff\xff\xff", "size 2147483647 is outside 5..65536"),
        ("before HELLO", wire.PREAMBLE + wire.request(1, Op.SESSION, 1, False, 1, False), "only one HELLO"),
    ],
)
def test_bad_frames_get_an_error_and_the_connection_closes_without_harming_others(harness, alice, name, data, match):
    raw = RawClient(harness.service.port, preamble=None)
    raw.send(data)
    preamble_ok = True
    try:
        failure = raw.next_event()
    except wire.ProtocolError:
        preamble_ok = False
        failure = None
    if preamble_ok:
        assert isinstance(failure, wire.Failure) and failure.fatal, failure
        assert isinstance(failure.error, wire.ProtocolError)
        assert pytest.importorskip("re").search(match, str(failure.error))
    assert raw.closed_by_server()
    assert roundtrip(alice) == "ping"


def test_bad_frames_after_login_close_only_that_connection_and_give_back_its_messages(harness, alice, broker):
    roundtrip(alice)
    session = alice.create_session()
    session.create_producer(Q).send(TextMessage("held"))
    raw = authenticated_raw(harness)
    assert raw.call(Op.SESSION, 1, False, int(AckMode.CLIENT_ACKNOWLEDGE), False) == wire.Reply(7, None)
    assert raw.call(Op.CONSUMER, 1, 1, Q, None, False, None, 10) == wire.Reply(7, None)
    assert raw.call(Op.START) == wire.Reply(7, None)
    wait_for(lambda: broker.destinations()["queue:orders"]["unacked"] == 1)
    raw.send(b"\x00\x00\x00\x05\x63\x00\x00\x00\x00")  # an unknown frame kind
    assert raw.closed_by_server()
    wait_for(lambda: broker.destinations()["queue:orders"]["pending"] == 1)
    with session.create_consumer(Q) as consumer:
        got = consumer.receive(2)
    assert got.text == "held" and got.redelivered
    assert roundtrip(alice) == "ping"


def test_an_oversize_frame_after_login_is_refused_before_it_is_read(broker):
    with Harness(broker, max_frame=4096) as h:
        raw = RawClient(h.service.port)
        assert isinstance(raw.hello(), wire.Reply)
        raw.send(b"\x00\x01\x00\x00")  # announces 64 KiB
        failure = raw.next_event()
        assert "size 65536 is outside 5..4096" in str(failure.error)
        assert raw.closed_by_server()
        conn = h.factory().create_connection()
        with pytest.raises(ResourceAllocationException, match="more than the jms service takes"):
            conn.create_session().create_producer(Q).send(TextMessage("x" * 5000))
        conn.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300), st.booleans())
def test_random_byte_streams_never_harm_the_service(harness, alice, data, after_login):
    raw = authenticated_raw(harness) if after_login else RawClient(harness.service.port, preamble=None)
    raw.send(data)
    raw.sock.shutdown(socket.SHUT_WR)  # the service must settle what it got, then close
    assert raw.closed_by_server(5)
    raw.close()
    assert roundtrip(alice, text=repr(data[:10])) == repr(data[:10])


def test_every_connection_is_released_after_the_fuzzing(harness, alice):
    for data in (b"\x00" * 50, wire.PREAMBLE + b"\xff" * 20, b"IMQJ"):
        raw = RawClient(harness.service.port, preamble=None)
        raw.send(data)
        raw.close()
    wait_for(lambda: len(harness.service.connections) == 1)  # alice's only


def test_no_hello_in_time_closes_the_connection(broker):
    with Harness(broker, guard=ServiceGuard("jms", login_timeout=0.2)) as h:
        raw = RawClient(h.service.port)
        failure = raw.next_event(2)
        assert isinstance(failure, wire.Failure) and "no HELLO within 0.2 s" in str(failure.error)
        assert raw.closed_by_server()


# --- authentication and authorization ---------------------------------------------------------


def test_authentication_failure_names_the_user_not_the_password(harness, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(JMSSecurityException, match="authentication failed for user 'alice'"):
        harness.factory().create_connection("alice", "guess-me-42")
    with pytest.raises(JMSSecurityException):
        harness.factory().create_connection(None, None)
    assert "guess-me-42" not in caplog.text


def test_an_unauthenticated_client_gets_nothing(harness, alice):
    alice.create_session().create_producer(Q).send(TextMessage("secret"))
    raw = RawClient(harness.service.port)
    raw.send(
        wire.request(1, Op.HELLO, "alice", "wrong", 30000, "raw")
        + wire.request(2, Op.SESSION, 1, False, 1, False)
        + wire.request(3, Op.CONSUMER, 1, 1, Q, None, False, None, 10)
    )
    events = []
    while (event := raw.next_event()) is not None:
        events.append(event)
    assert len(events) == 1 and isinstance(events[0].error, JMSSecurityException)
    assert roundtrip(alice, Queue("other"), "other") == "other"
    assert alice.create_session().create_consumer(Q).receive(1).text == "secret"


def test_a_client_sees_only_what_its_credentials_allow(harness, alice):
    reader = harness.factory().create_connection("reader", "r")
    writer = harness.factory().create_connection("writer", "w")
    reader.start()
    public, private = Queue("public.news"), Queue("private.pay")
    rs, ws = reader.create_session(), writer.create_session()
    ws.create_producer(public).send(TextMessage("hello"))
    with pytest.raises(JMSSecurityException, match=r"'writer' may not produce queue://private.pay"):
        ws.create_producer(private).send(TextMessage("x"))
    with pytest.raises(JMSSecurityException, match="may not consume"):
        ws.create_consumer(public)
    with pytest.raises(JMSSecurityException, match=r"'reader' may not consume queue://private.pay"):
        rs.create_consumer(private)
    with pytest.raises(JMSSecurityException, match="may not browse"):
        ws.create_browser(public)
    assert [m.text for m in rs.create_browser(public)] == ["hello"]
    assert rs.create_consumer(public).receive(2).text == "hello"
    with pytest.raises(JMSSecurityException, match="may not produce"):
        rs.create_producer(public).send(TextMessage("no"))
    tq = rs.create_temporary_queue()  # a client's own temporary destinations are its own
    rs.create_producer(tq).send(TextMessage("mine"))
    assert rs.create_consumer(tq).receive(2).text == "mine"
    reader.close()
    writer.close()


def test_a_refused_browser_fails_at_creation_and_the_session_goes_on(harness, alice):
    alice.create_session().create_producer(Queue("public.news")).send(TextMessage("hello"))
    writer = harness.factory().create_connection("writer", "w")
    session = writer.create_session()
    with pytest.raises(JMSSecurityException, match=r"'writer' may not browse queue://public.news"):
        session.create_browser(Queue("public.news"))  # not first when iterated
    session.create_producer(Queue("public.news")).send(TextMessage("still here"))
    reader = harness.factory().create_connection("reader", "r")
    assert [m.text for m in reader.create_session().create_browser(Queue("public.news"))] == ["hello", "still here"]
    reader.close()
    writer.close()


def test_a_refused_asynchronous_send_fails_the_next_send_and_the_transaction(harness, alice):
    writer = harness.factory().create_connection("writer", "w")
    session = writer.create_session()
    producer = session.create_producer(Topic("private.t"))
    producer.send(TextMessage("x"), delivery_mode=DeliveryMode.NON_PERSISTENT)  # not waited for
    with pytest.raises(JMSSecurityException, match=r"may not produce topic://private.t"):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)
            producer.send(TextMessage("y"), delivery_mode=DeliveryMode.NON_PERSISTENT)
    tx = writer.create_session(transacted=True)
    tx.create_producer(Queue("public.ok")).send(TextMessage("kept?"))
    tx.create_producer(Queue("private.no")).send(TextMessage("refused"))
    with pytest.raises(TransactionRolledBackException, match="may not produce"):
        tx.commit()
    tx.create_producer(Queue("public.ok")).send(TextMessage("next"))
    tx.commit()
    got = alice.create_session().create_consumer(Queue("public.ok"))
    assert got.receive(2).text == "next" and got.receive(0.1) is None
    writer.close()


def test_a_refused_send_in_an_xa_branch_makes_the_branch_roll_back(harness, alice):
    writer = harness.factory().create_xa_connection("writer", "w")
    xs = writer.create_xa_session()
    resource = xs.xa_resource
    x = Xid(1, b"refused", b"b")
    resource.start(x, xa.TMNOFLAGS)
    xs.create_producer(Queue("public.ok")).send(TextMessage("a"))
    xs.create_producer(Queue("private.no")).send(TextMessage("b"))
    with pytest.raises(XAException, match="rollback-only because a send in it failed") as e:
        resource.end(x, xa.TMSUCCESS)
    assert e.value.errorcode == xa.XA_RBROLLBACK
    with pytest.raises(XAException) as e:
        resource.prepare(x)
    assert e.value.errorcode == xa.XA_RBROLLBACK
    assert alice.create_session().create_consumer(Queue("public.ok")).receive(0.2) is None
    resource.start(Xid(1, b"next", b"b"), xa.TMNOFLAGS)  # the session is free for the next branch
    resource.end(Xid(1, b"next", b"b"), xa.TMSUCCESS)
    writer.close()


# --- heart-beats ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_silent_client_is_taken_for_dead_and_its_messages_come_back(broker):
    with Harness(broker, heartbeat=0.1) as h:
        conn = h.factory().create_connection()
        conn.create_session().create_producer(Q).send(TextMessage("m"))
        raw = RawClient(h.service.port)
        assert isinstance(raw.hello(heartbeat_ms=100), wire.Reply)
        raw.call(Op.SESSION, 1, False, int(AckMode.CLIENT_ACKNOWLEDGE), False)
        raw.call(Op.CONSUMER, 1, 1, Q, None, False, None, 10)
        raw.call(Op.START)
        wait_for(lambda: broker.destinations()["queue:orders"]["unacked"] == 1)
        started = time.monotonic()  # now the raw client goes silent
        wait_for(lambda: broker.destinations()["queue:orders"]["pending"] == 1, timeout=3)
        assert time.monotonic() - started < 1.5
        conn.start()
        got = conn.create_session().create_consumer(Q).receive(2)
        assert got.text == "m" and got.redelivered
        conn.close()


@pytest.mark.slow
def test_heart_beats_keep_an_idle_connection_alive(broker):
    with Harness(broker, heartbeat=0.1) as h:
        conn = h.factory(heartbeat=0.1).create_connection()
        conn.start()
        time.sleep(0.8)  # eight intervals without traffic
        assert roundtrip(conn) == "ping"
        conn.close()


@pytest.mark.slow
def test_a_silent_service_is_taken_for_dead_by_the_client():
    """A fake service that answers HELLO and then says nothing at all."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def serve():
        sock, _ = listener.accept()
        accepted.append(sock)
        sock.recv(65536)
        sock.sendall(
            wire.PREAMBLE
            + wire.reply(
                1,
                {
                    "instance": "fake",
                    "rm_id": "r",
                    "provider": "fake",
                    "version": "0",
                    "protocol": 1,
                    "heartbeat_ms": 100,
                    "max_frame": 1 << 20,
                },
            )
        )

    thread = threading.Thread(target=serve)
    thread.start()
    conn = RemoteConnectionFactory(f"mqtcp://127.0.0.1:{port}").create_connection()
    thread.join()
    lost = threading.Event()
    errors = []
    conn.set_exception_listener(lambda e: (errors.append(e), lost.set()))
    assert lost.wait(3)
    assert "no heart-beat from the service" in str(errors[0])
    with pytest.raises(TransportException, match="was lost: no heart-beat"):
        conn.create_session()
    conn.close()
    listener.close()
    accepted[0].close()


# --- many clients --------------------------------------------------------------------------------


@pytest.mark.slow
def test_many_clients_at_once_lose_and_duplicate_nothing(harness, broker):
    n_clients, per = 12, 150
    factory = harness.factory(prefetch=20)
    received: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def produce(i):
        try:
            with factory.create_connection("alice", "wonder") as conn:
                tx = conn.create_session(transacted=True)
                producer = tx.create_producer(Q)
                for k in range(per):
                    producer.send(
                        TextMessage(f"{i}:{k}"),
                        delivery_mode=DeliveryMode.PERSISTENT if k % 2 else DeliveryMode.NON_PERSISTENT,
                    )
                    if k % 10 == 9:
                        tx.commit()
        except BaseException as exc:
            errors.append(exc)

    def consume(mode):
        try:
            with factory.create_connection("alice", "wonder") as conn:
                conn.start()
                session = conn.create_session(ack_mode=mode)
                consumer = session.create_consumer(Q)
                while not done.is_set():
                    m = consumer.receive(0.05)
                    if m is not None:
                        if mode is AckMode.CLIENT_ACKNOWLEDGE:
                            m.acknowledge()
                        with lock:
                            received.append(m.text)
        except BaseException as exc:
            errors.append(exc)

    modes = [AckMode.AUTO_ACKNOWLEDGE, AckMode.CLIENT_ACKNOWLEDGE, AckMode.DUPS_OK_ACKNOWLEDGE]
    consumers = [threading.Thread(target=consume, args=(modes[i % 3],)) for i in range(n_clients // 2)]
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(n_clients)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    wait_for(lambda: len(received) >= n_clients * per, timeout=30)
    done.set()
    for t in consumers:
        t.join()
    assert not errors
    assert sorted(received) == sorted(f"{i}:{k}" for i in range(n_clients) for k in range(per))
    wait_for(lambda: broker.destinations()["queue:orders"] == {"pending": 0, "unacked": 0, "bytes": 0})
    wait_for(lambda: len(harness.service.connections) == 0)


def test_stopping_the_service_breaks_clients_clearly_and_returns_their_messages(broker):
    h = Harness(broker)
    conn = h.factory().create_connection()
    lost = threading.Event()
    conn.set_exception_listener(lambda e: lost.set())
    conn.start()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    session.create_producer(Q).send(TextMessage("a"))
    consumer = session.create_consumer(Q)
    assert consumer.receive(2).text == "a"
    h.close()
    assert lost.wait(5)
    with pytest.raises(TransportException, match="the jms service is stopping"):
        consumer.receive(1)
    assert broker.destinations()["queue:orders"]["pending"] == 1
    conn.close()


def test_closing_the_broker_under_the_service_tells_the_clients(tmp_path):
    from bridgemgr.providers.embedded import Broker

    b = Broker(tmp_path / "s")
    with Harness(b) as h:
        conn = h.factory().create_connection()
        lost = threading.Event()
        errors = []
        conn.set_exception_listener(lambda e: (errors.append(e), lost.set()))
        b.close()
        assert lost.wait(5)
        assert "shut down" in str(errors[0])


@pytest.mark.parametrize("sync", [False, True])
def test_a_persistent_send_is_written_on_the_loop_unless_the_store_fsyncs(tmp_path, sync):
    """Without fsync a store write is a copy into the page cache: the service's loop
    writes a strict send's batch itself when nobody else is writing, rather than hand the
    wait to its pool and the answer back (two thread hand-offs per send). With fsync the
    pool waits, so the loop goes on serving the other connections."""
    from bridgemgr.providers.embedded import Broker

    broker = Broker(tmp_path / "store", sync=sync)
    harness = Harness(broker)
    try:
        conn = harness.factory().create_connection()
        conn.start()
        jobs: list[object] = []
        submit = harness.service.executor.submit
        harness.service.executor.submit = lambda fn, *a, **k: jobs.append(fn) or submit(fn, *a, **k)
        producer = conn.create_session().create_producer(Q)
        for i in range(20):
            producer.send(TextMessage(f"p{i}"), delivery_mode=DeliveryMode.PERSISTENT)
        assert broker.store.stats()["rows"] >= 20  # each written before its send returned
        assert (len(jobs) >= 20) if sync else not jobs
        conn.close()
    finally:
        harness.close()
        broker.close()
    broker = Broker(tmp_path / "store")
    try:
        assert broker.queue_depth("orders") == 20
    finally:
        broker.close()
