"""The mq:// client beyond the shared SPI scenarios: addressing, failover, the host
broker seen from other processes, prefetch and pull, asynchronous sends, browsing in
pages, TLS."""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
import time

import pytest

import bridgemgr
from bridgemgr.jms import AckMode, DeliveryMode, Queue, TextMessage, naming
from bridgemgr.jms.errors import JMSException, ResourceAllocationException, TransportException
from bridgemgr.jmsbridge.resolve import with_host_broker
from bridgemgr.providers import embedded
from bridgemgr.providers.embedded import DestinationLimits, EmbeddedConnectionFactory, clientconn, wire
from bridgemgr.providers.embedded.client import EmbeddedConnection
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.providers.embedded.remote import Address, RemoteConnection, RemoteConnectionFactory, parse_url
from ports import free_port
from remote.support import Harness
from waiting import wait_for

Q = Queue("orders")


@pytest.fixture
def harness(broker):
    h = Harness(broker, heartbeat=5.0)
    yield h
    h.close()


def put(conn, *texts, dest=Q):
    producer = conn.create_session().create_producer(dest)
    for text in texts:
        producer.send(TextMessage(text))


def depth(broker):
    return broker.destinations()["queue:orders"]


# --- addressing and connecting ------------------------------------------------------------


def test_connect_is_one_call(harness):
    with bridgemgr.connect(harness.url) as conn:
        conn.start()
        put(conn, "hi")
        assert conn.create_session().create_consumer(Q).receive(2).text == "hi"
        assert conn.metadata.provider_name == "imqbridge embedded broker"
        assert isinstance(conn, RemoteConnection)
    with bridgemgr.connect_xa(harness.url) as xconn:
        assert xconn.create_xa_session().xa_resource.recover(0) == []


def test_import_bridgemgr_does_not_load_the_client():
    code = "import bridgemgr, sys; print('bridgemgr.providers.embedded.remote' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.parametrize(
    "url, addresses",
    [
        ("mq://broker", [Address("broker", 7676, True, False)]),
        ("mq://10.0.0.1:7677/jms", [Address("10.0.0.1", 7677, True, False)]),
        ("mqtcp://h:1234, mqssl://[::1]:99", [Address("h", 1234, False, False), Address("::1", 99, False, True)]),
    ],
)
def test_urls(url, addresses):
    assert parse_url(url) == addresses
    assert str(addresses[0]).startswith(url.split(":")[0] + "://")


@pytest.mark.parametrize(
    "url, match",
    [
        ("tcp://h:1", "write mq://host:port"),
        ("mq://", "write mq://host:port"),
        ("mqtcp://h", "needs the service's port"),
        ("mq://h:99999", "bad broker URL"),
        ("mq://h/queue", "write mq://host:port"),
    ],
)
def test_bad_urls_say_how_to_write_them(url, match):
    with pytest.raises(JMSException, match=match):
        RemoteConnectionFactory(url)


def test_the_next_url_is_tried_and_every_failure_is_reported(harness):
    dead = free_port()
    conn = RemoteConnectionFactory(f"mq://127.0.0.1:{dead},{harness.url}").create_connection()
    assert conn.address.port == harness.portmapper.port
    conn.close()
    with pytest.raises(TransportException) as e:
        RemoteConnectionFactory(
            f"mq://127.0.0.1:{dead},mqtcp://127.0.0.1:{dead}", connect_timeout=2
        ).create_connection()
    text = str(e.value)
    assert text.startswith("no broker could be reached: ")
    assert f"cannot reach the port mapper at 127.0.0.1:{dead}" in text
    assert f"cannot connect to mqtcp://127.0.0.1:{dead}" in text


def test_a_port_mapper_without_a_jms_service_is_named(broker):
    from bridgemgr.admin.portmapper import PortMapper
    from bridgemgr.netloop import NetLoop

    with NetLoop() as netloop:
        pm = PortMapper(netloop, "127.0.0.1", 0, "lonely").start()
        with pytest.raises(
            TransportException,
            match=r"broker lonely .* offers no jms service \(its services: "
            r"portmapper\)",
        ):
            RemoteConnectionFactory(f"mq://127.0.0.1:{pm.port}").create_connection()
        pm.stop()


# --- the host broker from another process ----------------------------------------------------


@pytest.fixture
def no_broker_env(monkeypatch):
    for name in (embedded.BROKER_URL_ENV, embedded.BROKER_USER_ENV, embedded.BROKER_PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)


