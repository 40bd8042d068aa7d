"""A link's excused redeliveries survive an HA takeover, end to end: instances A and B of
one HA cluster in a database of this test's own (conftest's `database`: its server is
stopped and started); A
owns bridge jb, whose transacted link moves xa.src of A's host broker (its store in the
shared database) to xa.dst at T (a plain `serve`, file store), batches of 10,
backoutThreshold 2, a gate transformer holding it at will (test_xa_pg_outage_e2e.py).

The database goes down while the link holds a unit: its attempts to complete it roll it
back, excused (the outage's fault), until m0 has been delivered 3+ times. A is then
killed (kill -9) with m0 in its unit; B takes A over (A's store moves into B's, m0's
delivery count with it) and starts jb with its own var folder. m0 comes back once more:
one crash is one backout, under the threshold. Every message reaches T once, in order;
none goes to the DMQ. (Before, the excuses were a file in A's var folder: B read m0's
excused redeliveries as backouts and sent its unit to the DMQ,
BACKOUT_THRESHOLD_REACHED.)
"""

from __future__ import annotations

import pytest

from ha_support import PASSWORD, Cluster
from service_support import Daemon, one_bridge_files, send, take
from test_xa_faults_e2e import IDLE_XML
from test_xa_pg_outage_e2e import gated_xml, roll_back_in_an_outage
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MONITOR = 8  # s: longer than the outage, so that no lease runs out while the database is down


def excused_rows(cluster: Cluster) -> int | None:
    """The rows of the cluster's table of excuses (None while it does not exist)."""
    import psycopg

    from bridgemgr.providers.embedded.cluster import cluster_schema

    with psycopg.connect(**cluster.postgresql.conninfo(cluster.database)) as conn:
        table = f'"{cluster_schema(cluster.clusterid)}".imq_bridge_excuses'
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return None
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_outage_rollbacks_stay_excused_after_a_takeover(tmp_path, database, monkeypatch):
    n = 30
    (tmp_path / "target").mkdir()
    tprops, _ = one_bridge_files(tmp_path / "target", "target", IDLE_XML, PASSWORD, activelist="")
    target = Daemon(tprops)
    xml, gate = gated_xml(tmp_path, target, PASSWORD, monkeypatch)
    cluster = Cluster(
        tmp_path / "cluster",
        database,
        {"jb": xml},
        "imq.bridge.jb.transaction.batchSize=10",
        "imq.bridge.jb.backoutThreshold=2",
    )
    monitor = f"imq.cluster.monitor.interval={MONITOR}"
    try:
        a = cluster.start("A", "jb", monitor)
        b = cluster.start("B", "", monitor)
        assert a.bridges == {"jb": "STARTED"} and b.bridges == {}, (a.lines, b.lines)
        send(a, PASSWORD, "xa.src", *(f"m{i}" for i in range(n)))
        roll_back_in_an_outage(database, gate)
        wait_for(lambda: excused_rows(cluster), 10, "A's excuses written to the cluster's table")
        a.kill()
        (gate / "hold").unlink()
        wait_for(lambda: b.when("bridge jb (JMS): STARTED"), 3 * MONITOR)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=n, wait=60, quiet=1.0)]
        assert got == [f"m{i}" for i in range(n)], got
        dead = take(b, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5)
        assert dead == [], [(m.text, m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON")) for m in dead]
        assert take(b, PASSWORD, "xa.src", quiet=0.5) == []
        assert wait_for(lambda: excused_rows(cluster) == 0, 10)  # committed: none is excused now
    finally:
        cluster.stop()
        target.stop()
