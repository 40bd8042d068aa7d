"""Epoch fencing of an HA instance's writes on a real PostgreSQL server (docs/ha.md#fencing):
every store batch and every write of a bridge's XA log carries the lease generation its
process joined as, and fails once the cluster holds another (a takeover, or a new process
of the same broker id); a message insert that conflicts is an error, never skipped; a
batch whose commit was lost with its connection is settled, not written twice. And where
a client's last broker's store is served now (locate, through a chain of takeovers)."""

from __future__ import annotations

import uuid

import pytest

from bridgemgr.jms.errors import StoreError
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded.cluster import open_cluster, store_settings
from bridgemgr.providers.embedded.pgstore import PostgresDatabase, jdbc_settings

pytestmark = pytest.mark.slow  # (a database per test)


@pytest.fixture
def database(postgresql):
    return postgresql.create_database("fence" + uuid.uuid4().hex[:10])


def props(postgresql, database: str, brokerid: str):
    return load_properties(
        [],
        [
            "imq.cluster.ha=true",
            "imq.cluster.clusterid=f2",
            f"imq.brokerid={brokerid}",
            "imq.persist.store=jdbc",
            f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
        ],
        environ={},
    )


def test_a_new_process_of_a_taken_over_broker_id_fences_the_old_one(postgresql, database):
    from bridgemgr.jms.xa import Xid
    from bridgemgr.xa.sqllog import SqlTxLog
    from bridgemgr.xa.txlog import CommitRecord, Participant, TxLogError

    old, b = (
        open_cluster(props(postgresql, database, "A"), "a", {}),
        open_cluster(props(postgresql, database, "B"), "b", {}),
    )
    old_store = PostgresDatabase(store_settings(props(postgresql, database, "A"), old.generation), sync=True)
    told: list[str] = []
    old_store.on_fenced = told.append
    new = new_store = None
    try:
        old_store.write({1: ["q:x", 0, b"one"]}, set(), {}, [])
        old._transaction(
            lambda cur: cur.execute(
                "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 s' WHERE brokerid = 'A'"
            )
        )
        assert b.take_over() == ("A", [])
        # The row says "taken": a new process of A is accepted, as a new generation.
        new = open_cluster(props(postgresql, database, "A"), "a2", {})
        assert new.generation == old.generation + 2  # (the takeover was one)
        assert new.claim(["jb9"]) == ["jb9"]
        new_store = PostgresDatabase(store_settings(props(postgresql, database, "A"), new.generation), sync=True)
        new_store.write({2: ["q:x", 0, b"new two"]}, set(), {}, [])  # (B has no broker to move 1 into)
        # The old process resumes: it shares broker id, state (live) and store schema with
        # the new one, and writes nothing: neither messages nor acknowledgements nor the
        # XA log of a bridge its broker id owns.
        with pytest.raises(StoreError, match="fenced: broker A generation 1 was replaced by generation 3"):
            old_store.write({2: ["q:x", 0, b"old two"]}, {1}, {}, [])
        assert told == ["broker A generation 1 was replaced by generation 3 (live: a new process of broker A)"]
        connect, style = store_settings(props(postgresql, database, "A"), old.generation).txlog_sql()
        log = SqlTxLog(connect, "jb9", style)
        try:
            log.open()
            with pytest.raises(TxLogError, match="fenced: broker A generation 1 was replaced"):
                log.log_commits([CommitRecord(b"g", (Participant("jb9:m", Xid(1, b"g", b"m#1")),))])
        finally:
            log.close()
        assert not old.renew()
        assert old._replacement() == (
            "broker A generation 1 was replaced by generation 3: another process joined HA cluster f2 as broker A"
        )
        assert new_store.page("q:x", 0, 10) == [(1, 0, b"one"), (2, 0, b"new two")]
        assert new.renew()
    finally:
        for store in (old_store, new_store):
            if store is not None:
                store.close()
        for member in (old, b, new):
            if member is not None:
                member.leave()


def test_a_conflicting_message_insert_is_an_error(postgresql, database):
    store = PostgresDatabase(jdbc_settings(props(postgresql, database, "A"), "plain"), sync=True)
    try:
        store.write({1: ["q:x", 0, b"one"]}, set(), {}, [])
        with pytest.raises(Exception, match="duplicate key"):
            store.write({1: ["q:x", 0, b"other"]}, set(), {}, [])
        assert store.page("q:x", 0, 10) == [(1, 0, b"one")]
    finally:
        store.close()


def test_a_batch_whose_commit_was_lost_is_settled_not_written_twice(postgresql, database):
    store = PostgresDatabase(jdbc_settings(props(postgresql, database, "A"), "plain"), sync=True)
    try:
        # Batch 1 committed, but its connection broke before the answer came: the store
        # keeps it, merges what came since (seq 2 acknowledged, seq 1 delivered again, seq
        # 4 sent) and writes that as the next batch.
        store.write({1: ["q:x", 0, b"one"], 2: ["q:x", 0, b"two"], 3: ["q:x", 0, b"three"]}, set(), {}, [])
        store._uncertain = {1, 2, 3}
        store.write({1: ["q:x", 1, b"one"], 3: ["q:x", 0, b"three"], 4: ["q:x", 0, b"four"]}, set(), {}, [])
        assert store.page("q:x", 0, 10) == [(1, 1, b"one"), (3, 0, b"three"), (4, 0, b"four")]
        assert store._uncertain == set()
    finally:
        store.close()


def test_locate_follows_takeovers_to_the_instance_serving_a_store(postgresql, database):
    from bridgemgr.providers.embedded.cluster import ClusterError

    a, b, c = (open_cluster(props(postgresql, database, x), x.lower(), {}) for x in "ABC")
    try:
        for member in (a, b, c):
            member.advertise(f"mq://{member.brokerid.lower()}:7676")

        def expire(broker: str) -> None:
            a._transaction(
                lambda cur: cur.execute(
                    "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 s' WHERE brokerid = %s", (broker,)
                )
            )

        assert a.locate("A") is None and b.locate("Z") is None  # its own; no member
        assert b.locate("A") == ("A", "mq://a:7676")  # live: its store is there
        expire("A")
        with pytest.raises(ClusterError, match="broker A of HA cluster f2 is not taken over yet; try again"):
            b.locate("A")
        assert c.take_over() == ("A", [])
        assert b.locate("A") == ("C", "mq://c:7676") and c.locate("A") is None
        expire("C")
        assert b.take_over() == ("C", [])
        assert b.locate("A") is None  # A's store went to C, C's to B
    finally:
        for member in (a, b, c):
            member.leave()
