"""Epoch fencing of an HA instance's writes to the cluster's shared rows (real PostgreSQL,
docs/ha.md#fencing): a process whose lease generation was replaced (SIGSTOPped, a new
process of its broker id joined, resumed) writes none of imq_ha_destinations,
imq_ha_dstcounts, imq_ha_demand or imq_ha_durables, and is told it was replaced (the
service then ends: serve exits 1)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import Queue, Topic
from bridgemgr.jms.errors import StoreError
from bridgemgr.providers.embedded.clustercatalog import CATALOG, COUNTS, ClusterDestinations
from bridgemgr.providers.embedded.clusterdst import DEMAND, DURABLES
from clusterdst_support import cluster_members
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def _rows(member: Any, sql: str) -> list[tuple[Any, ...]]:
    return member.cluster._transaction(lambda cur: cur.execute(sql) and list(cur.fetchall()))


def test_a_replaced_process_writes_no_catalog_counts_demand_or_durables(members):
    start, stack = members
    old = start("A", threads=False)
    old_catalog = ClusterDestinations(old.cluster, old.host, 3600)
    old_catalog.create_tables()
    old_catalog.publish()  # (its generation holds the lease: written)
    conn = old.connection(stack, client_id="app")
    session = conn.create_session()
    session.create_consumer(Queue("orders"))
    # SIGSTOPped past its lease; a new process of broker id A joins as a new generation.
    old.cluster._transaction(
        lambda cur: cur.execute("UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 s' WHERE brokerid = 'A'")
    )
    new = start("A", threads=False)
    assert new.cluster.generation == old.cluster.generation + 1
    new_catalog = ClusterDestinations(new.cluster, new.host, 3600)
    new_catalog.publish()
    counts = _rows(new, f"SELECT published, rows FROM {COUNTS} WHERE brokerid = 'A'")
    # The old process resumes, and each of its writes fails, naming the fence.
    old.host.broker.cluster_durables = []  # (as ClusterQueues.start makes it)
    session.create_durable_subscriber(Topic("news"), "d")
    with old.host.broker.lock:
        demand = old.queues._demand()
    assert "q:orders" in demand
    fenced = "fenced: broker A generation 1 was replaced by generation 2: another process joined"
    with pytest.raises(StoreError, match=fenced):
        old_catalog.publish()
    with pytest.raises(StoreError, match=fenced):
        old_catalog.record(Queue("zq"), destroyed=True)
    with pytest.raises(StoreError, match=fenced):
        old.queues.advertise(demand, True)
    with pytest.raises(StoreError, match=fenced):
        old_catalog.start()  # (its seed of the catalog)
    assert _rows(new, f"SELECT published, rows FROM {COUNTS} WHERE brokerid = 'A'") == counts
    assert _rows(new, f"SELECT dkey FROM {CATALOG}") == []
    assert _rows(new, f"SELECT qkey FROM {DEMAND}") == []
    assert _rows(new, f"SELECT name FROM {DURABLES}") == []
    wait_for(lambda: old.cluster._replaced, 5, "the old process told it was replaced")
    assert old.cluster._reason == (
        f"broker A generation 1 was replaced by generation 2: another process joined HA cluster "
        f"{old.cluster.settings.clusterid} as broker A"
    )
    # The new process writes as before.
    new_catalog.publish()
    with new.host.broker.lock:
        demand = new.queues._demand()
    new.queues.advertise(demand, True)


def test_a_process_paused_inside_a_fenced_transaction_is_taken_over_all_the_same(postgresql):
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster

    database = postgresql.create_database("pause" + uuid.uuid4().hex[:10])

    def join(brokerid: str) -> Any:
        props = load_properties(
            [],
            [
                "imq.cluster.ha=true",
                "imq.cluster.clusterid=p1",
                f"imq.brokerid={brokerid}",
                "imq.cluster.heartbeat.interval=1",
                "imq.cluster.monitor.interval=3",
                "imq.persist.store=jdbc",
                f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
            ],
            environ={},
        )
        return open_cluster(props, brokerid, {})

    a, b = join("A"), join("B")
    paused = a.settings.jdbc.connect()  # one of A's connections, SIGSTOPped inside a write
    try:
        a._transaction(
            lambda cur: cur.execute(
                "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 s' WHERE brokerid = 'A'"
            )
        )
        with paused.cursor() as cur:
            a.fence(cur)  # its lease row locked FOR SHARE, the transaction left open
        # The server ends the idle transaction after 1 s: B's SKIP LOCKED no longer passes A over.
        assert wait_for(b.take_over, 10, "B takes A over") == ("A", [])
    finally:
        paused.close()
        for member in (a, b):
            member.leave()
