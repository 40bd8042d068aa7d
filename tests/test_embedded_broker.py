"""The embedded host broker through the provider SPI: one test per rule."""

from __future__ import annotations

import threading
import time

import pytest

from bridgemgr.jms import (
    AckMode,
    BytesMessage,
    DeliveryMode,
    MapMessage,
    ObjectMessage,
    Queue,
    StreamMessage,
    TextMessage,
    Topic,
    naming,
)
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    JMSException,
    MessageFormatException,
    MessageNotWriteableException,
    ResourceAllocationException,
)
from bridgemgr.jms.hostbroker import DestinationAttributes, Principal
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import (
    DMQ_NAME,
    Broker,
    DestinationLimits,
    EmbeddedConnectionFactory,
    LimitBehavior,
)
from bridgemgr.providers.embedded.host import open_host_broker

Q = Queue("orders")


def send_texts(session, dest, texts, **kw):
    producer = session.create_producer(dest)
    for t in texts:
        producer.send(TextMessage(t), **kw)
    producer.close()


def drain(consumer, timeout=0.2):
    out = []
    while (m := consumer.receive(timeout)) is not None:
        out.append(m)
    return out


def texts(msgs):
    return [m.text for m in msgs]


# --- queues -------------------------------------------------------------------


def test_send_sets_headers_and_receive_gets_them(session):
    producer = session.create_producer(Q)
    msg = TextMessage("hello")
    msg.set_int_property("n", 7)
    producer.send(msg, priority=6, time_to_live=60_000)
    assert msg.message_id.startswith("ID:")
    assert msg.destination == Q and msg.priority == 6
    assert msg.expiration - msg.timestamp == 60_000
    got = session.create_consumer(Q).receive(1)
    assert got.text == "hello" and got.get_int_property("n") == 7
    assert got.message_id == msg.message_id and got.timestamp == msg.timestamp
    assert got.destination == Q and got.priority == 6
    assert got.delivery_mode == DeliveryMode.PERSISTENT
    assert not got.redelivered and got.delivery_count == 1


def test_received_message_is_read_only_until_cleared(session):
    send_texts(session, Q, ["x"])
    got = session.create_consumer(Q).receive(1)
    with pytest.raises(MessageNotWriteableException):
        got.set_string_property("a", "b")
    with pytest.raises(MessageNotWriteableException):
        got.text = "y"
    got.clear_properties()
    got.set_string_property("a", "b")
    got.clear_body()
    got.text = "y"


def test_changing_a_message_after_send_does_not_change_what_was_sent(session):
    producer = session.create_producer(Q)
    msg = TextMessage("one")
    msg.set_string_property("k", "v1")
    producer.send(msg)
    msg.text = "two"
    msg.set_string_property("k", "v2")
    got = session.create_consumer(Q).receive(1)
    assert got.text == "one" and got.get_string_property("k") == "v1"


@pytest.mark.slow
def test_competing_consumers_share_a_queue_round_robin(factory):
    conn = factory.create_connection()
    conn.start()
    counts = {0: 0, 1: 0}
    stop = threading.Event()

    def run(i):
        s = conn.create_session()
        c = s.create_consumer(Q)
        while not stop.is_set():
            if c.receive(0.1) is not None:
                counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    producer = conn.create_session().create_producer(Q)
    for i in range(200):
        producer.send(TextMessage(str(i)), delivery_mode=DeliveryMode.NON_PERSISTENT)
        time.sleep(0.001)
    deadline = time.time() + 5
    while sum(counts.values()) < 200 and time.time() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    conn.close()
    assert sum(counts.values()) == 200
    assert min(counts.values()) >= 40, counts  # both share the queue (exact alternation depends on scheduling)


