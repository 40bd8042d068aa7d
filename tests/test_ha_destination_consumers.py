"""Table 4-1's producer and consumer attributes on an HA pair (real PostgreSQL): set with
create dst on one instance, the same on both; maxNumProducers counted per instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.admin.protocol import OK, Command
from bridgemgr.dstadmin import destination_command
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException
from bridgemgr.jms.hostbroker import DestinationAttributes, Principal
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from bridgemgr.providers.embedded.clustercatalog import open_cluster_destinations
from clusterdst_support import cluster_members
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
Q = Queue("orders")
ATTRIBUTES = {
    "maxNumProducers": "1",
    "maxNumActiveConsumers": "1",
    "maxNumBackupConsumers": "1",
    "consumerFlowLimit": "7",
}


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def test_create_dst_on_one_instance_sets_them_on_both_and_producers_count_per_instance(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    catalogs = [open_cluster_destinations(m.cluster, m.host, 3600) for m in (b1, b2)]
    for catalog in catalogs:
        stack.callback(catalog.stop)
    command = Command("CREATE_DST", dst_type="q", destination="orders", attributes=ATTRIBUTES)
    reply = destination_command(
        b1.host, Principal("admin"), command, DestinationAttributes(), cluster=catalogs[0], instance="B1"
    )
    assert reply.status == OK and "not_yet" not in reply.data, reply.message
    found = wait_for(lambda: b2.host.broker.describe_destination(Q), 10, "orders on B2")
    limits = found[0]
    assert (limits.max_num_producers, limits.max_num_active_consumers) == (1, 1)
    assert (limits.max_num_backup_consumers, limits.consumer_flow_limit) == (1, 7)
    queried = destination_command(
        b2.host, Principal("admin"), Command("QUERY_DST", dst_type="q", destination="orders"), DestinationAttributes()
    )
    assert {k: str(v) for k, v in queried.data["attributes"].items() if k in ATTRIBUTES} == ATTRIBUTES
    for member in (b1, b2):  # per broker: one producer of a user on each instance
        user = EmbeddedConnectionFactory(member.host.broker).create_connection()  # (not the service's)
        stack.callback(user.close)
        session = user.create_session()
        session.create_producer(Q).send(TextMessage(member.brokerid))
        with pytest.raises(ResourceAllocationException, match="orders has 1 producer"):
            session.create_producer(Q)
    for member in (b1, b2):  # the same consumer limits on each: an active one, a backup, no third
        session = member.connection(stack).create_session()
        session.create_consumer(Q)
        session.create_consumer(Q)
        with pytest.raises(ResourceAllocationException, match="maxNumActiveConsumers=1 plus maxNumBackupConsumers=1"):
            session.create_consumer(Q)
