"""Cluster-wide queues of an HA cluster (docs/ha.md): instances of one cluster on a real
PostgreSQL server serve the same queues; a message sent to one reaches a consumer on
another, once (providers/embedded/clusterdst.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import Queue
from clusterdst_support import Member, Taker, cluster_members, texts_of
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def test_a_message_sent_to_one_instance_reaches_a_consumer_on_another_once(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    consumer = b2.connection(stack).create_session().create_consumer(Queue("orders"))
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("orders"))
    sent = [f"m{i}" for i in range(50)]
    for text in sent:
        producer.send(session.create_text_message(text))
    got: list[str] = []
    texts_of(consumer, got, len(sent), 20)
    quiet_for(lambda: len(got) + (1 if consumer.receive(0.05) else 0), 1.0, 10)
    assert got == sent
    assert b1.queues.handed_off == 50 and b2.queues.taken_in == 50


def test_competing_consumers_on_three_instances_share_a_queue_each_message_once(members):
    start, stack = members
    b1, b2, b3 = start("B1"), start("B2"), start("B3")
    takers = [Taker(m.connection(stack).create_session().create_consumer(Queue("work"))) for m in (b1, b2, b3)]
    for taker in takers:
        stack.callback(taker.close)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("work"))
    sent = [f"w{i}" for i in range(300)]
    for text in sent:
        producer.send(session.create_text_message(text))
    total = lambda: sum(len(t.texts) for t in takers)  # noqa: E731
    wait_for(lambda: total() >= len(sent), 30, "300 messages taken")
    quiet_for(total, 1.0, 10)
    got = [text for t in takers for text in t.texts]
    assert sorted(got) == sorted(sent) and len(got) == len(sent)
    assert b1.queues.handed_off == b2.queues.taken_in + b3.queues.taken_in


def test_a_peer_takes_only_what_its_consumers_selectors_take(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    red = b2.connection(stack).create_session().create_consumer(Queue("paint"), "color = 'red'")
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("paint"))
    for i in range(20):
        message = session.create_text_message(f"p{i}")
        message.set_string_property("color", "red" if i % 2 else "blue")
        producer.send(message)
    got: list[str] = []
    texts_of(red, got, 10, 20)
    assert got == [f"p{i}" for i in range(1, 20, 2)]
    assert b1.host.broker.queue_depth("paint") == 10  # the blue ones wait where they were sent
    b3 = start("B3")
    anything = b3.connection(stack).create_session().create_consumer(Queue("paint"))
    blue: list[str] = []
    texts_of(anything, blue, 10, 20)
    assert blue == [f"p{i}" for i in range(0, 20, 2)]
    assert b1.host.broker.queue_depth("paint") == 0


def test_a_redelivered_message_keeps_its_delivery_count_on_the_peer(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    session = b1.connection(stack).create_session(transacted=True)
    session.create_producer(Queue("again")).send(session.create_text_message("once"))
    session.commit()
    first = session.create_consumer(Queue("again"))
    assert first.receive(5).text == "once"
    session.rollback()  # delivered once on B1, not acknowledged
    first.close()
    consumer = b2.connection(stack).create_session().create_consumer(Queue("again"))
    message = wait_for(lambda: consumer.receive(0.05), 20, "the message on B2")
    assert (message.text, message.redelivered, message.delivery_count) == ("once", True, 2)


def test_serve_instances_a_producer_on_one_and_a_consumer_on_another(tmp_path, postgresql):
    from ha_support import PASSWORD, Cluster
    from service_support import send, take

    cluster = Cluster(tmp_path, postgresql, {}, "imq.bridge.enabled=false")
    try:
        b1, b2 = cluster.start("B1", ""), cluster.start("B2", "")
        sent = [f"m{i}" for i in range(20)]
        send(b1, PASSWORD, "orders", *sent)
        assert [m.text for m in take(b2, PASSWORD, "orders", 20, 30, 0.5)] == sent
    finally:
        cluster.stop()


def configure(member: Member, queue: str, text: str) -> None:
    """``update dst``'s attributes (name=value) on one instance's queue."""
    from bridgemgr.dstadmin import _updated
    from bridgemgr.jms.hostbroker import DestinationAttributes, Principal

    name, _, value = text.partition("=")
    member.host.configure_destination(
        Principal("admin"), Queue(queue), _updated(DestinationAttributes(), {name: value})
    )


def test_local_delivery_preferred_goes_to_other_instances_only_without_local_consumers(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    configure(b1, "near", "localDeliveryPreferred=true")
    local = b1.connection(stack).create_session().create_consumer(Queue("near"))  # open, not receiving
    remote = Taker(b2.connection(stack).create_session().create_consumer(Queue("near")))
    stack.callback(remote.close)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("near"))
    for i in range(10):
        producer.send(session.create_text_message(f"n{i}"))
    quiet_for(lambda: len(remote.texts), 1.0, 10)
    assert remote.texts == [] and b1.host.broker.queue_depth("near") == 10
    local.close()
    wait_for(lambda: len(remote.texts) == 10, 20, "10 messages on B2")
    assert remote.texts == [f"n{i}" for i in range(10)]


def test_a_local_only_queue_never_delivers_to_another_instance(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    configure(b1, "here", "isLocalOnly=true")
    remote = Taker(b2.connection(stack).create_session().create_consumer(Queue("here")))
    stack.callback(remote.close)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("here"))
    for i in range(5):
        producer.send(session.create_text_message(f"h{i}"))
    quiet_for(lambda: len(remote.texts), 1.0, 10)
    assert remote.texts == [] and b1.host.broker.queue_depth("here") == 5
    got: list[str] = []
    texts_of(b1.connection(stack).create_session().create_consumer(Queue("here")), got, 5, 10)
    assert got == [f"h{i}" for i in range(5)]


def test_a_backlog_larger_than_the_peers_credit_arrives_whole(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    consumer = b2.connection(stack).create_session().create_consumer(Queue("bulk"))
    session = b1.connection(stack).create_session(transacted=True)
    producer = session.create_producer(Queue("bulk"))
    sent = [f"b{i}" for i in range(2500)]  # twice the 1000 a consumer's instance may hold
    for i, text in enumerate(sent):
        producer.send(session.create_text_message(text))
        if i % 500 == 499:
            session.commit()
    got: list[str] = []
    texts_of(consumer, got, len(sent), 60)
    assert got == sent


def advertise(member: Member) -> None:
    """One advertisement of ``member`` (started with threads=False): its demand written,
    its peers' read."""
    with member.host.broker.lock:
        demand = member.queues._demand()
    member.queues.advertise(demand, True)