def test_priority_order_then_fifo(session):
    producer = session.create_producer(Q)
    sent = [(p, i) for i, p in enumerate([1, 9, 4, 9, 0, 4, 7, 1])]
    for p, i in sent:
        producer.send(TextMessage(f"{p}-{i}"), priority=p)
    got = texts(drain(session.create_consumer(Q)))
    expected = [f"{p}-{i}" for p, i in sorted(sent, key=lambda x: (-x[0], x[1]))]
    assert got == expected


def test_priority_out_of_range_is_refused(session):
    with pytest.raises(Exception, match="priority"):
        session.create_producer(Q).send(TextMessage("x"), priority=10)


@pytest.mark.slow
def test_selector_on_queue_consumer_leaves_others(session):
    producer = session.create_producer(Q)
    for color in ["red", "blue", "red", "green"]:
        m = TextMessage(color)
        m.set_string_property("color", color)
        producer.send(m)
    reds = drain(session.create_consumer(Q, "color = 'red'"))
    assert texts(reds) == ["red", "red"]
    assert texts(drain(session.create_consumer(Q))) == ["blue", "green"]


def test_selector_on_header_fields(session):
    producer = session.create_producer(Q)
    producer.send(TextMessage("low"), priority=1)
    producer.send(TextMessage("np"), priority=5, delivery_mode=DeliveryMode.NON_PERSISTENT)
    producer.send(TextMessage("high"), priority=8)
    got = drain(session.create_consumer(Q, "JMSPriority > 4 AND JMSDeliveryMode = 'PERSISTENT'"))
    assert texts(got) == ["high"]


@pytest.mark.slow
def test_expired_messages_are_never_delivered_and_go_to_the_dmq(session, broker):
    producer = session.create_producer(Q)
    producer.send(TextMessage("short"), time_to_live=1)
    producer.send(TextMessage("long"), time_to_live=60_000)
    time.sleep(0.02)
    assert texts(drain(session.create_consumer(Q))) == ["long"]
    dead = drain(session.create_consumer(Queue(DMQ_NAME)))
    assert texts(dead) == ["short"]
    assert dead[0].get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "EXPIRED"
    assert dead[0].expiration == 0


def test_browse_does_not_consume_and_honours_selector(session):
    producer = session.create_producer(Q)
    for i in range(5):
        m = TextMessage(str(i))
        m.set_int_property("i", i)
        producer.send(m)
    with session.create_browser(Q, "i >= 3") as browser:
        assert texts(browser) == ["3", "4"]
    assert texts(list(session.create_browser(Q))) == ["0", "1", "2", "3", "4"]
    assert len(drain(session.create_consumer(Q))) == 5


@pytest.mark.parametrize(
    "msg",
    [
        BytesMessage(b"\x00\x01binary\xff"),
        MapMessage({"a": 1, "b": "two", "c": 3.5, "d": True, "e": b"\x00"}),
        StreamMessage([1, "x", 2.5, False, b"z"]),
        ObjectMessage({"nested": [1, 2, {"k": "v"}], "n": None}),
        TextMessage("ünïcode ✓"),
    ],
)
@pytest.mark.parametrize("mode", [DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT])
def test_every_body_kind_travels(session, msg, mode):
    original = msg.copy()
    session.create_producer(Q).send(msg, delivery_mode=mode)
    got = session.create_consumer(Q).receive(1)
    assert type(got) is type(original)
    assert got.get_body() == original.get_body()


def test_unserialisable_object_message_is_refused_at_send(session):
    with pytest.raises(MessageFormatException, match="not serialisable"):
        session.create_producer(Q).send(ObjectMessage({1, 2, 3}))
    assert session.create_consumer(Q).receive(0.05) is None


# --- acknowledgement ----------------------------------------------------------------


def test_client_acknowledge_acks_everything_delivered_so_far(conn):
    s = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    send_texts(s, Q, ["a", "b", "c"])
    c = s.create_consumer(Q)
    _a, b = c.receive(1), c.receive(1)
    b.acknowledge()  # acks a and b
    assert c.receive(1).text == "c"
    s.recover()
    got = drain(c)
    assert texts(got) == ["c"] and got[0].redelivered
    got[0].acknowledge()
    s.recover()
    assert c.receive(0.05) is None


