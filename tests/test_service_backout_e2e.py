"""End to end, as a migrating user tries it: two `imqbridgemgr serve` processes, the first
running a transacted link to the second (an external provider reached over mq://, its
destinations refusing messages over 20 KiB). The big message is refused at the target's
prepare: the link rolls back (no COMMIT_FAILURE copy), backs the message out until the
default backoutThreshold, then puts it in the DMQ once and moves on, in order."""

from __future__ import annotations

import re

import pytest

from service_support import Daemon, link_row, one_bridge_files, send, take

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PASSWORD = "Backout-Secret-1"
DMQ = "imq.bridge.jms.dmq"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l" transacted="true">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="far" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far" lookup-name="XAConnectionFactory"
                      username="admin" password="{password}">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="mq://{far}"/>
  </connection-factory>
  <destination ref-name="src" name="backout.src"/>
  <destination ref-name="dst" name="backout.dst"/>
</jmsbridge>
"""


@pytest.fixture
def services(tmp_path):
    """The far service (autocreated destinations refuse messages over 20 KiB), then the
    bridge's service linking to it."""
    (tmp_path / "far").mkdir()
    (tmp_path / "near").mkdir()
    far_props, _ = one_bridge_files(
        tmp_path / "far",
        "far",
        '<jmsbridge name="jb"/>',
        PASSWORD,
        "imq.autocreate.destination.maxBytesPerMsg=20k",
        activelist="",
    )
    far = Daemon(far_props)
    try:
        props, passfile = one_bridge_files(
            tmp_path / "near",
            "near",
            XML.format(password=PASSWORD, far=far.address),
            PASSWORD,
            "imq.bridge.stomp.tcp.port=0",
        )
        near = Daemon(props)
        try:
            yield near, far, passfile, tmp_path / "near" / "var" / "instances" / "near"
        finally:
            near.stop()
    finally:
        far.stop()


def test_a_message_the_target_refuses_at_prepare_is_backed_out_then_dead_once(services):
    near, far, passfile, instance = services
    assert "bridge jb (JMS): STARTED" in near.lines
    big = "big" + "x" * 30 * 1024
    send(near, PASSWORD, "backout.src", "good1", big, "good2")

    arrived = take(far, PASSWORD, "backout.dst", expect=2)
    assert [m.text for m in arrived] == ["good1", "good2"]
    dead = take(near, PASSWORD, DMQ, expect=1, wait=5)
    assert len(dead) == 1, [d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") for d in dead]
    (letter,) = dead
    assert letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "BACKOUT_THRESHOLD_REACHED"
    assert letter.object.text == big
    assert "backoutThreshold=5" in letter.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    # good2 waited behind the big one until it was in the DMQ
    assert arrived[1].timestamp >= letter.get_long_property("JMS_SUN_JMSBRIDGE_DMQ_TIMESTAMP")

    assert link_row(near, passfile, "l")[1] == "STARTED"
    send(near, PASSWORD, "backout.src", "later")
    assert [m.text for m in take(far, PASSWORD, "backout.dst", expect=1)] == ["later"]
    assert take(near, PASSWORD, DMQ, expect=0) == [] and take(near, PASSWORD, "backout.src", expect=0) == []
    assert link_row(near, passfile, "l")[1] == "STARTED"
    log = (instance / "bridges" / "jb" / "log.txt").read_text()
    assert "COMMIT_FAILURE" not in log
    assert len(re.findall(r"prepare of \S+ failed", log)) == 5  # backed out 5 times
