"""Connections of a bridge: the chapter's dedicated/pooled/shared rules, connect attempts,
pools with idle timeouts, shared reference counts, and stop waiting for every lease;
then the same rules seen from a running bridge."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from bridgemgr.jms.errors import JMSException
from bridgemgr.jmsbridge.config import ConnectionFactoryConfig, Property
from bridgemgr.jmsbridge.connections import (
    BridgeConnections,
    ConnectError,
    ConnectionKind,
    Connector,
    connection_kind,
)
from bridgemgr.jmsbridge.pipeline import Interrupted
from bridgemgr.jmsbridge.states import State
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from jmsbridge_support import bridge_xml, drain, link_xml, make_bridge, send, wait_until

pytestmark = pytest.mark.timeout(60)
log = logging.getLogger("test")
D, P, S = ConnectionKind.DEDICATED, ConnectionKind.POOLED, ConnectionKind.SHARED


@pytest.mark.parametrize(
    "role, stay, clientid, factory_id, kind",
    [
        ("source", False, None, None, D),  # sources: always dedicated
        ("source", True, "c", "f", D),
        ("target", True, None, None, D),  # stay-connected
        ("target", False, "c", None, D),  # a clientid of its own
        ("target", False, None, None, P),  # neither, and the factory has no client id
        ("target", False, None, "f", S),  # the factory configures a client id
        ("dmq", False, None, None, P),
        ("dmq", False, None, "f", S),
        ("dmq", True, None, "f", D),
    ],
)
def test_the_chapters_rules(role, stay, clientid, factory_id, kind):
    assert connection_kind(role, stay, clientid, factory_id) is kind


class Flaky(EmbeddedConnectionFactory):
    """Fails the first ``fail`` connects; records the credentials it was given."""

    def __init__(self, broker, fail: int) -> None:
        super().__init__(broker)
        self.fail = fail
        self.calls: list[tuple[str | None, str | None]] = []

    def create_connection(self, username=None, password=None):
        self.calls.append((username, password))
        if len(self.calls) <= self.fail:
            raise JMSException("not yet")
        return super().create_connection(username, password)


def cf(**kw) -> ConnectionFactoryConfig:
    return ConnectionFactoryConfig("f", **{"connect_attempt_interval_in_seconds": 0, **kw})


def test_connect_attempts_and_credentials(broker):
    factory = Flaky(broker, fail=2)
    handle = Connector(cf(connect_attempts=3, username="u", password="p"), factory, log).connect()
    assert factory.calls == [("u", "p")] * 3
    handle.close()
    with pytest.raises(ConnectError, match=r"after 2 attempt\(s\).*not yet"):
        Connector(cf(connect_attempts=2), Flaky(broker, fail=5), log).connect()


def test_forever_until_stopped(broker):
    stop = threading.Event()
    factory = Flaky(broker, fail=10**9)
    connector = Connector(cf(connect_attempts=-1), factory, log)
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Interrupted):
        connector.connect(stop=stop)
    assert len(factory.calls) > 3


@pytest.mark.slow
def test_interval_between_attempts(broker):
    start = time.monotonic()
    with pytest.raises(ConnectError):
        Connector(cf(connect_attempts=3, connect_attempt_interval_in_seconds=1), Flaky(broker, fail=9), log).connect(
            stop=threading.Event()
        )
    assert 1.9 < time.monotonic() - start < 4


def test_client_id_from_the_host_factory_properties(broker):
    config = cf(properties=(Property("imqConfiguredClientID", "cid-1"),))
    connector = Connector(config, EmbeddedConnectionFactory(broker), log)
    assert connector.configured_client_id == "cid-1"
    handle = connector.connect()
    assert handle.connection.client_id == "cid-1"
    handle.close()


def test_pool_reuses_and_reaps_idle_connections(broker):
    conns = BridgeConnections({"f": Connector(cf(idle_timeout_in_seconds=60), EmbeddedConnectionFactory(broker), log)})
    first = conns.lease("f", P)
    first_conn = first.connection
    first.release()
    again = conns.lease("f", P)
    assert again.connection is first_conn  # taken from the pool
    other = conns.lease("f", P)
    assert other.connection is not first_conn  # the pool was empty
    other.release(broken=True)  # a broken one is closed, not pooled
    again.release()
    assert conns.pooled_idle("f") == 1
    assert conns.reap(time.monotonic() + 30) == 0
    assert conns.reap(time.monotonic() + 61) == 1
    assert conns.pooled_idle("f") == 0 and len(broker.connections) == 0


def test_shared_connection_is_reference_counted(broker):
    config = cf(properties=(Property("imqConfiguredClientID", "shared"),))
    conns = BridgeConnections({"f": Connector(config, EmbeddedConnectionFactory(broker), log)})
    a, b = conns.lease("f", S), conns.lease("f", S)
    assert a.connection is b.connection and len(broker.connections) == 1
    a.release()
    b.release()
    assert len(broker.connections) == 1  # kept until the bridge stops
    broken = conns.lease("f", S)
    broken.release(broken=True)  # replaced next time
    assert len(broker.connections) == 0
    c = conns.lease("f", S)
    c.release()
    conns.close()
    assert len(broker.connections) == 0


def test_close_waits_for_every_lease(broker):
    conns = BridgeConnections({"f": Connector(cf(), EmbeddedConnectionFactory(broker), log)})
    lease = conns.lease("f", D)
    threading.Timer(0.2, lease.release).start()
    start = time.monotonic()
    assert conns.close(timeout=5) is True
    assert time.monotonic() - start >= 0.15 and conns.outstanding == 0
    held = conns.lease("f", D)
    assert conns.close(timeout=0.05) is False
    held.release()


def test_broken_handle_is_flagged_by_the_exception_listener(tmp_path):
    from bridgemgr.providers.embedded import Broker

    broker = Broker(tmp_path / "s")
    handle = Connector(cf(), EmbeddedConnectionFactory(broker), log).connect()
    broker.close()
    assert handle.broken.is_set()


# --- on a running bridge ------------------------------------------------------------------------


@pytest.mark.slow
def test_pooled_target_connection_goes_back_and_times_out(broker):
    xml = bridge_xml(
        link_xml(target_attrs='stay-connected="false"'),
        cfs='<connection-factory ref-name="host" idle-timeout-in-seconds="1"/>',
    )
    b = make_bridge(broker, xml, reap_interval=0.1)
    b.start()
    try:
        assert b.info()["links"][0]["target"] == "host:P:queue:dst"
        send(broker, "src", ["a"])
        assert [m.text for m in drain(broker, "dst", expect=1)] == ["a"]
        # source + built-in DMQ stay; the pooled target goes back when idle, then times out
        wait_until(lambda: len(broker.connections) == 2, 5, "the idle pooled connection closed")
        send(broker, "src", ["b"])
        assert [m.text for m in drain(broker, "dst", expect=1)] == ["b"]
    finally:
        b.stop()
    assert not broker.connections


def test_targets_share_a_factory_connection_with_a_client_id(broker):
    links = link_xml("l1", src="src", dst="dst", target_attrs='stay-connected="false"') + link_xml(
        "l2", src="other", dst="dst", target_attrs='stay-connected="false"'
    )
    xml = bridge_xml(
        links,
        cfs='<connection-factory ref-name="host"/>'
        '<connection-factory ref-name="shared">'
        '<property name="imqConfiguredClientID" value="bridge-shared"/>'
        "</connection-factory>",
    )
    xml = xml.replace(b'<target connection-factory-ref="host"', b'<target connection-factory-ref="shared"')
    b = make_bridge(broker, xml)
    b.start()
    try:
        assert {x["target"] for x in b.info()["links"]} == {"shared:S:queue:dst"}
        send(broker, "src", ["1"])
        send(broker, "other", ["2"])
        assert sorted(m.text for m in drain(broker, "dst", expect=2)) == ["1", "2"]
        assert sum(1 for c in broker.connections if c.client_id == "bridge-shared") == 1
    finally:
        b.stop()
    assert not broker.connections
    assert b.state is State.STOPPED