@pytest.mark.slow
def test_individual_acknowledge_acks_only_that_message(conn):
    s = conn.create_session(ack_mode=AckMode.INDIVIDUAL_ACKNOWLEDGE)
    send_texts(s, Q, ["a", "b", "c"])
    c = s.create_consumer(Q)
    msgs = drain(c)
    msgs[1].acknowledge()
    s.recover()
    again = drain(c)
    assert texts(again) == ["a", "c"]
    assert all(m.redelivered and m.delivery_count == 2 for m in again)


@pytest.mark.slow
def test_recover_redelivers_in_order_with_delivery_count(conn):
    s = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    send_texts(s, Q, ["1", "2", "3"])
    c = s.create_consumer(Q)
    assert texts(drain(c)) == ["1", "2", "3"]
    s.recover()
    s.recover()
    again = drain(c)
    assert texts(again) == ["1", "2", "3"]
    assert [m.delivery_count for m in again] == [2, 2, 2]
    assert again[0].get_int_property("JMSXDeliveryCount") == 2


@pytest.mark.slow
def test_closing_a_connection_returns_unacked_messages_redelivered(factory):
    c1 = factory.create_connection()
    c1.start()
    s1 = c1.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    send_texts(s1, Q, ["a", "b"])
    assert texts(drain(s1.create_consumer(Q))) == ["a", "b"]
    c1.close()
    c2 = factory.create_connection()
    c2.start()
    got = drain(c2.create_session().create_consumer(Q))
    assert texts(got) == ["a", "b"] and all(m.redelivered for m in got)
    c2.close()


def test_auto_acknowledge_consumes_at_receive(factory):
    c1 = factory.create_connection()
    c1.start()
    s1 = c1.create_session()
    send_texts(s1, Q, ["a"])
    assert s1.create_consumer(Q).receive(1).text == "a"
    c1.close()
    c2 = factory.create_connection()
    c2.start()
    assert c2.create_session().create_consumer(Q).receive(0.05) is None
    c2.close()


def test_stopped_connection_does_not_deliver_until_started(factory):
    conn = factory.create_connection()
    s = conn.create_session()
    send_texts(s, Q, ["x"])
    c = s.create_consumer(Q)
    assert c.receive(0.05) is None
    result = []
    t = threading.Thread(target=lambda: result.append(c.receive(5)))
    t.start()
    time.sleep(0.1)
    conn.start()
    t.join()
    assert result[0].text == "x"
    conn.stop()
    send_texts(s, Q, ["y"])
    assert c.receive(0.05) is None
    conn.close()


def test_message_listener_receives_and_failure_redelivers(conn):
    s = conn.create_session()
    seen, done = [], threading.Event()

    def listener(m):
        seen.append((m.text, m.redelivered))
        if len(seen) == 1:
            raise RuntimeError("first time fails")
        done.set()

    c = s.create_consumer(Q)
    c.set_message_listener(listener)
    send_texts(conn.create_session(), Q, ["a"])
    assert done.wait(5)
    c.close()
    assert seen == [("a", False), ("a", True)]


def test_receive_on_closed_consumer_returns_or_raises(session):
    c = session.create_consumer(Q)
    out = []
    t = threading.Thread(target=lambda: out.append(c.receive()))
    t.start()
    time.sleep(0.05)
    c.close()
    t.join(2)
    assert out == [None]
    with pytest.raises(IllegalStateException):
        c.receive(0)


# --- topics -------------------------------------------------------------------------


@pytest.mark.slow
def test_topic_delivers_to_every_subscriber_present(session):
    t = Topic("news")
    early1, early2 = session.create_consumer(t), session.create_consumer(t)
    send_texts(session, t, ["a", "b"])
    late = session.create_consumer(t)
    assert texts(drain(early1)) == ["a", "b"]
    assert texts(drain(early2)) == ["a", "b"]
    assert drain(late) == []


