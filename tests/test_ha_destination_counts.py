"""list dst and query dst on an HA cluster of three instances (real PostgreSQL): a topic's
counts are its subscribers', not the proxies that carry its messages to other instances,
a durable subscription counts once; query dst gives the cluster's counts per instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.admin.protocol import OK, Command
from bridgemgr.admincli import _dst_text
from bridgemgr.dstadmin import destination_command
from bridgemgr.jms import Queue, Topic
from bridgemgr.jms.hostbroker import DestinationAttributes, Principal
from bridgemgr.providers.embedded.clustercatalog import open_cluster_destinations
from clusterdst_support import cluster_members
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def three(postgresql, tmp_path: Path) -> Iterator[Any]:
    for start, stack in cluster_members(postgresql, tmp_path):
        members = [start(b) for b in ("B1", "B2", "B3")]
        catalogs = [open_cluster_destinations(m.cluster, m.host, 3600) for m in members]
        for catalog in catalogs:
            stack.callback(catalog.stop)
        yield members, catalogs, stack


def ask(member: Any, catalog: Any, command: Command) -> dict[str, Any]:
    reply = destination_command(
        member.host, Principal("admin"), command, DestinationAttributes(), cluster=catalog, instance=member.brokerid
    )
    assert reply.status == OK, reply.message
    return reply.data


def test_a_topics_subscribers_on_three_instances_count_once_without_the_proxies(three):
    members, catalogs, stack = three
    durable = members[0].connection(stack, client_id="app").create_session()
    durable.create_durable_subscriber(Topic("news"), "d").close()  # (kept on every instance)
    for member in members:
        member.connection(stack).create_session().create_consumer(Topic("news"))
    for member in members:
        others = sorted(m.brokerid for m in members if m is not member)
        wait_for(lambda m=member, o=others: m.queues.remote_subscribers("news") == o, 20, "the proxies")

    def news() -> dict[str, Any] | None:
        rows = ask(members[0], catalogs[0], Command("LIST_DST", dst_type="t"))["destinations"]
        found = [r for r in rows if r["name"] == "news"]
        settled = found and len(found[0]["instances"]) == 3 and found[0]["consumers"] == 3
        return found[0] if settled and all(i["durable_subscriptions"] for i in found[0]["instances"]) else None

    row = wait_for(news, 20, "each instance's counts of news")
    assert [(i["subscriptions"], i["durable_subscriptions"]) for i in row["instances"]] == [(2, 1)] * 3
    assert (row["consumers"], row["subscriptions"], row["durable_subscriptions"]) == (3, 4, 1)


def test_query_dst_gives_the_clusters_counts_and_each_instances(three):
    members, catalogs, stack = three
    for member, count in zip(members[:2], (2, 3), strict=True):
        session = member.connection(stack).create_session()
        producer = session.create_producer(Queue("orders"))
        for i in range(count):
            producer.send(session.create_text_message(f"{member.brokerid}-{i}"))

    rest = (catalogs[2], "B3")

    def queried() -> dict[str, Any] | None:  # (asked on B3, which has no queue orders)
        command = Command("QUERY_DST", dst_type="q", destination="orders")
        reply = destination_command(members[2].host, Principal("admin"), command, DestinationAttributes(), (), *rest)
        data = reply.data if reply.status == OK else {}
        return data if [i["pending"] for i in data.get("instances", ())] == [2, 3] else None

    data = wait_for(queried, 20, "B1's and B2's counts of orders")
    assert [i["broker_id"] for i in data["instances"]] == ["B1", "B2"]
    assert (data["pending"], data["producers"], data["consumers"], data["name"]) == (5, 2, 0, "orders")
    assert all(i["age"] >= 0 and i["unacked"] == 0 and i["bytes"] > 0 for i in data["instances"])
    listed = ask(members[0], catalogs[0], Command("LIST_DST", dst_type="q"))["destinations"]
    assert [r["pending"] for r in listed if r["name"] == "orders"] == [5]
    text = _dst_text("query", data)
    assert text is not None
    brokers = [cells[2] for line in text.splitlines() if (cells := line.split())[:2] == ["orders", "queue"]]
    assert brokers == ["RUNNING", "B1", "B2", "(total)"]  # the table's row, then each instance's