def test_without_a_host_broker_given_the_host_factory_goes_over_the_wire(harness, no_broker_env, monkeypatch, broker):
    factory = embedded.HostBrokerFactory()
    monkeypatch.setenv(embedded.BROKER_URL_ENV, harness.url)
    conn = factory.create_xa_connection()
    assert isinstance(conn, RemoteConnection) and conn.address.port == harness.portmapper.port
    conn.close()
    monkeypatch.delenv(embedded.BROKER_URL_ENV)
    monkeypatch.setenv(embedded.BROKER_URL_ENV, f"mqtcp://127.0.0.1:{harness.service.port}")
    env = {naming.INITIAL_CONTEXT_FACTORY: "imq.embedded"}  # an empty provider URL
    conn = naming.lookup("XAConnectionFactory", env).create_connection()
    assert isinstance(conn, RemoteConnection)
    conn.close()
    # a JMS bridge resolves the empty provider URL against the host broker it was given
    host = EmbeddedHostBroker(broker)
    lookup = with_host_broker(naming.lookup, lambda env: host.connection_factory())
    conn = lookup("XAConnectionFactory", env).create_connection()
    assert isinstance(conn, EmbeddedConnection)
    conn.close()
    assert isinstance(lookup("queue/q", env), Queue)


def test_factories_travel_to_other_processes(harness, no_broker_env, monkeypatch):
    """Spark ships factories to executors by pickling them."""
    import pickle

    remote = pickle.loads(pickle.dumps(RemoteConnectionFactory(harness.url, prefetch=7)))
    assert remote.prefetch == 7
    remote.create_connection().close()
    host = pickle.loads(pickle.dumps(embedded.HostBrokerFactory()))
    monkeypatch.setenv(embedded.BROKER_URL_ENV, harness.url)
    conn = host.create_connection()
    assert isinstance(conn, RemoteConnection)
    conn.close()


def test_a_provider_url_names_a_remote_broker(harness):
    env = {naming.INITIAL_CONTEXT_FACTORY: "imq.embedded", naming.PROVIDER_URL: harness.url}
    factory = naming.lookup("ConnectionFactory", env)
    assert isinstance(factory, RemoteConnectionFactory)
    factory.create_connection().close()


def test_the_remote_url_comes_from_the_broker_properties(no_broker_env):
    from bridgemgr.props import load_properties

    props = load_properties([], ["imq.portmapper.port=7777", "imq.hostname=mq.example"], {})
    assert embedded.broker_url(props) == "mq://mq.example:7777"
    assert embedded.broker_url(load_properties([], [], {})) == embedded.DEFAULT_BROKER_URL
    assert embedded.HostBrokerFactory(embedded.broker_url(props)).url == "mq://mq.example:7777"
    with pytest.raises(JMSException, match="bad broker URL"):
        embedded.HostBrokerFactory("http://x")


def test_without_any_broker_the_error_says_where_it_looked(no_broker_env, monkeypatch):
    port = free_port()
    monkeypatch.setenv(embedded.BROKER_URL_ENV, f"mq://127.0.0.1:{port}")
    with pytest.raises(TransportException, match=f"cannot reach the port mapper at 127.0.0.1:{port}"):
        embedded.HostBrokerFactory().create_connection()


# --- prefetch, pull and acknowledgement ------------------------------------------------------------


def test_the_prefetch_window_bounds_what_a_consumer_holds(harness, broker):
    conn = harness.factory(prefetch=10).create_connection()
    put(conn, *[str(i) for i in range(50)])
    conn.start()
    consumer = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE).create_consumer(Q)
    wait_for(lambda: depth(broker)["pending"] == 40)
    time.sleep(0.1)
    assert depth(broker) | {"bytes": 0} == {"pending": 40, "unacked": 10, "bytes": 0}
    assert consumer.receive(1).text == "0"
    consumer.close()  # the nine not handed out go back as never delivered
    wait_for(lambda: depth(broker)["pending"] == 49)
    again = conn.create_session().create_consumer(Q).receive(1)
    assert again.text == "1" and not again.redelivered
    conn.close()


def test_closed_consumers_leave_no_trace_in_the_queue(harness, broker):
    conn = harness.factory().create_connection()
    conn.start()
    session = conn.create_session()
    for _ in range(20):
        session.create_consumer(Q).close()  # each one parked in the queue while open
    put(conn, "after")
    assert session.create_consumer(Q).receive(2).text == "after"
    conn.close()
    mq = broker.queues["orders"]
    assert not mq.waiters and not mq.consumers


