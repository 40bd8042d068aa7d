"""The link's collaborators without a broker: the reconnect policy, the batch (unit of work
being filled, one-by-one after a rollback, dead messages remembered) and the settler
(counting completed units, taking the outcomes of those completing behind the link)."""

from __future__ import annotations

import logging
import threading

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import HeuristicMixedException, TransactionRolledBackException
from bridgemgr.jmsbridge.batch import Batch
from bridgemgr.jmsbridge.counters import LinkCounters
from bridgemgr.jmsbridge.pipeline import Action, DMQReason, ProcessingContext, RetryWithTolerance
from bridgemgr.jmsbridge.reconnect import ReconnectPolicy
from bridgemgr.jmsbridge.settle import Settler
from bridgemgr.xa.completer import Outcome


def ctx(message_id: str, action: Action = Action.TRANSFER) -> ProcessingContext:
    m = TextMessage(message_id)
    m.message_id, m.destination = message_id, Queue("src")
    c = ProcessingContext(m, 0)
    c.destination = Queue("dst")
    if action is Action.DEAD:
        c.dead(DMQReason.SEND_FAILURE)
    else:
        c.action = action
    return c


# --- ReconnectPolicy -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(answer: bool = True) -> tuple[ReconnectPolicy, list[int], Clock]:
    waits: list[int] = []
    clock = Clock()

    def backoff(attempt: int) -> bool:
        waits.append(attempt)
        return answer

    return ReconnectPolicy(backoff, quick=1.0, clock=clock), waits, clock


def test_losses_while_connecting_back_off_longer_each_time():
    p, waits, _ = policy()
    for _ in range(3):
        p.lost(connecting=True)
        assert p.wait()
    assert waits == [1, 2, 3]


def test_a_link_that_ran_a_while_reconnects_at_once_and_counts_afresh():
    p, waits, clock = policy()
    p.lost(connecting=True)
    p.wait()
    p.connected()
    clock.now += 5
    p.lost()
    assert p.wait() and p.failures == 0
    assert waits == [1]  # no backoff for the loss after running


def test_losses_soon_after_connecting_are_failures_in_a_row():
    p, waits, clock = policy()
    for _ in range(3):
        p.connected()
        clock.now += 0.5
        p.lost()
        assert p.wait()
    assert waits == [1, 2, 3]


def test_a_failed_setup_waits_between_attempts_and_a_quick_loss_backs_off():
    backoffs: list[int] = []
    intervals: list[int] = []
    clock = Clock()
    p = ReconnectPolicy(
        lambda n: backoffs.append(n) is None, clock=clock, between_attempts=lambda n: intervals.append(n) is None
    )
    p.lost(connecting=True)
    assert p.wait()
    p.connected()
    clock.now += 0.5
    p.lost()  # dropped right after connecting
    assert p.wait()
    assert (intervals, backoffs) == ([1], [2])


def test_a_link_stopped_during_the_backoff_gives_up():
    p, _, _ = policy(answer=False)
    p.lost(connecting=True)
    assert not p.wait()
    stop = threading.Event()
    stop.set()  # the link's own backoff: the stop event ends it
    real = ReconnectPolicy(RetryWithTolerance(stop, initial=5.0).backoff)
    real.lost(connecting=True)
    assert not real.wait()


# --- Batch -----------------------------------------------------------------------------------


def test_a_batch_is_full_at_its_size():
    b = Batch(3, LinkCounters())
    for i in range(3):
        assert not b.full()
        b.pending.append(ctx(f"ID:{i}"))
    assert b.full()
    assert Batch(0, LinkCounters()).size == 1


def test_after_a_back_out_the_messages_move_one_per_unit():
    counters = LinkCounters()
    b = Batch(10, counters)
    b.pending.extend([ctx("ID:1"), ctx("ID:2"), ctx("ID:3")])  # the send of the third failed
    b.open = True
    b.back_out(b.pending)
    b.undone(b.pending)
    assert (b.pending, b.open, counters.rolled_back, b.one_by_one) == ([], False, 3, 3)
    for i in range(3):  # they come back: each is a unit of its own
        b.pending.append(ctx(f"ID:{i}"))
        assert b.full()
        b.completed()
        b.pending.clear()
    assert b.one_by_one == 0
    b.pending.append(ctx("ID:4"))
    assert not b.full()  # batches again


def test_dead_messages_of_an_undone_unit_are_remembered_once():
    counters = LinkCounters()
    b = Batch(5, counters)
    unit = [ctx("ID:1"), ctx("ID:2", Action.DEAD), ctx("ID:3", Action.CONSUME)]
    b.returned(unit)
    assert counters.rolled_back == 3 and b.lettered == {"ID:2"}
    assert b.in_dmq_already("ID:2")
    assert not b.in_dmq_already("ID:2")  # a later copy is a new dead message
    assert not b.in_dmq_already("ID:1")


