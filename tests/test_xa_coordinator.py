"""The XA coordinator on real embedded brokers: our Xid format, two-phase commit across two
brokers (logged), one-phase when both ends are one resource manager (not logged), read-only
votes, a "no" vote or a failed log write rolling everything back, a commit phase that
cannot reach an RM (in doubt, for recovery), heuristic and lost one-phase outcomes, the
state tables and their guards, and the fault hook."""

from __future__ import annotations

import threading
import time

import pytest

from bridgemgr.jms import Queue, TextMessage, xa
from bridgemgr.jms.errors import (
    HeuristicMixedException,
    IllegalStateException,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from bridgemgr.jms.spi import XAResource
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.xa.coordinator import (
    BRANCH_TRANSITIONS,
    FINISHED,
    FORMAT_ID,
    TX_TRANSITIONS,
    Branch,
    BranchEvent,
    BranchState,
    Coordinator,
    FaultPoint,
    Faults,
    TxState,
    branch_qualifier,
    gtrid_owner,
    is_ours,
    make_gtrid,
    name_tag,
)
from bridgemgr.xa.recovery import Recovery, RecoverySource
from bridgemgr.xa.txlog import CommitRecord, FileTxLog, Participant, TxLogFull, TxLogSettings
from waiting import wait_for

SRC, DST = Queue("src"), Queue("dst")


@pytest.fixture
def brokers(tmp_path):
    a, b = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def coordinator(tmp_path):
    log = FileTxLog(tmp_path / "txlog.b", TxLogSettings(sync=False))
    log.open()
    c = Coordinator("b", log, Faults(""))
    yield c
    c.close()


class End:
    """One end of a link: an XA session on a broker, its consumer and producer."""

    def __init__(self, broker: Broker) -> None:
        self.conn = EmbeddedConnectionFactory(broker).create_xa_connection()
        self.conn.start()
        self.session = self.conn.create_xa_session()
        self.resource = self.session.xa_resource
        self.consumer = self.session.create_consumer(SRC)
        self.producer = self.session.create_producer(DST)


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


def move(coordinator: Coordinator, source: End, target: End, n: int = 1):
    """What a transacted link does: enlist both ends, receive n, send them on."""
    tx = coordinator.begin()
    tx.enlist(source.resource, "b:src", "src")
    tx.enlist(target.resource, "b:dst", "dst")
    for _ in range(n):
        target.producer.send(source.consumer.receive(1))
    return tx


class Failing(XAResource):
    """A real XA resource whose chosen calls fail as an unreachable (or otherwise failing)
    resource manager's would."""

    def __init__(self, inner: XAResource, fail: dict[str, int]) -> None:
        self.inner, self.fail = inner, fail

    def _call(self, name, *args):
        code = self.fail.pop(name, None)
        if code is not None:
            raise XAException(f"{name}: simulated", code)
        return getattr(self.inner, name)(*args)

    def start(self, xid, flags=0):
        return self._call("start", xid, flags)

    def end(self, xid, flags):
        return self._call("end", xid, flags)

    def prepare(self, xid):
        return self._call("prepare", xid)

    def commit(self, xid, one_phase):
        return self._call("commit", xid, one_phase)

    def rollback(self, xid):
        return self._call("rollback", xid)

    def recover(self, flags):
        return self.inner.recover(flags)

    def forget(self, xid):
        return self._call("forget", xid)

    def is_same_rm(self, other):
        return self.inner.is_same_rm(getattr(other, "inner", other))


# --- our Xid format ---------------------------------------------------------------------------


def test_xids_name_the_bridge_and_never_repeat(coordinator):
    tx1, tx2 = coordinator.begin(), coordinator.begin()
    assert tx1.gtrid != tx2.gtrid
    tag, boot = gtrid_owner(tx1.gtrid)
    assert tag == b"b" and boot == coordinator.boot
    assert Coordinator("b", coordinator.txlog).boot != coordinator.boot  # per start
    x = Xid(FORMAT_ID, tx1.gtrid, branch_qualifier("src", 1))
    assert is_ours(x, b"b") and coordinator.is_ours(x)
    assert not is_ours(Xid(FORMAT_ID, make_gtrid(b"bb", b"1", 1), b""), b"b")
    assert not is_ours(Xid(FORMAT_ID + 1, tx1.gtrid, b""), b"b")
    assert not is_ours(Xid(FORMAT_ID, b"b-no-separator", b""), b"b")
    tx1.rollback()
    tx2.rollback()


def test_long_names_are_shortened_with_a_hash():
    long = "x" * 200
    tag = name_tag(long)
    assert len(tag) == 32 and tag != name_tag("x" * 199)
    gtrid = make_gtrid(tag, b"0123456789abcdef", 2**48)
    assert len(gtrid) <= 64 and gtrid_owner(gtrid)[0] == tag
    assert len(branch_qualifier("r" * 100, 12)) <= 64


# --- completion paths -----------------------------------------------------------------------------


def test_two_phase_commit_across_brokers_is_logged_then_forgotten(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m1", "m2")
    src, dst = End(a), End(b)
    tx = move(coordinator, src, dst, 2)
    assert len(tx.branches) == 2 and tx.branches[0].xid.bqual == b"src#1"
    tx.end()
    tx.commit()
    assert tx.state is TxState.COMMITTED and tx.logged
    assert [br.state for br in tx.branches] == [BranchState.COMMITTED] * 2
    assert take(b, DST) == ["m1", "m2"] and take(a, SRC) == []
    record = coordinator.txlog.live()[tx.gtrid]  # forgotten with the next record only
    assert [p.rm for p in record.participants] == ["b:src", "b:dst"]
    coordinator.flush()
    assert coordinator.txlog.live() == {} and not coordinator.in_flight(tx.gtrid)


class Remote(Failing):
    """The same resource as a remote RM's (not in_process); records the threads it ran in."""

    in_process = False

    def __init__(self, inner: XAResource) -> None:
        super().__init__(inner, {})
        self.threads: list[str] = []

    def _call(self, name, *args):
        self.threads.append(threading.current_thread().name)
        return super()._call(name, *args)


@pytest.mark.parametrize("remote", [False, True])
def test_in_process_branches_complete_in_the_link_thread_remote_ones_in_the_pool(brokers, coordinator, remote):
    """A hand-off to the pool costs more than an embedded broker's prepare or commit; the
    round trips of remote RMs overlap there."""
    a, b = brokers
    put(a, SRC, "m1")
    src, dst = End(a), End(b)
    seen, target = Remote(src.resource), Remote(dst.resource)
    seen.in_process = target.in_process = not remote
    tx = coordinator.begin()
    tx.enlist(seen, "b:src", "src")
    tx.enlist(target, "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    tx.end()
    tx.commit()
    assert tx.state is TxState.COMMITTED and take(b, DST) == ["m1"]
    here = threading.current_thread().name
    assert set(seen.threads) == {here}  # the first branch: always in the link's thread
    expected = {f"xa {coordinator.bridge}"} if remote else {here}
    assert {t.rsplit("_", 1)[0] for t in target.threads[2:]} == expected  # prepare, commit


class Meeting(Remote):
    """A remote resource whose end() waits until every other one's end() has begun."""

    def __init__(self, inner: XAResource, meeting: threading.Barrier) -> None:
        super().__init__(inner)
        self.meeting = meeting

    def end(self, xid, flags):
        self.meeting.wait()
        return super().end(xid, flags)


@pytest.mark.parametrize("same_rm", [True, False])
def test_remote_associations_end_at_the_same_time(brokers, coordinator, same_rm):
    """Each association of a remote resource is its own connection: ending the source's
    and the target's (joined to the source's branch, or a branch of its own) costs one
    round trip, not one after the other."""
    a, b = brokers
    put(a, SRC, "m1")
    meeting = threading.Barrier(2, timeout=5)
    src, dst = End(a), End(a if same_rm else b)
    source, target = Meeting(src.resource, meeting), Meeting(dst.resource, meeting)
    tx = coordinator.begin()
    tx.enlist(source, "b:src", "src")
    tx.enlist(target, "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    tx.end()
    assert tx.state is TxState.ENDED and len(tx.branches) == (1 if same_rm else 2)
    assert all(b.state is BranchState.ENDED and not b.associated for b in tx.branches)
    tx.commit()
    assert take(a if same_rm else b, DST) == ["m1"] and take(a, SRC) == []
    assert source.threads[1] == threading.current_thread().name  # the first: this thread
    assert target.threads[1].startswith(f"xa {coordinator.bridge}")


def test_one_resource_manager_joins_one_branch_and_commits_in_one_phase(brokers, coordinator):
    a, _ = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(a)  # two connections, one broker
    tx = move(coordinator, src, dst)
    assert len(tx.branches) == 1 and tx.branches[0].associated == [src.resource, dst.resource]
    tx.commit()
    assert tx.state is TxState.COMMITTED and not tx.logged
    assert coordinator.counts["logged"] == 0 and coordinator.txlog.live() == {}
    assert take(a, DST) == ["m"] and take(a, SRC) == []


def test_a_read_only_vote_drops_its_branch_and_the_log_record(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(dst.resource, "b:dst", "dst")
    src.consumer.receive(1)  # consumed, nothing sent: the target did no work
    tx.commit()
    assert [br.state for br in tx.branches] == [BranchState.COMMITTED, BranchState.READ_ONLY]
    assert not tx.logged and coordinator.counts["logged"] == 0
    assert take(a, SRC) == []


def test_nothing_done_anywhere_commits_without_a_word(brokers, coordinator):
    a, b = brokers
    tx = coordinator.begin()
    tx.enlist(End(a).resource, "b:src", "src")
    tx.enlist(End(b).resource, "b:dst", "dst")
    tx.commit()
    assert tx.state is TxState.COMMITTED and not tx.logged


def test_a_no_vote_rolls_every_branch_back(brokers, coordinator):
    a, b = brokers
    b.configure_destination(DST, DestinationLimits(max_num_msgs=1))
    put(b, DST, "already there")
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = move(coordinator, src, dst)
    with pytest.raises(TransactionRolledBackException, match="prepare of b:dst"):
        tx.commit()
    assert tx.state is TxState.ROLLED_BACK and not tx.logged
    assert [br.state for br in tx.branches] == [BranchState.ROLLED_BACK] * 2
    assert take(a, SRC) == ["m"] and take(b, DST) == ["already there"]
    assert a.xa_recover() == [] and b.xa_recover() == []


def test_a_failed_log_write_rolls_back_prepared_branches(brokers, tmp_path):
    a, b = brokers
    log = FileTxLog(tmp_path / "small", TxLogSettings(size=4096, sync=False))
    log.open()
    coordinator = Coordinator("b", log, Faults(""))
    filler = coordinator.begin().gtrid  # live records nobody forgets fill the log
    with pytest.raises(TxLogFull):
        for n in range(100):
            g = filler + b"%d" % n
            log.log_commit(CommitRecord(g, (Participant("x", Xid(1, g, b"x")),)))
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = move(coordinator, src, dst)
    with pytest.raises(TxLogFull):
        tx.commit()
    assert tx.state is TxState.ROLLED_BACK and not coordinator.in_flight(tx.gtrid)
    assert take(a, SRC) == ["m"] and take(b, DST) == []
    assert a.xa_recover() == [] and b.xa_recover() == []  # nothing left in doubt
    log.close()


def test_a_failed_rollback_of_a_prepared_branch_schedules_recovery(brokers, tmp_path):
    """The decision cannot be logged, so both prepared branches roll back; the target's
    rollback fails (unreachable): a recovery pass soon rolls it back, not the next start."""
    a, b = brokers
    log = FileTxLog(tmp_path / "small", TxLogSettings(size=4096, sync=False))
    log.open()
    coordinator = Coordinator("b", log, Faults(""))
    filler = coordinator.begin().gtrid
    with pytest.raises(TxLogFull):
        for n in range(100):
            g = filler + b"%d" % n
            log.log_commit(CommitRecord(g, (Participant("x", Xid(1, g, b"x")),)))

    class Target(RecoverySource):
        name = "b:dst"

        def resource(self) -> XAResource:
            return EmbeddedConnectionFactory(b).create_xa_connection().create_xa_session().xa_resource

    recovery = Recovery(coordinator, [Target()], interval=0.05)
    try:
        put(a, SRC, "m")
        src, dst = End(a), End(b)
        tx = coordinator.begin()
        tx.enlist(src.resource, "b:src", "src")
        tx.enlist(Failing(dst.resource, {"rollback": xa.XAER_RMFAIL}), "b:dst", "dst")
        dst.producer.send(src.consumer.receive(1))
        with pytest.raises(TxLogFull):
            tx.commit()
        assert tx.state is TxState.ROLLED_BACK
        assert take(a, SRC) == ["m"]  # back at the source
        wait_for(lambda: not b.xa_recover(), 10, "b's in-doubt branches resolved")
        assert b.xa_recover() == [] and take(b, DST) == []
    finally:
        recovery.close()
        log.close()


def test_an_unreachable_rm_in_the_commit_phase_leaves_the_transaction_in_doubt(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    asked = []
    coordinator.on_in_doubt = asked.append
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(Failing(dst.resource, {"commit": xa.XAER_RMFAIL}), "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    tx.commit()  # decided: the link goes on
    assert tx.state is TxState.IN_DOUBT and asked == [["b:dst"]]
    assert [br.state for br in tx.branches] == [BranchState.COMMITTED, BranchState.IN_DOUBT]
    coordinator.flush()
    assert tx.gtrid in coordinator.txlog.live()  # kept for recovery
    assert b.xa_recover() == [tx.branches[1].xid]
    assert not coordinator.in_flight(tx.gtrid)


def test_a_heuristic_rollback_is_reported(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    failing = Failing(dst.resource, {"commit": xa.XA_HEURRB, "forget": xa.XAER_NOTA})
    tx.enlist(failing, "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    with pytest.raises(HeuristicMixedException, match="b:dst"):
        tx.commit()
    assert tx.state is TxState.COMMITTED  # the decision stands; the branch said otherwise
    b.xa_rollback(tx.branches[1].xid)


def test_a_lost_one_phase_answer_is_unknown_and_a_transport_error(brokers, coordinator):
    a, _ = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(a)
    tx = coordinator.begin()
    tx.enlist(Failing(src.resource, {"commit": xa.XAER_RMFAIL}), "b:src", "src")
    tx.enlist(dst.resource, "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    with pytest.raises(TransportException, match="one-phase commit"):
        tx.commit()
    assert tx.state is TxState.UNKNOWN and not coordinator.in_flight(tx.gtrid)
    tx.rollback()  # finished: nothing to do
    a.xa_rollback(tx.branches[0].xid)


def test_ending_fails_rolls_back_and_is_a_transport_error_when_unreachable(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(Failing(dst.resource, {"end": xa.XAER_RMFAIL}), "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    with pytest.raises(TransportException, match="ending"):
        tx.end()
    assert tx.state is TxState.ROLLED_BACK
    assert take(a, SRC) == ["m"]


def test_rollback_returns_the_messages(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = move(coordinator, src, dst)
    tx.rollback()
    assert tx.state is TxState.ROLLED_BACK and not coordinator.in_flight(tx.gtrid)
    assert take(a, SRC) == ["m"] and take(b, DST) == []


def test_a_released_resource_leaves_with_its_empty_branch(brokers, coordinator):
    a, b = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(dst.resource, "b:dst", "dst")
    tx.release(dst.resource)  # a pooled target going back while the link is idle
    assert len(tx.branches) == 1
    again = End(b)
    tx.enlist(again.resource, "b:dst", "dst")  # the target comes back for a message
    again.producer.send(src.consumer.receive(1))
    tx.commit()
    assert tx.branches[1].xid.bqual == b"dst#2"
    assert take(b, DST) == ["m"]


def test_a_joined_resource_released_leaves_the_branch_to_the_others(brokers, coordinator):
    a, _ = brokers
    put(a, SRC, "m")
    src, dst = End(a), End(a)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(dst.resource, "b:dst", "dst")
    tx.release(dst.resource)
    assert len(tx.branches) == 1 and tx.branches[0].associated == [src.resource]
    src.consumer.receive(1)
    tx.commit()
    assert take(a, SRC) == []


# --- state tables and guards -------------------------------------------------------------------


def test_guards_name_the_state(brokers, coordinator):
    a, _ = brokers
    tx = coordinator.begin()
    tx.enlist(End(a).resource, "b:src", "src")
    tx.end()
    with pytest.raises(IllegalStateException, match="cannot enlist while ENDED"):
        tx.enlist(End(a).resource, "b:dst", "dst")
    tx.commit()
    with pytest.raises(IllegalStateException, match="cannot end while COMMITTED"):
        tx.end()
    with pytest.raises(IllegalStateException, match="cannot commit while COMMITTED"):
        tx.commit()
    branch = Branch(Xid(1, b"g", b""), "rm", End(a).resource, state=BranchState.PREPARED)
    with pytest.raises(IllegalStateException, match="cannot vote ok while PREPARED"):
        branch.fire(BranchEvent.VOTE_OK)


def test_the_tables_are_closed():
    for table, states in ((BRANCH_TRANSITIONS, BranchState), (TX_TRANSITIONS, TxState)):
        for state, moves in table.items():
            assert set(moves.values()) <= set(states), state
    assert not FINISHED & set(TX_TRANSITIONS)  # nothing leaves a finished transaction
    for state in (BranchState.COMMITTED, BranchState.ROLLED_BACK, BranchState.READ_ONLY):
        assert state not in BRANCH_TRANSITIONS


# --- the fault hook --------------------------------------------------------------------------------


def test_the_fault_hook_parses_and_pauses():
    faults = Faults("logged:pause:0.05, prepared:kill:0")
    start = time.monotonic()
    faults.hit(FaultPoint.LOGGED)
    faults.hit(FaultPoint.PREPARED)  # probability 0: never
    faults.hit(FaultPoint.COMMITTED_ONE)  # not configured
    assert time.monotonic() - start >= 0.05
    with pytest.raises(ValueError, match="unknown action"):
        Faults("logged:explode")
    with pytest.raises(ValueError):
        Faults("nowhere:kill")
