"""Real XA through the Java provider: ActiveMQ's own XAResource behind ours, Xids both ways.
Two-phase and one-phase commit, rollback, the RM identity, error codes, and recovery of
branches a process prepared before it was killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue
from bridgemgr.jms.errors import XAException
from bridgemgr.jms.message import TextMessage
from bridgemgr.jms.spi import AckMode, is_xa_capable
from bridgemgr.jms.xa import (
    TMENDRSCAN,
    TMNOFLAGS,
    TMSTARTRSCAN,
    TMSUCCESS,
    XA_OK,
    XA_RDONLY,
    XAER_NOTA,
    Xid,
)

pytest.importorskip("jpype")
pytestmark = pytest.mark.timeout(120)
FORMAT_ID = 0x494D51
CHILD = Path(__file__).with_name("xa_child.py")


def qname(prefix: str) -> Queue:
    return Queue(f"{prefix}.{uuid.uuid4().hex[:10]}")


def new_xid() -> Xid:
    return Xid(FORMAT_ID, uuid.uuid4().bytes, b"branch-1")


@pytest.fixture(scope="module")
def xacf(activemq):
    factory = naming.lookup("XAConnectionFactory", activemq.jndi())
    assert is_xa_capable(factory)
    return factory


@pytest.fixture(scope="module")
def plain(activemq):
    return naming.lookup("ConnectionFactory", activemq.jndi())


@pytest.fixture
def xaconn(xacf):
    c = xacf.create_xa_connection()
    c.start()
    yield c
    c.close()


def put(plain, queue: Queue, *texts: str) -> None:
    with plain.create_connection() as c:
        producer = c.create_session().create_producer(queue)
        for text in texts:
            producer.send(TextMessage(text))


def take(plain, queue: Queue, wait: float = 1.0) -> list[str]:
    """Everything ``queue`` delivers now (consumed)."""
    with plain.create_connection() as c:
        c.start()
        consumer = c.create_session(False, AckMode.AUTO_ACKNOWLEDGE).create_consumer(queue)
        out = []
        while (m := consumer.receive(wait)) is not None:
            out.append(m.text)
        return out


def in_doubt(resource) -> list[Xid]:
    return [x for x in resource.recover(TMSTARTRSCAN | TMENDRSCAN) if x.format_id == FORMAT_ID]


def test_two_phase_commit_and_rollback(xaconn, plain):
    source, targets = qname("xa.src"), {"commit": qname("xa.dst"), "rollback": qname("xa.dst")}
    put(plain, source, "a", "b")
    for outcome, target in targets.items():
        session = xaconn.create_xa_session()
        resource, xid = session.xa_resource, new_xid()
        resource.start(xid, TMNOFLAGS)
        got = session.create_consumer(source).receive(5)
        session.create_producer(target).send(TextMessage(f"{outcome} {got.text}"))
        resource.end(xid, TMSUCCESS)
        assert resource.prepare(xid) == XA_OK
        assert xid in in_doubt(resource)
        assert take(plain, target, 0.3) == []  # prepared is not committed
        if outcome == "commit":
            resource.commit(xid, False)
        else:
            resource.rollback(xid)
        assert xid not in in_doubt(resource)
        session.close()
    assert take(plain, targets["commit"]) == ["commit a"]
    assert take(plain, targets["rollback"]) == []
    assert take(plain, source) == ["b"]  # the rolled back receive came back


def test_one_phase_commit_and_a_branch_without_work(xaconn, plain):
    target = qname("xa.one")
    session = xaconn.create_xa_session()
    resource, xid = session.xa_resource, new_xid()
    resource.start(xid, TMNOFLAGS)
    session.create_producer(target).send(TextMessage("one phase"))
    resource.end(xid, TMSUCCESS)
    resource.commit(xid, True)
    assert take(plain, target) == ["one phase"]
    idle = new_xid()
    resource.start(idle, TMNOFLAGS)
    resource.end(idle, TMSUCCESS)
    assert resource.prepare(idle) == XA_RDONLY  # ActiveMQ: nothing to commit, already forgotten
    assert idle not in in_doubt(resource)


def test_the_next_transaction_may_begin_before_the_last_commits(xaconn, plain):
    """Our coordinator's order: end T1, start T2 on the same session, then commit T1. ActiveMQ's
    session forgets T1's acknowledgement bookkeeping when T2 starts; the resource holds T2's
    start back until T1 completes, so every unit consumes exactly what it received."""
    source = qname("xa.order")
    put(plain, source, *[str(i) for i in range(6)])
    session = xaconn.create_xa_session()
    resource, consumer = session.xa_resource, session.create_consumer(source)
    xid = new_xid()
    resource.start(xid, TMNOFLAGS)
    for unit in range(3):
        got = [consumer.receive(5).text for _ in range(2)]
        assert got == [str(2 * unit), str(2 * unit + 1)]
        resource.end(xid, TMSUCCESS)
        following = new_xid()
        resource.start(following, TMNOFLAGS)  # before the commit, as the coordinator does
        assert resource.prepare(xid) == XA_OK
        resource.commit(xid, False)
        xid = following
    resource.end(xid, TMSUCCESS)
    resource.rollback(xid)
    session.close()
    assert take(plain, source) == []  # all six consumed, none twice


def test_resource_identity_and_error_codes(xaconn, xacf):
    a, b = xaconn.create_xa_session().xa_resource, xaconn.create_xa_session().xa_resource
    assert a.is_same_rm(b)
    with pytest.raises(XAException) as info:
        a.commit(new_xid(), False)
    assert info.value.errorcode == XAER_NOTA and "XAException" in str(info.value)


def test_recovery_after_our_process_is_killed(activemq, plain, xaconn):
    """A process prepares two branches (each moves one message) and dies by SIGKILL. A new
    process (this one) finds both by recover() and decides: commit one, roll back the other."""
    source, target = qname("xa.crash.src"), qname("xa.crash.dst")
    put(plain, source, "m1", "m2")
    keep, drop = uuid.uuid4().hex, uuid.uuid4().hex
    one_at_a_time = activemq.jndi(**{"java.naming.provider.url": f"{activemq.url}?jms.prefetchPolicy.all=0"})
    child = subprocess.Popen(
        [sys.executable, str(CHILD), repr(one_at_a_time), source.name, target.name, keep, drop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while (line := child.stdout.readline()) and line.strip() != "ready":
            lines.append(line.split())
        assert line.strip() == "ready", child.stderr.read()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    moved = {gtrid: text for _, gtrid, text in lines}
    # Killed between prepare and commit: nothing visible, nothing deliverable.
    assert take(plain, target, 0.5) == [] and take(plain, source, 0.5) == []
    resource = xaconn.create_xa_session().xa_resource
    found = in_doubt(resource)
    keep_xid = Xid(FORMAT_ID, bytes.fromhex(keep), b"branch-1")
    drop_xid = Xid(FORMAT_ID, bytes.fromhex(drop), b"branch-1")
    assert keep_xid in found and drop_xid in found
    resource.commit(keep_xid, False)
    resource.rollback(drop_xid)
    assert not {keep_xid, drop_xid} & set(in_doubt(resource))
    assert take(plain, target) == [f"moved {moved[keep]} in {keep}"]
    assert take(plain, source) == [moved[drop]]  # once and only once, on either side


def test_the_xa_factory_serves_non_transacted_sessions_too(xacf, plain):
    """ActiveMQ's XA connections ignore createSession's ack mode unless xaAckMode is set:
    a CLIENT_ACKNOWLEDGE session from the XAConnectionFactory must work like a plain one
    (a non-transacted link on the same factory as an XA link)."""
    queue = qname("xa.plain")
    put(plain, queue, "a", "b", "c")
    with xacf.create_connection() as conn:
        conn.start()
        session = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(queue)
        got = [consumer.receive(5.0) for _ in range(2)]
        assert [m.text for m in got] == ["a", "b"]
        got[-1].acknowledge()  # CLIENT_ACKNOWLEDGE: both are gone
        auto = conn.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        auto.create_producer(queue).send(TextMessage("d"))  # sent outside any transaction
    assert take(plain, queue) == ["c", "d"]


def test_the_xa_factory_makes_locally_transacted_sessions(xacf, plain):
    """A transacted link whose ends are one ActiveMQ commits locally: the XA factory's plain
    connections (from its plain twin: ActiveMQ's XA connections make only XA sessions) give
    transacted sessions whose consumer and producer commit and roll back together."""
    assert xacf.local_transactions
    source, target = qname("local.src"), qname("local.dst")
    put(plain, source, "a", "b")
    with xacf.create_connection() as conn:
        conn.start()
        session = conn.create_session(True)
        consumer, producer = session.create_consumer(source), session.create_producer(target)
        producer.send(TextMessage(consumer.receive(5.0).text))
        session.rollback()  # neither the receive nor the send happened
        for _ in range(2):
            producer.send(TextMessage(consumer.receive(5.0).text))
            session.commit()
    assert take(plain, target) == ["a", "b"]
    assert take(plain, source) == []
