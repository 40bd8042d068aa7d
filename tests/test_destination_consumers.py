"""A destination's producers and consumers: maxNumProducers, maxNumActiveConsumers,
maxNumBackupConsumers and consumerFlowLimit, in process and over mq://."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from bridgemgr.admincli import _dst_table
from bridgemgr.dstadmin import _updated, attributes_json
from bridgemgr.jms import CLIENT_ACKNOWLEDGE, Queue, TextMessage
from bridgemgr.jms.errors import JMSException, ResourceAllocationException
from bridgemgr.jms.hostbroker import DestinationAttributes
from bridgemgr.jmsbridge.states import State
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.destinations import _limits_from_json, _limits_to_json
from bridgemgr.providers.embedded.host import _limits
from bridgemgr.stompbridge.frames import MESSAGE
from jmsbridge_support import bridge_xml, drain, link_xml, make_bridge, texts
from remote.support import Harness
from stomp_support import Driver
from waiting import quiet_for, wait_for

Q = Queue("orders")


@pytest.fixture
def broker():
    b = Broker()
    yield b
    b.close()


def _connection(broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    return conn


def _send(broker, *texts):
    session = _connection(broker).create_session()
    producer = session.create_producer(Q)
    for text in texts:
        producer.send(TextMessage(text))
    session.connection.close()


def test_the_four_attributes_parse_under_their_names_with_the_originals_defaults():
    attributes = _updated(
        DestinationAttributes(),
        {
            "maxNumProducers": "5",
            "maxNumActiveConsumers": "2",
            "maxNumBackupConsumers": "-1",
            "consumerFlowLimit": "50",
        },
    )
    shown = attributes_json(attributes)
    assert (shown["maxNumProducers"], shown["maxNumActiveConsumers"]) == (5, 2)
    assert (shown["maxNumBackupConsumers"], shown["consumerFlowLimit"]) == (-1, 50)
    defaults = attributes_json(DestinationAttributes())
    assert [defaults[n] for n in ("maxNumProducers", "maxNumActiveConsumers", "maxNumBackupConsumers")] == [100, -1, 0]
    assert defaults["consumerFlowLimit"] == 1000
    with pytest.raises(ValueError, match="maxNumProducers='many'"):
        _updated(DestinationAttributes(), {"maxNumProducers": "many"})
    with pytest.raises(JMSException, match="maxNumActiveConsumers=0"):
        _limits(dataclasses.replace(DestinationAttributes(), max_num_active_consumers=0))


def test_a_producer_beyond_max_num_producers_is_refused_naming_the_destination(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_producers=2))
    session = _connection(broker).create_session()
    first, _ = session.create_producer(Q), session.create_producer(Q)
    with pytest.raises(ResourceAllocationException, match=r"orders has 2 producer.*maxNumProducers"):
        session.create_producer(Q)
    anonymous = session.create_producer()  # its first send there would be a third producer
    with pytest.raises(ResourceAllocationException, match="maxNumProducers"):
        anonymous.send(TextMessage("x"), destination=Q)
    first.close()
    anonymous.send(TextMessage("x"), destination=Q)  # room again
    assert broker.describe_destination(Q)[1]["producers"] == 2
    broker.configure_destination(Q, DestinationLimits(max_num_producers=-1))  # update dst: at once
    session.create_producer(Q).send(TextMessage("y"))
    assert broker.queue_depth("orders") == 2


def test_users_at_the_limit_cannot_keep_the_bridge_services_own_producer_out(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_producers=1))
    _connection(broker).create_session().create_producer(Q)  # a user takes the one place
    service = EmbeddedConnectionFactory(broker, service=True).create_connection()
    service.create_session().create_producer(Q).send(TextMessage("link"))  # counted, not refused
    assert broker.describe_destination(Q)[1]["producers"] == 2
    with pytest.raises(ResourceAllocationException, match="orders has 2 producer"):
        _connection(broker).create_session().create_producer(Q)
    service.close()


def test_the_default_limit_lets_a_hundred_producers_on_one_destination(broker):
    session = _connection(broker).create_session()
    for _ in range(100):
        session.create_producer(Q)
    with pytest.raises(ResourceAllocationException, match="orders has 100 producer"):
        session.create_producer(Q)


def test_a_backup_consumer_takes_over_with_the_closed_ones_unacknowledged_messages(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_active_consumers=1, max_num_backup_consumers=1))
    first = _connection(broker)
    active = first.create_session(False, CLIENT_ACKNOWLEDGE).create_consumer(Q)
    backup = _connection(broker).create_session().create_consumer(Q)
    with pytest.raises(ResourceAllocationException, match="maxNumActiveConsumers=1 plus maxNumBackupConsumers=1"):
        _connection(broker).create_session().create_consumer(Q)
    _send(broker, "a", "b", "c")
    assert [active.receive(1).text, active.receive(1).text] == ["a", "b"]  # not acknowledged
    assert backup.receive(0.05) is None  # a backup receives nothing while the active one is open
    first.close()
    got = [backup.receive(2) for _ in range(3)]
    assert [m.text for m in got] == ["a", "b", "c"]
    assert [m.redelivered for m in got] == [True, True, False]


def test_update_dst_wakes_a_backup_consumer_when_it_may_become_active(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_active_consumers=1, max_num_backup_consumers=1))
    _connection(broker).create_session().create_consumer(Q)  # active, never receives
    backup = _connection(broker).create_session().create_consumer(Q)
    _send(broker, "a")
    got: list = []
    thread = threading.Thread(target=lambda: got.append(backup.receive(5)), daemon=True)
    thread.start()
    wait_for(lambda: backup in backup.queue.waiters, 2, "the backup waits")
    broker.configure_destination(Q, DestinationLimits(max_num_active_consumers=2, max_num_backup_consumers=0))
    thread.join(5)
    assert got and got[0] is not None and got[0].text == "a"


def test_a_receive_batch_is_capped_at_the_consumer_flow_limit(broker):
    broker.configure_destination(Q, DestinationLimits(consumer_flow_limit=3))
    consumer = _connection(broker).create_session(False, CLIENT_ACKNOWLEDGE).create_consumer(Q)
    _send(broker, *"abcdefgh")
    assert len(broker.receive_many(consumer, 10, 1)) == 3


@pytest.mark.slow
def test_an_mq_consumer_holds_at_most_the_consumer_flow_limit_and_an_update_raises_it_live(broker):
    broker.configure_destination(Q, DestinationLimits(consumer_flow_limit=5, max_num_producers=1))
    _send(broker, *(str(i) for i in range(20)))

    def unacked() -> int:
        return broker.describe_destination(Q)[1]["unacked"]

    with Harness(broker) as service:
        conn = service.factory(prefetch=100).create_connection()
        try:
            conn.start()
            session = conn.create_session(False, CLIENT_ACKNOWLEDGE)
            session.create_consumer(Q)
            assert quiet_for(unacked, 0.3, 10, "held by the consumer") == 5  # not its prefetch of 100
            broker.configure_destination(Q, DestinationLimits(consumer_flow_limit=8, max_num_producers=1))
            assert quiet_for(unacked, 0.3, 10, "held after the update") == 8
            session.create_producer(Q).send(TextMessage("x"))  # the one producer maxNumProducers=1 allows
            other = conn.create_session()  # (the service counts a session's sends to Q as one producer)
            with pytest.raises(ResourceAllocationException, match="orders has 1 producer"):
                other.create_producer(Q).send(TextMessage("y"))
        finally:
            conn.close()


def test_the_attributes_survive_a_restart_and_travel_as_the_ha_catalogs_json(tmp_path):
    limits = DestinationLimits(
        max_num_producers=7, max_num_active_consumers=2, max_num_backup_consumers=3, consumer_flow_limit=9
    )
    broker = Broker(tmp_path / "store")
    broker.configure_destination(Q, limits)
    broker.close()
    broker = Broker(tmp_path / "store")
    try:
        assert broker.describe_destination(Q)[0] == limits
    finally:
        broker.close()
    assert _limits_from_json(json.loads(_limits_to_json(limits))) == limits  # clustercatalog.py's form
    older = {k: v for k, v in json.loads(_limits_to_json(limits)).items() if k != "max_num_producers"}
    assert _limits_from_json(older).max_num_producers == 100  # a row written before them: the defaults


@pytest.mark.slow
def test_a_stomp_subscription_holds_at_most_the_flow_limit_and_a_sender_counts_as_a_producer(broker):
    broker.configure_destination(Q, DestinationLimits(consumer_flow_limit=3, max_num_producers=1))
    _send(broker, *"abcdef")  # (its producer closed: the count is 0 again)
    d = Driver(broker)  # imq.bridge.stomp.consumerFlowLimit: 1000
    d.connect()
    d.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "1", "ack": "client-individual"})
    got = d.messages(3)
    assert [f for f in d.pump(0.1) if f.command == MESSAGE] == []  # 3 held, no more
    d.send("ACK", {"id": got[0].headers["ack"]})
    assert [f.body for f in d.messages(1)] == [b"d"]
    assert not [f for f in d.send("SEND", {"destination": "/queue/orders"}, b"x") if f.command == "ERROR"]
    other = Driver(broker, name="s2")
    other.connect()
    refused = [f for f in other.send("SEND", {"destination": "/queue/orders"}, b"y") if f.command == "ERROR"]
    assert refused and "maxNumProducers" in refused[0].headers.get("message", "") + refused[0].body.decode()
    d.close()
    other.close()


def test_a_message_wakes_the_waiting_active_consumer_never_a_waiting_backup(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_active_consumers=1, max_num_backup_consumers=1))
    active = _connection(broker).create_session().create_consumer(Q)
    backup = _connection(broker).create_session().create_consumer(Q)
    threading.Thread(target=backup.receive, args=(6,), daemon=True).start()
    wait_for(lambda: backup in backup.queue.waiters, 2, "the backup waits first")
    got: list = []
    thread = threading.Thread(target=lambda: got.append(active.receive(4)), daemon=True)
    thread.start()
    wait_for(lambda: active in active.queue.waiters, 2, "the active consumer waits")
    _send(broker, "a")  # one wake-up: it must go to the active consumer, not at its timeout
    thread.join(2)
    assert got and got[0] is not None and got[0].text == "a"
    backup.close()


@pytest.mark.slow
def test_a_link_and_clients_stay_under_the_default_limits(broker):
    """A running link is one consumer of its source and one producer of its target: with
    the defaults (100 producers, every consumer active) it and 99 client producers fit."""
    bridge = make_bridge(broker, bridge_xml(link_xml()))
    assert bridge.start() is State.STARTED
    try:
        session = _connection(broker).create_session()
        for _ in range(98):
            session.create_producer(Queue("dst"))
        session.create_producer(Queue("src")).send(TextMessage("m"))
        assert texts(drain(broker, "dst", expect=1)) == ["m"]
        assert broker.describe_destination(Queue("dst"))[1]["producers"] == 99  # the link's one, not one per send
        session.create_producer(Queue("dst"))
        with pytest.raises(ResourceAllocationException, match="dst has 100 producer"):
            session.create_producer(Queue("dst"))
        session.create_consumer(Queue("src"))  # a second consumer of the link's source: both active
    finally:
        bridge.stop()


def test_query_dsts_table_shows_them(broker):
    attributes = attributes_json(DestinationAttributes(max_num_producers=5, consumer_flow_limit=50))
    row = {"name": "orders", "type": "q", "state": "RUNNING", "attributes": attributes, "producers": 0}
    row |= {"consumers": 0, "pending": 0, "unacked": 0, "bytes": 0, "producers_waiting": 0}
    titles, values = _dst_table([row]).splitlines()[1].split(), _dst_table([row]).splitlines()[3].split()
    shown = dict(zip(titles[-4:], values[-4:], strict=True))
    assert shown == {
        "maxNumProducers": "5",
        "maxNumActiveConsumers": "-1",
        "maxNumBackupConsumers": "0",
        "consumerFlowLimit": "50",
    }
