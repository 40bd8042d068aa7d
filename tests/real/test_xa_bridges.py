"""Transacted (XA) links to a real ActiveMQ through the Java provider and the bridge's XA
coordinator: embedded -> ActiveMQ with two-phase commit across two resource managers,
ActiveMQ -> ActiveMQ with the target joining the source's branch (one-phase), and a bridge
killed with SIGKILL again and again mid-transfer (at random, and exactly after the prepares,
after the commit record, between the commits): every message reaches ActiveMQ exactly once,
nothing stays in doubt; the same for ActiveMQ -> ActiveMQ one transaction per message (the
source's and the joined target's associations ended at the same time)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from xa_bridge_child import amq_factory

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.message import DeliveryMode, MapMessage, TextMessage
from bridgemgr.jms.xa import TMENDRSCAN, TMSTARTRSCAN
from bridgemgr.jmsbridge.bridge import JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.xa.coordinator import FAULT_ENV, is_ours, name_tag
from jmsbridge_support import FAST, bridge_xml, drain, send, wait_until

pytest.importorskip("jpype")
pytestmark = pytest.mark.timeout(240)
CHILD = Path(__file__).with_name("xa_bridge_child.py")
ROOT = Path(__file__).resolve().parents[2]
FAULTS = ["prepared:kill:{p}", "logged:kill:{p}", "committed-one:kill:{p}", None]


def xa_link(src_ref: str = "host", dst_ref: str = "amq", src: str = "src", dst: str = "dst") -> str:
    return (
        f'<link name="l" transacted="true"><source connection-factory-ref="{src_ref}" '
        f'destination-ref="{src}"/><target connection-factory-ref="{dst_ref}" '
        f'destination-ref="{dst}"/></link>'
    )


def props(tmp_path: Path, name: str, batch: int, local: bool = True):
    return load_properties(
        [],
        [
            f"imq.varhome={tmp_path / 'var'}",
            f"imq.bridge.{name}.type=jms",
            f"imq.bridge.{name}.xmlurl=x.xml",
            f"imq.bridge.{name}.transaction.batchSize={batch}",
            f"imq.bridge.{name}.transaction.local={str(local).lower()}",
        ],
        environ={},
    )


def amq_in_doubt(activemq, bridge: str) -> int:
    factory = naming.lookup("XAConnectionFactory", activemq.jndi())
    with factory.create_xa_connection() as conn:
        found = conn.create_xa_session().xa_resource.recover(TMSTARTRSCAN | TMENDRSCAN)
    return sum(1 for xid in found if is_ours(xid, name_tag(bridge)))


def take(activemq, queue: str) -> list:
    """Everything on an ActiveMQ queue (consumed)."""
    with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(queue))
        out = []
        while (m := consumer.receive(1.0)) is not None:
            out.append(m)
        return out


def test_embedded_to_activemq_in_xa_transactions(activemq, tmp_path):
    name, dst = "xa1", f"xa.dst.{uuid.uuid4().hex[:8]}"
    broker = Broker(tmp_path / "store", sync=True)
    xml = bridge_xml(
        xa_link(), cfs=amq_factory(activemq.jndi()), name=name, dests=f'<destination ref-name="dst" name="{dst}"/>'
    )
    bridge = JMSBridge(
        parse_bridge_config(xml),
        props(tmp_path, name, 10),
        host_factory=lambda env: EmbeddedConnectionFactory(broker),
        tuning=FAST,
    )
    sent = []
    for i in range(300):
        m = TextMessage(str(i)) if i % 2 else MapMessage({"i": i})
        m.set_int_property("i", i)
        sent.append(m)
    send(broker, "src", sent, delivery_mode=DeliveryMode.PERSISTENT)
    try:
        assert bridge.start() is State.STARTED
        wait_until(lambda: bridge.links[0].counters.transferred >= 300, 120, "the transfer")
        link_state = bridge.links[0].state
    finally:
        bridge.stop()
        broker.close()
    got = take(activemq, dst)
    assert link_state is State.STARTED
    assert sorted(m.get_int_property("i") for m in got) == list(range(300))  # once each
    assert [m.get_int_property("i") for m in got] == list(range(300))  # in order
    assert amq_in_doubt(activemq, name) == 0


def test_activemq_to_activemq_joins_one_branch(activemq, tmp_path):
    """Both ends on one ActiveMQ, transaction.local=false: XA, the target joins the source's
    branch (same RM), one phase."""
    name = "xa2"
    got, info = one_broker_link(activemq, tmp_path, name, 100, 5, local=False)
    assert info["transaction"] == "XA"
    assert [m.text for m in got] == [str(i) for i in range(100)]


@pytest.mark.slow
def test_activemq_to_activemq_in_local_transactions(activemq, tmp_path, caplog):
    """Both ends on one ActiveMQ (two connection-factory elements, one JNDI environment):
    each message is one local transaction of one session holding the consumer and the
    producer, not XA (the link's info and log say so); 500 arrive in order, once each,
    none stays on the source, nothing in doubt."""
    name = "xa3"
    with caplog.at_level("INFO"):
        got, info = one_broker_link(activemq, tmp_path, name, 500, 1)
    assert info["transaction"] == "local transaction (one resource manager)"
    assert "transacted, local transaction (one resource manager)" in caplog.text
    assert [m.text for m in got] == [str(i) for i in range(500)]
    assert info["counters"]["redelivered"] == 0  # type: ignore[index]


def one_broker_link(activemq, tmp_path: Path, name: str, n: int, batch: int, local: bool = True) -> tuple[list, dict]:
    """Move n messages between two queues of ActiveMQ on a transacted link whose two
    factories look up the same environment; what reached the target, and the link's info
    (the source is checked empty and nothing left in doubt)."""
    src, dst = f"xa.src.{uuid.uuid4().hex[:8]}", f"xa.dst.{uuid.uuid4().hex[:8]}"
    host = Broker(tmp_path / "host")
    cfs = amq_factory(activemq.jndi()) + amq_factory(activemq.jndi()).replace('ref-name="amq"', 'ref-name="amq2"')
    xml = bridge_xml(
        xa_link("amq", "amq2"),
        cfs=cfs,
        name=name,
        log_message_transfer="false",
        dests=f'<destination ref-name="src" name="{src}"/><destination ref-name="dst" name="{dst}"/>',
    )
    with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as conn:
        session = conn.create_session(True)
        producer = session.create_producer(Queue(src))
        for i in range(n):
            producer.send(TextMessage(str(i)))
        session.commit()
    bridge = JMSBridge(
        parse_bridge_config(xml),
        props(tmp_path, name, batch, local),
        host_factory=lambda env: EmbeddedConnectionFactory(host),
        tuning=FAST,
    )
    try:
        bridge.start()
        wait_until(lambda: bridge.links[0].counters.transferred >= n, 120, "the transfer")
        info = bridge.links[0].info()
    finally:
        bridge.stop()
        host.close()
    got = take(activemq, dst)
    assert take(activemq, src) == []
    assert amq_in_doubt(activemq, name) == 0
    return got, info


def test_activemq_to_embedded_in_xa_transactions(activemq, tmp_path):
    """ActiveMQ as the XA source: its consumer's acknowledgements commit with each unit, so
    nothing is left behind on ActiveMQ and nothing arrives twice."""
    name, src = "xa3", f"xa.src.{uuid.uuid4().hex[:8]}"
    host = Broker(tmp_path / "host", sync=True)
    xml = bridge_xml(
        xa_link("amq", "host"),
        cfs=amq_factory(activemq.jndi()),
        name=name,
        dests=f'<destination ref-name="src" name="{src}"/>',
    )
    with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as conn:
        producer = conn.create_session().create_producer(Queue(src))
        for i in range(200):
            producer.send(TextMessage(str(i)))
    bridge = JMSBridge(
        parse_bridge_config(xml),
        props(tmp_path, name, 3),
        host_factory=lambda env: EmbeddedConnectionFactory(host),
        tuning=FAST,
    )
    try:
        bridge.start()
        wait_until(lambda: bridge.links[0].counters.transferred >= 200, 120, "the transfer")
        assert bridge.links[0].counters.reconnects == 0
    finally:
        bridge.stop()
    try:
        assert [m.text for m in drain(host, "dst")] == [str(i) for i in range(200)]
    finally:
        host.close()
    assert take(activemq, src) == []
    assert amq_in_doubt(activemq, name) == 0


def start_child(args: list[str], fault: str | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env.pop(FAULT_ENV, None)
    # C1 only, one GC thread: each child's JVM lives a second or two, and C2's compiling
    # would take the CPU the bridge needs (its stderr is not read: no "Picked up" line seen)
    env["JAVA_TOOL_OPTIONS"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    if fault:
        env[FAULT_ENV] = fault
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    line = proc.stdout.readline().strip()
    if line != "ready":  # a fault may kill it during recovery's first transactions
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, (line, proc.returncode)
    return proc


def preload(activemq, queue: str, n: int, first: int = 0) -> None:
    """``n`` text messages "first".."first+n-1" on an ActiveMQ queue (local transactions
    of 500)."""
    with naming.lookup("ConnectionFactory", activemq.jndi()).create_connection() as conn:
        session = conn.create_session(True)
        producer = session.create_producer(Queue(queue))
        for i in range(first, first + n):
            producer.send(TextMessage(str(i)))
            if i % 500 == 499:
                session.commit()
        session.commit()


def kill_mid_transfer(activemq, args: list[str], kills: int, src: str, dst: str, backlog: int) -> tuple[list, int]:
    """Start the bridge child ``kills`` times, each killed -9 once it says it moved a
    random share (up to a third) of the ``backlog`` messages waiting on ``src`` at each
    start: what a run moved is taken from ``dst`` and as many new messages are added
    (numbered on), so every kill lands mid-transfer however fast the machine moves them
    (after a time, a quiet machine once moved all 1,000 first) and the last, clean run
    moves one backlog. Returns what was taken and how many were sent."""
    moved: list = []
    preload(activemq, src, backlog)
    sent = backlog
    for _ in range(kills):
        proc = start_child(args, None)
        wait_moved(proc, random.randint(1, backlog // 3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, "the child ended before it was killed"
        taken = take(activemq, dst)
        assert len(taken) < backlog, "the source emptied before the kill"
        moved += taken
        preload(activemq, src, len(taken), first=sent)
        sent += len(taken)
    assert moved, "the kills did not land mid-transfer (nothing moved)"
    return moved, sent


def wait_moved(proc: subprocess.Popen, at_least: int) -> None:
    """Read the child's "moved N" lines until N >= ``at_least``."""
    for line in proc.stdout:
        if line.startswith("moved ") and int(line.split()[1]) >= at_least:
            return
    raise AssertionError(f"the child ended before it moved {at_least}")


def last_line(proc: subprocess.Popen) -> str:
    """The child's first line that is not a "moved N" (its "done ...")."""
    return next((line.strip() for line in proc.stdout if not line.startswith("moved ")), "")


@pytest.mark.crash
def test_kill9_mid_transfer_on_an_xa_link_to_activemq(activemq, tmp_path):
    """4 messages per XA transaction, the bridge process killed 4 times, once with each of
    FAULTS (a backlog of about 1,500 kept on the source: each kill's moves are taken and as
    many new ones added; a run moved at most 364 on a loaded 2-core machine)."""
    backlog, batch = 1500, 4
    source = tmp_path / "source"

    def fill(first: int, count: int) -> None:
        broker = Broker(source, sync=True)
        try:
            messages = [TextMessage(str(i)) for i in range(first, first + count)]
            send(broker, "src", messages, delivery_mode=DeliveryMode.PERSISTENT)
        finally:
            broker.close()

    fill(0, backlog)
    n, moved = backlog, []
    args = [str(source), str(tmp_path / "var"), repr(activemq.jndi()), str(batch)]
    doubts, by_fault = 0, 0
    for fault in FAULTS:
        proc = start_child(args, fault.format(p=0.05) if fault else None)
        if proc.returncode is None:
            try:
                proc.wait(random.uniform(0.3, 1.5) if fault is None else 4)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                by_fault += 1
        else:
            by_fault += 1
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, "the source emptied before the last kill"
        doubts += amq_in_doubt(activemq, "crash")
        taken = take(activemq, "dst")
        moved += taken
        fill(n, len(taken))
        n += len(taken)
    proc = start_child(args, None)  # the last run finishes cleanly
    assert proc.stdout.readline().strip() == "done"
    proc.wait(60)
    proc.stdout.close()
    assert by_fault, "the fault hook never fired"
    assert doubts, "no kill landed between prepare and commit at ActiveMQ"
    got = Counter(int(m.text) for m in moved + take(activemq, "dst"))
    missing = sorted(set(range(n)) - set(got))
    assert not missing, f"lost {len(missing)}: {missing[:20]}"
    duplicated = {k: c for k, c in got.items() if c > 1}
    assert not duplicated, f"duplicated {len(duplicated)}: {list(duplicated.items())[:20]}"
    assert amq_in_doubt(activemq, "crash") == 0
    broker = Broker(source)
    try:
        assert broker.queue_depth("src") == 0 and drain(broker, "imq.bridge.jms.dmq") == []
    finally:
        broker.close()


@pytest.mark.crash
@pytest.mark.slow
def test_kill9_mid_transfer_on_a_local_activemq_to_activemq_link(activemq, tmp_path):
    """One local transaction per message (both ends one ActiveMQ: one session consumes and
    sends), the bridge process killed 3 times mid-transfer (kill_mid_transfer: a backlog
    of 1,000): each message on the target once and in order, none left on the source."""
    queue_src, queue_dst = "local.src", "local.dst"
    args = ["activemq", str(tmp_path / "var"), repr(activemq.jndi()), "1", "true", queue_src, queue_dst]
    moved, n = kill_mid_transfer(activemq, args, 3, queue_src, queue_dst, 1000)
    proc = start_child([*args, str(n - len(moved))], None)  # the last run finishes cleanly
    assert last_line(proc) == "done (local transaction (one resource manager))"
    proc.wait(60)
    proc.stdout.close()
    order = [int(m.text) for m in moved + take(activemq, queue_dst)]
    got = Counter(order)
    missing = sorted(set(range(n)) - set(got))
    assert not missing, f"lost {len(missing)}: {missing[:20]}"
    duplicated = {k: c for k, c in got.items() if c > 1}
    assert not duplicated, f"duplicated {len(duplicated)}: {list(duplicated.items())[:20]}"
    assert order == list(range(n))  # a killed unit comes back first: the order holds too
    assert take(activemq, queue_src) == [] and amq_in_doubt(activemq, "crash") == 0


@pytest.mark.crash
def test_kill9_mid_transfer_on_a_joined_activemq_to_activemq_link(activemq, tmp_path):
    """One XA transaction per message (the target joined to the source's branch,
    both associations ended at the same time, one-phase commit), the bridge process killed
    4 times mid-transfer (a backlog of 1,000): each message on the target once, none left
    on the source. (A kill
    counts as a delivery of every message ActiveMQ had prefetched to the link: the backout
    threshold is off, or the head of the queue would reach the DMQ after five kills.)"""
    args = ["activemq", str(tmp_path / "var"), repr(activemq.jndi()), "1", "false", "src", "dst"]
    moved, n = kill_mid_transfer(activemq, args, 4, "src", "dst", 1000)
    proc = start_child([*args, str(n - len(moved))], None)  # the last run finishes cleanly
    assert last_line(proc) == "done (XA)"
    proc.wait(60)
    proc.stdout.close()
    got = Counter(int(m.text) for m in moved + take(activemq, "dst"))
    missing = sorted(set(range(n)) - set(got))
    assert not missing, f"lost {len(missing)}: {missing[:20]}"
    duplicated = {k: c for k, c in got.items() if c > 1}
    assert not duplicated, f"duplicated {len(duplicated)}: {list(duplicated.items())[:20]}"
    assert take(activemq, "src") == [] and amq_in_doubt(activemq, "crash") == 0
    host = Broker(tmp_path / "var" / "host")
    try:
        assert drain(host, "imq.bridge.jms.dmq") == []
    finally:
        host.close()
