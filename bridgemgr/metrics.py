"""What /metrics, /healthz and /readyz say: a prometheus-client Collector over the
service's live state, and the readiness check.

Nothing is updated per message for metrics. The links keep their plain counters
(jmsbridge/counters.py), the host broker its per-destination counts and the store its batch
write histogram; at scrape time ServiceCollector reads them all (the bridges' info(), the
broker's metrics(), the front ends' connection sets, an HA instance's lease) and turns them into Prometheus metric
families, which prometheus-client writes in the text format. readiness() answers /readyz
from the same live state: every bridge of imq.bridge.activelist with autostart must be
loaded and STARTED with none of its links STARTING (connecting, or its source or target
unreachable), and the store must take writes. On an HA instance every series carries the
label broker_id (imq.brokerid), so one Prometheus scraping the cluster tells the instances
apart. The HTTP shell that serves these is metricshttp.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from .props import MEMORY_STATES, BrokerProperties

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BROKER_LABEL = "broker_id"  # an HA instance's imq.brokerid, on each of its series
STATES = ("UNINITIALIZED", "STARTING", "STARTED", "PAUSING", "PAUSED", "RESUMING", "STOPPING", "STOPPED")


class Service(Protocol):
    """What the collector reads of the running service (service.BridgeServiceManager)."""

    props: BrokerProperties
    bridges: dict[str, Any]
    host_broker: Any
    jms_services: list[Any]
    cluster: Any  # providers/embedded/cluster.py's HACluster on an HA instance, else None
    cluster_queues: Any  # ... and its clusterdst.ClusterQueues (once it serves), else None


def _histogram(
    name: str, doc: str, labels: list[str], values: list[str], bounds: Iterable[float], buckets: list[int], total: float
) -> HistogramMetricFamily:
    """A histogram family from per-bucket counts (the last: above every bound)."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    cumulative, rows = 0, []
    for bound, count in zip([*list(bounds), float("inf")], buckets):
        cumulative += count
        rows.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
    family.add_metric(values, rows, total)
    return family


