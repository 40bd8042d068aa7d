"""A JMS bridge's lifecycle and commands, start failures, its own log file (rotation,
levels from a logging configuration file, no passwords), and loading from properties."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from bridgemgr.jms.errors import JMSException, TransportException
from bridgemgr.jms.spi import ConnectionFactory
from bridgemgr.jmsbridge.bridge import BridgeStartError, JMSBridge, NoSuchLink
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.logs import read_levels
from bridgemgr.jmsbridge.states import IllegalTransition, State
from bridgemgr.props import ConfigError, load_properties
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from jmsbridge_support import FAST, bridge_xml, drain, host, link_xml, make_bridge, send, wait_until

pytestmark = pytest.mark.timeout(60)

TWO_LINKS = (
    link_xml("l1", src="src", dst="dst")
    + link_xml("l2", src="other", dst="dst")
    + link_xml("off", src="src", dst="other", link_attrs='enabled="false"')
)


@pytest.fixture
def bridge(broker):
    b = make_bridge(broker, bridge_xml(TWO_LINKS))
    yield b
    b.stop()


def states(b: JMSBridge) -> dict[str, str]:
    return {x["name"]: x["state"] for x in b.info()["links"]}


def test_start_stop_and_what_info_shows(bridge, broker):
    assert bridge.state is State.UNINITIALIZED
    assert states(bridge) == {"l1": "UNINITIALIZED", "l2": "UNINITIALIZED", "off": "UNINITIALIZED"}
    assert bridge.start() is State.STARTED
    assert states(bridge) == {"l1": "STARTED", "l2": "STARTED", "off": "UNINITIALIZED"}
    info = bridge.info()
    assert info["type"] == "JMS" and info["state"] == "STARTED"
    row = info["links"][0]
    assert (row["source"], row["target"], row["transacted"]) == ("host:D:queue:src", "host:D:queue:dst", False)
    assert bridge.start() is State.STARTED  # already started: nothing happens
    assert bridge.stop() is State.STOPPED
    assert states(bridge)["l1"] == "STOPPED"
    assert not broker.connections  # every connection returned and closed
    assert bridge.start() is State.STARTED  # and again


@pytest.mark.slow
def test_pause_and_resume_the_bridge(bridge, broker):
    bridge.start()
    assert bridge.pause() is State.PAUSED
    assert states(bridge) == {"l1": "PAUSED", "l2": "PAUSED", "off": "UNINITIALIZED"}
    send(broker, "src", ["while paused"])
    assert drain(broker, "dst", timeout=0.3) == []
    assert bridge.resume() is State.STARTED
    assert [m.text for m in drain(broker, "dst", expect=1)] == ["while paused"]
    with pytest.raises(IllegalTransition, match="cannot pause bridge b: it is STOPPED"):
        bridge.stop() and bridge.pause()


@pytest.mark.slow
def test_link_commands(bridge, broker):
    with pytest.raises(IllegalTransition, match="the bridge is UNINITIALIZED"):
        bridge.stop_link("l1")
    bridge.start()
    assert bridge.pause_link("l1") is State.PAUSED
    send(broker, "src", ["a"])
    send(broker, "other", ["b"])
    assert [m.text for m in drain(broker, "dst", expect=1)] == ["b"]  # only l2 moves
    assert bridge.resume_link("l1") is State.STARTED
    assert [m.text for m in drain(broker, "dst", expect=1)] == ["a"]
    assert bridge.stop_link("l1") is State.STOPPED
    with pytest.raises(IllegalTransition, match="cannot pause link l1 of bridge b: it is STOPPED"):
        bridge.pause_link("l1")
    with pytest.raises(IllegalTransition, match="resume"):
        bridge.resume_link("l1")
    assert bridge.start_link("l1") is State.STARTED
    with pytest.raises(NoSuchLink, match="no link 'nope'"):
        bridge.start_link("nope")
    with pytest.raises(IllegalTransition, match="not enabled"):
        bridge.start_link("off")
    bridge.pause()
    with pytest.raises(IllegalTransition, match="the bridge is PAUSED"):
        bridge.start_link("l1")


class Gate(ConnectionFactory):
    """The broker's factory behind a gate: every connect fails until the gate opens."""

    def __init__(self, broker) -> None:
        self.inner = EmbeddedConnectionFactory(broker)
        self.open = threading.Event()

    def create_connection(self, username=None, password=None):
        if not self.open.is_set():
            raise TransportException("the gate is closed")
        return self.inner.create_connection(username, password)


