"""A link's excused redeliveries (a database outage's rollbacks) kept on disk: a restart of
the link, or of the service after kill -9, reads them again, as the source broker keeps
the delivery counts they offset (before, they lived in memory and a restart after an
outage sent healthy messages to the DMQ as backed out)."""

from __future__ import annotations

import itertools
import json
import logging
import stat

import pytest

from bridgemgr.jms import TextMessage, xa
from bridgemgr.jms.errors import (
    HeuristicMixedException,
    IllegalStateException,
    JMSException,
    ResourceAllocationException,
    StoreFull,
    StoreUnavailable,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from bridgemgr.jmsbridge import excuses
from bridgemgr.jmsbridge.batch import Batch
from bridgemgr.jmsbridge.counters import LinkCounters
from bridgemgr.jmsbridge.excuses import Excuses, excuses_path, outage
from bridgemgr.jmsbridge.pipeline import ProcessingContext
from bridgemgr.xa.txlog import TxLogFull, TxLogUnavailable


def ctx(message_id: str) -> ProcessingContext:
    message = TextMessage("x")
    message.message_id = message_id
    return ProcessingContext(message, 0)


def test_excuses_outlive_the_batch_that_made_them(tmp_path):
    path = excuses_path(tmp_path / "bridges" / "jb", "l1")
    batch = Batch(10, LinkCounters(), Excuses(path))
    batch.restart()
    batch.excuse([ctx("ID:1"), ctx("ID:2")])
    batch.excuse_id("ID:1")
    again = Batch(10, LinkCounters(), Excuses(path))  # a new process: the link starts
    again.restart()
    assert (again.excused.get("ID:1"), again.excused.get("ID:2")) == (2, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_final_unit_forgets_its_excuses_on_disk(tmp_path):
    path = tmp_path / "excused.l1"
    batch = Batch(10, LinkCounters(), Excuses(path))
    batch.excuse([ctx("ID:1"), ctx("ID:2")])
    batch.final([ctx("ID:1")])
    assert json.loads(path.read_text()) == {"ID:2": 1}
    batch.final([ctx("ID:3")])  # nothing of it excused: nothing to write
    assert json.loads(path.read_text()) == {"ID:2": 1}


def test_a_message_without_an_id_is_not_excused(tmp_path):
    path = tmp_path / "excused.l1"
    excused = Excuses(path)
    excused.add(["", ""])
    assert not excused and not path.exists()


def test_without_a_file_a_restart_forgets_them():
    batch = Batch(10, LinkCounters())
    batch.excuse([ctx("ID:1")])
    batch.restart()
    assert not batch.excused


def test_an_unreadable_file_is_reported_and_left_out(tmp_path, caplog):
    path = tmp_path / "excused.l1"
    for text in ("{not json", '["ID:1"]', '{"ID:1": "two"}', '{"ID:1": 0}', '{"ID:1": true}'):
        path.write_text(text)
        excused = Excuses(path, logging.getLogger("t"))
        with caplog.at_level(logging.WARNING):
            excused.load()
        assert not excused, text
        assert str(path) in caplog.text and "cannot be read" in caplog.text
        caplog.clear()


def test_a_failed_write_keeps_them_in_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    excused = Excuses(blocker / "excused.l1")  # its folder cannot be made
    with caplog.at_level(logging.WARNING):
        excused.add(["ID:1"])
    assert excused.get("ID:1") == 1
    assert "cannot be written" in caplog.text


def test_at_most_limit_ids_are_kept_the_oldest_go_first(tmp_path, monkeypatch):
    monkeypatch.setattr(excuses, "LIMIT", 3)
    path = tmp_path / "excused.l1"
    excused = Excuses(path)
    for i in range(5):
        excused.add([f"ID:{i}"])
    excused.add(["ID:2"])  # excused again: now the newest
    excused.add(["ID:5"])
    assert json.loads(path.read_text()) == {"ID:4": 1, "ID:2": 2, "ID:5": 1}
    again = Excuses(path)
    again.load()
    assert [again.get(f"ID:{i}") for i in range(6)] == [0, 0, 2, 0, 1, 1]


def caused(*chain: BaseException) -> BaseException:
    """``chain[0]``, raised from ``chain[1]``, raised from ... (each the next's __cause__)."""
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    return chain[0]


@pytest.mark.parametrize(
    "failure",
    [
        StoreUnavailable("store unavailable"),
        StoreFull("store full"),
        TxLogUnavailable("the log's database"),
        TxLogFull("no room for a record"),
        TransportException("connection lost"),
        XAException("prepare", xa.XAER_RMFAIL),
        # a local or one-phase commit the store rolled back (over mq:// too: the wire keeps causes)
        caused(TransactionRolledBackException("rolled back"), StoreUnavailable("store unavailable")),
        caused(
            TransactionRolledBackException("one-phase"),
            XAException("commit", xa.XA_RBROLLBACK),
            StoreUnavailable("store unavailable"),
        ),
        caused(TransportException("prepare failed"), XAException("prepare", xa.XAER_RMFAIL)),
    ],
)
def test_an_outage_anywhere_in_the_chain_is_excused(failure):
    assert outage(failure)


@pytest.mark.parametrize(
    "failure",
    [
        TransactionRolledBackException("a send refused at prepare"),
        caused(TransactionRolledBackException("vote"), XAException("prepare", xa.XA_RBROLLBACK)),
        ResourceAllocationException("queue full"),
        HeuristicMixedException("some committed"),
        IllegalStateException("session closed"),
        JMSException("refused"),
        ValueError("a bug"),
    ],
)
def test_what_a_message_may_cause_is_not(failure):
    assert not outage(failure)


def test_a_unit_comes_back_excused_only_when_an_outage_undid_it(tmp_path):
    """Every path that undoes a unit hands the Batch its cause: a local commit the store
    rolled back is excused as an XA log outage is (before, only a lost connection whose
    cause was a store or log was: a rolled-back local or one-phase commit counted)."""
    counters = LinkCounters()
    batch = Batch(10, counters, Excuses(tmp_path / "excused.l1"))
    batch.pending.extend([ctx("ID:1"), ctx("ID:2")])
    batch.undone(
        batch.pending, caused(TransactionRolledBackException("rolled back"), StoreUnavailable("store unavailable"))
    )
    batch.returned([ctx("ID:2")], TxLogUnavailable("the log's database"))
    batch.returned([ctx("ID:3")], TransactionRolledBackException("refused at prepare"))
    batch.returned([ctx("ID:4")])
    assert [batch.excused.get(f"ID:{i}") for i in range(1, 5)] == [1, 2, 0, 0]
    assert counters.rolled_back == 5 and batch.pending == []
    assert json.loads((tmp_path / "excused.l1").read_text()) == {"ID:1": 1, "ID:2": 2}
