"""A link whose target goes away while it is idle: it shows STARTING with a current error
naming the connection factory, its broker and the cause, tries to connect again every
connect-attempt-interval, and says once when it reconnected and after how long. The
target is another embedded broker's jms service over mq://, stopped and started again on
the same ports; a target that takes connections but refuses their sessions is tried
again every connect-attempt-interval too; a link stopped by its connect-attempts and
started again drops that error; a bridge that starts with a link given up says so."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest

from bridgemgr.admin.portmapper import PortMapper
from bridgemgr.jms import TextMessage
from bridgemgr.jms.errors import TransportException
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.netloop import NetLoop
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.client import EmbeddedConnection
from bridgemgr.providers.embedded.jmsservice import JmsService
from jmsbridge_support import FAST, bridge_xml, drain, host, link_xml, send
from ports import free_port
from test_jmsbridge_reconnect import Provider
from waiting import wait_for

pytestmark = pytest.mark.timeout(60)
ATTEMPT = re.compile(r"connect attempt (\d+) \(of unlimited\) with connection-factory far failed")


class Far:
    """A broker's jms service and port mapper on 127.0.0.1, to be stopped and started
    again on the same ports (the link's provider URL names the port mapper's)."""

    def __init__(self, broker: Broker, service_port: int = 0, portmapper_port: int = 0) -> None:
        self.broker = broker
        self.netloop = NetLoop().start()
        self.service = JmsService(broker, self.netloop, "127.0.0.1", service_port).start()
        self.portmapper = PortMapper(self.netloop, "127.0.0.1", portmapper_port, broker.instance_name).start()
        self.portmapper.register(self.service.service_entry())

    @property
    def url(self) -> str:
        return f"mq://127.0.0.1:{self.portmapper.port}"

    def stop(self) -> None:
        self.service.stop()
        self.portmapper.stop()
        self.netloop.stop()

    def again(self) -> Far:
        return Far(self.broker, self.service.port, self.portmapper.port)


def far_factory(url: str, attempts: int = -1) -> str:
    return (
        f'<connection-factory ref-name="far" lookup-name="ConnectionFactory" connect-attempts="{attempts}" '
        'connect-attempt-interval-in-seconds="1">'
        '<property name="java.naming.factory.initial" value="imq.embedded"/>'
        f'<property name="java.naming.provider.url" value="{url}"/></connection-factory>'
    )


def to_far(name: str = "l") -> str:
    return link_xml(name).replace('<target connection-factory-ref="host"', '<target connection-factory-ref="far"')


@pytest.fixture
def brokers(tmp_path: Path):
    near, far = Broker(tmp_path / "near"), Broker(tmp_path / "far")
    yield near, far
    near.close()
    far.close()


@pytest.mark.slow
def test_an_idle_link_whose_target_goes_down_shows_it_and_reconnects_every_interval(brokers, caplog):
    near, far_broker = brokers
    caplog.set_level(logging.INFO)
    far = Far(far_broker)
    bridge = JMSBridge(
        parse_bridge_config(bridge_xml(to_far(), cfs=far_factory(far.url))), host_factory=host(near), tuning=FAST
    )
    try:
        assert bridge.start() is State.STARTED
        link = bridge.links[0]
        far.stop()
        # Before: nothing noticed the target's loss while no message came (STARTED, no error).
        assert link.lifecycle.wait_for({State.STARTING}, 10) is State.STARTING
        error = wait_for(
            lambda: link.counters.current_error if "cannot connect" in (link.counters.current_error or "") else None, 10
        )
        assert f"connection-factory far to {far.url}" in error and "Connection refused" in error, error

        def attempts() -> list[tuple[int, float]]:
            return [(int(m.group(1)), r.created) for r in caplog.records if (m := ATTEMPT.search(r.getMessage()))]

        seen = wait_for(lambda: len(got := attempts()) >= 4 and got, 15, "four failed connect attempts")
        (first, began), (fourth, ended) = seen[0], seen[3]
        assert (first, fourth) == (1, 4)
        # connect-attempt-interval-in-seconds="1": three intervals between them
        assert 2.4 <= ended - began <= 4.5, seen
        assert link.state is State.STARTING and link.info()["counters"]["current_error"] == link.counters.current_error

        far = far.again()
        assert link.lifecycle.wait_for({State.STARTED}, 10) is State.STARTED
        assert link.counters.current_error is None
        back = [r.getMessage() for r in caplog.records if "reconnected after" in r.getMessage()]
        assert len(back) == 1 and re.match(r"link l reconnected after \d+\.\d s \(disconnected since ", back[0]), back
        send(near, "src", [TextMessage("after")])
        assert [m.text for m in drain(far_broker, "dst", expect=1)] == ["after"]
    finally:
        bridge.stop()
        far.stop()


class _RefusingConnection(EmbeddedConnection):
    refuse: threading.Event

    def create_session(self, *args, **kwargs):
        if self.refuse.is_set():
            raise TransportException("the broker refused the session")
        return super().create_session(*args, **kwargs)


class Refusing(EmbeddedConnectionFactory):
    """The embedded broker, taking connections (each noted with its time) and, while
    ``refuse`` is set, refusing their sessions: a provider that fails after it connected."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.refuse = threading.Event()
        self.connected: list[float] = []

    def create_connection(self, username=None, password=None):
        conn = super().create_connection(username, password)
        self.connected.append(time.monotonic())
        conn.__class__ = _RefusingConnection
        conn.refuse = self.refuse
        return conn


