"""An HA cluster's XA branches as one resource manager's (real PostgreSQL, in-process
instances; docs/ha.md#xa-branches-across-the-cluster): a branch prepared on B1 is listed by
recover() on B2 and committed or rolled back through B2's XAResource, once; an unknown
xid is XAER_NOTA anywhere; a branch whose instance was taken over is settled by the taker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms import xa as xacodes
from bridgemgr.jms.errors import XAException
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded.clusterxa import DECISIONS, open_cluster_xa
from clusterdst_support import Member, cluster_members, take_over, texts_of
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SRC, DST = Queue("src"), Queue("dst")


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def _serve_xa(member: Member, stack: ExitStack) -> Member:
    stack.callback(open_cluster_xa(member.cluster, member.host.broker).stop)
    return member


def _resource(member: Member, stack: ExitStack) -> Any:
    conn = member.host.connection_factory().create_xa_connection()
    stack.callback(conn.close)
    conn.start()
    return conn.create_xa_session().xa_resource


def _prepare_on(member: Member, stack: ExitStack, xid: Xid) -> None:
    """On ``member``: src holds in1, in2; a branch receives in1, sends out1, out2 to dst
    and is prepared."""
    conn = member.connection(stack)
    conn.create_session().create_producer(SRC).send(TextMessage("in1"))
    conn.create_session().create_producer(SRC).send(TextMessage("in2"))
    xconn = member.host.connection_factory().create_xa_connection()
    stack.callback(xconn.close)
    xconn.start()
    session = xconn.create_xa_session()
    resource = session.xa_resource
    resource.start(xid, xacodes.TMNOFLAGS)
    assert session.create_consumer(SRC).receive(5).text == "in1"
    producer = session.create_producer(DST)
    producer.send(TextMessage("out1"))
    producer.send(TextMessage("out2"))
    resource.end(xid, xacodes.TMSUCCESS)
    assert resource.prepare(xid) == xacodes.XA_OK


def _decisions(member: Member) -> list[Any]:
    return member.cluster._transaction(lambda cur: cur.execute(f"SELECT xid FROM {DECISIONS}").fetchall())


def _drain(member: Member, stack: ExitStack, queue: Queue, settle: float = 1.0) -> list[Any]:
    """Every message ``member``'s consumer of ``queue`` gets until none came for ``settle`` s."""
    consumer = member.connection(stack).create_session().create_consumer(queue)
    got: list[Any] = []

    def more() -> int:
        while (message := consumer.receive(0.05)) is not None:
            got.append(message)
        return len(got)

    quiet_for(more, settle, 30, f"{queue.name} on {member.brokerid}")
    return got


def test_a_branch_prepared_on_b1_is_recovered_and_committed_through_b2(members):
    start, stack = members
    b1, b2 = (_serve_xa(start(b), stack) for b in ("B1", "B2"))
    xid = Xid(7, b"g-commit", b"b1")
    _prepare_on(b1, stack, xid)
    resource = _resource(b2, stack)
    assert xid in resource.recover(xacodes.TMSTARTRSCAN | xacodes.TMENDRSCAN)
    resource.commit(xid, False)
    # settled when commit returned: nothing in doubt anywhere, the decision row gone
    assert xid not in resource.recover(xacodes.TMSTARTRSCAN | xacodes.TMENDRSCAN)
    assert xid not in _resource(b1, stack).recover(xacodes.TMSTARTRSCAN | xacodes.TMENDRSCAN)
    assert _decisions(b2) == []
    out: list[str] = []
    texts_of(b2.connection(stack).create_session().create_consumer(DST), out, 2, 10)  # (handed to B2)
    assert sorted(out) == ["out1", "out2"]
    assert [m.text for m in _drain(b1, stack, DST)] == []  # once
    assert [m.text for m in _drain(b1, stack, SRC)] == ["in2"]  # in1 was received in the branch
    with pytest.raises(XAException) as again:  # a retry after it was applied
        resource.commit(xid, False)
    assert again.value.errorcode == xacodes.XAER_NOTA


def test_a_branch_prepared_on_b1_rolled_back_through_b2_redelivers_what_it_received(members):
    start, stack = members
    b1, b2 = (_serve_xa(start(b), stack) for b in ("B1", "B2"))
    xid = Xid(7, b"g-rollback", b"b1")
    _prepare_on(b1, stack, xid)
    _resource(b2, stack).rollback(xid)
    assert _decisions(b2) == []
    got = _drain(b1, stack, SRC)
    assert [(m.text, m.redelivered) for m in got] == [("in1", True), ("in2", False)]
    assert [m.text for m in _drain(b2, stack, DST, settle=0.5)] == []
    assert xid not in _resource(b1, stack).recover(xacodes.TMSTARTRSCAN | xacodes.TMENDRSCAN)


def test_an_unknown_xid_is_xaer_nota_on_every_instance(members):
    start, stack = members
    b1, b2 = (_serve_xa(start(b), stack) for b in ("B1", "B2"))
    xid = Xid(7, b"nobody", b"")
    for member in (b1, b2):
        resource = _resource(member, stack)
        for call in (lambda r=resource: r.commit(xid, False), lambda r=resource: r.rollback(xid)):
            with pytest.raises(XAException, match=r"unknown branch .* \(prepared on no instance of HA") as caught:
                call()
            assert caught.value.errorcode == xacodes.XAER_NOTA
    assert _decisions(b1) == []


def test_a_commit_through_b2_of_a_stalled_b1s_branch_is_applied_by_its_taker(members):
    start, stack = members
    b1, b2, b3 = start("B1"), _serve_xa(start("B2"), stack), _serve_xa(start("B3"), stack)
    xid = Xid(7, b"g-takeover", b"b1")
    _prepare_on(b1, stack, xid)  # B1 applies nothing (no ha-xa thread: as if stopped)
    resource = _resource(b2, stack)
    outcome: list[Any] = []

    def commit() -> None:
        try:
            resource.commit(xid, False)
            outcome.append("ok")
        except XAException as exc:
            outcome.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    wait_for(lambda: _decisions(b2), 10, "the decision recorded")
    b1.cluster.halt()
    b1.cluster._transaction(
        lambda cur: cur.execute(
            "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 s' WHERE brokerid = 'B1'"
        )
    )
    assert take_over(b3) == ("B1", [])
    committer.join(30)
    assert outcome == ["ok"]
    assert _decisions(b2) == []
    out: list[str] = []
    texts_of(b3.connection(stack).create_session().create_consumer(DST), out, 2, 10)
    assert sorted(out) == ["out1", "out2"]
    assert [m.text for m in _drain(b3, stack, SRC)] == ["in2"]