def gated_bridge(broker):
    """Bridge b: link l reads src through the gate (connect-attempts -1, 1 s apart)."""
    gate = Gate(broker)
    xml = bridge_xml(
        link_xml("l").replace('<source connection-factory-ref="host"', '<source connection-factory-ref="gated"'),
        cfs='<connection-factory ref-name="gated" connect-attempts="-1" '
        'connect-attempt-interval-in-seconds="1">'
        '<property name="imqConfiguredClientID" value="gated"/>'
        "</connection-factory>",
    )
    bridge = JMSBridge(
        parse_bridge_config(xml, "test.xml"),
        tuning=FAST,
        reap_interval=0.05,
        host_factory=lambda env: gate if env.get("imqConfiguredClientID") else host(broker)(env),
    )
    return bridge, gate


@pytest.mark.slow
def test_a_bridge_is_starting_until_its_links_connect(broker):
    bridge, gate = gated_bridge(broker)
    try:
        assert bridge.start(timeout=0.3) is State.STARTING
        assert states(bridge) == {"l": "STARTING"} and bridge.info()["state"] == "STARTING"
        for command in (bridge.start, bridge.pause, bridge.resume):
            with pytest.raises(IllegalTransition, match="it is STARTING"):
                command()
        with pytest.raises(IllegalTransition, match="the bridge is STARTING"):
            bridge.stop_link("l")
        gate.open.set()  # the provider comes up: the housekeeping thread finishes the start
        wait_until(lambda: bridge.state is State.STARTED, 5)
        send(broker, "src", ["late"])
        assert [m.text for m in drain(broker, "dst", expect=1)] == ["late"]
    finally:
        bridge.stop()


def test_stop_cancels_a_start_under_way(broker):
    bridge, gate = gated_bridge(broker)
    returned: list[State] = []
    starter = threading.Thread(target=lambda: returned.append(bridge.start(timeout=None)))
    starter.start()
    wait_until(lambda: states(bridge) == {"l": "STARTING"}, 5)
    assert bridge.stop() is State.STOPPED  # at once, not after the provider
    starter.join(5)
    assert not starter.is_alive() and returned[0] in (State.STOPPING, State.STOPPED)
    assert bridge.state is State.STOPPED and not broker.connections
    gate.open.set()
    assert bridge.start() is State.STARTED  # a new start after a cancelled one
    bridge.stop()


@pytest.mark.slow
def test_missing_transformer_class_fails_the_start_clearly(broker):
    xml = bridge_xml(link_xml(target_attrs='message-transformer-class="nowhere.Missing"'))
    b = make_bridge(broker, xml)
    with pytest.raises(BridgeStartError) as err:
        b.start()
    text = str(err.value)
    assert "test.xml:1: link l" in text and "nowhere.Missing" in text and "No module" in text
    assert b.state is State.STOPPED and not broker.connections


def test_a_transformer_from_a_configured_folder(broker, tmp_path):
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "shout_tx.py").write_text(
        "from bridgemgr.transform import MessageTransformer\n"
        "class Shout(MessageTransformer):\n"
        "    def transform(self, m, ro, cs, s, t, p):\n"
        "        m = m.copy(); m.text = m.text + '!'; return m\n"
    )
    xml = bridge_xml(link_xml(target_attrs='message-transformer-class="shout_tx.Shout"'))
    b = make_bridge(broker, xml, transformer_path=[ext])
    b.start()
    try:
        send(broker, "src", ["hi"])
        assert [m.text for m in drain(broker, "dst", expect=1)] == ["hi!"]
    finally:
        b.stop()


@pytest.mark.slow
def test_unresolvable_destination_fails_the_start(broker):
    xml = bridge_xml(
        link_xml(dst="ghost"),
        dests='<destination ref-name="ghost" lookup-name="q">'
        '<property name="java.naming.factory.initial" value="no.such.Factory"/>'
        "</destination>",
    )
    with pytest.raises(BridgeStartError, match="destination 'ghost' cannot be resolved"):
        make_bridge(broker, xml).start()


# --- logs -----------------------------------------------------------------------------------------


def props_for(tmp_path, *extra: str):
    return load_properties([], [f"imq.varhome={tmp_path / 'var'}", "imq.instancename=inst", *extra])


def bridge_log_dir(tmp_path):
    return tmp_path / "var" / "instances" / "inst" / "bridges" / "b"