@pytest.mark.slow
def test_a_pull_consumer_holds_nothing_while_it_does_not_receive(harness, broker):
    conn = harness.factory(prefetch=0).create_connection()
    conn.start()
    put(conn, "a", "b", "c")
    consumer = conn.create_session().create_consumer(Q)
    time.sleep(0.2)
    assert depth(broker)["pending"] == 3
    assert consumer.receive(1).text == "a"
    assert consumer.receive(0.05).text == "b"
    assert consumer.receive_no_wait().text == "c"
    assert consumer.receive(0.05) is None
    put(conn, "late")
    time.sleep(0.1)
    assert depth(broker)["pending"] == 1  # the timed-out receive took its credit back
    conn.close()


def test_receive_no_wait_sees_what_the_queue_holds(harness):
    conn = harness.factory().create_connection()
    conn.start()
    put(conn, "x")
    assert conn.create_session().create_consumer(Q).receive_no_wait().text == "x"
    conn.close()


def test_receive_blob_hands_over_what_receive_would_give_encoded_and_acknowledges_alike(harness, broker):
    """A runner=spark link's receiver logs blobs: the host broker's are passed on without
    decoding, redelivery counted, and CLIENT_ACKNOWLEDGE covers them like messages."""
    from bridgemgr.jms import codec

    conn = harness.factory().create_connection()
    conn.start()
    put(conn, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(Q)
    first = consumer.receive_blob(2)
    assert codec.decode(first).text == "a" and codec.decode(first).delivery_count == 1
    session.recover()  # both come again, now redelivered
    again = [consumer.receive_blob(2), consumer.receive_blob(2)]
    assert [codec.decode(b).text for b in again] == ["a", "b"]
    seen = codec.decode(again[0])
    assert (seen.delivery_count, seen.redelivered) == (2, True)
    assert seen.message_id.startswith("ID:") and codec.message_id(again[0]) == seen.message_id
    assert consumer.receive_blob(0.1) is None
    session.acknowledge()
    wait_for(lambda: depth(broker) == {"pending": 0, "unacked": 0, "bytes": 0})
    conn.close()  # its consumer's prefetch window would take the next message
    # every provider has it: the SPI's receive_blob encodes what receive() gives
    local = EmbeddedConnectionFactory(broker).create_connection()
    local.start()
    put(local, "c")
    blob = local.create_session().create_consumer(Q).receive_blob(2)
    assert codec.decode(blob).text == "c"
    local.close()


@pytest.mark.parametrize("over", ["mq://", "in-process"])
def test_acknowledge_oldest_takes_the_oldest_messages_only(harness, broker, over):
    """A bridge link whose transformer stops it on a message acknowledges those received
    before it and not it (CLIENT_ACKNOWLEDGE's acknowledge() would take it too); the
    mq:// client and the host broker in-process both can."""
    factory = harness.factory() if over == "mq://" else EmbeddedConnectionFactory(broker)
    conn = factory.create_connection()
    conn.start()
    put(conn, "a", "b", "c", "d")
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(Q)
    assert session.acknowledges_oldest
    assert [consumer.receive(2).text for _ in range(3)] == ["a", "b", "c"]
    assert session.acknowledge_oldest(2) is True
    session.recover()  # c (received, not acknowledged) comes again, then d
    again = consumer.receive(2)
    assert (again.text, again.redelivered) == ("c", True)
    assert consumer.receive(2).text == "d"
    assert session.acknowledge_oldest(1) is True  # c only: d comes again after a recover
    session.recover()
    assert consumer.receive(2).text == "d"
    session.acknowledge()
    wait_for(lambda: depth(broker) == {"pending": 0, "unacked": 0, "bytes": 0})
    auto = conn.create_session()
    assert auto.acknowledge_oldest(1) is False  # only CLIENT_ACKNOWLEDGE can
    conn.close()


def test_a_link_window_raises_the_source_consumers_prefetch(harness, broker):
    """prefetch_at_least() (a link's PREFETCH_WINDOWS confirm windows) raises what a
    consumer created afterwards may hold above the factory's prefetch."""
    conn = harness.factory(prefetch=10).create_connection()
    put(conn, *[str(i) for i in range(50)])
    conn.start()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    session.prefetch_at_least(30)
    session.create_consumer(Q)
    wait_for(lambda: depth(broker)["unacked"] == 30)
    conn.close()


def test_a_link_byte_bound_stops_the_source_consumers_prefetch(harness, broker):
    """prefetch_at_least(count, max_bytes): the service delivers no more while what the
    consumer holds reaches max_bytes (16 KiB messages, 64k: 4, not 1000); what it
    consumes makes room again, and every message comes, in order."""
    conn = harness.factory(prefetch=10).create_connection()
    put(conn, *[f"{i:03d}" + "z" * 16384 for i in range(12)])
    conn.start()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    session.prefetch_at_least(1000, max_bytes=64 * 1024)
    consumer = session.create_consumer(Q)
    wait_for(lambda: depth(broker)["unacked"] == 4)
    time.sleep(0.1)
    assert depth(broker)["unacked"] == 4
    got = [consumer.receive(2).text[:3] for _ in range(12)]
    session.acknowledge()
    assert got == [f"{i:03d}" for i in range(12)]
    conn.close()


def test_a_service_that_does_not_offer_prefetch_bytes_is_asked_for_the_count_alone(harness, broker):
    """A service too old for prefetch bytes (its HELLO reply does not say "prefetch_bytes")
    would refuse a CONSUMER with them: the client sends the count alone."""
    conn = harness.factory(prefetch=10).create_connection()
    del conn.channel.welcome["prefetch_bytes"]
    put(conn, *[f"{i:03d}" + "z" * 16384 for i in range(12)])
    conn.start()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    session.prefetch_at_least(1000, max_bytes=64 * 1024)
    session.create_consumer(Q)
    wait_for(lambda: depth(broker)["unacked"] == 12)
    conn.close()


def test_a_consumer_without_prefetch_bytes_is_what_an_older_client_asks_for(harness, broker):
    """CONSUMER with 7 arguments (a client from before prefetch bytes) is still taken."""
    conn = harness.factory(prefetch=10).create_connection()
    put(conn, *[str(i) for i in range(20)])
    conn.start()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    conn.request(wire.Op.CONSUMER, session.sid, 99, Q, None, False, None, 5)
    wait_for(lambda: depth(broker)["unacked"] == 5)
    conn.close()


@pytest.mark.parametrize(
    "mode, acked_at_once", [(AckMode.AUTO_ACKNOWLEDGE, True), (AckMode.DUPS_OK_ACKNOWLEDGE, False)]
)
def test_auto_acknowledges_at_once_and_dups_ok_within_a_heart_beat(broker, mode, acked_at_once):
    with Harness(broker, heartbeat=0.3) as h:
        conn = h.factory(heartbeat=0.3).create_connection()
        conn.start()
        put(conn, "a", "b")
        consumer = conn.create_session(ack_mode=mode).create_consumer(Q)
        assert consumer.receive(1).text == "a" and consumer.receive(1).text == "b"
        if acked_at_once:  # written at once: the service has it well before a heart-beat (0.3 s) passes
            wait_for(lambda: depth(broker)["unacked"] == 0, timeout=0.25)
        else:  # kept for the next heart-beat: right after the receive nothing is acknowledged yet
            assert depth(broker)["unacked"] == 2
            wait_for(lambda: depth(broker)["unacked"] == 0, timeout=2)
        conn.close()


def test_a_listener_in_client_acknowledge_mode(harness, broker):
    conn = harness.factory(prefetch=0).create_connection()
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    got, done = [], threading.Event()

    def listener(m):
        got.append(m.text)
        if len(got) == 3:
            m.acknowledge()
            done.set()

    session.create_consumer(Q).set_message_listener(listener)
    conn.start()
    put(conn, "1", "2", "3")
    assert done.wait(5) and got == ["1", "2", "3"]
    wait_for(lambda: depth(broker) == {"pending": 0, "unacked": 0, "bytes": 0})
    conn.close()


def test_closing_a_consumer_whose_listener_is_reading_the_socket_is_prompt(harness):
    conn = harness.factory().create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    consumer.set_message_listener(lambda m: None)
    time.sleep(0.2)  # its thread now waits in the socket
    started = time.monotonic()
    consumer.close()
    assert time.monotonic() - started < 1
    conn.close()


# --- sending ----------------------------------------------------------------------------------------


def test_a_refused_non_persistent_send_surfaces_at_the_next_send(harness, broker):
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=1))
    conn = harness.factory().create_connection()
    producer = conn.create_session().create_producer(Q)
    producer.delivery_mode = DeliveryMode.NON_PERSISTENT
    producer.send(TextMessage("1"))
    producer.send(TextMessage("2"))  # refused by the broker, not waited for
    with pytest.raises(ResourceAllocationException, match="full"):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)
            producer.send(TextMessage("3"))
    conn.close()
    strict = harness.factory(sync_sends=True).create_connection()
    with pytest.raises(ResourceAllocationException, match="full"):
        strict.create_session().create_producer(Q).send(TextMessage("4"), delivery_mode=DeliveryMode.NON_PERSISTENT)
    strict.close()


