"""A provider goes away under traffic and comes back: the link reconnects within the
connection factory's connect-attempts and resumes; every message arrives, duplicates
only for what was in flight at each outage (at-least-once)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import IllegalStateException, JMSException
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.providers.embedded import EmbeddedConnectionFactory, open_broker
from jmsbridge_support import FAST, bridge_xml, link_xml, wait_until

pytestmark = pytest.mark.timeout(90)
N = 1500
OUTAGES = 3


class Provider:
    """The broker of one directory that can be taken down and brought back."""

    def __init__(self, path) -> None:
        self.path = path
        self.down = False
        self.broker = open_broker(path)

    def __call__(self):
        if self.down:
            raise IllegalStateException("the provider is down")
        return open_broker(self.path)

    def stop(self) -> None:
        self.down = True
        self.broker.close()

    def restart(self) -> None:
        self.broker = open_broker(self.path)
        self.down = False


class Allowance:
    """How many messages the producer may have sent so far: the test hands out traffic
    phase by phase, so every outage happens with messages still flowing however fast the
    producer and the link are."""

    def __init__(self) -> None:
        self.limit = 0
        self.cond = threading.Condition()

    def allow(self, limit: int) -> None:
        with self.cond:
            self.limit = max(self.limit, limit)
            self.cond.notify_all()

    def wait_for(self, i: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: i < self.limit)


def produce(factory: EmbeddedConnectionFactory, done: threading.Event, sent: list[int], allowance: Allowance) -> None:
    """Send 0..N-1 to src, reconnecting (and resending the failed one) across outages."""
    i, producer, conn = 0, None, None
    while i < N:
        allowance.wait_for(i)
        try:
            if producer is None:
                conn = factory.create_connection()
                producer = conn.create_session().create_producer(Queue("src"))
            m = TextMessage(str(i))
            producer.send(m)
            sent.append(i)
            i += 1
            if i % 50 == 0:
                time.sleep(0.01)  # spread the traffic over the outages
        except JMSException:
            producer = None
            time.sleep(0.02)
    if conn is not None:
        conn.close()
    done.set()


@pytest.mark.slow
def test_provider_restarts_under_traffic(tmp_path):
    provider = Provider(tmp_path / "store")
    factory = EmbeddedConnectionFactory(provider)
    xml = bridge_xml(
        link_xml(),
        cfs='<connection-factory ref-name="host" connect-attempts="-1" connect-attempt-interval-in-seconds="1"/>',
    )
    bridge = JMSBridge(parse_bridge_config(xml), host_factory=lambda env: factory, tuning=FAST)
    bridge.start()
    link = bridge.links[0]
    done, sent, allowance = threading.Event(), [], Allowance()
    producer = threading.Thread(target=produce, args=(factory, done, sent, allowance), daemon=True)
    producer.start()
    try:
        for phase in range(1, OUTAGES + 1):
            allowance.allow(phase * N // (OUTAGES + 1))
            moved = link.counters.transferred
            wait_until(
                lambda moved=moved: (
                    link.state is State.STARTED  # connected again
                    and link.counters.transferred >= moved + N // (OUTAGES + 2)
                ),
                30,
                "traffic before the outage",
            )
            provider.stop()
            time.sleep(0.3)
            provider.restart()
        allowance.allow(N)
        assert done.wait(60)
        wait_until(
            lambda: provider.broker.queue_depth("dst") >= N and provider.broker.queue_depth("src") == 0,
            30,
            "the link to catch up",
        )
        time.sleep(0.2)
        assert link.state is State.STARTED and link.counters.reconnects >= OUTAGES
    finally:
        bridge.stop()
    conn = EmbeddedConnectionFactory(provider.broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue("dst"))
    got = Counter()
    while (m := consumer.receive(0.2)) is not None:
        got[int(m.text)] += 1
    conn.close()
    provider.broker.close()
    assert sorted(sent) == list(range(N))
    assert set(got) == set(range(N)), f"lost: {sorted(set(range(N)) - set(got))[:20]}"
    # only what was in flight at each outage comes twice: the unit sent but not yet
    # acknowledged when the provider stopped (a stored send is confirmed by its store
    # write, so a unit holds a few sends: seen 4), one run of consecutive messages each
    twice = sorted(k for k, n in got.items() if n > 1)
    runs = sum(1 for i, k in enumerate(twice) if i == 0 or twice[i - 1] != k - 1)
    assert runs <= OUTAGES and all(got[k] == 2 for k in twice), sorted(got.items())[:20]


def test_link_stops_when_the_connect_attempts_run_out(tmp_path):
    provider = Provider(tmp_path / "store")
    factory = EmbeddedConnectionFactory(provider)
    xml = bridge_xml(
        link_xml(),
        cfs='<connection-factory ref-name="host" connect-attempts="3" connect-attempt-interval-in-seconds="0"/>',
    )
    bridge = JMSBridge(parse_bridge_config(xml), host_factory=lambda env: factory, tuning=FAST)
    bridge.start()
    link = bridge.links[0]
    try:
        provider.stop()  # and it stays down
        assert link.lifecycle.wait_for({State.STOPPED}, 10) is State.STOPPED
        assert "after 3 attempt(s)" in link.counters.last_error
        assert link.counters.reconnects >= 1
    finally:
        bridge.stop()
        provider.restart()
        provider.broker.close()
