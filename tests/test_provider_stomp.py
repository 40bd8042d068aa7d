"""The STOMP provider without an external server: URLs and options, frames <-> messages
(hypothesis), dialects, naming, the config-time XA refusal, connection failures, and the
whole JMS contract against our own STOMP bridge running in this process."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, TemporaryQueue, TemporaryTopic, Topic
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidSelectorError,
    JMSException,
    JMSSecurityException,
    NamingException,
    TransportException,
)
from bridgemgr.jms.message import (
    BytesMessage,
    DeliveryMode,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    java_string,
)
from bridgemgr.jms.spi import AckMode, is_xa_capable
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.resolve import check_xa
from bridgemgr.netloop import NetLoop
from bridgemgr.providers import stomp as sp
from bridgemgr.providers.embedded import Broker, DestinationLimits
from stomp_support import make_bridge, make_users, qname
from waiting import wait_for

pytestmark = pytest.mark.timeout(60)

# --- URLs ---------------------------------------------------------------------------------------


def test_url_hosts_and_options():
    opts = sp.parse_url(
        "stomp+ssl://a.example:61614,[::1]:7672?heart-beat=500,700&prefetch=5"
        "&connect-attempts=-1&vhost=prod&dialect=RabbitMQ&ca=/etc/ca.pem"
    )
    assert opts.hosts == (("a.example", 61614), ("::1", 7672))
    assert opts.tls and opts.heart_beat == (500, 700) and opts.prefetch == 5
    assert opts.connect_attempts == -1 and opts.vhost == "prod" and opts.dialect == "rabbitmq"
    assert opts.ca == "/etc/ca.pem"
    plain = sp.parse_url("stomp://h:1")
    assert not plain.tls and plain.vhost == "/" and plain.heart_beat == (10_000, 10_000)


@pytest.mark.parametrize(
    "url, says",
    [
        ("tcp://h:1", "use stomp://"),
        ("stomp://h", "is not host:port"),
        ("stomp://h:99999", "is not host:port"),
        ("stomp://h:1?prefetch=lots", "prefetch='lots' is not valid"),
        ("stomp://h:1?colour=red", "unknown option 'colour'"),
        ("stomp://h:1?dialect=ibmmq", "dialect must be auto or one of"),
    ],
)
def test_bad_urls_name_the_problem(url, says):
    with pytest.raises(NamingException, match=r"java.naming.provider.url") as info:
        sp.parse_url(url)
    assert says in str(info.value)


@given(
    st.lists(
        st.tuples(st.sampled_from(["h", "broker.example", "10.0.0.7"]), st.integers(1, 65535)), min_size=1, max_size=4
    )
)
@pytest.mark.slow
def test_any_host_list_parses_back(hosts):
    url = "stomp://" + ",".join(f"{h}:{p}" for h, p in hosts)
    assert sp.parse_url(url).hosts == tuple(hosts)


# --- frames <-> messages ---------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z][A-Za-z0-9_]{0,11}", fullmatch=True).filter(
    lambda n: n.upper() not in ("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE")
)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
TYPED = st.one_of(
    st.tuples(st.just(PropertyType.BOOLEAN), st.booleans()),
    st.tuples(st.just(PropertyType.BYTE), st.integers(-128, 127)),
    st.tuples(st.just(PropertyType.INT), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(PropertyType.LONG), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(PropertyType.DOUBLE), st.floats()),
    st.tuples(st.just(PropertyType.STRING), TEXT),
)


@st.composite
def messages(draw):
    kind = draw(st.sampled_from(["text", "bytes", "map", "stream", "object", "plain"]))
    if kind == "text":
        msg: Message = TextMessage(draw(st.one_of(TEXT, st.just("nul\0inside"))))
    elif kind == "bytes":
        msg = BytesMessage(draw(st.binary(max_size=64)))
    elif kind == "map":
        msg = MapMessage()
        for name, (ptype, value) in draw(st.dictionaries(NAMES, TYPED, max_size=4)).items():
            msg.set_typed(name, ptype, value)
    elif kind == "stream":
        msg = StreamMessage()
        for ptype, value in draw(st.lists(TYPED, max_size=4)):
            msg.write_typed(ptype, value)
    elif kind == "object":
        msg = ObjectMessage(
            draw(
                st.recursive(st.one_of(st.none(), st.integers(), TEXT), lambda c: st.lists(c, max_size=3), max_leaves=6)
            )
        )
    else:
        msg = Message()
    for name, (ptype, value) in draw(st.dictionaries(NAMES, TYPED, max_size=4)).items():
        msg.set_typed_property(name, ptype, value)
    msg.correlation_id = draw(st.one_of(st.none(), TEXT.filter(bool)))
    msg.type = draw(st.one_of(st.none(), st.just("Order")))
    msg.reply_to = draw(
        st.one_of(
            st.none(),
            st.sampled_from([Queue("replies"), Topic("news"), TemporaryQueue("t1"), Topic("/exchange/amq.direct/k")]),
        )
    )
    msg.delivery_mode = draw(st.sampled_from(list(DeliveryMode)))
    msg.priority = draw(st.integers(0, 9))
    msg.expiration = draw(st.sampled_from([0, 1_900_000_000_000]))
    return msg


def _canon(ptype, value):
    return struct.pack(">d", value) if isinstance(value, float) else value


def _body(msg):
    if isinstance(msg, (MapMessage,)):
        return sorted((n, p, _canon(p, v)) for n, p, v in msg.typed_items())
    if isinstance(msg, StreamMessage):
        return [(p, _canon(p, v)) for p, v in msg.typed_items()]
    return msg.get_body()


def deliver(msg: Message, dialect: str = "generic", **extra: str) -> Message:
    """``msg`` as a broker would hand it back: SEND headers plus the MESSAGE headers."""
    headers, body = sp.to_frame(msg, sp.DIALECTS[dialect])
    headers.update({"destination": "/queue/q", "message-id": "ID:1", "subscription": "s", "ack": "a1", **extra})
    return sp.from_frame(headers, body)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(messages())
def test_messages_survive_a_stomp_trip(msg):
    got = deliver(msg)
    assert type(got) is type(msg)
    assert _body(got) == _body(msg)
    assert (got.correlation_id, got.type, got.reply_to, got.priority, got.expiration) == (
        msg.correlation_id,
        msg.type,
        msg.reply_to,
        msg.priority,
        msg.expiration,
    )
    assert got.delivery_mode == msg.delivery_mode
    assert got.message_id == "ID:1" and got.destination == Queue("q") and got.is_read_only
    if isinstance(msg, (TextMessage, BytesMessage)):
        # STOMP headers are strings: a property comes back as the text Java would print.
        assert got.properties == {n: java_string(p, v) for n, p, v in msg.typed_properties()}
    else:
        # Kinds STOMP has no body for travel whole in our codec: types survive too.
        assert [(n, p, _canon(p, v)) for n, p, v in got.typed_properties()] == [
            (n, p, _canon(p, v)) for n, p, v in msg.typed_properties()
        ]


def test_text_rules_of_real_brokers():
    """What decides Text vs Bytes on the way in: ActiveMQ omits content-length for text,
    RabbitMQ keeps content-type, ActiveMQ's amq-msg-type marks text with a length."""
    assert isinstance(sp.from_frame({"destination": "/queue/q"}, b"plain"), TextMessage)
    assert isinstance(sp.from_frame({"content-length": "4", "content-type": "text/plain"}, b"abcd"), TextMessage)
    assert isinstance(sp.from_frame({"content-length": "4", "amq-msg-type": "text"}, b"abcd"), TextMessage)
    assert isinstance(sp.from_frame({"content-length": "2"}, b"\xff\x00"), BytesMessage)
    bad_text = sp.from_frame({"content-type": "text/plain"}, b"\xff\xfe")
    assert isinstance(bad_text, BytesMessage)  # not UTF-8 after all: keep the bytes
    json = sp.from_frame({"content-length": "2", "content-type": "application/json"}, b"{}")
    assert isinstance(json, TextMessage) and json.get_string_property("JMS_STOMP_CONTENT_TYPE") == "application/json"
    headers, _ = sp.to_frame(TextMessage("a\0b"), sp.DIALECTS["activemq"])
    assert headers["content-length"] == "3" and headers["amq-msg-type"] == "text"
    headers, _ = sp.to_frame(TextMessage("ab"), sp.DIALECTS["activemq"])
    assert "content-length" not in headers