def test_a_send_window_pipelines_persistent_sends_and_still_reports_refusals(harness, broker):
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=3))
    conn = harness.factory(send_window=8).create_connection()
    session = conn.create_session()
    producer = session.create_producer(Q)
    for i in range(6):
        producer.send(TextMessage(str(i)))  # none waits: the window holds eight
    with pytest.raises(ResourceAllocationException, match="full"):
        session.close()  # closing waits for the window: three were refused
    assert depth(broker)["pending"] == 3
    small = harness.factory(send_window=2).create_connection()
    producer = small.create_session().create_producer(Q)
    producer.send(TextMessage("a"))
    producer.send(TextMessage("b"))
    with pytest.raises(ResourceAllocationException, match="full"):
        producer.send(TextMessage("c"))  # the window is full: it waits, and sees "a" refused
    with pytest.raises(ResourceAllocationException, match="full"):
        small.close()  # closing the connection waits for the windows too
    assert small.closed
    conn.close()


def test_a_transaction_that_fails_at_commit_is_rolled_back(harness, broker):
    from bridgemgr.jms.errors import TransactionRolledBackException

    broker.configure_destination(Q, DestinationLimits(max_num_msgs=1))
    conn = harness.factory().create_connection()
    put(conn, "first")
    tx = conn.create_session(transacted=True)
    tx.create_producer(Q).send(TextMessage("2"))
    with pytest.raises(TransactionRolledBackException, match="full"):
        tx.commit()
    conn.start()
    with conn.create_session().create_consumer(Q) as consumer:
        assert consumer.receive(1).text == "first"
    tx.create_producer(Q).send(TextMessage("only"))
    tx.commit()
    assert depth(broker)["pending"] == 1
    conn.close()