def test_restart_forgets_everything():
    b = Batch(5, LinkCounters())
    b.pending.append(ctx("ID:1", Action.DEAD))
    b.back_out(b.pending)
    b.returned(b.pending)
    b.open = True
    b.restart()
    assert (b.pending, b.open, b.one_by_one, b.lettered) == ([], False, 0, set())


# --- Settler ---------------------------------------------------------------------------------


class Txn:
    """What the settler uses of a TransferTransaction: outcomes in order, and reset()."""

    def __init__(self) -> None:
        self.ready: list[Outcome] = []  # finished, not taken
        self.later: list[Outcome] = []  # finished by the time outcomes(wait=True) returns
        self.resets = 0

    def outcomes(self, wait: bool = False) -> list[Outcome]:
        taken, self.ready = self.ready, []
        if wait:
            taken, self.later = taken + self.later, []
        return taken

    def reset(self) -> None:
        self.resets += 1


def settler(log_transfers: bool = False) -> tuple[Settler, Batch, LinkCounters]:
    counters = LinkCounters()
    batch = Batch(1, counters)
    s = Settler(batch, counters, logging.getLogger("test.linkparts"), "l1")
    s.log_transfers = log_transfers
    return s, batch, counters


def test_count_counts_transfers_and_consumed_only(caplog):
    s, _, counters = settler(log_transfers=True)
    unit = [ctx("ID:1"), ctx("ID:2", Action.CONSUME), ctx("ID:3", Action.DEAD)]
    with caplog.at_level(logging.INFO, "test.linkparts"):
        s.count(unit)
    assert unit == [] and (counters.transferred, counters.consumed_only) == (1, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "link l1: transferred message ID:1 from queue://src to queue://dst"
    ]


def test_units_handed_over_count_when_their_outcome_comes():
    s, _, counters = settler()
    pending = [ctx("ID:1")]
    s.handed_over(pending)
    pending.clear()  # the link reuses its list: the settler kept a copy
    assert len(s.units) == 1
    txn = Txn()
    assert s.settle(txn) is None and len(s.units) == 1  # not finished yet
    txn.ready = [Outcome()]
    assert s.settle(txn) is None
    assert (len(s.units), counters.transferred, txn.resets) == (0, 1, 0)


def test_a_failed_unit_is_returned_and_those_after_it_come_back():
    s, batch, counters = settler()
    units = [[ctx("ID:1")], [ctx("ID:2"), ctx("ID:3")], [ctx("ID:4", Action.DEAD)], [ctx("ID:5")]]
    for unit in units:
        s.handed_over(unit)
    heuristic = HeuristicMixedException("some branch did not commit")
    behind = TransactionRolledBackException("rolled back after an earlier one failed")
    txn = Txn()
    txn.ready = [Outcome(), Outcome(heuristic), Outcome(behind, behind=True)]
    txn.later = [Outcome(behind, behind=True)]
    failed = s.settle(txn)
    assert failed is not None
    unit, error = failed
    assert [c.headers[0] for c in unit] == ["ID:2", "ID:3"] and error is heuristic
    assert (counters.transferred, counters.rolled_back, txn.resets, len(s.units)) == (1, 2, 1, 0)
    assert batch.lettered == {"ID:4"}  # in a DMQ already: not sent there twice


def test_closing_counts_the_committed_and_returns_the_rolled_back():
    s, _, counters = settler()
    s.handed_over([ctx("ID:1")])
    s.handed_over([ctx("ID:2")])
    txn = Txn()
    txn.ready = [Outcome(), Outcome(TransactionRolledBackException("no"))]
    s.closed(txn)
    assert (counters.transferred, counters.rolled_back, len(s.units)) == (1, 1, 0)
    s.handed_over([ctx("ID:3")])
    s.closed(None)  # never connected: nothing to take
    assert len(s.units) == 0


@pytest.mark.parametrize("wait", [False, True])
def test_settle_waits_only_when_asked(wait):
    s, _, counters = settler()
    s.handed_over([ctx("ID:1")])
    txn = Txn()
    txn.later = [Outcome()]
    s.settle(txn, wait=wait)
    assert counters.transferred == (1 if wait else 0)


def test_an_excused_message_keeps_its_excuse_until_its_unit_is_final():
    """A unit handed over may still be rolled back behind the link: the rollbacks excused
    before stay in the message's delivery count, so they stay excused until it committed
    (before, completing the unit forgot them and a later outage rollback reached
    backoutThreshold=1)."""
    s, batch, _ = settler()
    unit = [ctx("ID:1")]
    batch.excuse(unit)
    batch.pending[:] = unit
    batch.completed()
    s.handed_over(unit)
    assert batch.excused.get("ID:1") == 1
    txn = Txn()
    txn.ready = [Outcome()]
    s.settle(txn)
    assert not batch.excused  # committed: it does not come back
