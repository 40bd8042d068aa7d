"""A two-phase commit the embedded broker made in memory but its store could not write yet
(a full disk, a database that cannot be reached) stays in doubt for recover() until the
store has it. Before, the branch left recover()'s list at once: a coordinator's recovery
pass then took its commit record for settled and forgot it, and a crash before the store
wrote the commit brought the branch back prepared with no record, so presumed abort rolled
it back: its consumed messages came back, already committed at the other branch (the XA
chaos test saw a batch of 10 delivered twice with H's store in PostgreSQL)."""

from __future__ import annotations

import pytest

from bridgemgr.jms import Queue, TextMessage, xa
from bridgemgr.jms.errors import XAException
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from stores import fill
from waiting import wait_for

SRC = Queue("src")
XID = Xid(0x1234, b"gtrid-unwritten", b"b1")


def test_a_commit_the_store_has_not_written_stays_in_doubt_until_it_has(tmp_path):
    broker = Broker(tmp_path / "b")
    store = broker.store
    assert store is not None
    factory = EmbeddedConnectionFactory(broker)
    conn = factory.create_connection()
    conn.start()
    conn.create_session().create_producer(SRC).send(TextMessage("m"))
    xconn = factory.create_xa_connection()
    xconn.start()
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(XID, xa.TMNOFLAGS)
    assert xs.create_consumer(SRC).receive(1).text == "m"
    res.end(XID, xa.TMSUCCESS)
    assert res.prepare(XID) == xa.XA_OK
    fill(broker)
    db = store.database._db  # type: ignore[attr-defined]
    with pytest.raises(XAException) as failed:
        res.commit(XID, False)  # committed in memory; the store cannot write it
    assert failed.value.errorcode == xa.XAER_RMFAIL and "store full" in str(failed.value)
    assert res.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN) == [XID]  # still in doubt
    with pytest.raises(XAException) as rolled:
        res.rollback(XID)
    assert rolled.value.errorcode == xa.XA_HEURCOM  # decided: it cannot be undone
    with pytest.raises(XAException, match="store full"):
        res.commit(XID, False)  # recovery's commit waits for the write, which fails again
    assert res.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN) == [XID]
    db.execute("PRAGMA max_page_count=1000000")
    wait_for(lambda: not store.full, what="the store writing again")
    res.commit(XID, False)  # recovery's commit again: written now
    assert res.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN) == []
    xconn.close()
    conn.close()
    broker.close()
    again = Broker(tmp_path / "b")
    try:
        consumer = EmbeddedConnectionFactory(again).create_connection()
        consumer.start()
        assert consumer.create_session().create_consumer(SRC).receive(0.2) is None
        assert again.xa_recover() == []
        consumer.close()
    finally:
        again.close()
