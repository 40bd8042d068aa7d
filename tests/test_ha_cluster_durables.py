"""Durable subscriptions of an HA cluster (docs/ha.md): one (client id, name) in the whole
cluster; its messages are kept whichever instance they were published on, and reach its
subscriber on whichever instance it attaches, once (providers/embedded/clusterdst.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.jms import IllegalStateException, Topic
from clusterdst_support import cluster_members, texts_of
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def members(postgresql, tmp_path: Path) -> Iterator[Any]:
    yield from cluster_members(postgresql, tmp_path)


def knows(member: Any, client_id: str, name: str) -> bool:
    with member.host.broker.lock:
        return (client_id, name) in member.host.broker.durable


def attach(connection: Any, topic: str, name: str, selector: str | None = None, mode: int = 1) -> Any:
    """A durable subscriber, once no other instance has one attached (it is told within
    0.2 s of a detach; a dead instance's, once its lease ran out)."""

    def subscribe() -> Any:
        try:
            return connection.create_session(False, mode).create_durable_subscriber(Topic(topic), name, selector)
        except IllegalStateException:
            return None

    return wait_for(subscribe, 30, f"durable subscription {name} free")


def test_a_durable_subscriber_reattaching_on_a_third_instance_gets_what_was_kept_once(members):
    start, stack = members
    b1, b2, b3 = start("B1"), start("B2"), start("B3")
    conn = b2.connection(stack, client_id="app")
    conn.create_session().create_durable_subscriber(Topic("prices"), "p", "kind = 'stock'").close()
    conn.close()
    wait_for(lambda: knows(b1, "app", "p") and knows(b3, "app", "p"), 20, "B1 and B3 to know the durable")
    session = b1.connection(stack).create_session()
    producer = session.create_producer(Topic("prices"))
    sent = []
    for i in range(60):
        message = session.create_text_message(f"p{i}")
        message.set_string_property("kind", "stock" if i % 3 else "bond")
        producer.send(message)
        if i % 3:
            sent.append(f"p{i}")
    subscriber = attach(b3.connection(stack, client_id="app"), "prices", "p", "kind = 'stock'")
    got: list[str] = []
    texts_of(subscriber, got, len(sent), 30)
    quiet_for(lambda: len(got) + (1 if subscriber.receive(0.05) else 0), 1.0, 10)
    assert got == sent
    assert b1.host.broker.destinations()["durable:app:p"]["pending"] == 0


def test_unsubscribe_on_one_instance_removes_the_durable_from_every_instance(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    conn = b2.connection(stack, client_id="app")
    session = conn.create_session()
    session.create_durable_subscriber(Topic("t"), "gone").close()
    wait_for(lambda: knows(b1, "app", "gone"), 20, "B1 to know the durable")
    publisher = b1.connection(stack).create_session()
    publisher.create_producer(Topic("t")).send(publisher.create_text_message("kept until unsubscribe"))
    assert b1.host.broker.destinations()["durable:app:gone"]["pending"] == 1
    session.unsubscribe("gone")
    wait_for(lambda: not knows(b1, "app", "gone"), 20, "B1 to drop the durable")
    publisher.create_producer(Topic("t")).send(publisher.create_text_message("for nobody"))
    conn.close()
    again = b1.connection(stack, client_id="app").create_session().create_durable_subscriber(Topic("t"), "gone")
    assert again.receive(0.3) is None  # a new subscription: nothing of the old one's


def test_kill_9_of_the_instance_holding_the_durable_subscriber_loses_nothing(tmp_path, postgresql):
    import psycopg

    from bridgemgr import connect
    from bridgemgr.jms import CLIENT_ACKNOWLEDGE, DeliveryMode, TextMessage
    from bridgemgr.providers.embedded.cluster import instance_schema
    from ha_support import MONITOR, PASSWORD, Cluster

    cluster = Cluster(tmp_path / "cluster", postgresql, {}, "imq.bridge.enabled=false")

    def count(brokerid: str, where: str) -> int:
        schema = instance_schema(cluster.clusterid, brokerid)
        with psycopg.connect(**postgresql.conninfo(cluster.database)) as db:
            return db.execute(f'SELECT COUNT(*) FROM "{schema}".{where}').fetchone()[0]

    try:
        b1, b2, b3 = (cluster.start(b, "") for b in ("B1", "B2", "B3"))
        holder = connect(f"mq://{b2.address}", "admin", PASSWORD, prefetch=0)
        holder.client_id = "app"
        session = holder.create_session(False, CLIENT_ACKNOWLEDGE)
        subscriber = session.create_durable_subscriber(Topic("flow"), "d")
        holder.start()
        wait_for(lambda: count("B1", "subs WHERE client_id = 'app'") == 1, 20, "B1 to know the durable")
        texts = [f"f{i:03d}" for i in range(100)]
        with connect(f"mq://{b1.address}", "admin", PASSWORD) as publisher:
            producer = publisher.create_session().create_producer(Topic("flow"))
            for text in texts:
                producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)
        [subscriber.receive(10) for _ in range(10)][-1].acknowledge()  # done with the first 10
        assert [subscriber.receive(10).text for _ in range(20)] == texts[10:30]  # in flight
        wait_for(lambda: count("B2", "msgs WHERE dcount > 0") == 20, 10, "the delivery counts in B2's store")
        b2.kill()
        holder.close()
        again = connect(f"mq://{b3.address}", "admin", PASSWORD)
        try:
            again.client_id = "app"
            subscriber = attach(again, "flow", "d", mode=CLIENT_ACKNOWLEDGE)  # once B2's lease ran out
            again.start()
            got: list[Any] = []

            def more() -> bool:
                while (message := subscriber.receive(0.1)) is not None:
                    got.append(message)
                return len(got) >= 90

            wait_for(more, 6 * MONITOR + 20, "the 90 unacknowledged messages on B3")
            quiet_for(lambda: len(got) + (1 if subscriber.receive(0.1) else 0), 1.0, 10)
            got[-1].acknowledge()
        finally:
            again.close()
        assert sorted(m.text for m in got) == texts[10:]
        assert sorted(m.text for m in got if m.redelivered) == texts[10:30]
    finally:
        cluster.stop()


def test_a_durable_has_one_subscriber_in_the_cluster(members):
    start, stack = members
    b1, b2, b3 = start("B1"), start("B2"), start("B3")
    holder = b2.connection(stack, client_id="app")
    holder.create_session().create_durable_subscriber(Topic("t"), "one")
    elsewhere = b3.connection(stack, client_id="app")
    on_b1 = b1.connection(stack, client_id="app")

    def refused(conn) -> str | None:
        try:
            conn.create_session().create_durable_subscriber(Topic("t"), "one").close()
        except IllegalStateException as exc:
            return str(exc)
        return None

    assert "active subscriber on broker B2" in wait_for(lambda: refused(elsewhere), 20, "B3 to refuse a second")
    # each instance learns of the attach on its own (within 0.2 s): B1 too, before its unsubscribe
    assert "active subscriber on broker B2" in wait_for(lambda: refused(on_b1), 20, "B1 to know of B2's")
    with pytest.raises(IllegalStateException, match="on broker B2"):
        on_b1.create_session().unsubscribe("one")
    holder.close()
    attach(elsewhere, "t", "one")  # free again once B2's detach is told


def test_a_durable_unsubscribed_while_an_instance_was_down_stays_gone_when_it_starts(members):
    start, stack = members
    b1, b2 = start("B1"), start("B2")
    conn = b2.connection(stack, client_id="app")
    for name in ("gone", "again"):
        conn.create_session().create_durable_subscriber(Topic("t"), name).close()
    wait_for(lambda: knows(b1, "app", "gone") and knows(b1, "app", "again"), 20, "B1 to know the durables")
    publisher = b2.connection(stack).create_session()
    publisher.create_producer(Topic("t")).send(publisher.create_text_message("old"))  # kept on B2
    conn.close()
    b2.queues.stop()  # B2 is down: its store keeps both, with "old"
    b2.host.close()
    b2.cluster.leave()
    session = b1.connection(stack, client_id="app").create_session()
    session.unsubscribe("gone")
    session.unsubscribe("again")
    session.create_durable_subscriber(Topic("t"), "again").close()  # made again: a new one
    db = b1.cluster.settings.jdbc.connect()
    stack.callback(db.close)

    def written() -> bool:  # (with B1's next advertisement)
        rows = {n: (v, d) for n, v, d in db.execute("SELECT name, version, deleted FROM imq_ha_durables")}
        db.commit()
        return rows["gone"][1] and not rows["again"][1] and rows["again"][0] > rows["gone"][0]

    wait_for(written, 20, "B1 to write its changes")
    b2 = start("B2")  # (its first advertisement, made by start(), mirrors the cluster's)
    assert not knows(b2, "app", "gone") and knows(b2, "app", "again")
    assert quiet_for(lambda: (knows(b1, "app", "gone"), knows(b2, "app", "gone")), 1.0, 10) == (False, False)
    subscriber = attach(b2.connection(stack, client_id="app"), "t", "again")
    publisher = b1.connection(stack).create_session()
    publisher.create_producer(Topic("t")).send(publisher.create_text_message("new"))
    assert wait_for(lambda: subscriber.receive(0.05), 20, "the new message").text == "new"  # not "old"
    assert subscriber.receive(0.3) is None