def test_broker_headers_and_invalid_names():
    msg = sp.from_frame(
        {
            "destination": "/topic/news",
            "message-id": "m-1",
            "redelivered": "true",
            "timestamp": "17",
            "priority": "12",
            "persistent": "true",
            "reply-to": "/remote-temp-queue/ID:x",
            "x-death": "1",
            "receipt": "r",
            "color": "red",
            "subscription": "s",
            "ack": "a",
        },
        b"hi",
    )
    assert msg.destination == Topic("news") and msg.redelivered and msg.delivery_count == 2
    assert msg.timestamp == 17 and msg.priority == 9 and msg.delivery_mode == DeliveryMode.PERSISTENT
    assert msg.reply_to == TemporaryQueue("/remote-temp-queue/ID:x")
    assert sp.to_stomp_destination(msg.reply_to) == "/remote-temp-queue/ID:x"
    assert msg.properties == {"color": "red"}  # x-death is no JMS name; receipt is protocol


@pytest.mark.parametrize(
    "dest, text",
    [
        (Queue("a"), "/queue/a"),
        (Topic("a"), "/topic/a"),
        (TemporaryQueue("t"), "/temp-queue/t"),
        (TemporaryTopic("t"), "/temp-topic/t"),
        (Queue("/amq/queue/x"), "/amq/queue/x"),
    ],
)
def test_destinations_both_ways(dest, text):
    assert sp.to_stomp_destination(dest) == text
    assert sp.to_jms_destination(text) == dest


