"""maxNumActiveConsumers over an HA cluster of two real `serve` instances on one real
PostgreSQL (docs/ha.md#active-and-backup-consumers-across-the-cluster): mq:// consumers
on B1 (the oldest) and B2; only B1's receives, and when B1 is killed, B2's becomes
active once the lease lapsed and gets B1's unacknowledged messages, redelivered.
`query dst --json` on B2 shows both instances' counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridgemgr import connect
from bridgemgr.jms import CLIENT_ACKNOWLEDGE, Queue, TextMessage
from clusterdst_support import Taker
from ha_support import MONITOR, PASSWORD, Cluster, Instance
from service_support import cli
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def queried(instance: Instance) -> dict[str, Any]:
    """`query dst -t q -n orders --json` on ``instance``: the reply's data."""
    r = cli(instance, instance.passfile, "query", "dst", "-t", "q", "-n", "orders", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["data"]


def consumers_on(instance: Instance) -> dict[str, int]:
    return {i["broker_id"]: i["consumers"] for i in queried(instance)["instances"]}


def delivered(cluster: Cluster, postgresql: Any) -> int:
    """B1's stored messages counted as delivered (written with its store's next batch)."""
    import psycopg

    from bridgemgr.providers.embedded.cluster import instance_schema

    with psycopg.connect(**postgresql.conninfo(cluster.database)) as db:
        schema = instance_schema(cluster.clusterid, "B1")
        return int(db.execute(f'SELECT COUNT(*) FROM "{schema}".msgs WHERE dcount > 0').fetchone()[0])


def test_the_oldest_consumer_in_the_cluster_receives_and_a_backup_takes_over_a_killed_ones(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {})
    try:
        b1, b2 = cluster.start("B1", ""), cluster.start("B2", "")
        limits = ("-o", "maxNumActiveConsumers=1", "-o", "maxNumBackupConsumers=1")
        r = cli(b1, b1.passfile, "create", "dst", "-t", "q", "-n", "orders", *limits)
        assert r.returncode == 0, r.stdout + r.stderr
        first = connect(f"mq://{b1.address}", "admin", PASSWORD, prefetch=0)
        oldest = first.create_session(False, CLIENT_ACKNOWLEDGE).create_consumer(Queue("orders"))
        first.start()
        wait_for(lambda: consumers_on(b2).get("B1") == 1, 20, "B2 to know B1's consumer")
        second = connect(f"mq://{b2.address}", "admin", PASSWORD, prefetch=0)
        backup = Taker(second.create_session(False, CLIENT_ACKNOWLEDGE).create_consumer(Queue("orders")))
        second.start()
        wait_for(lambda: consumers_on(b2) == {"B1": 1, "B2": 1}, 20, "both consumers in query dst")
        sent = [f"o{i}" for i in range(5)]
        with connect(f"mq://{b2.address}", "admin", PASSWORD) as producer:
            sender = producer.create_session().create_producer(Queue("orders"))
            for text in sent:
                sender.send(TextMessage(text))
        got = [wait_for(lambda: oldest.receive(0.1), 20, "B1's consumer to receive").text for _ in sent]
        assert got == sent and backup.texts == []  # (B2's own backup took none of B2's)
        wait_for(lambda: delivered(cluster, postgresql) == len(sent), 10, "the delivery counts in B1's store")
        b1.kill()  # B1's five unacknowledged messages: in its store, with their delivery counts
        wait_for(lambda: len(backup.texts) >= len(sent), 6 * MONITOR + 20, "B2's backup to get them")
        assert backup.texts == sent and backup.redelivered == sent
        backup.close()
        second.close()
        try:
            first.close()
        except Exception:
            pass  # (its broker is gone)
    finally:
        cluster.stop()
