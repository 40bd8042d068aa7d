"""Start-up of `imqbridgemgr serve` with a bridge that cannot connect: bridges start
independently, so a bridge stuck in connect-attempts="-1" is listed as STARTING at once
beside the others (a JMS bridge and the STOMP bridge), which start and move messages; a STARTING bridge answers every
command sensibly and `stop bridge` cancels its start. Everything through the CLI, as
processes, against a real service.
"""

from __future__ import annotations

import re
import signal
import socket
import time
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.admin.portmapper import lookup_services
from bridgemgr.jms import Queue, TextMessage
from service_support import Daemon, cli, one_bridge_files
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
UP = {"stuck": "STARTING", "jb": "STARTED", "stomp": "STARTED"}

WORKING = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="up.src"/>
  <destination ref-name="dst" name="up.dst"/>
</jmsbridge>
"""

# The source is a broker nobody runs: mq:// to a closed port, tried forever.
STUCK = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="stuck">
  <link name="far" transacted="false">
    <source connection-factory-ref="far" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="far" lookup-name="ConnectionFactory" connect-attempts="-1"
                      connect-attempt-interval-in-seconds="1">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="mq://127.0.0.1:{port}"/>
  </connection-factory>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="far.src"/>
  <destination ref-name="dst" name="far.dst"/>
</jmsbridge>
"""


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bridge_states(daemon: Daemon, passfile: Path) -> dict[str, str]:
    r = cli(daemon, passfile, "list", "bridge")
    assert r.returncode == 0, r.stderr
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+(?:JMS|STOMP)\s+(\w+)$", r.stdout, re.M)}


@pytest.fixture
def service(tmp_path):
    (tmp_path / "stuck.xml").write_text(STUCK.format(port=closed_port()))
    props, passfile = one_bridge_files(
        tmp_path,
        "startup",
        WORKING,
        "Secret-1",
        "imq.bridge.stuck.type=jms",
        "imq.bridge.stuck.xmlurl=stuck.xml",
        "imq.bridge.stomp.tcp.port=0",
        activelist="stuck,jb,stomp",
    )
    began = time.monotonic()
    daemon = Daemon(props, settle=False)
    up = time.monotonic() - began
    yield daemon, passfile, up
    daemon.proc.send_signal(signal.SIGTERM)
    rest, _ = daemon.proc.communicate(timeout=60)
    assert daemon.proc.returncode == 0, rest


def test_a_bridge_stuck_connecting_holds_up_nothing(service):
    daemon, passfile, up = service
    assert up < 15, f"serve printed Running after {up:.1f} s"  # before: after the stuck one's 30 s
    states = wait_for(
        lambda: (now := bridge_states(daemon, passfile)) == UP and now, 10, f"the bridges to be {UP}", interval=0.2
    )
    assert states == UP
    host, port = daemon.address.split(":")
    assert "stomp" in {e.name for e in lookup_services(host, int(port))}
    # (the bridge is STARTING from the first of its start steps; its link, once started)
    wait_for(
        lambda: re.search(r"^far\s+STARTING\s", cli(daemon, passfile, "list", "link", "-bn", "stuck").stdout, re.M),
        10,
        "link far to be STARTING",
        interval=0.2,
    )

    # The working bridge moves messages meanwhile.
    with connect(f"mq://{daemon.address}", username="admin", password="Secret-1") as conn:
        conn.start()
        session = conn.create_session()
        producer = session.create_producer(Queue("up.src"))
        for i in range(20):
            producer.send(TextMessage(f"m{i}"))
        consumer = session.create_consumer(Queue("up.dst"))
        got = [consumer.receive(30) for _ in range(20)]
    assert [m.text for m in got if m is not None] == [f"m{i}" for i in range(20)]

    # Commands on the STARTING bridge: start and pause are refused, naming the state ...
    for op in ("start", "pause"):
        r = cli(daemon, passfile, op, "bridge", "-bn", "stuck")
        assert r.returncode == 1 and "it is STARTING" in r.stderr, (op, r.stdout, r.stderr)
    r = cli(daemon, passfile, "stop", "link", "-bn", "stuck", "-ln", "far")
    assert r.returncode == 1 and "the bridge is STARTING" in r.stderr, r.stderr
    # ... and stop cancels the start.
    began = time.monotonic()
    r = cli(daemon, passfile, "stop", "bridge", "-bn", "stuck")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - began < 8
    assert bridge_states(daemon, passfile) == {**UP, "stuck": "STOPPED"}

    # An admin start of it is answered (STARTING) instead of waiting for the provider.
    began = time.monotonic()
    r = cli(daemon, passfile, "start", "bridge", "-bn", "stuck")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - began < 9
    assert bridge_states(daemon, passfile) == UP
    # SIGTERM (the fixture) stops the service promptly though one bridge is connecting.


def test_a_service_without_java_bridges_loads_no_jvm_library(tmp_path):
    """`serve` of a bridge between host destinations maps neither JPype nor numpy: asking
    whether a JVM ran imported JPype (and numpy with it), 0.18 s of CPU at every start."""
    props, _ = one_bridge_files(tmp_path, "nojava", WORKING, "Startup-Secret-1")
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
        loaded = [line for line in maps.splitlines() if "_jpype" in line or "numpy" in line]
        assert not loaded, loaded
    finally:
        daemon.stop()