class ServiceCollector(Collector):
    """Every metric of the service, read from its live state at each scrape."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from self._bridges()
        broker = self.service.host_broker
        if broker is not None:
            yield from self._broker(broker.metrics())
        yield from self._connections()
        cluster = self.service.cluster
        if cluster is not None:
            yield GaugeMetricFamily(
                "imq_ha_lease_held",
                "1 while this HA instance holds its lease in the cluster",
                value=int(cluster.holding),
            )
            queues = self.service.cluster_queues
            for name, doc in (  # (each a counter of ClusterQueues; 0 until it serves)
                ("handed_off", "Messages this instance handed to other instances' consumers"),
                ("taken_in", "Messages other instances handed to this one, taken in from the inbox"),
                ("inbox_rejected", "Inbox rows for this instance that were not messages, set aside for the operator"),
            ):
                yield CounterMetricFamily(f"imq_ha_{name}", doc, value=getattr(queues, name) if queues else 0)

    # --- bridges and links --------------------------------------------------------------
    def _bridges(self) -> Iterator[Metric]:
        bridge_state = StateSetMetricFamily("imq_bridge_state", "Each bridge's state", labels=["bridge", "type"])
        link_state = StateSetMetricFamily("imq_link_state", "Each link's state", labels=["bridge", "link"])
        L = ["bridge", "link"]
        counters = {
            key: CounterMetricFamily(f"imq_link_{name}", doc, labels=L)
            for key, name, doc in (
                ("received", "received", "Messages taken from the link's source"),
                ("transferred", "transferred", "Messages sent to the target and consumed from the source"),
                ("consumed_only", "consumed_only", "Messages consumed without a transfer (no_transfer)"),
                ("redelivered", "redelivered", "Messages received with JMSRedelivered set"),
                ("rolled_back", "rolled_back", "Messages returned to the source (recover, rollback)"),
                ("reconnects", "reconnects", "Connections the link lost and made again"),
            )
        }
        dead = CounterMetricFamily(
            "imq_link_dead_lettered", "Messages given to a DMQ, by reason", labels=[*L, "reason"]
        )
        lost = CounterMetricFamily(
            "imq_link_dead_letters_lost", "Dead messages no DMQ took (only the bridge log has them)", labels=L
        )
        backlog = GaugeMetricFamily(
            "imq_link_source_backlog", "Messages waiting at the link's source (where its provider can tell)", labels=L
        )
        last = GaugeMetricFamily(
            "imq_link_last_transfer_timestamp_seconds", "When the link last completed a transfer (Unix time)", labels=L
        )
        latency: list[Metric] = []
        for name, bridge in list(self.service.bridges.items()):
            info = bridge.info()
            bridge_state.add_metric([name, bridge.type], {s: info["state"] == s for s in STATES})
            for link in info.get("links", []):
                values = [name, link["name"]]
                link_state.add_metric(values, {s: link["state"] == s for s in STATES})
                c = link.get("counters", {})
                for key, family in counters.items():
                    family.add_metric(values, c.get(key, 0))
                for reason, count in sorted(c.get("dmq_reasons", {}).items()):
                    dead.add_metric([*values, reason], count)
                lost.add_metric(values, c.get("dmq_lost", 0))
                if link.get("backlog") is not None:
                    backlog.add_metric(values, link["backlog"])
                if c.get("last_transfer_at") is not None:
                    last.add_metric(values, c["last_transfer_at"])
                hist = c.get("latency_ms")
                if hist is not None:
                    latency.append(
                        _histogram(
                            "imq_link_transfer_latency_seconds",
                            "From a message's receipt to its transfer's completion",
                            L,
                            values,
                            [b / 1000 for b in hist["bounds"]],
                            hist["buckets"],
                            hist["sum"] / 1000,
                        )
                    )
        yield bridge_state
        yield link_state
        yield from counters.values()
        yield from (dead, lost, backlog, last)
        yield from _merged(latency)

    # --- the host broker -------------------------------------------------------------------
    def _broker(self, m: dict[str, Any]) -> Iterator[Metric]:
        L = ["type", "name"]
        families = {
            key: (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                f"imq_destination_{name}", doc, labels=L
            )
            for key, name, kind, doc in (
                ("depth", "messages", "gauge", "Messages waiting (a topic: over its subscriptions)"),
                ("bytes", "bytes", "gauge", "Bytes of the messages held (encoded size)"),
                ("consumers", "consumers", "gauge", "Open consumers"),
                (
                    "producers",
                    "producers",
                    "gauge",
                    "Open producers bound to it, and anonymous ones "
                    "(bridge links, STOMP connections, remote sessions) "
                    "that have sent to it",
                ),
                ("enqueued", "enqueued", "counter", "Messages put on it since start"),
                ("dequeued", "dequeued", "counter", "Messages acknowledged, expired or removed since start"),
            )
        }
        for (kind, name), counts in sorted(m["destinations"].items()):
            for key, family in families.items():
                family.add_metric([kind, name], counts[key])
        yield from families.values()
        yield GaugeMetricFamily(
            "imq_broker_connections",
            "Open connections to the host broker (in-process ones included)",
            value=m["connections"],
        )
        memory = m.get("memory")
        if memory is not None:
            state = StateSetMetricFamily("imq_memory_state", "The host broker's memory state")
            state.add_metric([], {s: memory["state"] == s for s in MEMORY_STATES})
            yield state
            yield GaugeMetricFamily(
                "imq_memory_used_ratio", "Memory in use, of the budget", value=memory["percent"] / 100
            )
            yield GaugeMetricFamily("imq_memory_budget_bytes", "The memory budget", value=memory["budget"])
        store = m.get("store")
        if store is not None:
            if store["size"] is not None:
                yield GaugeMetricFamily("imq_store_size_bytes", "Bytes the store takes on disk", value=store["size"])
            yield GaugeMetricFamily(
                "imq_store_writable", "1 while the store takes writes", value=0 if store["problem"] else 1
            )
            yield CounterMetricFamily("imq_store_rows_written", "Rows written or deleted", value=store["rows"])
            yield CounterMetricFamily(
                "imq_store_rows_rejected",
                "Stored rows that were not messages when read back, set aside in the store's table rejected",
                value=store["rejected"],
            )
            yield _histogram(
                "imq_store_commit_seconds",
                "A store batch write, its fsync included when imq.persist.file.sync.enabled",
                [],
                [],
                store["commit_bounds"],
                store["commit_buckets"],
                store["commit_seconds"],
            )

    def _connections(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("imq_connections", "Open connections per front end", labels=["service"])
        family.add_metric(["jms"], sum(len(s.connections) for s in self.service.jms_services))
        for bridge in list(self.service.bridges.values()):
            if bridge.type == "STOMP":
                family.add_metric(["stomp"], bridge.connections)
        yield family


def _merged(families: list[Metric]) -> Iterator[Metric]:
    """Histogram families of one name as one family (one HELP and TYPE line)."""
    if families:
        first = families[0]
        for other in families[1:]:
            first.samples.extend(other.samples)
        yield first


class BrokerLabelled(Collector):
    """Another collector's series, each with the label broker_id (an HA instance's)."""

    def __init__(self, collector: Collector, brokerid: str) -> None:
        self.collector, self.brokerid = collector, brokerid

    def collect(self) -> Iterator[Metric]:
        for metric in self.collector.collect():
            metric.samples = [s._replace(labels={**s.labels, BROKER_LABEL: self.brokerid}) for s in metric.samples]
            yield metric


def registry(service: Service) -> CollectorRegistry:
    """A registry with the service's collector, the process's (memory, CPU, files) and
    Python's garbage collector's (passes and objects collected per generation); on an HA
    instance each of their series labelled with its broker id."""
    reg = CollectorRegistry(auto_describe=False)
    props = service.props
    brokerid = props.get("imq.brokerid") if props.get("imq.cluster.ha") else None
    scratch = CollectorRegistry(auto_describe=False)  # (GCCollector registers itself somewhere)
    for collector in (ServiceCollector(service), ProcessCollector(registry=None), GCCollector(registry=scratch)):
        reg.register(collector if not brokerid else BrokerLabelled(collector, brokerid))
    return reg


def scrape(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)


def readiness(service: Service) -> list[str]:
    """Why the service is not ready (empty: it is): an autostart bridge not STARTED or
    not loaded, a link of one still (or again) connecting, the store not taking writes."""
    reasons = []
    broker = service.host_broker
    if broker is None:
        reasons.append("the host broker is not running")
    else:
        problem = broker.store_problem()
        if problem is not None:
            reasons.append(problem)
    props = service.props
    if props.enabled:
        for name in props.activelist:
            if not props.bridge(name).autostart:
                continue
            bridge = service.bridges.get(name)
            if bridge is None:
                reasons.append(f"bridge {name} is not loaded (see the log)")
                continue
            state = getattr(bridge.state, "value", str(bridge.state))
            if state != "STARTED":
                reasons.append(f"bridge {name} is {state}, not STARTED")
            reasons.extend(_links_not_connected(name, bridge.info()))
    return reasons


def _links_not_connected(bridge: str, info: dict[str, Any]) -> Iterator[str]:
    """A reason for each link of a bridge that is STARTING: connecting, or connecting
    again after its source or target became unreachable (with what keeps it)."""
    for link in info.get("links", []):
        if link.get("state") == "STARTING":
            error = link.get("counters", {}).get("current_error")
            yield f"link {link['name']} of bridge {bridge} is STARTING" + (f": {error}" if error else "")
