"""Application server facilities: connection consumers delivering to a server session
pool, the broker's backout threshold and backout queue, message retention off; over
the in-process broker and over mq:// (the jms service)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest

from bridgemgr.jms import AckMode, Queue, TextMessage, Topic
from bridgemgr.jms.serversessions import ThreadServerSessionPool
from bridgemgr.providers.embedded import DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.broker import Broker
from remote.support import Harness
from waiting import wait_for

pytestmark = pytest.mark.slow  # pools, waits for redeliveries: 0.3-1.5 s each
IN = Queue("asf.in")
POISON = "asf.poison"
DMQ = Queue("mq.sys.dmq")

KINDS = {
    "auto": {},
    "client": {"ack_mode": AckMode.CLIENT_ACKNOWLEDGE},
    "transacted": {"transacted": True},
    "xa": {"xa": True},
}


@pytest.fixture(params=["embedded", "remote"])
def connect(request, broker):
    """Connections to ``broker``: in-process, or over the jms service."""
    opened = []
    harness = None
    if request.param == "remote":
        harness = Harness(broker)
        cf = harness.factory()
    else:
        cf = EmbeddedConnectionFactory(broker)

    def connect():
        c = cf.create_connection()
        opened.append(c)
        return c

    yield connect
    for c in opened:
        c.close()
    if harness is not None:
        harness.close()


def put(conn, *texts, dest=IN, **props):
    session = conn.create_session()
    producer = session.create_producer(dest)
    for text in texts:
        msg = TextMessage(text)
        for k, v in props.items():
            msg.set_string_property(k, v)
        producer.send(msg)
    session.close()


def drain(conn, dest, wait=0.3):
    session = conn.create_session()
    consumer = session.create_consumer(dest)
    out = []
    while (msg := consumer.receive(wait)) is not None:
        out.append(msg)
    session.close()
    return out


@contextmanager
def serving(conn, rec, size, batch, selector=None, dest=IN, **kind):
    """A pool of ``size`` sessions with ``rec``'s listeners and a connection consumer
    loading ``batch`` messages at a time into them."""
    with (
        ThreadServerSessionPool(conn, size, rec.make, **kind) as pool,
        conn.create_connection_consumer(dest, selector, pool, batch),
    ):
        yield


class Recorder:
    """Listeners that note which session got each message; ``poison`` texts raise."""

    def __init__(self, delay=0.0, poison=()):
        self.lock = threading.Lock()
        self.by_session: Counter[int] = Counter()
        self.texts: list[str] = []
        self.attempts: Counter[str] = Counter()
        self.busy = self.max_busy = 0
        self.delay = delay
        self.poison = set(poison)

    def make(self, session):
        def on_message(msg):
            with self.lock:
                self.attempts[msg.text] += 1
                self.busy += 1
                self.max_busy = max(self.max_busy, self.busy)
            try:
                time.sleep(self.delay)
                if msg.text in self.poison:
                    raise ValueError(f"cannot handle {msg.text}")
                with self.lock:
                    self.by_session[id(session)] += 1
                    self.texts.append(msg.text)
            finally:
                with self.lock:
                    self.busy -= 1

        return on_message


def test_messages_spread_over_the_sessions_of_the_pool_in_batches(connect):
    conn = connect()
    conn.start()
    put(conn, *[f"m{i}" for i in range(40)])
    rec = Recorder(delay=0.01)
    with serving(conn, rec, 4, 5, None):
        wait_for(lambda: len(rec.texts) == 40)
    assert sorted(rec.texts) == sorted(f"m{i}" for i in range(40))
    assert len(rec.by_session) == 4 and rec.max_busy > 1, (rec.by_session, rec.max_busy)
    assert drain(conn, IN) == []


def test_a_selector_takes_only_what_it_selects_and_retention_keeps_the_rest(connect):
    conn = connect()
    conn.start()
    put(conn, "red1", color="red")
    put(conn, "blue1", color="blue")
    rec = Recorder()
    with serving(conn, rec, 2, 1, "color = 'red'"):
        wait_for(lambda: rec.texts == ["red1"])
        time.sleep(1.2)  # loaded sessions came back empty at least twice
    assert [m.text for m in drain(conn, IN)] == ["blue1"]


def test_retention_off_removes_what_no_connection_consumer_selects(connect, broker):
    conn = connect()
    conn.message_retention = False
    conn.start()
    put(conn, "red1", color="red")
    put(conn, "blue1", color="blue")
    rec = Recorder()
    with serving(conn, rec, 2, 1, "color = 'red'"):
        wait_for(lambda: rec.texts == ["red1"])
        wait_for(lambda: broker.destinations()["queue:asf.in"]["pending"] == 0)
    assert drain(conn, IN) == []
    (dead,) = drain(conn, DMQ)
    assert dead.text == "blue1"
    assert dead.get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "MSG_NOT_MATCHED"


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_poison_message_reaches_the_backout_queue_at_the_threshold(connect, broker, kind):
    broker.configure_destination(IN, DestinationLimits(backout_threshold=3, backout_queue=POISON))
    conn = connect()
    conn.start()
    put(conn, "good1", "bad", "good2")
    rec = Recorder(poison={"bad"})
    with serving(conn, rec, 2, 1, None, **KINDS[kind]):
        wait_for(lambda: broker.destinations().get(f"queue:{POISON}", {}).get("pending") == 1)
        wait_for(lambda: sorted(rec.texts) == ["good1", "good2"])
    assert rec.attempts["bad"] == 3
    (moved,) = drain(conn, Queue(POISON))
    assert moved.text == "bad"
    assert moved.get_int_property("JMS_IMQ_BACKOUT_COUNT") == 3
    assert moved.get_string_property("JMS_IMQ_BACKOUT_DESTINATION") == str(IN)
    assert drain(conn, IN) == [] and drain(conn, DMQ) == []


@pytest.mark.parametrize("disposition", ["dmq", "discard"])
def test_without_a_backout_queue_the_disposition_rule_decides(connect, broker, disposition):
    broker.configure_destination(IN, DestinationLimits(backout_threshold=2, backout_disposition=disposition))
    conn = connect()
    conn.start()
    put(conn, "bad")
    rec = Recorder(poison={"bad"})
    with serving(conn, rec, 1, 1, None, transacted=True):
        wait_for(lambda: broker.destinations()["queue:asf.in"] == {"pending": 0, "unacked": 0, "bytes": 0})
    assert rec.attempts["bad"] == 2
    dead = drain(conn, DMQ)
    if disposition == "discard":
        assert dead == []
    else:
        assert [d.get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") for d in dead] == ["BACKOUT_THRESHOLD_REACHED"]


def test_a_backout_queue_that_refuses_falls_back_to_the_dmq(broker):
    broker.configure_destination(Queue(POISON), DestinationLimits(max_num_msgs=0))
    broker.configure_destination(IN, DestinationLimits(backout_threshold=1, backout_queue=POISON))
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    put(conn, "bad")
    session = conn.create_session(transacted=True)
    assert session.create_consumer(IN).receive(1).text == "bad"
    session.rollback()
    (dead,) = drain(conn, DMQ)
    assert dead.get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "BACKOUT_THRESHOLD_REACHED"
    conn.close()


def test_threshold_zero_keeps_redelivering(broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    put(conn, "bad")
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(IN)
    for i in range(1, 8):
        msg = consumer.receive(1)
        assert msg.text == "bad" and msg.delivery_count == i
        session.rollback()
    conn.close()


def test_the_backout_count_survives_a_restart(tmp_path):
    broker = Broker(tmp_path / "store")
    broker.configure_destination(IN, DestinationLimits(backout_threshold=3, backout_queue=POISON))
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    put(conn, "bad")
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(IN)
    assert consumer.receive(1).delivery_count == 1
    session.rollback()
    assert consumer.receive(1).delivery_count == 2
    broker.close()  # the second delivery is neither acknowledged nor rolled back
    broker = Broker(tmp_path / "store")
    try:
        conn = EmbeddedConnectionFactory(broker).create_connection()
        conn.start()
        session = conn.create_session(transacted=True)
        consumer = session.create_consumer(IN)
        assert consumer.receive(1).delivery_count == 3
        session.rollback()  # the third backout: to the backout queue
        assert consumer.receive(0.2) is None
        assert [m.text for m in drain(conn, Queue(POISON))] == ["bad"]
        conn.close()
    finally:
        broker.close()


def test_topic_connection_consumers_deliver_each_message_once(connect):
    conn = connect()
    conn.client_id = "asf-client"
    conn.start()
    rec = Recorder(delay=0.005)
    durable = Recorder(delay=0.005)
    topic = Topic("asf.t")
    with (
        serving(conn, rec, 3, 2, dest=topic),
        ThreadServerSessionPool(conn, 3, durable.make) as dpool,
        conn.create_durable_connection_consumer(topic, "sub", None, dpool, 2),
    ):
        time.sleep(0.2)
        put(conn, *[f"t{i}" for i in range(30)], dest=topic)
        wait_for(lambda: len(rec.texts) == 30 and len(durable.texts) == 30)
        time.sleep(0.3)
    assert sorted(rec.texts) == sorted(durable.texts) == sorted(f"t{i}" for i in range(30))
    assert len(rec.by_session) > 1 and len(durable.by_session) > 1


def test_the_backout_attributes_parse_and_reach_the_broker(broker):
    from bridgemgr.dstadmin import _updated
    from bridgemgr.jms.hostbroker import DestinationAttributes
    from bridgemgr.providers.embedded.host import _limits

    got = _updated(
        DestinationAttributes(), {"backoutThreshold": "3", "backoutQueue": "poison", "backoutDisposition": "DISCARD"}
    )
    assert (got.backout_threshold, got.backout_queue, got.backout_disposition) == (3, "poison", "discard")
    with pytest.raises(ValueError, match="backoutDisposition='keep': write one of dmq, discard"):
        _updated(got, {"backoutDisposition": "keep"})
    with pytest.raises(ValueError, match="backoutThreshold='-1'"):
        _updated(got, {"backoutThreshold": "-1"})
    limits = _limits(got)
    assert (limits.backout_threshold, limits.backout_queue, limits.backout_disposition) == (3, "poison", "discard")
