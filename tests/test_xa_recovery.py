"""XA recovery on real embedded brokers: what a crashed coordinator leaves behind (prepared
branches with and without a logged decision, in persistent stores reopened) is committed or
rolled back; this run's transactions in flight and other bridges' branches are left alone;
an unreachable resource manager is retried in the background until it answers; settled
commit records are forgotten after a clean pass; RM registration follows the chapter."""

from __future__ import annotations

import logging

import pytest

from bridgemgr.jms import Queue, TextMessage, xa
from bridgemgr.jms.errors import NamingException, XAException
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.xa.coordinator import FORMAT_ID, Coordinator, Faults, make_gtrid
from bridgemgr.xa.recovery import Decision, Recovery, decide
from bridgemgr.xa.registry import BridgeTransactions, FactoryEntry, ResourceManager, registration, rm_name
from bridgemgr.xa.txlog import CommitRecord, FileTxLog, MemoryTxLog, Participant
from jmsbridge_support import wait_until
from stores import fill

SRC, DST = Queue("src"), Queue("dst")
LOG = logging.getLogger("test.recovery")


def put(broker: Broker, dest: Queue, *texts: str) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    producer = conn.create_session().create_producer(dest)
    for t in texts:
        producer.send(TextMessage(t))
    conn.close()


def take(broker: Broker, dest: Queue) -> list[str]:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(dest)
    out = []
    while (m := consumer.receive(0.05)) is not None:
        out.append(m.text)
    conn.close()
    return out


def prepared_move(a: Broker, b: Broker, gtrid: bytes) -> tuple[Xid, Xid]:
    """Leave one message moved a -> b in two prepared branches of ``gtrid``: what a crash
    between prepare and commit leaves."""
    xa_, xb = Xid(FORMAT_ID, gtrid, b"src#1"), Xid(FORMAT_ID, gtrid, b"dst#2")
    sa = EmbeddedConnectionFactory(a).create_xa_connection()
    sa.start()
    sb = EmbeddedConnectionFactory(b).create_xa_connection()
    s1, s2 = sa.create_xa_session(), sb.create_xa_session()
    s1.xa_resource.start(xa_, 0)
    s2.xa_resource.start(xb, 0)
    s2.create_producer(DST).send(s1.create_consumer(SRC).receive(1))
    s1.xa_resource.end(xa_, 0x04000000)
    s2.xa_resource.end(xb, 0x04000000)
    s1.xa_resource.prepare(xa_)
    s2.xa_resource.prepare(xb)
    sa.close()
    sb.close()
    return xa_, xb


def rms_for(bridge: str, **brokers: Broker) -> list[ResourceManager]:
    return [ResourceManager(rm_name(bridge, ref), ref, EmbeddedConnectionFactory(b)) for ref, b in brokers.items()]


def test_decisions():
    c = Coordinator("b", MemoryTxLog(), Faults(""))
    mine = c.begin()
    old = make_gtrid(b"b", b"oldboot", 1)
    live = {old: CommitRecord(old, ())}
    assert decide(Xid(FORMAT_ID, old, b"x"), c, live) is Decision.COMMIT
    assert decide(Xid(FORMAT_ID, make_gtrid(b"b", b"oldboot", 2), b"x"), c, live) is Decision.ROLLBACK
    assert decide(Xid(FORMAT_ID, mine.gtrid, b"x"), c, live) is Decision.IN_FLIGHT
    assert decide(Xid(FORMAT_ID, make_gtrid(b"other", b"o", 1), b"x"), c, live) is Decision.NOT_OURS
    assert decide(Xid(99, old, b"x"), c, live) is Decision.NOT_OURS


def test_a_crashed_run_is_recovered_after_the_brokers_restart(tmp_path):
    a, b = Broker(tmp_path / "a", sync=True), Broker(tmp_path / "b", sync=True)
    put(a, SRC, "decided", "undecided")
    decided = make_gtrid(b"b", b"deadbeef", 1)
    undecided = make_gtrid(b"b", b"deadbeef", 2)
    x1 = prepared_move(a, b, decided)
    prepared_move(a, b, undecided)
    log = FileTxLog(tmp_path / "txlog.b")
    log.open()
    log.log_commit(CommitRecord(decided, (Participant("b:a", x1[0]), Participant("b:b", x1[1]))))
    log.close()
    a.close()
    b.close()  # the crash: only what is durable is left

    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    assert len(a.xa_recover()) == 2 and len(b.xa_recover()) == 2
    log = FileTxLog(tmp_path / "txlog.b")
    log.open()
    c = Coordinator("b", log, Faults(""))
    recovery = Recovery(c, rms_for("b", a=a, b=b), LOG)
    assert recovery.start() is True
    assert [(len(r.committed), len(r.rolled_back)) for r in recovery.last] == [(1, 1), (1, 1)]
    assert a.xa_recover() == [] and b.xa_recover() == []
    assert take(b, DST) == ["decided"] and take(a, SRC) == ["undecided"]
    assert log.live() == {}  # settled and forgotten after the clean pass
    recovery.close()
    c.close()
    a.close()
    b.close()


