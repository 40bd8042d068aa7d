"""XA on the embedded broker: branch states, two-phase and one-phase commit, recovery."""

from __future__ import annotations

import pytest

from bridgemgr.jms import Queue, TextMessage, xa
from bridgemgr.jms.errors import TransactionInProgressException, XAException
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory

SRC, DST = Queue("src"), Queue("dst")


def xid(n: int, branch: bytes = b"b1") -> Xid:
    return Xid(0x1234, f"gtrid-{n}".encode(), branch)


def drain(consumer, timeout=0.1):
    out = []
    while (m := consumer.receive(timeout)) is not None:
        out.append(m.text)
    return out


@pytest.fixture
def xconn(factory):
    c = factory.create_xa_connection()
    c.start()
    yield c
    c.close()


def put(conn, dest, *texts):
    p = conn.create_session().create_producer(dest)
    for t in texts:
        p.send(TextMessage(t))


def move_one(xs, x):
    """Receive from SRC and send to DST inside branch x (what a transacted link does)."""
    res = xs.xa_resource
    res.start(x, xa.TMNOFLAGS)
    msg = xs.create_consumer(SRC).receive(1)
    xs.create_producer(DST).send(TextMessage(msg.text.upper()))
    res.end(x, xa.TMSUCCESS)
    return res


@pytest.mark.slow
def test_two_phase_commit_moves_the_message(xconn, conn):
    put(conn, SRC, "a")
    xs = xconn.create_xa_session()
    res = move_one(xs, xid(1))
    observer = conn.create_session()
    assert drain(observer.create_consumer(DST)) == []  # not before commit
    assert res.prepare(xid(1)) == xa.XA_OK
    assert res.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN) == [xid(1)]
    assert drain(observer.create_consumer(SRC)) == []  # locked by the prepared branch
    res.commit(xid(1), False)
    assert drain(observer.create_consumer(DST)) == ["A"]
    assert drain(observer.create_consumer(SRC)) == []
    assert res.recover(xa.TMSTARTRSCAN) == []


def test_rollback_of_prepared_branch_returns_source_and_drops_target(xconn, conn):
    put(conn, SRC, "a")
    xs = xconn.create_xa_session()
    res = move_one(xs, xid(2))
    res.prepare(xid(2))
    res.rollback(xid(2))
    observer = conn.create_session()
    assert drain(observer.create_consumer(DST)) == []
    got = observer.create_consumer(SRC).receive(1)
    assert got.text == "a" and got.redelivered


def test_one_phase_commit(xconn, conn):
    put(conn, SRC, "a")
    res = move_one(xconn.create_xa_session(), xid(3))
    res.commit(xid(3), True)
    assert drain(conn.create_session().create_consumer(DST)) == ["A"]


def test_empty_branch_votes_read_only_and_is_forgotten(xconn):
    res = xconn.create_xa_session().xa_resource
    res.start(xid(4), xa.TMNOFLAGS)
    res.end(xid(4), xa.TMSUCCESS)
    assert res.prepare(xid(4)) == xa.XA_RDONLY
    with pytest.raises(XAException) as e:
        res.commit(xid(4), False)
    assert e.value.errorcode == xa.XAER_NOTA


def test_protocol_errors_have_xa_codes(xconn, conn):
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    with pytest.raises(XAException) as e:
        res.prepare(xid(9))
    assert e.value.errorcode == xa.XAER_NOTA
    res.start(xid(5), xa.TMNOFLAGS)
    with pytest.raises(XAException) as e:
        res.prepare(xid(5))  # still active
    assert e.value.errorcode == xa.XAER_PROTO
    res.end(xid(5), xa.TMSUCCESS)
    with pytest.raises(XAException) as e:
        res.start(xid(5), xa.TMNOFLAGS)
    assert e.value.errorcode == xa.XAER_DUPID
    with pytest.raises(XAException) as e:
        res.commit(xid(5), False)  # two-phase commit before prepare
    assert e.value.errorcode == xa.XAER_PROTO
    res.rollback(xid(5))
    with pytest.raises(XAException) as e:
        res.forget(xid(5))
    assert e.value.errorcode == xa.XAER_NOTA


def test_tmfail_marks_rollback_only(xconn, conn):
    put(conn, SRC, "a")
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(xid(6), xa.TMNOFLAGS)
    assert xs.create_consumer(SRC).receive(1).text == "a"
    res.end(xid(6), xa.TMFAIL)
    with pytest.raises(XAException) as e:
        res.prepare(xid(6))
    assert e.value.errorcode == xa.XA_RBROLLBACK
    assert conn.create_session().create_consumer(SRC).receive(1).text == "a"


def test_join_from_a_second_session_of_the_same_rm(xconn, conn):
    put(conn, SRC, "a")
    s1, s2 = xconn.create_xa_session(), xconn.create_xa_session()
    r1, r2 = s1.xa_resource, s2.xa_resource
    assert r1.is_same_rm(r2)
    r1.start(xid(7), xa.TMNOFLAGS)
    msg = s1.create_consumer(SRC).receive(1)
    r2.start(xid(7), xa.TMJOIN)
    s2.create_producer(DST).send(TextMessage(msg.text))
    r1.end(xid(7), xa.TMSUCCESS)
    r2.end(xid(7), xa.TMSUCCESS)
    r1.prepare(xid(7))
    r2.commit(xid(7), False)
    assert drain(conn.create_session().create_consumer(DST)) == ["a"]


