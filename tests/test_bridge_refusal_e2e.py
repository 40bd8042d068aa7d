"""End to end, as a migrating user would run it: two `imqbridgemgr serve` processes, the
second one an external provider whose destinations refuse messages over 20 KiB
(imq.autocreate.destination.maxBytesPerMsg=20k), reached from the first one's bridge
XML through a lookup-name connection factory (imq.embedded, mq://). Messages go in and
are read back over the services' jms connection services (real sockets, no mocks).

- A NON_PERSISTENT message the target refuses, between two good ones, on a
  non-transacted link: the refused one goes to the DMQ (SEND_FAILURE, with the
  target's exception), both good ones reach the target, nothing is lost or misrouted.
- The DMQ sequence (the chapter's step 5): a dead message lands in the built-in DMQ and
  in the first user <dmq> that takes it, and not in a later one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode
from service_support import Daemon, cli, link_row, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Secret-1"
BIG = "x" * 30 * 1024  # over the target's maxBytesPerMsg=20k
BUILTIN_DMQ = "imq.bridge.jms.dmq"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="remote" destination-ref="dst"/>
  </link>
  {dmqs}
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="remote" lookup-name="XAConnectionFactory"
                      username="admin" password="{password}">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="mq://{target}"/>
  </connection-factory>
  <destination ref-name="src" name="e2e.src"/>
  <destination ref-name="dst" name="e2e.dst"/>
  <destination ref-name="udmq1" name="user.dmq1"/>
  <destination ref-name="udmq2" name="user.dmq2"/>
</jmsbridge>
"""
USER_DMQS = """<dmq name="first" connection-factory-ref="host" destination-ref="udmq1"
       send-attempts="1" send-attempt-interval-in-seconds="0"/>
  <dmq name="second" connection-factory-ref="host" destination-ref="udmq2"
       send-attempts="1" send-attempt-interval-in-seconds="0"/>"""

TARGET_XML = """<jmsbridge name="idle">
  <connection-factory ref-name="host"/>
</jmsbridge>
"""


@pytest.fixture
def target(tmp_path):
    """The external provider: a serve whose auto-created destinations take at most 20 KiB
    per message (no bridge running in it)."""
    base = tmp_path / "target"
    base.mkdir()
    props, _ = one_bridge_files(
        base, "target", TARGET_XML, PASSWORD, "imq.autocreate.destination.maxBytesPerMsg=20k", activelist=""
    )
    daemon = Daemon(props)
    yield daemon
    daemon.stop()


def bridge_service(tmp_path: Path, target: Daemon, dmqs: str = "") -> tuple[Daemon, Path]:
    """The serve with bridge jb (link l1: e2e.src here -> e2e.dst at ``target``), not
    started yet, and its admin passfile."""
    base = tmp_path / "bridge"
    base.mkdir()
    props, passfile = one_bridge_files(
        base, "bridging", XML.format(dmqs=dmqs, password=PASSWORD, target=target.address), PASSWORD
    )
    return Daemon(props), passfile


def link_counters(daemon: Daemon, passfile: Path) -> tuple[int, int]:
    """(Transferred, DMQ) of link l1 as `imqbridgemgr list link` shows them."""
    row = link_row(daemon, passfile, "l1")
    return int(row[5]), int(row[6])


def wait_handled(daemon: Daemon, passfile: Path, n: int) -> None:
    """Until link l1 has transferred or dead-lettered ``n`` messages."""
    wait_for(lambda: sum(link_counters(daemon, passfile)) >= n, 30, f"link l1 to handle {n} messages", interval=0.2)


def start_bridge(daemon: Daemon, passfile: Path) -> None:
    r = cli(daemon, passfile, "start", "bridge", "-bn", "jb")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_refused_non_persistent_send_goes_to_the_dmq_and_the_next_message_is_sent(tmp_path, target):
    bridge, passfile = bridge_service(tmp_path, target)
    try:
        ids = send(bridge, PASSWORD, "e2e.src", ("good 1", DeliveryMode.PERSISTENT), (BIG, DeliveryMode.NON_PERSISTENT))
        start_bridge(bridge, passfile)
        wait_handled(bridge, passfile, 2)
        # The target's refusal of BIG has long arrived when the link sends this one.
        ids += send(bridge, PASSWORD, "e2e.src", ("good 2", DeliveryMode.PERSISTENT))
        delivered = take(target, PASSWORD, "e2e.dst", expect=2)
        dead = take(bridge, PASSWORD, BUILTIN_DMQ, expect=1)
        # The refused message is the one in the DMQ (not the next one), the good ones are
        # at the target (neither lost nor dead-lettered for another message's refusal).
        assert [m.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") for m in dead] == [ids[1]]
        assert [m.text for m in delivered] == ["good 1", "good 2"]
        (letter,) = dead
        assert letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "SEND_FAILURE"
        assert letter.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") == ids[1]
        exception = letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
        assert re.search(r"ResourceAllocationException: .*maxBytesPerMsg=20480", exception), exception
        assert letter.object.text == BIG
        assert letter.delivery_mode == DeliveryMode.NON_PERSISTENT
        assert take(bridge, PASSWORD, "e2e.src", expect=0) == []
        assert link_counters(bridge, passfile) == (2, 1)
    finally:
        bridge.stop()
    log = (tmp_path / "bridge/var/instances/bridging/bridges/jb/log.txt").read_text()
    assert re.findall(r"transferred message (\S+)", log) == [ids[0], ids[2]]
    assert re.search(rf"sending message {ids[1]} to queue://e2e.dst failed .*maxBytesPerMsg", log)


def test_a_dead_message_goes_to_the_builtin_dmq_and_the_first_user_dmq_that_takes_it(tmp_path, target):
    bridge, passfile = bridge_service(tmp_path, target, USER_DMQS)
    try:
        (big,) = send(bridge, PASSWORD, "e2e.src", (BIG, DeliveryMode.PERSISTENT))
        start_bridge(bridge, passfile)
        builtin = take(bridge, PASSWORD, BUILTIN_DMQ, expect=1)
        first = take(bridge, PASSWORD, "user.dmq1", expect=1)
        assert take(bridge, PASSWORD, "user.dmq2", expect=0, quiet=0.5) == []
        for dead in (builtin, first):
            assert len(dead) == 1
            assert dead[0].get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") == big
            assert dead[0].get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "SEND_FAILURE"
            assert dead[0].object.text == BIG
        assert take(target, PASSWORD, "e2e.dst", expect=0, quiet=0.5) == []
        assert take(bridge, PASSWORD, "e2e.src", expect=0, quiet=0.5) == []
        assert link_counters(bridge, passfile) == (0, 1)  # one dead message, in two DMQs
    finally:
        bridge.stop()
