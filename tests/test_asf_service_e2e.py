"""End to end: a real `imqbridgemgr serve`, destinations given backout attributes with
`imqbridgemgr create dst`, a poison message consumed over mq:// (a plain transacted
consumer, then a connection consumer with a transacted server session pool), and a
kill -9 of the service in between: the delivery count survives it, so the message
reaches its backout queue, or the DMQ, at the threshold counted across the restart."""

from __future__ import annotations

import os
import signal
import time

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue
from bridgemgr.jms.serversessions import ThreadServerSessionPool
from service_support import Daemon, cli, one_bridge_files, send, take
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PASSWORD = "Asf-Secret-1"


def _held_once(daemon: Daemon, queue: str) -> None:
    """Deliver ``queue``'s message in a transacted session and roll it back."""
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        conn.start()
        session = conn.create_session(transacted=True)
        assert session.create_consumer(Queue(queue)).receive(5).text == "bad"
        session.rollback()


def test_backout_queue_and_disposition_count_across_a_kill_9(tmp_path):
    props, passfile = one_bridge_files(tmp_path, "asf", "", PASSWORD, activelist="")
    daemon = Daemon(props)
    try:
        for args in (
            ["-n", "asf.in", "-o", "backoutThreshold=3", "-o", "backoutQueue=asf.poison"],
            ["-n", "asf.dq", "-o", "backoutThreshold=2"],
        ):
            r = cli(daemon, passfile, "create", "dst", "-t", "q", *args)
            assert r.returncode == 0, r.stdout + r.stderr
        send(daemon, PASSWORD, "asf.in", "bad")
        send(daemon, PASSWORD, "asf.dq", "bad")
        _held_once(daemon, "asf.in")  # backout 1
        # delivery 2 of asf.in and 1 of asf.dq are in flight when the service dies
        conn = connect(f"mq://{daemon.address}", username="admin", password=PASSWORD)
        conn.start()
        session = conn.create_session(transacted=True)
        assert session.create_consumer(Queue("asf.in")).receive(5).delivery_count == 2
        assert session.create_consumer(Queue("asf.dq")).receive(5).delivery_count == 1
        time.sleep(1.0)  # the store's writer records the deliveries
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(30)
        conn.close()
    finally:
        daemon.stop()

    daemon = Daemon(props)
    try:
        query = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", "asf.in")
        assert query.returncode == 0 and "asf.poison" in query.stdout, query.stdout + query.stderr
        # asf.dq: its second delivery is rolled back: the DMQ (no backout queue)
        _held_once(daemon, "asf.dq")
        # asf.in: a connection consumer whose listener always fails; delivery 3 is the last
        attempts: list[int] = []

        def make_listener(session):
            def on_message(msg):
                attempts.append(msg.delivery_count)
                raise ValueError("poison")

            return on_message

        with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            with (
                ThreadServerSessionPool(conn, 2, make_listener, transacted=True) as pool,
                conn.create_connection_consumer(Queue("asf.in"), None, pool, 1),
            ):
                wait_for(lambda: attempts, 20, "the listener's first attempt")
                quiet_for(lambda: len(attempts), 1.0, 20)  # no attempt after it
        assert attempts == [3]
        (moved,) = take(daemon, PASSWORD, "asf.poison", expect=1, quiet=0.3)
        assert moved.text == "bad" and moved.get_int_property("JMS_IMQ_BACKOUT_COUNT") == 3
        (dead,) = take(daemon, PASSWORD, "mq.sys.dmq", expect=1, quiet=0.3)
        assert dead.get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "BACKOUT_THRESHOLD_REACHED"
        assert dead.get_string_property("JMS_SUN_DMQ_DESTINATION") == str(Queue("asf.dq"))
        assert take(daemon, PASSWORD, "asf.in", quiet=0.3) == []
        assert take(daemon, PASSWORD, "asf.dq", quiet=0.3) == []
    finally:
        daemon.stop()


LINK_XML = """<?xml version="1.0" encoding="UTF-8"?>
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
  <destination ref-name="src" name="asf.src"/>
  <destination ref-name="dst" name="asf.dst"/>
</jmsbridge>
"""


def test_a_poison_message_of_a_link_source_goes_to_its_backout_queue_not_twice_to_the_target(tmp_path):
    """The target refuses a big message at prepare, so the transacted link rolls it back;
    the source queue's backoutThreshold=2 (below the bridge's 5: it wins; update dst, the
    link made the queue) moves it to its backout queue after the second backout; the
    target has every other message once."""
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
            LINK_XML.format(password=PASSWORD, far=far.address),
            PASSWORD,
            "imq.bridge.stomp.tcp.port=0",
        )
        near = Daemon(props)
        try:
            r = cli(
                near,
                passfile,
                "update",
                "dst",
                "-t",
                "q",
                "-n",
                "asf.src",
                "-o",
                "backoutThreshold=2",
                "-o",
                "backoutQueue=asf.src.poison",
            )
            assert r.returncode == 0, r.stdout + r.stderr
            big = "big" + "x" * 30 * 1024
            send(near, PASSWORD, "asf.src", "good1", big, "good2")
            arrived = take(far, PASSWORD, "asf.dst", expect=2, quiet=2.0)
            assert [m.text for m in arrived] == ["good1", "good2"]
            (moved,) = take(near, PASSWORD, "asf.src.poison", expect=1)
            assert moved.text == big and moved.get_int_property("JMS_IMQ_BACKOUT_COUNT") == 2
            assert take(near, PASSWORD, "imq.bridge.jms.dmq", quiet=0.3) == []
            assert take(near, PASSWORD, "asf.src", quiet=0.3) == []
            send(near, PASSWORD, "asf.src", "later")
            assert [m.text for m in take(far, PASSWORD, "asf.dst", expect=1)] == ["later"]
        finally:
            near.stop()
    finally:
        far.stop()