@pytest.mark.slow
def test_a_target_refusing_sessions_is_tried_again_every_interval(brokers):
    """Before: every refused setup backed off by the link's tuning (here 10 ms to 50 ms,
    by default up to 10 s), not connect-attempt-interval-in-seconds."""
    near, far_broker = brokers
    xml = bridge_xml(
        to_far(),
        cfs='<connection-factory ref-name="far" lookup-name="ConnectionFactory" '
        'connect-attempt-interval-in-seconds="1"><property name="java.naming.factory.initial" value="x"/>'
        "</connection-factory>",
    )
    refusing = Refusing(far_broker)
    refusing.refuse.set()
    bridge = JMSBridge(
        parse_bridge_config(xml), host_factory=host(near), lookup=lambda name, env: refusing, tuning=FAST
    )
    try:
        assert bridge.start(timeout=0) is State.STARTING
        link = bridge.links[0]
        seen = wait_for(lambda: len(refusing.connected) >= 3 and list(refusing.connected), 10, "three connects")
        assert 1.6 <= seen[2] - seen[0] <= 3.5, seen  # two intervals of 1 s
        assert link.state is State.STARTING and "the broker refused the session" in link.counters.current_error
        refusing.refuse.clear()
        assert link.lifecycle.wait_for({State.STARTED}, 10) is State.STARTED
        assert link.counters.current_error is None
    finally:
        refusing.refuse.clear()
        bridge.stop()


def test_a_link_started_again_after_its_connect_attempts_ran_out_drops_that_error(tmp_path):
    provider = Provider(tmp_path / "store")
    xml = bridge_xml(
        link_xml(),
        cfs='<connection-factory ref-name="host" connect-attempts="2" connect-attempt-interval-in-seconds="0"/>',
    )
    bridge = JMSBridge(
        parse_bridge_config(xml), host_factory=lambda env: EmbeddedConnectionFactory(provider), tuning=FAST
    )
    bridge.start()
    link = bridge.links[0]
    try:
        provider.stop()
        assert link.lifecycle.wait_for({State.STOPPED}, 10) is State.STOPPED
        assert "after 2 attempt(s)" in link.counters.last_error
        assert link.counters.current_error == link.counters.last_error
        provider.restart()
        assert bridge.start_link("l") is State.STARTED
        # Before: Last Error still said it could not connect, though it just had.
        assert (link.counters.current_error, link.counters.last_error) == (None, None)
        assert link.counters.reconnects >= 1
    finally:
        bridge.stop()
        provider.broker.close()


def test_a_bridge_that_starts_with_a_link_given_up_says_which(brokers, caplog):
    near, _ = brokers
    caplog.set_level(logging.INFO)
    xml = bridge_xml(link_xml("l1") + to_far("l2"), cfs=far_factory(f"mq://127.0.0.1:{free_port()}", attempts=1))
    bridge = JMSBridge(parse_bridge_config(xml), host_factory=host(near), tuning=FAST)
    try:
        assert bridge.start() is State.STARTED
        assert [link.state for link in bridge.links] == [State.STARTED, State.STOPPED]
        started = [r for r in caplog.records if "bridge b started" in r.getMessage()]
        # Before: "bridge b started with 2 link(s)" with l2 STOPPED.
        assert len(started) == 1 and started[0].levelno == logging.WARNING
        text = started[0].getMessage()
        assert text.startswith("bridge b started with 1 of 2 link(s) running; link l2 is STOPPED: cannot connect")
    finally:
        bridge.stop()
