"""A link's excused redeliveries on an instance of an HA cluster (excuses.SharedExcuses): kept
in the cluster's table imq_bridge_excuses of the real PostgreSQL server, so the instance
that takes a bridge over reads them; written behind the link, also when the database was
out of reach at first; fenced like the XA log (only the bridge's owner writes them)."""

from __future__ import annotations

import dataclasses
import logging
import uuid

import pytest

from bridgemgr.jmsbridge import excuses
from bridgemgr.jmsbridge.batch import Batch
from bridgemgr.jmsbridge.counters import LinkCounters
from bridgemgr.jmsbridge.excuses import SharedExcuses, shared_excuses
from pgserver import free_port
from test_jmsbridge_excuses import ctx


@pytest.fixture
def members(postgresql):
    """The excuses stores of instances A and B of a cluster of their own, and the cluster's
    database; A owns bridge jb1."""
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster

    database = postgresql.create_database("exc" + uuid.uuid4().hex[:10])

    def props(brokerid: str):
        return load_properties(
            [],
            [
                "imq.cluster.ha=true",
                "imq.cluster.clusterid=e1",
                f"imq.brokerid={brokerid}",
                "imq.persist.store=jdbc",
                f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
            ],
            environ={},
        )

    a, b = open_cluster(props("A"), "a", {}), open_cluster(props("B"), "b", {})
    # the service's excuses stores (service.py) of instances A and B
    a_store, b_store = shared_excuses(a.jdbc.connect), shared_excuses(b.jdbc.connect)
    assert a.claim(["jb1"]) == ["jb1"]
    try:
        yield a_store, b_store, a.jdbc
    finally:
        a.leave()
        b.leave()


def test_the_taker_reads_what_the_owner_excused(members):
    store_a, store_b, _ = members
    owner = store_a("jb1", "l1", logging.getLogger("t"))
    assert isinstance(owner, SharedExcuses)
    batch = Batch(10, LinkCounters(), owner)
    batch.restart()
    batch.excuse([ctx("ID:1"), ctx("ID:2"), ctx("ID:3")])
    batch.excuse_id("ID:1")
    batch.final([ctx("ID:3")])
    assert owner.written(10)
    taker = store_b("jb1", "l1", logging.getLogger("t"))  # another instance
    taker.load()
    assert (taker.get("ID:1"), taker.get("ID:2"), taker.get("ID:3")) == (2, 1, 0)
    other_link = store_a("jb1", "l2", logging.getLogger("t"))
    other_link.load()
    assert not other_link


def test_at_most_limit_ids_are_kept_the_oldest_go(members, monkeypatch):
    monkeypatch.setattr(excuses, "LIMIT", 3)
    store_a, _, _ = members
    owner = store_a("jb1", "l1", logging.getLogger("t"))
    owner.load()
    for i in range(4):
        owner.add([f"ID:{i}"])
    owner.add(["ID:1"])  # excused again: now the newest
    owner.add(["ID:5"])
    assert owner.written(10)
    again = store_a("jb1", "l1", logging.getLogger("t"))
    again.load()
    assert list(again._counts) == ["ID:3", "ID:1", "ID:5"]
    assert again.get("ID:1") == 2


def test_excuses_made_while_the_database_is_out_of_reach_are_written_when_it_is_back(members, caplog):
    """The link does not wait: add() returns at once, and the writer tries again until the
    database takes the rows."""
    _, store_b, settings = members
    down = dataclasses.replace(settings, conninfo={**settings.conninfo, "port": str(free_port())})
    reach = [down]  # where the connections go: nothing listens there at first
    owner = SharedExcuses(lambda: reach[0].connect(), "jb1", "l1", logging.getLogger("t"))
    with caplog.at_level(logging.INFO):
        owner.add(["ID:1"])
        owner.add(["ID:1", "ID:2"])
        assert not owner.written(2.5 * excuses.RETRY)
        assert owner.get("ID:1") == 2
        reach[0] = settings
        assert owner.written(3 * excuses.RETRY)
    text = caplog.text
    assert text.count("cannot be written to the HA cluster's table imq_bridge_excuses") == 1, text
    assert "written to the HA cluster's table imq_bridge_excuses again" in text
    taker = store_b("jb1", "l1", logging.getLogger("t"))
    taker.load()
    assert (taker.get("ID:1"), taker.get("ID:2")) == (2, 1)


def test_only_the_bridges_owner_writes_its_excuses(members, caplog):
    store_a, store_b, _ = members
    owner = store_a("jb1", "l1", logging.getLogger("t"))
    owner.add(["ID:1"])
    assert owner.written(10)
    intruder = store_b("jb1", "l1", logging.getLogger("t"))  # B does not own jb1
    intruder.load()
    with caplog.at_level(logging.WARNING):
        intruder.forget(["ID:1"])
        intruder.add(["ID:2"])
        assert intruder.written(10)  # refused, given up
    assert "fenced: bridge jb1 is not owned by broker B" in caplog.text
    owner.load()
    assert (owner.get("ID:1"), owner.get("ID:2")) == (1, 0)


def test_a_link_started_again_keeps_what_is_not_written_yet(members):
    """Stopped and started while the database is out of reach, the link keeps its counts
    (newer than the rows), and they are written when it is back."""
    _, _, settings = members
    reach = [dataclasses.replace(settings, conninfo={**settings.conninfo, "port": str(free_port())})]
    owner = SharedExcuses(lambda: reach[0].connect(), "jb1", "l1", logging.getLogger("t"))
    owner.add(["ID:1"])
    owner.load()  # the link starts again
    assert owner.get("ID:1") == 1
    reach[0] = settings
    assert owner.written(3 * excuses.RETRY)
    owner.load()
    assert owner.get("ID:1") == 1