@pytest.mark.parametrize(
    "server, dialect",
    [
        ("ActiveMQ/5.17.2", "activemq"),
        ("RabbitMQ/3.10.8", "rabbitmq"),
        ("imqbridge/0.1.0", "imqbridge"),
        (None, "generic"),
        ("Artemis/2.30", "generic"),
    ],
)
def test_dialect_follows_the_server_header(server, dialect):
    assert sp.dialect_for(server).name == dialect
    assert sp.dialect_for(server, "rabbitmq").name == "rabbitmq"


# --- naming and the XA rule ---------------------------------------------------------------------

ENV = {
    naming.INITIAL_CONTEXT_FACTORY: "imq.stomp",
    naming.PROVIDER_URL: "stomp://127.0.0.1:1",
    naming.SECURITY_PRINCIPAL: "u",
    naming.SECURITY_CREDENTIALS: "s3cret-pw",
}


def test_lookups():
    cf = naming.lookup("ConnectionFactory", ENV)
    assert isinstance(cf, sp.StompConnectionFactory) and not is_xa_capable(cf)
    assert cf.username == "u" and "s3cret-pw" not in repr(cf)
    assert naming.lookup("queue/orders", ENV) == Queue("orders")
    assert naming.lookup("dynamicTopics/news", ENV) == Topic("news")
    assert naming.lookup("/topic/x", ENV) == Topic("x")
    with pytest.raises(NamingException, match="not bound in the STOMP context"):
        naming.lookup("Orders", ENV)
    with pytest.raises(NamingException, match=r"needs java.naming.provider.url"):
        naming.lookup("ConnectionFactory", {naming.INITIAL_CONTEXT_FACTORY: "imq.stomp"})


