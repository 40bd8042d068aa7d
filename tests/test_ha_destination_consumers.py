"""Table 4-1's producer and consumer attributes on an HA pair (real PostgreSQL): set with
create dst on one instance, the same on both; maxNumProducers counted per instance,
maxNumActiveConsumers and maxNumBackupConsumers over the cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.admin.protocol import OK, Command
from bridgemgr.dstadmin import destination_command
from bridgemgr.jms import AckMode, Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException
from bridgemgr.jms.hostbroker import DestinationAttributes, Principal
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from bridgemgr.providers.embedded.clustercatalog import open_cluster_destinations
from clusterdst_support import Member, Taker, cluster_members, take_over, texts_of
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
    # global: an active consumer and a backup in the whole cluster, no third on either
    first = b1.connection(stack).create_session().create_consumer(Q)
    wait_for(lambda: b2.host.broker.queues["orders"].elsewhere == 1, 10, "B2 to know B1's consumer")
    session = b2.connection(stack).create_session()
    session.create_consumer(Q)
    for member in (b2, b1):
        wait_for(lambda m=member: queue_of(m).elsewhere + len(queue_of(m).consumers) == 2, 10, "both consumers")
        with pytest.raises(ResourceAllocationException, match="maxNumActiveConsumers=1 plus maxNumBackupConsumers=1"):
            member.connection(stack).create_session().create_consumer(Q)
    assert first in queue_of(b1).consumers


def queue_of(member: Any) -> Any:
    return member.host.broker.queues["orders"]


def create_orders(stack: Any, b1: Member, b2: Member, **more: str) -> None:
    """Queue orders with one active consumer and one backup (and ``more``), made on both."""
    catalogs = [open_cluster_destinations(m.cluster, m.host, 3600) for m in (b1, b2)]
    for catalog in catalogs:
        stack.callback(catalog.stop)
    attributes = {"maxNumActiveConsumers": "1", "maxNumBackupConsumers": "1", **more}
    command = Command("CREATE_DST", dst_type="q", destination="orders", attributes=attributes)
    reply = destination_command(
        b1.host, Principal("admin"), command, DestinationAttributes(), cluster=catalogs[0], instance="B1"
    )
    assert reply.status == OK and "not_yet" not in reply.data, reply.message


def active_and_backup(stack: Any, b1: Member, b2: Member) -> tuple[Any, Any, Any]:
    """(B1's connection, its consumer: the oldest, active; B2's: a backup, receiving)."""
    conn = b1.connection(stack)
    oldest = conn.create_session(False, AckMode.CLIENT_ACKNOWLEDGE).create_consumer(Q)
    wait_for(lambda: queue_of(b1).cluster_active == [oldest], 10, "B1's consumer active")
    backup = b2.connection(stack).create_session(False, AckMode.CLIENT_ACKNOWLEDGE).create_consumer(Q)
    wait_for(lambda: queue_of(b1).elsewhere == 1, 10, "B1 to know B2's consumer")
    assert queue_of(b2).cluster_active == [] and queue_of(b2).elsewhere == 1
    taker = Taker(backup)
    stack.callback(taker.close)
    return conn, oldest, taker


def send(stack: Any, member: Member, texts: list[str]) -> None:
    session = member.connection(stack).create_session()
    producer = session.create_producer(Q)
    for text in texts:
        producer.send(session.create_text_message(text))


def test_one_consumer_is_active_in_the_cluster_and_a_backup_on_another_takes_over_at_its_close(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    create_orders(stack, b1, b2)
    conn, oldest, backup = active_and_backup(stack, b1, b2)
    sent = [f"m{i}" for i in range(6)]
    send(stack, b2, sent)  # (B2's own backup, receiving, takes none of them)
    got: list[str] = []
    texts_of(oldest, got, len(sent), 20)
    assert got == sent and backup.texts == []
    conn.close()  # unacknowledged: back to B1's queue, and B2's backup is the oldest now
    wait_for(lambda: len(backup.texts) >= len(sent), 20, "the backup to get them")
    assert backup.texts == sent and backup.redelivered == sent
    assert queue_of(b2).cluster_active is not None and len(queue_of(b2).cluster_active) == 1


def test_a_backup_becomes_active_when_the_active_consumers_instance_is_taken_over(members):
    from bridgemgr.providers.embedded.cluster import instance_schema

    start, stack = members
    b1, b2 = start("B1"), start("B2")
    create_orders(stack, b1, b2)
    _, oldest, backup = active_and_backup(stack, b1, b2)
    sent = [f"k{i}" for i in range(6)]
    send(stack, b1, sent)
    got: list[str] = []
    texts_of(oldest, got, len(sent), 20)
    assert got == sent and backup.texts == []
    conn = b1.cluster.settings.jdbc.connect()
    stack.callback(conn.close)
    schema = instance_schema(b1.cluster.settings.clusterid, "B1")

    def counted() -> int:
        count = conn.execute(f'SELECT COUNT(*) FROM "{schema}".msgs WHERE dcount > 0').fetchone()[0]
        conn.commit()
        return int(count)

    wait_for(lambda: counted() == len(sent), 10, "the delivery counts in B1's store")
    conn.execute("UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 second' WHERE brokerid = 'B1'")
    conn.commit()  # B1 died: its lease lapsed, and B2 takes its store over
    assert take_over(b2) == ("B1", [])
    wait_for(lambda: len(backup.texts) >= len(sent), 20, "the backup to get B1's messages")
    assert backup.texts == sent and backup.redelivered == sent


def test_a_backup_does_not_keep_its_instances_messages_from_a_local_delivery_preferred_queue(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    create_orders(stack, b1, b2, localDeliveryPreferred="true")
    _, oldest, backup = active_and_backup(stack, b1, b2)
    sent = [f"p{i}" for i in range(4)]
    send(stack, b2, sent)  # (B2 has a consumer, but no active one: they go to B1's)
    got: list[str] = []
    texts_of(oldest, got, len(sent), 20)
    assert got == sent and backup.texts == []


def test_a_takeover_does_not_bring_back_a_queue_the_cluster_destroyed(members):
    """An instance is stopped (its lease ends at once) while an administrator destroys a
    queue it had messages of: the instance that takes its store over takes neither that
    queue nor its messages, not even until the catalog is applied again (a send there in
    that window was taken, and lost with the queue); its other queues come along."""
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    catalogs = [open_cluster_destinations(m.cluster, m.host, 3600) for m in (b1, b2)]
    for catalog in catalogs:
        stack.callback(catalog.stop)
    command = Command("CREATE_DST", dst_type="q", destination="adm", attributes={"maxNumMsgs": "10"})
    reply = destination_command(
        b1.host, Principal("admin"), command, DestinationAttributes(), cluster=catalogs[0], instance="B1"
    )
    assert reply.status == OK, reply.message
    session = b1.connection(stack).create_session()
    for name in ("adm", "kept"):
        session.create_producer(Queue(name)).send(session.create_text_message(f"to {name}"))
    b1.host.broker.store.flush()
    catalogs[0].stop()
    b1.queues.stop()
    b1.host.close()  # B1 stops: its store holds adm (configured) and one message of each
    b1.cluster.leave()
    catalogs[1].stop()  # (B2's own catalog thread would destroy adm again after the takeover)
    conn = b2.cluster.settings.jdbc.connect()
    stack.callback(conn.close)
    conn.execute(  # an administrator destroys adm on B2 meanwhile (B2's broker has none)
        "INSERT INTO imq_ha_destinations(dkey, limits, destroyed, version, brokerid) "
        "VALUES ('q:adm', NULL, true, nextval('imq_ha_destinations_version'), 'B2') "
        "ON CONFLICT (dkey) DO UPDATE SET destroyed = true, version = EXCLUDED.version"
    )
    conn.commit()
    b2.host.broker.destroy(Queue("adm"))
    assert take_over(b2) == ("B1", [])
    broker = b2.host.broker
    assert "adm" not in broker.queues and broker.describe_destination(Queue("adm")) is None
    receiver = b2.connection(stack).create_session().create_consumer(Queue("kept"))
    message = receiver.receive(10)
    assert message is not None and message.text == "to kept"
