"""JMS bridges (bridgemgr.jmsbridge.bridge.JMSBridge) whose links reach real servers
through the external providers: embedded -> ActiveMQ over JMS (JPype), ActiveMQ ->
RabbitMQ over STOMP, ActiveMQ -> embedded from a durable topic subscription with a
selector, a Java transformer on a link, ActiveMQ stopped for 10 s under traffic, and
ActiveMQ stopped and started again under idle links.

Non-transacted links (CLIENT_ACKNOWLEDGE after the send: at-least-once). Transacted (XA)
links need the XA coordinator (issue 5); tests/real/test_java_xa.py drives ActiveMQ's
XAResource through the provider meanwhile."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from html import escape

import pytest
from servers import JMS_API_JAR, ActiveMQ

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.message import BytesMessage, MapMessage, Message, PropertyType, TextMessage
from bridgemgr.jms.spi import AckMode
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from jmsbridge_support import FAST, drain, send, wait_until
from waiting import wait_for

pytestmark = pytest.mark.timeout(180)


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def properties(env: dict[str, str]) -> str:
    return "".join(f'<property name="{escape(k)}" value="{escape(v)}"/>' for k, v in env.items())


def bridge_xml(name: str, link: str, cfs: str, dests: str) -> bytes:
    return (
        f'<jmsbridge name="{name}" message-transfer-tag-bridge-name="true">{link}'
        '<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="src" '
        'send-attempts="2" send-attempt-interval-in-seconds="0"/>'
        f'<connection-factory ref-name="host"/>{cfs}{dests}</jmsbridge>'
    ).encode()


def cf_xml(ref: str, env: dict[str, str], lookup: str = "ConnectionFactory", attrs: str = "") -> str:
    return (
        f'<connection-factory ref-name="{ref}" lookup-name="{lookup}" '
        f'connect-attempt-interval-in-seconds="1" {attrs}>{properties(env)}</connection-factory>'
    )


def start_bridge(broker: Broker, xml: bytes) -> JMSBridge:
    bridge = JMSBridge(
        parse_bridge_config(xml, "real.xml"), host_factory=lambda env: EmbeddedConnectionFactory(broker), tuning=FAST
    )
    assert bridge.start() is State.STARTED
    return bridge


def take(factory, dest, expect: int, total: float = 60.0) -> list[Message]:
    """Consume ``expect`` messages of ``dest`` (fewer if ``total`` seconds pass), then what
    else comes within 0.5 s. Each is acknowledged as it comes (AUTO_ACKNOWLEDGE): ActiveMQ
    gives a STOMP consumer holding unacknowledged messages its next page of 200 only at its
    30 s expiry scan (see test_take_drains_an_activemq_stomp_queue_past_its_page_size)."""
    with factory.create_connection() as conn:
        conn.start()
        consumer = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE).create_consumer(dest)
        out: list[Message] = []
        deadline = time.monotonic() + total
        while time.monotonic() < deadline:
            m = consumer.receive(0.5)
            if m is not None:
                out.append(m)
            elif len(out) >= expect:
                break
        return out


def test_take_drains_an_activemq_stomp_queue_past_its_page_size(activemq):
    """ActiveMQ pages a queue in 200 messages at a time and pages in more when something
    wakes the queue (a send, an acknowledgement) or when its expiry scan runs (every 30 s):
    a STOMP consumer that acknowledged nothing yet waited up to 30 s per page, so a take of
    1,000 messages needed up to a minute, and under load returned m0-m799 at its deadline."""
    factory = naming.lookup("ConnectionFactory", activemq.stomp_env())
    queue = Queue(unique("take"))
    with factory.create_connection() as conn:
        producer = conn.create_session().create_producer(queue)
        for i in range(1000):
            producer.send(TextMessage(f"m{i}"), delivery_mode=1)
    started = time.monotonic()
    assert [m.text for m in take(factory, queue, 1000, total=20)] == [f"m{i}" for i in range(1000)]
    assert time.monotonic() - started < 20


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    yield b
    b.close()


def test_embedded_to_activemq_over_jms(activemq, broker):
    src, dst = unique("src"), unique("dst")
    amq = activemq.jndi()
    link = (
        '<link name="to-amq" transacted="false">'
        '<source connection-factory-ref="host" destination-ref="src"/>'
        '<target connection-factory-ref="amq" destination-ref="dst"/></link>'
    )
    dests = (
        f'<destination ref-name="src" name="{src}"/>'
        f'<destination ref-name="dst" lookup-name="dynamicQueues/{dst}">{properties(amq)}</destination>'
    )
    bridge = start_bridge(broker, bridge_xml("b1", link, cf_xml("amq", amq), dests))
    try:
        sent: list[Message] = []
        for i in range(200):
            m: Message = (
                TextMessage(f"t{i}")
                if i % 3 == 0
                else BytesMessage(bytes([i]))
                if i % 3 == 1
                else MapMessage({"i": i, "half": i / 2})
            )
            m.set_int_property("i", i)
            m.set_short_property("s", i)
            m.correlation_id = f"c{i}"
            sent.append(m)
        send(broker, src, sent)
        got = take(naming.lookup("ConnectionFactory", amq), Queue(dst), 200)
    finally:
        bridge.stop()
    assert len(got) == 200
    by_i = {m.get_int_property("i"): m for m in got}
    assert sorted(by_i) == list(range(200))
    for m in sent:
        back = by_i[m.get_int_property("i")]
        assert type(back) is type(m) and back.get_body() == m.get_body()
        assert back.get_property_type("s") is PropertyType.SHORT and back.correlation_id == m.correlation_id
        assert back.get_string_property("JMS_SUN_JMSBRIDGE_NAME") == "b1"
    assert bridge.info()["links"][0]["counters"]["transferred"] == 200
    assert drain(broker, src) == []


def test_activemq_to_rabbitmq_over_stomp(activemq, rabbitmq, broker):
    src, dst = unique("from.amq"), unique("to.rabbit")
    rabbit = {k: v for k, v in rabbitmq.stomp_env().items() if "security" not in k}
    link = (
        '<link name="amq-to-rabbit" transacted="false">'
        '<source connection-factory-ref="amq" destination-ref="src"/>'
        '<target connection-factory-ref="rabbit" destination-ref="dst"/></link>'
    )
    cfs = cf_xml("amq", activemq.stomp_env()) + cf_xml("rabbit", rabbit, attrs='username="guest" password="guest"')
    dests = f'<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>'
    bridge = start_bridge(broker, bridge_xml("b2", link, cfs, dests))
    try:
        # A Java JMS client produces on ActiveMQ; a STOMP client consumes from RabbitMQ.
        with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as jc:
            producer = jc.create_session().create_producer(Queue(src))
            for i in range(200):
                m = TextMessage(f"m{i}") if i % 2 else BytesMessage(b"\x00" + bytes([i]))
                m.set_string_property("n", str(i))
                producer.send(m)
        got = take(naming.lookup("ConnectionFactory", rabbitmq.stomp_env()), Queue(dst), 200)
    finally:
        bridge.stop()
    counts = Counter(m.get_string_property("n") for m in got)
    assert set(counts) == {str(i) for i in range(200)}
    assert sum(counts.values()) == 200  # nothing lost, nothing doubled on a clean run
    kinds = {m.get_string_property("n"): type(m) for m in got}
    assert kinds["1"] is TextMessage and kinds["2"] is BytesMessage


def test_activemq_durable_topic_with_selector_to_embedded(activemq, broker):
    topic, dst = unique("prices"), unique("eu.prices")
    amq = activemq.jndi()
    link = (
        '<link name="eu" transacted="false">'
        '<source connection-factory-ref="amq" destination-ref="topic" durable-sub="bridge-eu" '
        f'clientid="{unique("bridge")}" selector="region = \'eu\' AND price &gt; 10"/>'
        '<target connection-factory-ref="host" destination-ref="dst"/></link>'
    )
    dests = f'<destination ref-name="topic" name="{topic}" type="topic"/><destination ref-name="dst" name="{dst}"/>'
    xml = bridge_xml("b3", link, cf_xml("amq", amq), dests)

    def publish(n: int, base: int) -> None:
        with naming.lookup("ConnectionFactory", amq).create_connection() as jc:
            producer = jc.create_session().create_producer(Topic(topic))
            for i in range(base, base + n):
                m = TextMessage(str(i))
                m.set_string_property("region", "eu" if i % 2 == 0 else "us")
                m.set_int_property("price", 5 if i % 4 == 2 else 20)
                producer.send(m)

    bridge = start_bridge(broker, xml)
    try:
        publish(20, 0)
        first = drain(broker, dst, expect=5, total=30)
        bridge.stop()  # the durable subscription keeps what is published meanwhile
        publish(20, 20)
        bridge.start()
        second = drain(broker, dst, expect=5, total=30)
    finally:
        bridge.stop()
    wanted = [str(i) for i in range(40) if i % 4 == 0]
    assert sorted((m.text for m in first + second), key=int) == wanted
    with naming.lookup("ConnectionFactory", amq).create_connection() as jc:  # tidy up
        jc.client_id = parse_bridge_config(xml, "x").links[0].source.clientid
        jc.create_session().unsubscribe("bridge-eu")


UPPER = """import javax.jms.*;
import java.util.Properties;
public class UpperTransformer {
    public Message transform(Message m, boolean readOnly, String charset, String source,
                             String target, Properties props) throws JMSException {
        if (!(m instanceof TextMessage)) return m;
        String text = ((TextMessage) m).getText();
        m.clearBody();
        ((TextMessage) m).setText(text.toUpperCase() + props.getProperty("suffix"));
        return m;
    }
}
"""


def test_a_java_transformer_on_a_link(activemq, broker, tmp_path):
    if shutil.which("javac") is None:
        pytest.skip("javac is not installed (Debian package default-jdk-headless)")
    (tmp_path / "UpperTransformer.java").write_text(UPPER)
    subprocess.run(
        ["javac", "-cp", JMS_API_JAR, "-d", str(tmp_path), str(tmp_path / "UpperTransformer.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    from bridgemgr.providers import java

    java.configure([str(tmp_path), JMS_API_JAR])
    src, dst = unique("lower"), unique("upper")
    amq = activemq.jndi()
    link = (
        '<link name="shout" transacted="false">'
        '<source connection-factory-ref="amq" destination-ref="src"/>'
        '<target connection-factory-ref="host" destination-ref="dst" message-transformer-class='
        '"bridgemgr.providers.java.classes.UpperTransformer"><property name="suffix" value="!"/>'
        "</target></link>"
    )
    dests = f'<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>'
    bridge = start_bridge(broker, bridge_xml("b4", link, cf_xml("amq", amq), dests))
    try:
        with naming.lookup("ConnectionFactory", amq).create_connection() as jc:
            producer = jc.create_session().create_producer(Queue(src))
            for word in ("alpha", "beta", "gamma"):
                producer.send(TextMessage(word))
        got = drain(broker, dst, expect=3, total=30)
    finally:
        bridge.stop()
    assert sorted(m.text for m in got) == ["ALPHA!", "BETA!", "GAMMA!"]


def test_activemq_stopped_for_10_seconds_under_traffic(broker, tmp_path):
    """embedded -> ActiveMQ while messages keep coming; ActiveMQ goes down for 10 s and comes
    back: the link reconnects and every message arrives (at-least-once: a duplicate at most
    for what was in flight when it went down)."""
    from servers import missing_package

    if missing_package("activemq"):
        pytest.skip(missing_package("activemq"))
    amq_server = ActiveMQ(tmp_path / "activemq", name="outage").start()
    src, dst, n = unique("steady"), unique("far"), 600
    amq = amq_server.jndi()
    link = (
        '<link name="steady" transacted="false">'
        '<source connection-factory-ref="host" destination-ref="src"/>'
        '<target connection-factory-ref="amq" destination-ref="dst"/></link>'
    )
    dests = f'<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>'
    bridge = start_bridge(broker, bridge_xml("b5", link, cf_xml("amq", amq, attrs='connect-attempts="-1"'), dests))
    runner = bridge.links[0]
    produced = threading.Event()

    def produce() -> None:  # ~25 s of steady traffic
        conn = EmbeddedConnectionFactory(broker).create_connection()
        producer = conn.create_session().create_producer(Queue(src))
        for i in range(n):
            producer.send(TextMessage(str(i)))
            time.sleep(0.04)
        conn.close()
        produced.set()

    threading.Thread(target=produce, daemon=True).start()
    try:
        wait_until(lambda: runner.counters.transferred >= 100, 60, "traffic before the outage")
        amq_server.stop()
        down_at = runner.counters.transferred
        time.sleep(10)
        assert runner.counters.transferred <= down_at + 1  # nothing moved while it was down
        amq_server.start()
        assert produced.wait(60)
        got = take(naming.lookup("ConnectionFactory", amq), Queue(dst), n, total=90)
        assert runner.state is State.STARTED and runner.counters.reconnects >= 1
    finally:
        bridge.stop()
        amq_server.stop()
    counts = Counter(m.text for m in got)
    lost = sorted(set(map(str, range(n))) - set(counts), key=int)
    assert not lost, f"lost {len(lost)}: {lost[:20]}"
    assert sum(c - 1 for c in counts.values()) <= 2, counts.most_common(3)
    assert drain(broker, src) == []


def test_activemq_stopped_under_idle_links_shows_and_they_reconnect_every_interval(activemq, broker, caplog):
    """The session's ActiveMQ stopped under two idle links, one to it and one from it, and
    started again: both are STARTING with current_error naming the factory, the broker and
    the cause (before: STARTED with no error, the dead target connection kept); the
    attempts are connect-attempt-interval (1 s) apart; one line each says it reconnected;
    then messages move both ways."""
    caplog.set_level(logging.INFO)
    out_src, out_dst, in_src, in_dst = unique("out.src"), unique("out.dst"), unique("in.src"), unique("in.dst")
    amq = activemq.jndi()
    links = (
        '<link name="out" transacted="false"><source connection-factory-ref="host" destination-ref="out-src"/>'
        '<target connection-factory-ref="amq" destination-ref="out-dst"/></link>'
        '<link name="in" transacted="false"><source connection-factory-ref="amq" destination-ref="in-src"/>'
        '<target connection-factory-ref="host" destination-ref="in-dst"/></link>'
    )
    dests = "".join(
        f'<destination ref-name="{ref}" name="{name}"/>'
        for ref, name in (("out-src", out_src), ("out-dst", out_dst), ("in-src", in_src), ("in-dst", in_dst))
    )
    bridge = start_bridge(broker, bridge_xml("b6", links, cf_xml("amq", amq, attrs='connect-attempts="-1"'), dests))
    out, inbound = bridge.links
    try:
        activemq.stop()
        for link in (out, inbound):
            wait_until(lambda link=link: "cannot connect" in (link.counters.current_error or ""), 30, link.name)
            assert link.state is State.STARTING
            error = link.counters.current_error
            assert f"connection-factory amq to {activemq.url}" in error and "Connection refused" in error, error

        def attempts(link: str) -> list[float]:
            return [
                r.created
                for r in caplog.records
                if r.threadName == f"link b6/{link}" and "with connection-factory amq failed" in r.getMessage()
            ]

        for name in ("out", "in"):
            seen = wait_for(lambda name=name: len(got := attempts(name)) >= 4 and got, 20, f"4 attempts of {name}")
            assert 2.4 <= seen[3] - seen[0] <= 4.5, seen  # three 1 s intervals
    finally:
        activemq.start()
    try:
        for link in (out, inbound):
            assert link.lifecycle.wait_for({State.STARTED}, 60) is State.STARTED
            assert link.counters.current_error is None
        lines = [r.getMessage() for r in caplog.records if "reconnected after" in r.getMessage()]
        assert sorted(line.split()[1] for line in lines) == ["in", "out"], lines
        send(broker, out_src, [TextMessage("there")])
        factory = naming.lookup("ConnectionFactory", amq)
        assert [m.text for m in take(factory, Queue(out_dst), 1)] == ["there"]
        with factory.create_connection() as jc:
            jc.create_session().create_producer(Queue(in_src)).send(TextMessage("back"))
        assert [m.text for m in drain(broker, in_dst, expect=1, total=30)] == ["back"]
    finally:
        bridge.stop()
