"""A branch started on one instance is the cluster's, end to end (real `serve` processes on
a real PostgreSQL server; docs/ha.md#xa-branches-across-the-cluster): an XA client prepares
a branch on B1, which is then paused (SIGSTOP) past the monitor interval; a transaction
manager that reconnects to B2 finds the branch with recover() and commits it there (retrying
while it is not applied, as the bridge's coordinator does); the instance that took B1 over
applies it: its sends are delivered once, what it received is gone, and the resumed B1
exits 1 having changed nothing."""

from __future__ import annotations

import signal
import time

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jms import xa as xacodes
from bridgemgr.jms.errors import XAException
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory
from ha_support import MONITOR, PASSWORD, Cluster
from service_support import send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCAN = xacodes.TMSTARTRSCAN | xacodes.TMENDRSCAN


def test_a_commit_through_b2_of_a_paused_b1s_branch_settles_once(tmp_path, postgresql):
    cluster = Cluster(tmp_path / "cluster", postgresql, {})
    b1 = None
    try:
        b1, b2, b3 = (cluster.start(b, "") for b in ("B1", "B2", "B3"))
        send(b1, PASSWORD, "src", "in1", "in2")
        xconn = RemoteConnectionFactory(f"mq://{b1.address}").create_xa_connection("admin", PASSWORD)
        xconn.start()
        session = xconn.create_xa_session()
        resource, xid = session.xa_resource, Xid(9, b"e2e-takeover", b"b1")
        resource.start(xid, xacodes.TMNOFLAGS)
        assert session.create_consumer(Queue("src")).receive(10).text == "in1"
        producer = session.create_producer(Queue("dst"))
        for text in ("out1", "out2"):
            producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)
        resource.end(xid, xacodes.TMSUCCESS)
        assert resource.prepare(xid) == xacodes.XA_OK
        b1.proc.send_signal(signal.SIGSTOP)
        tm = RemoteConnectionFactory(f"mq://{b2.address}").create_xa_connection("admin", PASSWORD)
        try:
            other = tm.create_xa_session().xa_resource
            assert xid in other.recover(SCAN)  # B1's, B1 unreachable
            tries, deadline = [], time.monotonic() + 6 * MONITOR
            while True:  # the coordinator's retry: XAER_RMFAIL while no one applied it
                try:
                    other.commit(xid, False)
                    tries.append("ok")
                    break
                except XAException as exc:
                    tries.append(exc.errorcode)
                    if exc.errorcode == xacodes.XAER_NOTA and len(tries) > 1:
                        break  # applied after the last retry's wait ended: done
                    assert exc.errorcode == xacodes.XAER_RMFAIL and time.monotonic() < deadline, tries
            assert xid not in other.recover(SCAN)
        finally:
            tm.close()
        taker = wait_for(
            lambda: next((b for b in (b2, b3) if b.when("took over broker B1")), None), 4 * MONITOR, "the takeover"
        )
        out = [m.text for m in take(taker, PASSWORD, "dst", 2)]
        out += [m.text for m in take(b2 if taker is b3 else b3, PASSWORD, "dst", 0)]
        assert sorted(out) == ["out1", "out2"], (out, tries)
        assert [m.text for m in take(taker, PASSWORD, "src", 1)] == ["in2"]
        b1.proc.send_signal(signal.SIGCONT)
        assert b1.proc.wait(6 * MONITOR) == 1
        assert [m.text for m in take(taker, PASSWORD, "dst", 0)] == []  # B1 resumed added nothing
    finally:
        if b1 is not None and b1.proc.poll() is None:
            b1.proc.send_signal(signal.SIGCONT)
        cluster.stop()