def test_different_brokers_are_different_rms(tmp_path, xconn):
    other = Broker(tmp_path / "other")
    oc = EmbeddedConnectionFactory(other).create_xa_connection()
    assert not xconn.create_xa_session().xa_resource.is_same_rm(oc.create_xa_session().xa_resource)
    oc.close()
    other.close()


def test_xa_session_refuses_local_commit(xconn):
    xs = xconn.create_xa_session()
    with pytest.raises(TransactionInProgressException):
        xs.commit()


def test_outside_a_branch_an_xa_session_auto_acknowledges(xconn, conn):
    put(conn, SRC, "a")
    xs = xconn.create_xa_session()
    assert xs.create_consumer(SRC).receive(1).text == "a"
    xs.close()
    assert conn.create_session().create_consumer(SRC).receive(0.05) is None


def test_closing_the_connection_rolls_back_unprepared_keeps_prepared(factory, conn):
    put(conn, SRC, "a", "b", "c")
    xconn = factory.create_xa_connection()
    xconn.start()
    xs = xconn.create_xa_session()
    res = move_one(xs, xid(10))
    res.prepare(xid(10))
    move_one(xconn.create_xa_session(), xid(11))  # ended, not prepared
    xs3 = xconn.create_xa_session()
    xs3.xa_resource.start(xid(12), xa.TMNOFLAGS)  # still active
    xs3.create_consumer(SRC).receive(1)
    xconn.close()
    other = factory.create_xa_connection()
    probe = other.create_xa_session().xa_resource
    assert probe.recover(xa.TMSTARTRSCAN) == [xid(10)]
    got = drain(conn.create_session().create_consumer(SRC))
    assert got == ["b", "c"]  # branches 11 and 12 rolled back; "a" locked by branch 10
    probe.commit(xid(10), False)
    assert drain(conn.create_session().create_consumer(DST)) == ["A"]
    other.close()


def test_closing_a_session_fails_its_active_branch(xconn, conn):
    put(conn, SRC, "a")
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(xid(13), xa.TMNOFLAGS)
    xs.create_consumer(SRC).receive(1)
    xs.close()
    probe = xconn.create_xa_session().xa_resource
    with pytest.raises(XAException) as e:
        probe.prepare(xid(13))
    assert e.value.errorcode == xa.XA_RBROLLBACK
    assert conn.create_session().create_consumer(SRC).receive(1).text == "a"


@pytest.mark.slow
def test_prepared_branch_survives_restart_and_commits(tmp_path):
    path = tmp_path / "s"
    b = Broker(path)
    f = EmbeddedConnectionFactory(b)
    c = f.create_xa_connection()
    c.start()
    put(c, SRC, "a", "b")
    res = move_one(c.create_xa_session(), xid(20))
    res.prepare(xid(20))
    res2 = move_one(c.create_xa_session(), xid(21))
    res2.prepare(xid(21))
    b.close()  # as a crash would: the branches stay prepared

    b = Broker(path)
    c = EmbeddedConnectionFactory(b).create_xa_connection()
    c.start()
    res = c.create_xa_session().xa_resource
    assert sorted(res.recover(xa.TMSTARTRSCAN), key=str) == [xid(20), xid(21)]
    obs = c.create_session()
    assert drain(obs.create_consumer(SRC)) == []  # both locked
    assert drain(obs.create_consumer(DST)) == []  # neither visible
    res.commit(xid(20), False)
    res.rollback(xid(21))
    b.close()

    b = Broker(path)
    c = EmbeddedConnectionFactory(b).create_xa_connection()
    c.start()
    obs = c.create_session()
    assert c.create_xa_session().xa_resource.recover(xa.TMSTARTRSCAN) == []
    assert drain(obs.create_consumer(DST)) == ["A"]
    assert drain(obs.create_consumer(SRC)) == ["b"]
    b.close()


def test_prepared_sends_hold_their_room_until_commit_or_rollback(broker, xconn, conn):
    from bridgemgr.jms.errors import ResourceAllocationException
    from bridgemgr.providers.embedded import DestinationLimits

    broker.configure_destination(DST, DestinationLimits(max_num_msgs=1))
    put(conn, SRC, "a")
    res = move_one(xconn.create_xa_session(), xid(30))
    res.prepare(xid(30))
    with pytest.raises(ResourceAllocationException):
        put(conn, DST, "squeezed")  # the prepared send took the only room
    res.rollback(xid(30))
    put(conn, DST, "now")  # given back by the rollback
    assert drain(conn.create_session().create_consumer(DST)) == ["now"]
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(xid(31), xa.TMNOFLAGS)
    p = xs.create_producer(DST)
    p.send(TextMessage("1"))
    p.send(TextMessage("2"))
    res.end(xid(31), xa.TMSUCCESS)
    with pytest.raises(XAException) as e:
        res.prepare(xid(31))  # two sends, room for one
    assert e.value.errorcode == xa.XA_RBROLLBACK
    put(conn, DST, "fits")