def test_imq_stomp_resolves_without_importing_the_provider_first():
    code = (
        "import sys; from bridgemgr.jms import naming; assert 'bridgemgr.providers.stomp' "
        "not in sys.modules; print(type(naming.lookup('ConnectionFactory', {"
        "'java.naming.factory.initial': 'imq.stomp', 'java.naming.provider.url': "
        "'stomp://h:1'})).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "StompConnectionFactory", out.stderr


def test_transacted_link_on_stomp_is_refused_at_config_time():
    xml = (
        b'<jmsbridge name="b">\n'
        b'<link name="l1"><source connection-factory-ref="stomp" destination-ref="q"/>'
        b'<target connection-factory-ref="host" destination-ref="q"/></link>'
        b'<link name="l2" transacted="false"><source connection-factory-ref="stomp" destination-ref="q"/>'
        b'<target connection-factory-ref="host" destination-ref="q"/></link>'
        b'<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="q"/>'
        b'<connection-factory ref-name="stomp" lookup-name="ConnectionFactory">'
        b'<property name="java.naming.factory.initial" value="imq.stomp"/>'
        b'<property name="java.naming.provider.url" value="stomp://127.0.0.1:1"/>'
        b'</connection-factory><connection-factory ref-name="host"/>'
        b'<destination ref-name="q" name="q"/></jmsbridge>'
    )
    config = parse_bridge_config(xml, "stomp.xml")
    problems = check_xa(config)
    texts = [str(p) for p in problems]
    assert len(texts) == 1, texts  # l2 is not transacted
    assert texts[0].startswith("stomp.xml:2:") and "link 'l1' is transacted" in texts[0]
    assert "StompConnectionFactory, which cannot do XA" in texts[0]
    assert 'transacted="false"' in texts[0]


# --- connecting ---------------------------------------------------------------------------------------


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_tries_every_host_then_fails_naming_them():
    a, b = _dead_port(), _dead_port()
    factory = sp.StompConnectionFactory(f"stomp://127.0.0.1:{a},127.0.0.1:{b}?connect-attempts=2&connect-delay=0.05")
    started = time.monotonic()
    with pytest.raises(TransportException, match=f"127.0.0.1:{a}, 127.0.0.1:{b}"):
        factory.create_connection()
    assert time.monotonic() - started < 10


# --- the JMS contract against our own STOMP bridge ------------------------------------------------------


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """Our STOMP bridge on a free port, in front of an embedded broker."""
    d = tmp_path_factory.mktemp("stompbridge")
    broker = Broker(d / "store")
    with NetLoop("provider-test-loop") as loop:
        bridge = make_bridge(loop, broker, make_users(d))
        yield (
            sp.StompConnectionFactory(f"stomp://127.0.0.1:{bridge.tcp_port}?heart-beat=1000,1000", "admin", "secret"),
            broker,
        )
        bridge.stop()
    broker.close()


@pytest.fixture
def conn(ours):
    c = ours[0].create_connection()
    c.start()
    yield c
    c.close()


def test_wrong_password_is_a_security_error(ours):
    with pytest.raises(JMSSecurityException, match="cannot connect"):
        ours[0].create_connection("admin", "wrong")


def test_every_kind_round_trips_through_our_bridge(conn):
    q = Queue(qname("kinds"))
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    sent = [
        TextMessage("héllo"),
        BytesMessage(b"\0\1\2"),
        MapMessage({"a": 1, "b": b"x"}),
        StreamMessage([1, "s", 2.5]),
        ObjectMessage({"k": [1]}),
        Message(),
    ]
    sent[0].set_string_property("color", "red")
    producer = session.create_producer(q)
    for m in sent:
        producer.send(m)
    assert all(m.message_id and m.timestamp and m.destination == q for m in sent)
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in sent]
    assert [type(m) for m in got] == [type(m) for m in sent]
    assert [_body(m) for m in got] == [_body(m) for m in sent]
    assert got[0].get_string_property("color") == "red"
    session.acknowledge()


@pytest.mark.slow
def test_client_acknowledge_and_recover(conn, ours):
    q = Queue(qname("ack"))
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    producer = session.create_producer(q)
    for i in range(3):
        producer.send(TextMessage(str(i)))
    consumer = session.create_consumer(q)
    first = [consumer.receive(5).text for _ in range(3)]
    session.recover()
    again = [consumer.receive(5) for _ in range(3)]
    assert [m.text for m in again] == first and all(m.redelivered for m in again)
    again[-1].acknowledge()  # CLIENT_ACKNOWLEDGE: acknowledges everything delivered
    assert consumer.receive(0.3) is None
    consumer.close()
    assert session.create_consumer(q).receive(0.5) is None


def test_individual_acknowledge(conn):
    q = Queue(qname("individual"))
    session = conn.create_session(False, AckMode.INDIVIDUAL_ACKNOWLEDGE)
    producer = session.create_producer(q)
    for i in range(3):
        producer.send(TextMessage(str(i)))
    consumer = session.create_consumer(q)
    got = [consumer.receive(5) for _ in range(3)]
    got[1].acknowledge()
    session.recover()
    back = sorted(consumer.receive(5).text for _ in range(2))
    assert back == ["0", "2"]


@pytest.mark.slow
def test_transactions(conn):
    q = Queue(qname("tx"))
    session = conn.create_session(True)
    producer = session.create_producer(q)
    producer.send(TextMessage("rolled back"))
    session.rollback()
    producer.send(TextMessage("committed"))
    session.commit()
    consumer = session.create_consumer(q)
    first = consumer.receive(5)
    assert first.text == "committed"
    session.rollback()
    again = consumer.receive(5)
    assert again.text == "committed" and again.redelivered
    session.commit()
    assert consumer.receive(0.3) is None


@pytest.mark.slow
def test_durable_subscription_with_selector(ours):
    factory = ours[0]
    topic = Topic(qname("news"))
    conn = factory.create_connection()
    conn.client_id = "durable-client"
    session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
    session.create_durable_subscriber(topic, "sub1", "color = 'red'").close()
    producer = session.create_producer(topic)
    for color in ("red", "blue", "red"):
        m = TextMessage(color)
        m.set_string_property("color", color)
        producer.send(m)
    conn.start()
    sub = session.create_durable_subscriber(topic, "sub1", "color = 'red'")
    assert [sub.receive(5).text, sub.receive(5).text] == ["red", "red"]
    assert sub.receive(0.3) is None
    session.acknowledge()
    sub.close()
    session.unsubscribe("sub1")
    conn.close()