def test_a_persistent_send_returns_once_the_store_has_it_when_it_fsyncs(tmp_path):
    from bridgemgr.providers.embedded import Broker

    b = Broker(tmp_path / "s", sync=True)
    with Harness(b) as h:
        conn = h.factory().create_connection()
        put(conn, "durable")
        b.store.close()  # what was answered is on disk
        conn.close()
    b.close()
    b = Broker(tmp_path / "s")
    assert b.queue_depth("orders") == 1
    b.close()


def test_a_browser_of_a_queue_that_does_not_exist_fails_at_creation(tmp_path):
    from bridgemgr.jms.errors import InvalidDestinationException
    from bridgemgr.providers.embedded import Broker

    b = Broker(tmp_path / "s", autocreate_queue=False)
    try:
        with Harness(b) as h:
            conn = h.factory().create_connection()
            session = conn.create_session()
            with pytest.raises(InvalidDestinationException, match="'nowhere' does not exist"):
                session.create_browser(Queue("nowhere"))  # not first when iterated
            b.configure_destination(Queue("nowhere"), DestinationLimits())
            assert list(session.create_browser(Queue("nowhere"))) == []
            conn.close()
    finally:
        b.close()


def test_a_remote_senders_message_is_stored_and_delivered_as_it_sent_it(harness, broker, monkeypatch):
    """The service keeps the client's encoding (no re-encoding on the hot path) while a
    queue is short, and re-encodes past that; either way every message arrives whole.
    (The stored copy, also the client's encoding, is read back by the kill -9 tests.)"""
    from bridgemgr.providers.embedded import routing

    monkeypatch.setattr(routing, "WIRE_KEEP", 3)
    conn = harness.factory().create_connection()
    producer = conn.create_session().create_producer(Q)
    for i in range(5):
        m = TextMessage(f"m{i}")
        m.set_int_property("i", i)
        producer.send(m, delivery_mode=DeliveryMode.PERSISTENT)
    queue = broker._queue("orders")
    kept = [env.wire is not None for env in queue.browse()]
    assert kept == [True, True, True, False, False]
    conn.start()
    consumer = conn.create_session().create_consumer(Q)
    got = [consumer.receive(2) for _ in range(5)]
    assert [(m.text, m.get_int_property("i")) for m in got] == [(f"m{i}", i) for i in range(5)]
    conn.close()