@pytest.mark.slow
def test_topic_subscriber_selector_and_no_local(factory):
    t = Topic("news")
    c1, c2 = factory.create_connection(), factory.create_connection()
    c1.start()
    c2.start()
    s1, s2 = c1.create_session(), c2.create_session()
    local = s1.create_consumer(t, no_local=True)
    sel = s1.create_consumer(t, "n > 1")
    p1, p2 = s1.create_producer(t), s2.create_producer(t)
    for i, p in enumerate([p1, p2, p1, p2]):
        m = TextMessage(f"{i}")
        m.set_int_property("n", i)
        p.send(m)
    assert texts(drain(local)) == ["1", "3"]
    assert texts(drain(sel)) == ["2", "3"]
    c1.close()
    c2.close()


@pytest.mark.slow
def test_durable_subscription_keeps_messages_while_inactive_and_across_restart(tmp_path):
    t = Topic("events")
    b = Broker(tmp_path / "s")
    f = EmbeddedConnectionFactory(b)
    conn = f.create_connection()
    conn.client_id = "app1"
    conn.start()
    s = conn.create_session()
    sub = s.create_durable_subscriber(t, "audit")
    send_texts(s, t, ["1"])
    assert texts(drain(sub)) == ["1"]
    sub.close()
    send_texts(s, t, ["2", "3"])
    send_texts(s, t, ["np"], delivery_mode=DeliveryMode.NON_PERSISTENT)
    conn.close()
    b.close()

    b = Broker(tmp_path / "s")
    f = EmbeddedConnectionFactory(b)
    conn = f.create_connection()
    conn.client_id = "app1"
    conn.start()
    s = conn.create_session()
    send_texts(s, t, ["4"])
    sub = s.create_durable_subscriber(t, "audit")
    assert texts(drain(sub)) == ["2", "3", "4"]
    with pytest.raises(IllegalStateException):
        s.unsubscribe("audit")  # still active
    sub.close()
    s.unsubscribe("audit")
    send_texts(s, t, ["5"])
    assert drain(s.create_durable_subscriber(t, "audit")) == []
    conn.close()
    b.close()


def test_durable_subscription_rules(factory):
    t = Topic("events")
    anon = factory.create_connection()
    with pytest.raises(IllegalStateException, match="client id"):
        anon.create_session().create_durable_subscriber(t, "x")
    anon.close()
    conn = factory.create_connection()
    conn.client_id = "c"
    s = conn.create_session()
    s.create_durable_subscriber(t, "x")
    with pytest.raises(IllegalStateException, match="active subscriber"):
        s.create_durable_subscriber(t, "x")
    with pytest.raises(InvalidDestinationException):
        s.unsubscribe("nope")
    conn.close()


def test_changing_a_durable_subscription_selector_recreates_it(factory):
    t = Topic("events")
    conn = factory.create_connection()
    conn.client_id = "c"
    conn.start()
    s = conn.create_session()
    s.create_durable_subscriber(t, "x").close()
    send_texts(s, t, ["kept?"])
    sub = s.create_durable_subscriber(t, "x", "JMSPriority > 7")
    assert drain(sub) == []
    conn.close()


def test_client_ids_are_unique_and_set_first(factory):
    c1, c2 = factory.create_connection(), factory.create_connection()
    c1.client_id = "same"
    with pytest.raises(InvalidClientIDException):
        c2.client_id = "same"
    c3 = factory.create_connection()
    c3.create_session()
    with pytest.raises(IllegalStateException):
        c3.client_id = "late"
    c1.close()
    c2.client_id = "same"  # free again
    c2.close()
    c3.close()


# --- temporary destinations ------------------------------------------------------------