def test_the_bridge_has_its_own_rotating_log(broker, tmp_path):
    props = props_for(tmp_path, "imq.bridge.b.logfile.limit=2000", "imq.bridge.b.logfile.count=3")
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    send(broker, "src", [f"m{i}" for i in range(100)])
    drain(broker, "dst", expect=100)
    wait_until(lambda: b.links[0].counters.transferred == 100)
    b.stop()
    files = sorted(p.name for p in bridge_log_dir(tmp_path).glob("log.txt*"))
    assert files == ["log.txt", "log.txt.1", "log.txt.2"]  # (the folder holds largest.l too)
    for name in files:
        assert (bridge_log_dir(tmp_path) / name).stat().st_size <= 2000
    text = (bridge_log_dir(tmp_path) / "log.txt").read_text()
    assert "INFO link l: transferred message" in text and "bridge b stopped" in text


def test_log_lines_reach_the_file_while_running(broker, tmp_path):
    b = make_bridge(broker, bridge_xml(link_xml()), props=props_for(tmp_path), reap_interval=0.1)
    b.start()
    try:
        log = bridge_log_dir(tmp_path) / "log.txt"
        send(broker, "src", ["m"])
        wait_until(lambda: "transferred message" in log.read_text(), 5, "the buffered INFO line")
        b.links[0].log.warning("link l: something odd")
        assert "WARNING link l: something odd" in log.read_text()  # at once
    finally:
        b.stop()


def test_one_log_file_starts_over_at_the_limit(broker, tmp_path):
    props = props_for(tmp_path, "imq.bridge.b.logfile.limit=1500")
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    send(broker, "src", [f"m{i}" for i in range(60)])
    drain(broker, "dst", expect=60)
    b.stop()
    files = list(bridge_log_dir(tmp_path).glob("log.txt*"))
    assert [f.name for f in files] == ["log.txt"] and files[0].stat().st_size <= 1500


def test_levels_from_a_logging_configuration_file(broker, tmp_path):
    config = tmp_path / "logging.properties"
    config.write_text("handlers=java.util.logging.ConsoleHandler\n.level=INFO\nimq.bridge.b.level=WARNING\n")
    props = props_for(tmp_path, f"java.util.logging.config.file={config}")
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    send(broker, "src", ["m"])
    drain(broker, "dst", expect=1)
    b.stop()
    assert "transferred" not in (bridge_log_dir(tmp_path) / "log.txt").read_text()
    assert logging.getLogger("imq.bridge.b").level == logging.WARNING
    config.write_text("imq.bridge.b.level=FINE\n")
    assert read_levels(config) == {"imq.bridge.b": logging.DEBUG}
    config.write_text("# levels\nimq.bridge.b.level=LOUD\n")
    with pytest.raises(ConfigError, match=r"logging.properties:2: imq.bridge.b.level is 'LOUD'; write a level"):
        read_levels(config)


def test_passwords_never_reach_the_log(broker, tmp_path):
    secret = "s3cr3t-Pa55"

    class Refusing(EmbeddedConnectionFactory):
        def create_connection(self, username=None, password=None):
            if username == "app":  # a provider that quotes what it was given
                raise JMSException(f"login refused for {username}/{password}")
            return super().create_connection()

    xml = bridge_xml(
        link_xml(dst="dst").replace('<target connection-factory-ref="host"', '<target connection-factory-ref="auth"'),
        cfs=f'<connection-factory ref-name="auth" username="app" password="{secret}" '
        'connect-attempts="2" connect-attempt-interval-in-seconds="0"/>',
    )
    props = props_for(tmp_path)
    b = JMSBridge(parse_bridge_config(xml), props, host_factory=lambda env: Refusing(broker), tuning=FAST)
    b.start()
    wait_until(lambda: b.links[0].state is State.STOPPED)
    b.stop()
    text = (bridge_log_dir(tmp_path) / "log.txt").read_text()
    assert "login refused for app/********" in text and secret not in text
    assert b.links[0].counters.last_error and secret not in repr(b.config)


# --- loading from properties ---------------------------------------------------------------------


