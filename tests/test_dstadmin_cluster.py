"""list dst's rows on an HA instance (dstadmin.cluster_rows): this instance's rows and the
peers' published ones merged, one row per destination with each instance's counts and
their sums; and the -v table the CLI prints of them."""

from __future__ import annotations

import dataclasses

from bridgemgr.admincli import _dst_instances_table
from bridgemgr.dstadmin import attributes_json, cluster_rows
from bridgemgr.jms.hostbroker import DestinationAttributes

ATTRS = DestinationAttributes(max_num_msgs=2)


def row(name: str, pending: int, consumers: int = 0, kind: str = "q", published: bool = False) -> dict:
    """A list dst row as dstadmin makes it (``published``: as a peer publishes it)."""
    attributes = dataclasses.asdict(ATTRS) if published else attributes_json(ATTRS)
    counts = {"pending": pending, "unacked": 0, "bytes": 10 * pending, "producers_waiting": 0}
    return (
        {"type": kind, "name": name, "state": "RUNNING", "temporary": False, "attributes": attributes}
        | counts
        | {
            "producers": 0,
            "consumers": consumers,
        }
    )


def test_each_destination_once_with_its_instances_counts_and_their_sums():
    local = [row("orders", 2)]
    peers = [("B2", 0.4, [row("orders", 3, 1, published=True), row("only.b2", 1, published=True)]), ("B3", 1.2, [])]
    merged = {r["name"]: r for r in cluster_rows(local, "B1", peers)}
    orders = merged["orders"]
    assert (orders["pending"], orders["bytes"], orders["consumers"]) == (5, 50, 1)
    assert [(i["broker_id"], i["age"], i["pending"]) for i in orders["instances"]] == [("B1", 0.0, 2), ("B2", 0.4, 3)]
    only = merged["only.b2"]  # another instance's alone: its attributes under the original's names
    assert only["attributes"] == attributes_json(ATTRS) and [i["broker_id"] for i in only["instances"]] == ["B2"]
    assert list(merged) == ["only.b2", "orders"]


def test_without_peers_the_one_instance():
    (only,) = cluster_rows([row("orders", 2)], "imqbroker", [])
    assert only["instances"] == [
        {"broker_id": "imqbroker", "age": 0.0, "pending": 2, "unacked": 0, "bytes": 20}
        | {"producers_waiting": 0, "producers": 0, "consumers": 0}
    ]


def test_the_v_table_lists_each_instance_then_the_total():
    rows = cluster_rows([row("orders", 2)], "B1", [("B2", 0.4, [row("orders", 3, 1, published=True)])])
    lines = [line.split() for line in _dst_instances_table(rows).splitlines() if line.startswith("orders")]
    assert lines == [
        ["orders", "queue", "B1", "0.0", "0", "0", "2", "0", "20"],
        ["orders", "queue", "B2", "0.4", "0", "1", "3", "0", "30"],
        ["orders", "queue", "(total)", "0", "1", "5", "0", "50"],
    ]