def test_temporary_queue_belongs_to_its_connection_and_dies_with_it(factory):
    owner, other = factory.create_connection(), factory.create_connection()
    owner.start()
    other.start()
    tq = owner.create_session().create_temporary_queue()
    assert tq.is_temporary
    send_texts(other.create_session(), tq, ["reply"])
    with pytest.raises(InvalidDestinationException, match="another connection"):
        other.create_session().create_consumer(tq)
    assert owner.create_session().create_consumer(tq).receive(1).text == "reply"
    owner.close()
    with pytest.raises(InvalidDestinationException, match="no longer exists"):
        send_texts(other.create_session(), tq, ["late"])
    other.close()


def test_temporary_topic(conn):
    s = conn.create_session()
    tt = s.create_temporary_topic()
    c = s.create_consumer(tt)
    send_texts(s, tt, ["t"])
    assert texts(drain(c)) == ["t"]


def test_reply_to_round_trip(conn):
    s = conn.create_session()
    tq = s.create_temporary_queue()
    req = TextMessage("ping")
    req.reply_to = tq
    req.correlation_id = "c-1"
    s.create_producer(Q).send(req)
    got = s.create_consumer(Q).receive(1)
    assert got.reply_to == tq
    reply = TextMessage("pong")
    reply.correlation_id = got.correlation_id
    s.create_producer(None).send(reply, got.reply_to)
    back = s.create_consumer(tq).receive(1)
    assert back.text == "pong" and back.correlation_id == "c-1"


# --- local transactions --------------------------------------------------------------------


def test_transacted_sends_are_invisible_until_commit(conn):
    tx = conn.create_session(transacted=True)
    observer = conn.create_session().create_consumer(Q)
    send_texts(tx, Q, ["a", "b"])
    assert observer.receive(0.05) is None
    tx.commit()
    assert texts(drain(observer)) == ["a", "b"]


def test_rollback_discards_sends_and_redelivers_receives(conn):
    plain = conn.create_session()
    send_texts(plain, Q, ["in"])
    tx = conn.create_session(transacted=True)
    c = tx.create_consumer(Q)
    assert c.receive(1).text == "in"
    send_texts(tx, Queue("out"), ["out"])
    tx.rollback()
    again = c.receive(1)
    assert again.text == "in" and again.redelivered and again.delivery_count == 2
    tx.commit()
    assert drain(plain.create_consumer(Queue("out"))) == []
    assert plain.create_consumer(Q).receive(0.05) is None


def test_transacted_session_context_manager(conn):
    with pytest.raises(RuntimeError), conn.create_session(transacted=True) as tx:
        send_texts(tx, Q, ["never"])
        raise RuntimeError
    with conn.create_session(transacted=True) as tx:
        send_texts(tx, Q, ["yes"])
    assert texts(drain(conn.create_session().create_consumer(Q))) == ["yes"]


def test_commit_on_non_transacted_session_is_illegal(session):
    with pytest.raises(IllegalStateException):
        session.commit()
    tx = session.connection.create_session(transacted=True)
    with pytest.raises(IllegalStateException):
        tx.recover()


# --- persistence -----------------------------------------------------------------------------


def test_persistent_messages_survive_restart_non_persistent_do_not(tmp_path):
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    s = conn.create_session()
    send_texts(s, Q, ["p1"])
    send_texts(s, Q, ["np"], delivery_mode=DeliveryMode.NON_PERSISTENT)
    send_texts(s, Q, ["p2"])
    conn.close()
    b.close()
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    assert texts(drain(conn.create_session().create_consumer(Q))) == ["p1", "p2"]
    conn.close()
    b.close()


def test_consumed_messages_stay_consumed_after_restart(tmp_path):
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    s = conn.create_session()
    send_texts(s, Q, [str(i) for i in range(10)])
    c = s.create_consumer(Q)
    assert len([c.receive(1) for _ in range(4)]) == 4
    conn.close()
    b.close()
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    assert texts(drain(conn.create_session().create_consumer(Q))) == [str(i) for i in range(4, 10)]
    conn.close()
    b.close()


