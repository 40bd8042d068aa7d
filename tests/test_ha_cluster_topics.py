"""Cluster-wide topics of an HA cluster (docs/ha.md): instances of one cluster on a real
PostgreSQL server; a message published on one reaches every matching subscriber on every
instance, once each (providers/embedded/clusterdst.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import Topic
from clusterdst_support import cluster_members, texts_of
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def _reaches_newest(member: Any, peer: Any, topic: str) -> bool:
    """Whether ``member`` routes ``topic`` to a proxy of ``peer``'s newest subscription
    (each of ``peer``'s subscriptions of it has a version, once advertised)."""
    with peer.host.broker.lock:
        subscriptions = [mq for mq in peer.host.broker.topics.get(topic, ()) if not mq.key.startswith("r:")]
        versions = [peer.queues._versions.get(mq) for mq in subscriptions]
    if not versions or None in versions:
        return False
    with member.host.broker.lock:
        keys = {mq.key for mq in member.host.broker.topics.get(topic, ())}
    return f"r:{peer.brokerid}:{max(versions)}:{topic}" in keys


def test_a_publish_on_one_instance_reaches_subscribers_on_two_others_each_once(members):
    start, stack = members
    b1, b2, b3 = start("B1"), start("B2"), start("B3")
    news = Topic("news")
    on_b2 = b2.connection(stack).create_session().create_consumer(news)
    on_b3 = b3.connection(stack).create_session().create_consumer(news)
    odd_b3 = b3.connection(stack).create_session().create_consumer(news, "n > 100 AND odd = TRUE")
    on_b1 = b1.connection(stack).create_session().create_consumer(news)
    # B1 reaches B3's newest subscription (odd_b3): a proxy of an older version would not
    wait_for(lambda: _reaches_newest(b1, b3, "news"), 20, "B1 to see B3's newest subscription")
    wait_for(lambda: b1.queues.remote_subscribers("news") == ["B2", "B3"], 20, "B1 to see both")
    session = b1.connection(stack).create_session()
    producer = session.create_producer(news)
    sent = [f"n{i}" for i in range(200)]
    for i, text in enumerate(sent):
        message = session.create_text_message(text)
        message.set_int_property("n", i)
        message.set_boolean_property("odd", i % 2 == 1)
        producer.send(message)
    for consumer, expected in ((on_b1, sent), (on_b2, sent), (on_b3, sent), (odd_b3, sent[101::2])):
        got: list[str] = []
        texts_of(consumer, got, len(expected), 30)
        quiet_for(lambda c=consumer, g=got: len(g) + (1 if c.receive(0.05) else 0), 0.5, 10)
        assert got == expected
    assert b1.queues.handed_off == 400  # one copy per instance, not per subscriber
    assert b2.queues.taken_in == 200 and b3.queues.taken_in == 200


def test_a_subscriber_gets_nothing_published_before_it_subscribed(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2", threads=False)  # B2's cluster part runs when told

    def advertise() -> None:
        with b2.host.broker.lock:
            demand = b2.queues._demand()
        b2.queues.advertise(demand, True)

    first = b2.connection(stack).create_session().create_consumer(Topic("t"))
    advertise()
    wait_for(lambda: b1.queues.remote_subscribers("t") == ["B2"], 20, "B1 to see B2's subscriber")
    before = set(b1.host.broker.proxies)
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Topic("t"))
    for i in range(5):
        producer.send(session.create_text_message(f"early{i}"))
    wait_for(lambda: b1.queues.handed_off == 5, 20, "5 messages handed to B2")
    late = b2.connection(stack).create_session().create_consumer(Topic("t"))  # in flight now
    advertise()
    wait_for(lambda: set(b1.host.broker.proxies) - before, 20, "B1 to see B2's new subscriber")
    producer.send(session.create_text_message("after"))
    wait_for(lambda: b1.queues.handed_off == 6, 20, "the 6th message handed to B2")
    wait_for(lambda: b2.queues.take_in() or b2.queues.taken_in == 6, 20, "B2 to take them in")
    got: list[str] = []
    texts_of(first, got, 6, 10)
    assert got == [f"early{i}" for i in range(5)] + ["after"]
    assert late.receive(0.5).text == "after"
    assert late.receive(0.1) is None


def test_a_persistent_publish_is_in_the_store_for_the_remote_subscriber_when_send_returns(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2", threads=False)
    b2.connection(stack).create_session().create_consumer(Topic("kept"))
    with b2.host.broker.lock:
        demand = b2.queues._demand()
    b2.queues.advertise(demand, True)
    wait_for(lambda: b1.queues.remote_subscribers("kept") == ["B2"], 20, "B1 to see B2's subscriber")
    session = b1.connection(stack).create_session()
    session.create_producer(Topic("kept")).send(session.create_text_message("one"))
    with b1.host.broker.lock:  # (the handoff may have moved it on to the inbox already)
        proxied = sum(mq.count for mq in b1.host.broker.proxies.values())
    assert proxied + b1.queues.handed_off == 1
    from bridgemgr.providers.embedded.cluster import instance_schema

    schema = instance_schema(b1.cluster.settings.clusterid, "B1")
    conn = b1.cluster.settings.jdbc.connect()
    try:
        (stored,) = conn.execute(
            f"SELECT (SELECT COUNT(*) FROM \"{schema}\".msgs WHERE qkey LIKE 'r:B2:%%') "
            "+ (SELECT COUNT(*) FROM imq_ha_inbox WHERE target = 'B2')"
        ).fetchone()
    finally:
        conn.close()
    assert stored == 1


def test_serve_instances_a_publisher_on_one_and_subscribers_on_two_others(tmp_path, postgresql):
    from bridgemgr import connect
    from bridgemgr.jms import DeliveryMode, TextMessage
    from ha_support import PASSWORD, Cluster

    cluster = Cluster(tmp_path, postgresql, {}, "imq.bridge.enabled=false")
    try:
        b1, b2, b3 = (cluster.start(b, "") for b in ("B1", "B2", "B3"))
        with (
            connect(f"mq://{b1.address}", "admin", PASSWORD) as publisher,
            connect(f"mq://{b2.address}", "admin", PASSWORD) as on_b2,
            connect(f"mq://{b3.address}", "admin", PASSWORD) as on_b3,
        ):
            subscribers = [c.create_session().create_consumer(Topic("news")) for c in (on_b2, on_b3)]
            for conn in (on_b2, on_b3):
                conn.start()
            producer = publisher.create_session().create_producer(Topic("news"))
            heard = [False, False]

            def everyone_hears() -> bool:  # (B1 sees a new subscriber elsewhere within 0.2 s)
                probe = TextMessage("probe")
                producer.send(probe, delivery_mode=DeliveryMode.NON_PERSISTENT)
                for i, s in enumerate(subscribers):
                    while (m := s.receive(0.05)) is not None:
                        heard[i] = heard[i] or m.text == "probe"
                return all(heard)

            wait_for(everyone_hears, 30, "B2 and B3 to hear B1's probes")
            quiet_for(lambda: sum(1 for s in subscribers if s.receive(0.05) is not None), 1.0, 10)
            sent = [f"n{i}" for i in range(50)]
            for text in sent:
                producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)
            for s in subscribers:
                got: list[str] = []
                texts_of(s, got, len(sent), 30)
                assert got == sent and s.receive(0.3) is None
    finally:
        cluster.stop()


def test_a_topic_destroyed_on_the_publishers_instance_still_reaches_other_instances_after(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    subscriber = b2.connection(stack).create_session().create_consumer(Topic("gone"))
    wait_for(lambda: b1.queues.remote_subscribers("gone") == ["B2"], 20, "B1 to see B2's subscriber")
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Topic("gone"))
    producer.send(session.create_text_message("before"))
    assert wait_for(lambda: subscriber.receive(0.05), 20, "the first on B2").text == "before"
    assert b1.host.broker.destroy(Topic("gone")) == 0  # (no consumer on B1: it may go)
    wait_for(lambda: b1.queues.remote_subscribers("gone") == ["B2"], 20, "B1 to route to B2 again")
    producer.send(session.create_text_message("after"))
    assert wait_for(lambda: subscriber.receive(0.05), 20, "the message on B2").text == "after"


def test_copies_for_an_instance_whose_lease_lapsed_wait_for_it_until_it_is_taken_over(members):
    start, stack = members
    b1, b2 = start("B1", threads=False), start("B2")  # B1's cluster part runs when told
    subscriber = b2.connection(stack).create_session().create_consumer(Topic("lapse"))

    def advertise() -> list[str]:
        with b1.host.broker.lock:
            demand = b1.queues._demand()
        b1.queues.advertise(demand, True)
        return b1.queues.remote_subscribers("lapse")

    wait_for(lambda: advertise() == ["B2"], 20, "B1 to see B2's subscriber")
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Topic("lapse"))
    for i in range(3):
        producer.send(session.create_text_message(f"l{i}"))
    conn = b1.cluster.settings.jdbc.connect()
    try:

        def lease(expires: str) -> None:
            conn.execute(f"UPDATE imq_ha_brokers SET lease_expires = {expires} WHERE brokerid = 'B2'")
            conn.commit()

        lease("now() - interval '1 second'")  # B2 missed its renewals, nobody took it over yet
        assert advertise() == []  # no new copies for it...
        assert b1.queues.hand_off() and b1.queues.handed_off == 3  # ...but these go to it
        lease("now() + interval '60 seconds'")
    finally:
        conn.close()
    got: list[str] = []
    texts_of(subscriber, got, 3, 20)
    assert got == ["l0", "l1", "l2"]
