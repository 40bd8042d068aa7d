"""End to end: two `imqbridgemgr serve` processes. A bridge on service A whose target
<connection-factory> has no lookup-name but imqAddressList naming service B's port mapper
and the username/password of B's user moves A's messages to B's queues, not A's; with a
wrong password the link stops with B's refusal as its error and every message stays on
A's source (nothing reaches A's target queue), and the password is printed nowhere."""

from __future__ import annotations

import signal

import pytest

from service_support import Daemon, cli, link_row, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PW_A, PW_B = "Pw-A-31c7", "Pw-B-9d02"
WRONG = "Wrong-pw-e4a8"
N = 20


def a_xml(b_address: str, password: str, transacted_link: bool = True) -> str:
    """Service A's bridge jb: out1 (and, transacted, out2) from A's host broker to B."""
    link2 = (
        """
  <link name="l2">
    <source connection-factory-ref="host" destination-ref="in2"/>
    <target connection-factory-ref="b" destination-ref="out2"/>
  </link>"""
        if transacted_link
        else ""
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="in1"/>
    <target connection-factory-ref="b" destination-ref="out1"/>
  </link>{link2}
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="b" username="admin" password="{password}"
                      connect-attempts="2" connect-attempt-interval-in-seconds="1">
    <property name="imqAddressList" value="mq://{b_address}"/>
    <property name="imqReconnectEnabled" value="true"/>
    <property name="imqReconnectAttempts" value="1"/>
    <property name="imqReconnectInterval" value="200"/>
  </connection-factory>
  <destination ref-name="in1" name="addr.in1"/>
  <destination ref-name="in2" name="addr.in2"/>
  <destination ref-name="out1" name="addr.out1"/>
  <destination ref-name="out2" name="addr.out2"/>
</jmsbridge>
"""


B_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb"/>
"""


def drain(daemon: Daemon, password: str, queue: str, want: int = 0, wait: float = 0.0) -> list[str]:
    """The texts on ``queue`` of a service (waiting up to ``wait`` s for ``want`` of them)."""
    return [m.text for m in take(daemon, password, queue, want, wait, quiet=0.3)]


def stop(daemon: Daemon) -> str:
    """SIGTERM, and everything the service printed after "Running"."""
    daemon.proc.send_signal(signal.SIGTERM)
    rest, _ = daemon.proc.communicate(timeout=60)
    assert daemon.proc.returncode == 0, rest
    return rest


@pytest.fixture
def service_b(tmp_path):
    (tmp_path / "b").mkdir()
    props, _ = one_bridge_files(tmp_path / "b", "B", B_XML, PW_B, activelist="")
    daemon = Daemon(props)
    yield daemon
    stop(daemon)


def test_a_factory_without_lookup_name_reaches_the_broker_of_its_address_list(tmp_path, service_b):
    base = tmp_path / "a"
    base.mkdir()
    props, _ = one_bridge_files(base, "A", a_xml(service_b.address, PW_B), PW_A)
    a = Daemon(props)
    try:
        assert "bridge jb (JMS): STARTED" in a.lines, a.lines
        send(a, PW_A, "addr.in1", *(f"addr.in1-{i}" for i in range(N)))
        send(a, PW_A, "addr.in2", *(f"addr.in2-{i}" for i in range(N)))
        assert sorted(drain(service_b, PW_B, "addr.out1", N, 30)) == sorted(f"addr.in1-{i}" for i in range(N))
        assert sorted(drain(service_b, PW_B, "addr.out2", N, 30)) == sorted(f"addr.in2-{i}" for i in range(N))
        assert drain(a, PW_A, "addr.out1") == [] and drain(a, PW_A, "addr.out2") == []
        assert drain(a, PW_A, "addr.in1") == [] and drain(a, PW_A, "addr.in2") == []
    finally:
        stop(a)


def test_a_wrong_password_stops_the_link_and_nothing_goes_to_the_host(tmp_path, service_b):
    base = tmp_path / "a"
    base.mkdir()
    props, passfile = one_bridge_files(base, "A", a_xml(service_b.address, WRONG, transacted_link=False), PW_A)
    a = Daemon(props)
    try:
        send(a, PW_A, "addr.in1", *(f"addr.in1-{i}" for i in range(N)))
        words = wait_for(
            lambda: "STOPPED" in (row := link_row(a, passfile, "l1"))[1] and row, 60, "link l1 STOPPED", interval=0.3
        )
        row = " ".join(words)
        assert "authentication failed for user 'admin'" in row
        listed = cli(a, passfile, "list", "link", "-bn", "jb", "-ln", "l1").stdout
        assert WRONG not in row + listed
        assert drain(a, PW_A, "addr.out1") == []
        assert drain(service_b, PW_B, "addr.out1") == []
        assert len(drain(a, PW_A, "addr.in1", N, 10)) == N  # nothing lost either
    finally:
        output = stop(a)
    assert WRONG not in output + "\n".join(a.lines)
    logs = "\n".join(f.read_text(errors="replace") for f in (base / "var").rglob("log.txt*"))
    assert "authentication failed for user 'admin'" in logs and WRONG not in logs