def test_delivered_but_unacked_message_is_redelivered_after_restart(tmp_path):
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    s = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    send_texts(s, Q, ["x"])
    assert s.create_consumer(Q).receive(1).text == "x"
    b.store.flush()
    b.close()  # the connection never acknowledged
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    got = conn.create_session().create_consumer(Q).receive(1)
    assert got.text == "x" and got.redelivered
    conn.close()
    b.close()


def test_in_memory_broker_without_directory(tmp_path):
    b = Broker()
    conn = EmbeddedConnectionFactory(b).create_connection()
    conn.start()
    s = conn.create_session()
    send_texts(s, Q, ["m"])
    assert s.create_consumer(Q).receive(1).text == "m"
    conn.close()
    b.close()


# --- limits --------------------------------------------------------------------------------------


def test_max_num_msgs_reject_newest(broker, session):
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=2))
    send_texts(session, Q, ["1", "2"])
    with pytest.raises(ResourceAllocationException, match="full"):
        send_texts(session, Q, ["3"])
    assert texts(drain(session.create_consumer(Q))) == ["1", "2"]
    send_texts(session, Q, ["4"])  # room again once consumed


@pytest.mark.slow
def test_max_num_msgs_remove_oldest_goes_to_dmq(broker, session):
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=2, limit_behavior=LimitBehavior.REMOVE_OLDEST))
    send_texts(session, Q, ["1", "2", "3"])
    assert texts(drain(session.create_consumer(Q))) == ["2", "3"]
    dead = drain(session.create_consumer(Queue(DMQ_NAME)))
    assert texts(dead) == ["1"]
    assert dead[0].get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "REMOVE_OLDEST"


@pytest.mark.slow
def test_remove_oldest_without_dmq_drops(broker, session):
    broker.configure_destination(
        Q, DestinationLimits(max_num_msgs=1, use_dmq=False, limit_behavior=LimitBehavior.REMOVE_OLDEST)
    )
    send_texts(session, Q, ["1", "2"])
    assert texts(drain(session.create_consumer(Q))) == ["2"]
    assert drain(session.create_consumer(Queue(DMQ_NAME))) == []


def test_byte_limits(broker, session):
    broker.configure_destination(Q, DestinationLimits(max_bytes_per_msg=2000, max_total_msg_bytes=5000))
    with pytest.raises(ResourceAllocationException, match="maxBytesPerMsg"):
        send_texts(session, Q, ["x" * 3000])
    send_texts(session, Q, ["y" * 1500, "y" * 1500])
    with pytest.raises(ResourceAllocationException, match="full"):
        send_texts(session, Q, ["y" * 1500, "y" * 1500])


def test_limits_survive_restart(tmp_path):
    b = Broker(tmp_path / "s")
    b.configure_destination(Q, DestinationLimits(max_num_msgs=1))
    b.close()
    b = Broker(tmp_path / "s")
    s = EmbeddedConnectionFactory(b).create_connection().create_session()
    send_texts(s, Q, ["1"])
    with pytest.raises(ResourceAllocationException):
        send_texts(s, Q, ["2"])
    b.close()


def test_an_admin_created_queue_without_messages_is_listed_after_a_restart(tmp_path):
    b = Broker(tmp_path / "s")
    b.configure_destination(Q, DestinationLimits(max_num_msgs=1))
    b.close()
    b = Broker(tmp_path / "s")
    try:
        assert [(d, lim.max_num_msgs) for d, lim, _, _ in b.list_destinations(topics=False) if d == Q] == [(Q, 1)]
    finally:
        b.close()