@pytest.mark.slow
def test_from_properties_reads_the_xml_at_every_start(broker, tmp_path):
    xml_file = tmp_path / "b.xml"
    xml_file.write_bytes(bridge_xml(link_xml(dst="dst")))
    props = props_for(tmp_path, "imq.bridge.b.type=jms", f"imq.bridge.b.xmlurl={xml_file}")
    b = JMSBridge.from_properties(props, "b", host_factory=host(broker), tuning=FAST)
    assert b.info()["links"] == []  # not read yet
    b.start()
    send(broker, "src", ["1"])
    assert [m.text for m in drain(broker, "dst", expect=1)] == ["1"]
    b.stop()
    xml_file.write_bytes(bridge_xml(link_xml(dst="other")))
    b.start()
    send(broker, "src", ["2"])
    assert [m.text for m in drain(broker, "other", expect=1)] == ["2"]
    b.stop()
    xml_file.write_bytes(b"<jmsbridge name='b'><oops/></jmsbridge>")
    with pytest.raises(ConfigError, match=r"b.xml"):
        b.start()
    assert b.state is State.STOPPED


@pytest.mark.slow
def test_commands_from_many_threads(bridge):
    bridge.start()
    errors: list[Exception] = []

    def churn():
        for _ in range(5):
            try:
                bridge.pause_link("l1")
                bridge.resume_link("l1")
            except IllegalTransition:
                pass
            except Exception as exc:  # anything else is a bug
                errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and bridge.link("l1").state is State.STARTED


@pytest.mark.slow
def test_the_embedded_example_runs(tmp_path):
    from pathlib import Path

    from bridgemgr.jms import Queue, Topic
    from bridgemgr.providers.embedded import Broker
    from bridgemgr.providers.embedded.host import EmbeddedHostBroker

    root = Path(__file__).resolve().parents[1]
    props = load_properties([root / "examples" / "embedded" / "broker.properties"], [f"imq.varhome={tmp_path}"])
    broker = Broker(tmp_path / "store")
    bridge = JMSBridge.from_properties(props, "orders", host=EmbeddedHostBroker(broker), tuning=FAST)
    try:
        bridge.start()
        links = {x["name"]: x for x in bridge.info()["links"]}
        assert links["orders-upper"]["transacted"] and links["orders-upper"]["state"] == "STARTED"
        assert links["urgent-orders"]["target"] == "host:P:queue:orders.urgent"
        send(broker, "orders.in", ["order one"])
        send(broker, Topic("orders.priority"), ["urgent", "routine"], priority=8)
        assert [m.text for m in drain(broker, "orders.out", expect=1)] == ["ORDER ONE"]
        assert {
            m.get_string_property("JMS_SUN_JMSBRIDGE_NAME") for m in drain(broker, Queue("orders.urgent"), expect=2)
        } == {"orders"}
    finally:
        bridge.stop()
        broker.close()
    assert (tmp_path / "instances" / "imqbroker" / "bridges" / "orders" / "log.txt").exists()


def test_a_full_disk_costs_the_bridge_log_its_lines_not_the_bridge(broker, tmp_path, caplog):
    """The housekeeping thread's flush raised ENOSPC and the thread died: no buffered line
    reached the file again, idle connections were never reaped. Now the service log says
    that the file cannot be written and that it can again (not per line); lines flow after."""
    from disk_support import mount_tmpfs, unmount

    var = tmp_path / "var"
    if reason := mount_tmpfs(var, "512k"):
        pytest.skip(reason)
    caplog.set_level(logging.INFO, "bridgemgr.jmsbridge.logs")
    try:
        b = make_bridge(broker, bridge_xml(link_xml()), props=props_for(tmp_path), reap_interval=0.05)
        b.start()
        try:
            log = bridge_log_dir(tmp_path) / "log.txt"
            filler = var / "filler"
            with open(filler, "wb") as f:
                fs = os.statvfs(var)
                f.write(b"f" * (fs.f_bavail * fs.f_frsize))
            send(broker, "src", [f"m{i}" for i in range(200)])
            drain(broker, "dst", expect=200)
            b.links[0].log.warning("link l: written while the disk is full")
            time.sleep(0.3)  # several housekeeping flushes fail meanwhile
            filler.unlink()
            b.links[0].log.info("link l: after space is back")
            wait_until(lambda: "after space is back" in log.read_text(), 5, "a line after space is back")
        finally:
            b.stop()
    finally:
        unmount(var)
    messages = [r.getMessage() for r in caplog.records if r.name == "bridgemgr.jmsbridge.logs"]
    said = [m.split(": ", 1)[1][:12] for m in messages]
    # once, not per line (the last page's slack may take a flush's lines after the first failure)
    assert said[0] == "cannot write" and said[-1] == "writing agai" and len(said) <= 4, messages