def test_the_intake_reads_the_inbox_without_holding_the_brokers_lock(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2", threads=False)  # B2's intake runs when told
    consumer = b2.connection(stack).create_session().create_consumer(Queue("fast"))
    advertise(b2)  # (B1's threads read it)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("fast"))
    for i in range(5):
        producer.send(session.create_text_message(f"f{i}"))
    wait_for(lambda: b1.queues.handed_off == 5, 20, "5 messages in B2's inbox")
    pid = b2.queues._conn("intake").info.backend_pid
    holder, watcher = b2.cluster.settings.jdbc.connect(), b2.cluster.settings.jdbc.connect()
    stack.callback(watcher.close)
    stack.callback(holder.close)
    holder.execute("LOCK TABLE imq_ha_inbox IN ACCESS EXCLUSIVE MODE")  # B2's read of its rows waits

    def waits_for_a_lock() -> bool:
        row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        watcher.commit()  # (a fresh snapshot of the activity next time)
        return row is not None and row[0] == "Lock"

    intake = threading.Thread(target=b2.queues.take_in, daemon=True)
    intake.start()
    wait_for(waits_for_a_lock, 20, "B2's intake waiting to read the inbox")
    free = b2.host.broker.lock.acquire(timeout=5)  # its consumers, producers, acks go on
    if free:
        b2.host.broker.lock.release()
    holder.rollback()
    intake.join(20)
    assert free and not intake.is_alive() and b2.queues.taken_in == 5
    got: list[str] = []
    texts_of(consumer, got, 5, 20)
    assert got == [f"f{i}" for i in range(5)]


def test_a_handoff_leaves_no_removal_for_the_store_to_write(members):
    start, stack = members
    b1, b2 = start("B1", threads=False), start("B2")  # B1's handoff runs when told
    consumer = b2.connection(stack).create_session().create_consumer(Queue("moved"))
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("moved"))
    sent = [f"m{i}" for i in range(20)]
    for text in sent:
        producer.send(session.create_text_message(text))  # (persistent: in the store when sent)

    def sees_b2() -> bool:
        advertise(b1)
        return "q:moved" in b1.queues._parkers

    wait_for(sees_b2, 20, "B1 to see B2's consumer")
    store = b1.host.broker.store
    store.flush()
    rows = store.rows
    assert b1.queues.hand_off() and b1.queues.handed_off == 20
    store.flush()
    assert store.rows == rows  # the move deleted their rows: no delete per message to write
    assert b1.host.broker.queue_depth("moved") == 0
    got: list[str] = []
    texts_of(consumer, got, 20, 20)
    assert got == sent


def test_a_peer_with_nothing_waiting_gets_a_small_first_batch(members):
    from bridgemgr.providers.embedded.clusterdst import BATCH, FIRST

    start, stack = members
    b1, b2 = start("B1", threads=False), start("B2")  # B1's handoff runs when told
    consumer = b2.connection(stack).create_session().create_consumer(Queue("ramp"))
    session = b1.connection(stack).create_session(transacted=True)
    producer = session.create_producer(Queue("ramp"))
    sent = [f"r{i}" for i in range(FIRST + BATCH + 7)]
    for text in sent:
        producer.send(session.create_text_message(text))
    session.commit()

    def sees_b2() -> bool:
        advertise(b1)
        return "q:ramp" in b1.queues._parkers

    wait_for(sees_b2, 20, "B1 to see B2's consumer")
    batches = []
    while b1.queues.hand_off():
        batches.append(b1.queues.handed_off - sum(batches))
    assert batches == [FIRST, BATCH, 7]  # its consumer starts on the first while the next moves
    got: list[str] = []
    texts_of(consumer, got, len(sent), 30)
    assert got == sent