def test_only_an_idle_auto_created_queue_is_reaped():
    b = Broker()
    try:
        b.configure_destination(Queue("admin"), DestinationLimits())
        factory = EmbeddedConnectionFactory(b)
        sending, taking = factory.create_connection(), factory.create_connection()
        out, into = sending.create_session(), taking.create_session()
        taking.start()
        send_texts(out, Queue("full"), ["1"])
        producer = out.create_producer(Queue("produced"))
        producer.send(out.create_text_message("p"))
        send_texts(out, Queue("idle"), ["x"])
        into.create_consumer(Queue("watched"))
        assert into.create_consumer(Queue("produced")).receive(5).text == "p"
        assert into.create_consumer(Queue("idle")).receive(5).text == "x"
        assert b.idle_queues() == []  # each has a consumer, a producer or a message
        taking.close()
        assert sorted(b.idle_queues()) == ["idle", "watched"]  # "produced": its producer is open
        assert b.reap_queue("idle") and not b.reap_queue("full") and not b.reap_queue("admin")
        assert not b.reap_queue("produced") and not b.reap_queue("mq.sys.dmq")
        assert "idle" not in b.queues and {"full", "admin", "produced", "watched"} <= set(b.queues)
        sending.close()
    finally:
        b.close()


def test_the_host_broker_opens_from_properties_and_configures_limits(tmp_path):
    props = load_properties(
        [],
        [
            f"imq.varhome={tmp_path}",
            "imq.autocreate.destination.maxNumMsgs=1",
            "imq.autocreate.destination.limitBehavior=REJECT_NEWEST",
        ],
        environ={},
    )
    host = open_host_broker(props)
    try:
        assert host.store_location() == str(props.instance_dir / "store" / "store.db")
        assert not host.fsync
        admin = Principal("admin")
        host.configure_destination(admin, Q, DestinationAttributes(max_num_msgs=2, limit_behavior="REMOVE_OLDEST"))
        with pytest.raises(JMSException, match="limit behavior 'DROP'"):
            host.configure_destination(admin, Q, DestinationAttributes(limit_behavior="DROP"))
        conn = host.connection_factory().create_connection()
        conn.start()
        s = conn.create_session()
        send_texts(s, Q, ["1", "2", "3"])
        assert texts(drain(s.create_consumer(Q))) == ["2", "3"]
        send_texts(s, Queue("auto"), ["1"])  # created on first use, with imq.autocreate's limit
        with pytest.raises(ResourceAllocationException):
            send_texts(s, Queue("auto"), ["2"])
    finally:
        host.close()


def test_autocreate_off_refuses_unknown_queues(tmp_path):
    b = Broker(tmp_path / "s", autocreate_queue=False)
    s = EmbeddedConnectionFactory(b).create_connection().create_session()
    with pytest.raises(InvalidDestinationException, match="auto-create"):
        send_texts(s, Q, ["x"])
    b.configure_destination(Q, DestinationLimits())
    send_texts(s, Q, ["x"])
    b.close()


def test_a_browser_of_a_queue_that_cannot_be_browsed_fails_at_creation(tmp_path):
    b = Broker(tmp_path / "s", autocreate_queue=False)
    try:
        s = EmbeddedConnectionFactory(b).create_connection().create_session()
        with pytest.raises(InvalidDestinationException, match="auto-create"):
            s.create_browser(Queue("nowhere"))  # not first when iterated
        temporary = s.create_temporary_queue()
        s.delete_temporary(temporary)
        with pytest.raises(InvalidDestinationException, match="no longer exists"):
            s.create_browser(temporary)
        b.configure_destination(Q, DestinationLimits())
        send_texts(s, Q, ["x"])
        assert texts(s.create_browser(Q)) == ["x"]
    finally:
        b.close()