def test_a_decision_is_kept_until_every_rm_has_written_its_commit(tmp_path):
    """A's commit is made in memory but its store cannot write it (full; a database
    outage is the same): recovery keeps the decision and commits A again until the write
    is done, then forgets it. Before, A's branch left its recover() list at once, the pass
    forgot the decision, and a crash before A's write brought the branch back prepared
    with no decision: rolled back, its message came back, already committed at B."""
    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    put(a, SRC, "m")
    gtrid = make_gtrid(b"b", b"cafe", 1)
    xa_, xb = prepared_move(a, b, gtrid)
    log = MemoryTxLog()
    log.open()
    log.log_commit(CommitRecord(gtrid, (Participant("b:a", xa_), Participant("b:b", xb))))
    assert a.store is not None
    fill(a)  # A's next writes fail
    db = a.store.database._db  # type: ignore[attr-defined]
    with pytest.raises(XAException) as failed:
        a.xa_commit(xa_, False)
    assert failed.value.errorcode == xa.XAER_RMFAIL
    b.xa_commit(xb, False)
    c = Coordinator("b", log, Faults(""))
    recovery = Recovery(c, rms_for("b", a=a, b=b), LOG)
    assert recovery.run_pass() is False  # A's commit still cannot be written
    assert gtrid in log.live()  # so the decision stays
    db.execute("PRAGMA max_page_count=1000000")
    wait_until(lambda: not a.store.full)  # type: ignore[union-attr]
    assert recovery.run_pass() is True
    assert log.live() == {} and a.xa_recover() == []
    recovery.close()
    c.close()
    a.close()
    a = Broker(tmp_path / "a")
    assert take(a, SRC) == [] and take(b, DST) == ["m"] and a.xa_recover() == []
    a.close()
    b.close()


def test_in_flight_and_foreign_branches_are_left_alone(tmp_path):
    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    put(a, SRC, "mine", "foreign")
    log = FileTxLog(tmp_path / "txlog.b")
    log.open()
    c = Coordinator("b", log, Faults(""))
    tx = c.begin()  # this run's, prepared, not yet decided
    prepared_move(a, b, tx.gtrid)
    foreign = prepared_move(a, b, make_gtrid(b"another-bridge", b"1", 1))
    recovery = Recovery(c, rms_for("b", a=a, b=b), LOG)
    recovery.run_pass()
    assert [len(r.in_flight) for r in recovery.last] == [1, 1]
    assert len(a.xa_recover()) == 2 and foreign[0] in a.xa_recover()
    for xid in a.xa_recover() + b.xa_recover():
        (a if xid in a.xa_recover() else b).xa_rollback(xid)
    tx.rollback()
    c.close()
    a.close()
    b.close()


class Later:
    """A broker that is not there yet (as an RM that is down at bridge start)."""

    def __init__(self) -> None:
        self.broker: Broker | None = None

    def get(self) -> Broker:
        if self.broker is None:
            raise NamingException("the broker is not running")
        return self.broker


def test_an_unreachable_rm_is_retried_without_failing(tmp_path):
    a, b = Broker(tmp_path / "a", sync=True), Broker(tmp_path / "b", sync=True)
    put(a, SRC, "m")
    gtrid = make_gtrid(b"b", b"old", 1)
    x = prepared_move(a, b, gtrid)
    log = FileTxLog(tmp_path / "txlog.b")
    log.open()
    log.log_commit(CommitRecord(gtrid, (Participant("b:a", x[0]), Participant("b:b", x[1]))))
    b.close()  # b is down when the bridge starts
    later = Later()
    c = Coordinator("b", log, Faults(""))
    rms = [
        ResourceManager("b:a", "a", EmbeddedConnectionFactory(a)),
        ResourceManager("b:b", "b", EmbeddedConnectionFactory(later.get)),
    ]
    recovery = Recovery(c, rms, LOG, interval=0.02)
    assert recovery.start() is False  # a is done, b is retried later
    assert a.xa_recover() == [] and recovery.pending
    assert gtrid in log.live()  # not forgotten while b may still hold a branch
    later.broker = b = Broker(tmp_path / "b")  # b comes back
    wait_until(lambda: not recovery.pending and b.xa_recover() == [], 10, "recovery of b")
    assert take(b, DST) == ["m"] and take(a, SRC) == []
    wait_until(lambda: log.live() == {}, 5, "the record forgotten")
    recovery.close()
    c.close()
    a.close()
    b.close()


def test_registration_follows_the_chapter():
    xa_factory = EmbeddedConnectionFactory(lambda: None)  # never connected here
    assert registration(False, xa_factory) is None
    assert "multi-rm" in registration(True, xa_factory)
    assert "not an XAConnectionFactory" in registration(False, object())
    assert rm_name("bridge1", "cf1") == "bridge1:cf1"


def test_bridge_transactions_register_and_recover_before_returning(tmp_path, caplog):
    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    put(a, SRC, "m")
    gtrid = make_gtrid(b"br", b"old", 1)
    prepared_move(a, b, gtrid)  # undecided: rolled back
    caplog.set_level(logging.INFO)
    entries = [
        FactoryEntry("a", False, EmbeddedConnectionFactory(a)),
        FactoryEntry("b", False, EmbeddedConnectionFactory(b)),
        FactoryEntry("b-all", True, EmbeddedConnectionFactory(b)),
    ]
    xa = BridgeTransactions.start("br", entries, tmp_path / "var", {"txlogSync": "false"}, LOG)
    assert [rm.name for rm in xa.rms] == ["br:a", "br:b"]
    assert 'connection-factory b-all: multi-rm="true": not registered' in caplog.text
    assert a.xa_recover() == [] and b.xa_recover() == [] and take(a, SRC) == ["m"]
    assert (tmp_path / "var" / "txlog.br").exists()
    assert xa.coordinator.txlog.settings.sync is False
    xa.close()
    a.close()
    b.close()