# --- browsing and XA --------------------------------------------------------------------------------


def test_browsing_pages_through_a_long_queue(harness, monkeypatch):
    monkeypatch.setattr(clientconn, "BROWSE_PAGE_MESSAGES", 7)
    conn = harness.factory().create_connection()
    put(conn, *[str(i) for i in range(30)])
    session = conn.create_session()
    assert [m.text for m in session.create_browser(Q)] == [str(i) for i in range(30)]
    for m in session.create_browser(Q, "JMSPriority = 4"):
        assert m.is_read_only
        break  # stopping early closes it in the service
    wait_for(lambda: not next(iter(harness.service.connections)).client.browsers)
    conn.close()


def test_xa_resources_of_the_same_broker_are_the_same_rm(harness, tmp_path):
    a, b = harness.factory().create_xa_connection(), harness.factory().create_xa_connection()
    ra, rb = a.create_xa_session().xa_resource, b.create_xa_session().xa_resource
    assert ra.is_same_rm(rb)
    from bridgemgr.providers.embedded import Broker

    other = Broker(tmp_path / "other")
    with Harness(other) as h2:
        c = h2.factory().create_xa_connection()
        assert not ra.is_same_rm(c.create_xa_session().xa_resource)
        assert not ra.is_same_rm(
            EmbeddedConnectionFactory(other).create_xa_connection().create_xa_session().xa_resource
        )
        c.close()
    other.close()
    a.close()
    b.close()


# --- TLS --------------------------------------------------------------------------------------------


def test_tls_through_the_port_mapper_and_directly(broker):
    trustme = pytest.importorskip("trustme", reason="trustme is a test dependency (pip install -e .[test])")
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    with Harness(broker, ssl_context=server_context) as h:
        assert h.service.service_entry().name == "ssljms"
        for url in (h.url, f"mqssl://127.0.0.1:{h.service.port}"):
            conn = RemoteConnectionFactory(url, ssl_context=client_context).create_connection()
            conn.start()
            put(conn, "secret")
            assert conn.create_session().create_consumer(Q).receive(2).text == "secret"
            conn.close()
        with pytest.raises(TransportException, match="offers no jms service"):
            RemoteConnectionFactory(h.url).create_connection()  # plain TCP is not offered
        with pytest.raises(TransportException, match="handshake failed"):
            RemoteConnectionFactory(f"mqssl://127.0.0.1:{h.service.port}").create_connection()  # untrusted


@pytest.mark.slow
def test_connections_without_a_user_log_in_with_the_default_login(broker, no_broker_env, monkeypatch):
    """CLI jobs and Spark workers reach a service that checks passwords: a connection that
    names no user (a bridge XML rarely does) logs in with the job's login."""
    from bridgemgr.jms.errors import JMSSecurityException

    with Harness(
        broker, heartbeat=5.0, authenticator=lambda user, password: (user, password) == ("job", "s3cret")
    ) as h:
        with pytest.raises(JMSSecurityException):
            embedded.HostBrokerFactory(h.url).create_connection()
        embedded.HostBrokerFactory(h.url, "job", "s3cret").create_connection().close()
        factory = embedded.HostBrokerFactory()
        monkeypatch.setenv(embedded.BROKER_URL_ENV, h.url)
        monkeypatch.setenv(embedded.BROKER_USER_ENV, "job")
        monkeypatch.setenv(embedded.BROKER_PASSWORD_ENV, "s3cret")
        factory.create_connection().close()
        with pytest.raises(JMSSecurityException):  # a named user is never replaced
            factory.create_connection("job", "wrong")


def test_a_close_whose_socket_end_is_read_before_close_returns_is_no_loss(harness, caplog):
    """The service ends the socket once it has answered CLOSE; the client's idle reader may
    see that end before close() marks the channel closed (a loaded machine): no lost
    connection is reported, no exception listener told."""
    conn = harness.factory().create_connection()
    heard: list[JMSException] = []
    conn.set_exception_listener(heard.append)
    channel = conn.channel
    closing = channel.close

    def close_after_the_end_was_read() -> None:
        wait_for(lambda: channel.broken is not None, timeout=5, what="the service's end of the socket")
        closing()

    channel.close = close_after_the_end_was_read
    with caplog.at_level("WARNING"):
        conn.close()
    assert heard == []
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]