def test_client_id_only_right_after_connecting(conn):
    conn.create_session()
    with pytest.raises(IllegalStateException, match="right after"):
        conn.client_id = "late"


def test_selector_on_a_queue_of_a_broker_without_selectors(ours, conn):
    # Our bridge filters itself; the rabbitmq dialect cannot on a queue and says so.
    factory = sp.StompConnectionFactory(ours[0].url + "&dialect=rabbitmq", "admin", "secret")
    with factory.create_connection() as c, pytest.raises(InvalidSelectorError, match="on a topic only"):
        c.create_session().create_consumer(Queue("q"), "a = 1")


def test_message_listener(conn):
    q = Queue(qname("listener"))
    session = conn.create_session()
    got: list[str] = []
    session.create_consumer(q).set_message_listener(lambda m: got.append(m.text))
    conn.create_session().create_producer(q).send(TextMessage("async"))
    wait_for(lambda: got, 5, "the listener's message")
    assert got == ["async"]


def test_lost_connection_reaches_the_listener_and_every_call(ours):
    """The network goes away: the exception listener hears of it and calls fail."""
    factory, _ = ours
    conn = factory.create_connection()
    conn.start()
    errors: list[Exception] = []
    conn.set_exception_listener(errors.append)
    consumer = conn.create_session().create_consumer(Queue(qname("lost")))
    conn._stomp.transport.socket.shutdown(2)  # the network goes away under us
    wait_for(lambda: errors, 10, "the exception listener's call")
    assert errors and isinstance(errors[0], TransportException)
    with pytest.raises(TransportException, match="lost"):
        consumer.receive(1)
    conn.close()


@pytest.mark.slow
def test_a_silent_broker_is_detected_by_heart_beats():
    """A server that answers CONNECT promising heart-beats every 200 ms and then says
    nothing more: the connection is declared lost within a few intervals."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    held: list[socket.socket] = []

    def serve() -> None:
        peer, _ = server.accept()
        held.append(peer)
        data = b""
        while b"\0" not in data:
            data += peer.recv(4096)
        peer.sendall(b"CONNECTED\nversion:1.2\nheart-beat:200,200\nserver:Silent/1\n\n\0")

    threading.Thread(target=serve, daemon=True).start()
    url = f"stomp://127.0.0.1:{server.getsockname()[1]}?heart-beat=200,200"
    conn = sp.StompConnectionFactory(url).create_connection()
    errors: list[Exception] = []
    conn.set_exception_listener(errors.append)
    started = time.monotonic()
    while not errors and time.monotonic() - started < 10:
        time.sleep(0.02)
    assert errors and "heart-beat" in str(errors[0]), errors
    assert time.monotonic() - started < 3
    conn.close()
    server.close()
    for peer in held:
        peer.close()


def test_browsing_is_not_stomp(conn):
    with pytest.raises(JMSException, match="cannot browse"):
        conn.create_session().create_browser(Queue("q"))


def test_float_property_text_is_javas(conn):
    q = Queue(qname("float"))
    session = conn.create_session()
    m = TextMessage("x")
    m.set_float_property("f", 0.1)
    m.set_double_property("nan", math.nan)
    session.create_producer(q).send(m)
    got = session.create_consumer(q).receive(5)
    assert got.properties == {"f": "0.1", "nan": "NaN"}


def test_confirm_sends_makes_a_refused_non_persistent_send_fail_itself(ours):
    """A NON_PERSISTENT SEND goes without a receipt, so a refusal (an ERROR, after which
    our bridge, like most brokers, closes the connection) would only show as a later
    call's lost connection. With confirm_sends (a bridge link's producer) the send waits
    for its receipt and raises the refusal itself, as a JMSException, not as a lost
    connection: the link sends that message to the DMQ."""
    factory, broker = ours
    q = Queue(qname("small"))
    broker.configure_destination(q, DestinationLimits(max_bytes_per_msg=1024))
    conn = factory.create_connection()
    try:
        producer = conn.create_session().create_producer(q)
        producer.delivery_mode = DeliveryMode.NON_PERSISTENT
        producer.confirm_sends = True
        producer.send(TextMessage("small"))
        with pytest.raises(JMSException, match="maxBytesPerMsg=1024") as refused:
            producer.send(TextMessage("x" * 4096))
        assert not isinstance(refused.value, TransportException)
    finally:
        conn.close()