# --- concurrency -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_many_producers_and_consumers_lose_and_duplicate_nothing(factory):
    n_prod, n_cons, per = 4, 4, 2000
    conn = factory.create_connection()
    conn.start()
    received: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def produce(p):
        prod = conn.create_session().create_producer(Q)
        for i in range(per):
            prod.send(
                TextMessage(f"{p}:{i}"), delivery_mode=DeliveryMode.PERSISTENT if i % 2 else DeliveryMode.NON_PERSISTENT
            )

    def consume():
        s = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
        c = s.create_consumer(Q)
        while not done.is_set():
            m = c.receive(0.05)
            if m is not None:
                m.acknowledge()
                with lock:
                    received.append(m.text)

    consumers = [threading.Thread(target=consume) for _ in range(n_cons)]
    producers = [threading.Thread(target=produce, args=(p,)) for p in range(n_prod)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    deadline = time.time() + 30
    while len(received) < n_prod * per and time.time() < deadline:
        time.sleep(0.02)
    done.set()
    for t in consumers:
        t.join()
    conn.close()
    assert len(received) == n_prod * per
    assert len(set(received)) == n_prod * per
    for p in range(n_prod):  # per-producer order holds for a single queue
        mine = [int(x.split(":")[1]) for x in received if x.startswith(f"{p}:")]
        assert sorted(mine) == list(range(per))


# --- naming --------------------------------------------------------------------------------------------


def test_naming_lookup_of_the_embedded_broker(tmp_path):
    env = {naming.INITIAL_CONTEXT_FACTORY: "imq.embedded", naming.PROVIDER_URL: (tmp_path / "n").as_uri()}
    cf = naming.lookup("XAConnectionFactory", env)
    assert isinstance(cf, EmbeddedConnectionFactory)
    assert naming.lookup("queue/a.b", env) == Queue("a.b")
    assert naming.lookup("topic/t", env) == Topic("t")
    with pytest.raises(naming.NamingException):
        naming.lookup("nothing", env)
    cf.broker.close()  # the factory resolves the broker of that directory


def test_broker_close_breaks_connections_and_tells_listener(tmp_path):
    b = Broker(tmp_path / "s")
    conn = EmbeddedConnectionFactory(b).create_connection()
    errors = []
    conn.set_exception_listener(errors.append)
    conn.start()
    c = conn.create_session().create_consumer(Q)
    out = []
    t = threading.Thread(target=lambda: out.append(c.receive()))
    t.start()
    time.sleep(0.05)
    b.close()
    t.join(2)
    assert out == [None]
    assert errors and "shut down" in str(errors[0])
    with pytest.raises(IllegalStateException):
        EmbeddedConnectionFactory(b).create_connection()


def test_selector_consumer_skips_a_backlog_and_sees_later_arrivals_before_it(session):
    producer = session.create_producer(Q)
    for i in range(300):
        m = TextMessage(f"n{i}")
        m.set_boolean_property("match", i % 100 == 99)
        producer.send(m)
    picky = session.create_consumer(Q, "match = TRUE")
    assert texts(drain(picky, 0)) == ["n99", "n199", "n299"]
    late = TextMessage("urgent")
    late.set_boolean_property("match", True)
    producer.send(late, priority=9)  # lands before the skipped backlog
    redo = TextMessage("again")
    redo.set_boolean_property("match", True)
    producer.send(redo, priority=0)
    assert texts(drain(picky, 0)) == ["urgent", "again"]
    assert len(drain(session.create_consumer(Q), 0)) == 297


@pytest.mark.slow
def test_a_transaction_cannot_overshoot_a_limit_and_is_rolled_back(broker, conn):
    from bridgemgr.jms.errors import TransactionRolledBackException

    broker.configure_destination(Q, DestinationLimits(max_num_msgs=1))
    send_texts(conn.create_session(), Queue("in"), ["x"])
    tx = conn.create_session(transacted=True)
    assert tx.create_consumer(Queue("in")).receive(1).text == "x"
    send_texts(tx, Q, ["1", "2"])
    with pytest.raises(TransactionRolledBackException, match="full"):
        tx.commit()
    plain = conn.create_session()
    assert drain(plain.create_consumer(Q)) == []  # neither send landed
    again = plain.create_consumer(Queue("in")).receive(1)  # the receive was rolled back
    assert again.text == "x" and again.redelivered
    send_texts(plain, Q, ["3"])  # and the room is free again
    assert texts(drain(plain.create_consumer(Q))) == ["3"]
