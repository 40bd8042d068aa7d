"""The commit phase behind the link (bridgemgr/xa/completer.py), on two real embedded
brokers: deferred transactions commit in order with their records logged; a failure rolls
back it and everything after it (the messages come back in order) until reset(); only
in-process resource managers are deferred; a group of records costs one sync."""

from __future__ import annotations

import os
import threading

import pytest

from bridgemgr.jms import xa
from bridgemgr.jms.errors import HeuristicMixedException, TransactionRolledBackException
from bridgemgr.xa.completer import Completer, Outcome
from bridgemgr.xa.coordinator import Coordinator, Faults, TxState
from bridgemgr.xa.recovery import Recovery
from bridgemgr.xa.txlog import CommitRecord, FileTxLog, MemoryTxLog, Participant, TxLogError, TxLogSettings
from jmsbridge_support import wait_until
from test_xa_coordinator import DST, SRC, End, Failing, Remote, brokers, put, take  # noqa: F401

pytestmark = pytest.mark.timeout(60)


class FlakyLog(MemoryTxLog):
    """Refuses its next ``fail`` writes of commit records (a disk error)."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.fail = fail

    def log_commits(self, records, forget=()):
        if self.fail:
            self.fail -= 1
            raise TxLogError("simulated write error")
        super().log_commits(records, forget)


@pytest.fixture
def completing(brokers):  # noqa: F811  (the imported fixture)
    """Two brokers, a coordinator with a memory log, and a completer (closed after)."""
    coordinator = Coordinator("b", MemoryTxLog(), Faults(""))
    completer = Completer(coordinator, "l")
    yield (*brokers, coordinator, completer)


def deferred(coordinator: Coordinator, completer: Completer, src: End, dst: End, source=None, target=None) -> object:
    """One message moved in a transaction handed to ``completer`` once prepared."""
    tx = coordinator.begin()
    tx.enlist(source or src.resource, "b:src", "src")
    tx.enlist(target or dst.resource, "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    tx.end()
    assert tx.commit(defer=completer) is False
    return tx


def test_deferred_transactions_commit_in_order_with_their_records_logged(completing):
    a, b, coordinator, completer = completing
    put(a, SRC, *[f"m{i}" for i in range(20)])
    src, dst = End(a), End(b)
    txs = [deferred(coordinator, completer, src, dst) for _ in range(20)]
    assert completer.outcomes(wait=True) == [Outcome()] * 20
    assert all(tx.state is TxState.COMMITTED and tx.logged for tx in txs)
    assert take(b, DST) == [f"m{i}" for i in range(20)] and take(a, SRC) == []
    assert coordinator.counts["logged"] == 20 and a.xa_recover() == [] == b.xa_recover()
    coordinator.flush()
    assert coordinator.txlog.live() == {}  # forgotten once the brokers wrote the commits


class Unconfirmed(Failing):
    """An in-process RM that commits but cannot confirm its commit record durable."""

    in_process = True

    def commit_logged(self, xid):
        self.inner.commit(xid, False)

        def wait():
            raise OSError("simulated store failure")

        return wait


def test_commits_an_rm_cannot_confirm_durable_keep_their_log_records(completing):
    a, b, coordinator, completer = completing
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = deferred(coordinator, completer, src, dst, target=Unconfirmed(dst.resource, {}))
    assert completer.outcomes(wait=True) == [Outcome()] and take(b, DST) == ["m"]
    coordinator.flush()
    assert set(coordinator.txlog.live()) == {tx.gtrid}  # recovery would redo the commit


class Unwritten(Failing):
    """An in-process RM whose commits reach its store only once ``written`` is set."""

    in_process = True

    def __init__(self, inner, written: threading.Event) -> None:
        super().__init__(inner, {})
        self.written = written

    def commit_logged(self, xid):
        wait = self.inner.commit_logged(xid)

        def later():
            assert self.written.wait(10)
            wait()

        return later


class Asked:
    """A registered RM as recovery sees it."""

    def __init__(self, name, resource) -> None:
        self.name, self._resource = name, resource

    def resource(self):
        return self._resource

    def reset(self) -> None:
        pass


def test_recovery_leaves_a_commit_alone_until_its_store_write(completing):
    """A recovery pass (they run while links do, after an RM was unreachable) that comes
    while a deferred commit is in memory but not yet in the store must not take its record
    for settled: forgotten then, a crash would roll back the branch whose write was
    pending while its partner kept the messages, a duplicate on the target."""
    a, b, coordinator, completer = completing
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    written = threading.Event()
    tx = deferred(coordinator, completer, src, dst, target=Unwritten(dst.resource, written))
    wait_until(lambda: tx.state is TxState.COMMITTED)  # in memory; the store write waits
    recovery = Recovery(coordinator, [Asked("b:src", src.resource), Asked("b:dst", dst.resource)])
    assert recovery.run_pass()
    assert tx.gtrid in coordinator.txlog.live()
    written.set()
    assert completer.outcomes(wait=True) == [Outcome()]
    coordinator.flush()
    assert coordinator.txlog.live() == {} and take(b, DST) == ["m"] and take(a, SRC) == []


def test_a_failed_log_write_rolls_back_it_and_all_after_it_until_reset(brokers):  # noqa: F811  (the imported fixture)
    a, b = brokers
    coordinator = Coordinator("b", FlakyLog(fail=1), Faults(""))
    completer = Completer(coordinator, "l")
    put(a, SRC, "m0", "m1", "m2", "m3")
    src, dst = End(a), End(b)
    txs = [deferred(coordinator, completer, src, dst) for _ in range(3)]
    first, *rest = completer.outcomes(wait=True)
    assert isinstance(first.error, TxLogError) and not first.behind
    assert all(o.behind and isinstance(o.error, TransactionRolledBackException) for o in rest)
    assert all(o.error.__cause__ is first.error for o in rest)  # (a log outage excuses them)
    assert all(tx.state is TxState.ROLLED_BACK for tx in txs)
    assert a.xa_recover() == [] == b.xa_recover() and take(b, DST) == []
    src.conn.close()  # what it had received comes back, in order
    assert take(a, SRC) == ["m0", "m1", "m2", "m3"]  # (taken away by this check)
    put(a, SRC, "m4")
    src = End(a)
    deferred(coordinator, completer, src, dst)  # still failing: not reset yet
    assert completer.outcomes(wait=True)[0].behind
    completer.reset()
    src.conn.close()
    src = End(a)
    deferred(coordinator, completer, src, dst)
    assert completer.outcomes(wait=True) == [Outcome()]
    assert take(b, DST) == ["m4"]
    completer.close()
    coordinator.close()


def test_a_heuristic_commit_is_the_failed_outcome(completing):
    a, b, coordinator, completer = completing
    put(a, SRC, "m0", "m1")
    src, dst = End(a), End(b)
    target = Failing(dst.resource, {"commit": xa.XA_HEURRB})
    target.in_process = True
    deferred(coordinator, completer, src, dst, target=target)
    deferred(coordinator, completer, src, dst)
    first, second = completer.outcomes(wait=True)
    assert isinstance(first.error, HeuristicMixedException) and not first.behind
    assert second.behind


def test_remote_resource_managers_are_completed_by_the_caller(completing):
    a, b, coordinator, completer = completing
    put(a, SRC, "m")
    src, dst = End(a), End(b)
    tx = coordinator.begin()
    tx.enlist(src.resource, "b:src", "src")
    tx.enlist(Remote(dst.resource), "b:dst", "dst")
    dst.producer.send(src.consumer.receive(1))
    tx.end()
    assert tx.commit(defer=completer) is True and tx.state is TxState.COMMITTED
    assert completer.behind == 0 and take(b, DST) == ["m"]


def test_a_group_of_commit_records_costs_one_sync(tmp_path, monkeypatch):
    log = FileTxLog(tmp_path / "txlog.b", TxLogSettings(sync=True))
    log.open()
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    records = [CommitRecord(b"g%d" % i, (Participant("x", xa.Xid(1, b"g%d" % i, b"x")),)) for i in range(5)]
    log.log_commits(records)
    assert len(syncs) == 1 and set(log.live()) == {r.gtrid for r in records}
    log.close()
