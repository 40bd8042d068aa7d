"""imq_ha_lease_held: 1 while an HA instance holds its lease in a real PostgreSQL cluster
table, 0 once another broker took it (what the LeaseLost alert of
examples/monitoring/imqbridge-alerts.yml fires on); absent on an instance without HA."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridgemgr.metrics import registry, scrape
from bridgemgr.props import BrokerProperties, load_properties
from bridgemgr.providers.embedded.cluster import BROKERS, open_cluster
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@dataclass
class Instance:
    """What metrics.Service reads, here of an instance with no bridges and no broker."""

    props: BrokerProperties
    cluster: Any = None
    cluster_queues: Any = None
    bridges: dict[str, Any] = field(default_factory=dict)
    host_broker: Any = None
    jms_services: list[Any] = field(default_factory=list)


def lease_held(instance: Instance) -> float | None:
    page = scrape(registry(instance)).decode()
    found = [s.value for f in text_string_to_metric_families(page) for s in f.samples if s.name == "imq_ha_lease_held"]
    return found[0] if found else None


def test_the_lease_gauge_follows_the_lease(postgresql):
    database = postgresql.create_database("lease" + uuid.uuid4().hex[:10])
    props = load_properties(
        [],
        [
            "imq.cluster.ha=true",
            "imq.cluster.clusterid=c1",
            "imq.brokerid=A",
            "imq.cluster.heartbeat.interval=1",
            "imq.cluster.monitor.interval=3",
            "imq.persist.store=jdbc",
            f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
        ],
        environ={},
    )
    assert lease_held(Instance(props)) is None  # no HA: no series
    cluster = open_cluster(props, "a", {"imq.bridge.enabled": "false"})
    assert cluster is not None
    lost: list[str | None] = []
    instance = Instance(props, cluster)
    try:
        cluster.start(lambda broker, bridges: None, lost.append, lambda bridges: None, [])
        assert lease_held(instance) == 1.0
        # Broker B took A over: A's next renewal fails, and it is told once, by whom.
        conn = cluster.settings.jdbc.connect()
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {BROKERS} SET state = 'taken', taken_by = 'B' WHERE brokerid = 'A'")
        conn.commit()
        conn.close()
        wait_for(lambda: lost == ["broker A generation 1 was taken over by broker B of HA cluster c1"], 10)
        assert lease_held(instance) == 0.0
    finally:
        cluster.leave()


def labelled(props: BrokerProperties) -> set[str | None]:
    """The broker_id label values of every series one scrape of an instance shows."""
    page = scrape(registry(Instance(props))).decode()
    return {s.labels.get("broker_id") for f in text_string_to_metric_families(page) for s in f.samples}


def test_every_series_of_an_ha_instance_names_its_broker():
    ha = ["imq.cluster.ha=true", "imq.cluster.clusterid=c1", "imq.brokerid=B2", "imq.persist.store=jdbc"]
    ha.append("imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://127.0.0.1:1/none")
    assert labelled(load_properties([], ha, environ={})) == {"B2"}  # process_*, python_gc_* too
    assert labelled(load_properties([], ["imq.brokerid=B2"], environ={})) == {None}  # no HA: no label