def test_a_replaced_generation_neither_hands_off_nor_takes_in(members):
    from bridgemgr.jms.errors import StoreError

    start, stack = members
    b1, b2 = start("B1", threads=False), start("B2", threads=False)  # both run when told
    consumer = b2.connection(stack).create_session().create_consumer(Queue("fenced"))
    advertise(b2)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("fenced"))
    sent = [f"z{i}" for i in range(5)]
    for text in sent:
        producer.send(session.create_text_message(text))

    def sees_b2() -> bool:
        advertise(b1)
        return "q:fenced" in b1.queues._parkers

    wait_for(sees_b2, 20, "B1 to see B2's consumer")
    conn = b1.cluster.settings.jdbc.connect()
    stack.callback(conn.close)

    def generation(brokerid: str, step: int) -> None:  # (another process of that broker id joined)
        conn.execute("UPDATE imq_ha_brokers SET generation = generation + %s WHERE brokerid = %s", (step, brokerid))
        conn.commit()

    def inbox() -> int:
        (count,) = conn.execute("SELECT COUNT(*) FROM imq_ha_inbox").fetchone()
        conn.commit()
        return int(count)

    generation("B1", 100)
    with pytest.raises(StoreError, match="fenced: broker B1"):
        b1.queues.hand_off()
    generation("B1", -100)
    assert inbox() == 0 and b1.host.broker.queue_depth("fenced") == 5  # back in their places
    assert b1.queues.hand_off() and inbox() == 5
    generation("B2", 100)
    with pytest.raises(StoreError, match="fenced: broker B2"):
        b2.queues.take_in()
    generation("B2", -100)
    assert inbox() == 5 and b2.queues.taken_in == 0
    assert b2.queues.take_in() and inbox() == 0
    got: list[str] = []
    texts_of(consumer, got, 5, 20)
    assert got == sent


def test_an_inbox_row_that_is_not_a_message_is_kept_aside_and_the_rest_come_in(members, caplog):
    from bridgemgr.providers.embedded.clusterdst import INBOX, REJECTED

    start, stack = members
    b1, b2 = start("B1"), start("B2", threads=False)  # B2's intake runs when told
    conn = b1.cluster.settings.jdbc.connect()
    stack.callback(conn.close)
    # (written by an instance of a newer version, or damaged): first in B2's inbox
    (bad,) = conn.execute(
        f"INSERT INTO {INBOX}(target, qkey, dcount, blob) VALUES ('B2', 'q:mixed', 0, %s) RETURNING id",
        (b"\x7fnot a message",),
    ).fetchone()
    conn.commit()
    consumer = b2.connection(stack).create_session().create_consumer(Queue("mixed"))
    advertise(b2)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Queue("mixed"))
    for i in range(3):
        producer.send(session.create_text_message(f"g{i}"))
    wait_for(lambda: b1.queues.handed_off == 3, 20, "3 messages in B2's inbox")
    while b2.queues.take_in():
        pass
    got: list[str] = []
    texts_of(consumer, got, 3, 20)
    assert got == ["g0", "g1", "g2"] and b2.queues.taken_in == 3
    rows = conn.execute(f"SELECT id, target, qkey, blob, reason FROM {REJECTED}").fetchall()
    assert [(r[0], r[1], r[2], bytes(r[3])) for r in rows] == [(bad, "B2", "q:mixed", b"\x7fnot a message")]
    assert rows[0][4]  # why it was not taken in
    assert conn.execute(f"SELECT COUNT(*) FROM {INBOX}").fetchone()[0] == 0
    conn.commit()
    assert any(f"inbox row {bad} for q:mixed is not a message" in r.getMessage() for r in caplog.records)
    # what an operator alerts on: imq_ha_inbox_rejected_total on the instance it was for
    assert ha_counters(b2) == {
        "imq_ha_handed_off_total": 0,
        "imq_ha_taken_in_total": 3,
        "imq_ha_inbox_rejected_total": 1,
    }
    assert ha_counters(b1) == {
        "imq_ha_handed_off_total": 3,
        "imq_ha_taken_in_total": 0,
        "imq_ha_inbox_rejected_total": 0,
    }


def ha_counters(member: Any) -> dict[str, float]:
    """The imq_ha_* counters one scrape of ``member``'s /metrics shows."""
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from bridgemgr.metrics import registry, scrape
    from bridgemgr.props import load_properties

    ha = [
        "imq.cluster.ha=true",
        "imq.cluster.clusterid=c1",
        f"imq.brokerid={member.brokerid}",
        "imq.persist.store=jdbc",
    ]
    ha.append("imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://127.0.0.1:1/none")  # (labels only)
    props = load_properties([], ha, environ={})
    service = SimpleNamespace(
        props=props, bridges={}, host_broker=None, jms_services=[], cluster=member.cluster, cluster_queues=member.queues
    )
    page = scrape(registry(service)).decode()
    return {
        s.name: s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name.startswith("imq_ha_") and s.name.endswith("_total")
    }
