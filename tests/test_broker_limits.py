"""The embedded broker's limits in process: the four limit behaviours, the system-wide
limits, imq.message.max_size, the memory states, and the admin attributes' parsing."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from bridgemgr.admin.protocol import Command
from bridgemgr.dstadmin import _updated
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jms.errors import ProducerFlowControl, ResourceAllocationException
from bridgemgr.jms.hostbroker import DestinationAttributes
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory, LimitBehavior
from bridgemgr.providers.embedded.memory import MemoryConfig, MemoryMonitor
from bridgemgr.providers.embedded.queues import SystemUsage
from bridgemgr.stompbridge.session import Held

Q = Queue("orders")
FLOW = DestinationLimits(max_num_msgs=2, limit_behavior=LimitBehavior.FLOW_CONTROL)


@pytest.fixture
def broker():
    b = Broker()
    yield b
    b.close()


def _session(broker, transacted=False):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    return conn.create_session(transacted)


def _send(session, *texts, **kw):
    producer = session.create_producer(Q)
    for text in texts:
        producer.send(TextMessage(text), **kw)


def test_flow_control_blocks_an_in_process_producer_until_a_consumer_takes_one(broker):
    broker.configure_destination(Q, FLOW)
    session = _session(broker)
    _send(session, "a", "b")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (_send(_session(broker), "c"), done.set()), daemon=True)
    thread.start()
    assert not done.wait(0.5)
    assert broker.describe_destination(Q)[1]["producers_waiting"] == 1
    assert session.create_consumer(Q).receive(1).text == "a"  # AUTO_ACKNOWLEDGE: room
    assert done.wait(2)
    assert broker.queue_depth("orders") == 2


def test_flow_control_raises_for_a_front_end_and_calls_back_when_there_is_room(broker):
    broker.configure_destination(Q, FLOW)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    for text in "ab":
        broker.send(conn, TextMessage(text), Q)
    with pytest.raises(ProducerFlowControl, match=r"orders is full .*limitBehavior=FLOW_CONTROL") as info:
        broker.send(conn, TextMessage("c"), Q)
    woken = threading.Event()
    info.value.on_room(woken.set)
    assert not woken.is_set()
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=3, limit_behavior=LimitBehavior.FLOW_CONTROL))
    assert woken.is_set()  # new limits: try again
    broker.send(conn, TextMessage("c"), Q)


def test_a_transacted_send_waits_when_sent_and_the_commit_may_pass_the_limit(broker):
    broker.configure_destination(Q, FLOW)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    broker.send(conn, TextMessage("a"), Q)
    tx = _session(broker, transacted=True)
    _send(tx, "b", "c")  # room at each send: the queue holds 1 until commit
    tx.commit()
    assert broker.queue_depth("orders") == 3  # past maxNumMsgs=2: the producer waited at send time
    with pytest.raises(ProducerFlowControl):
        broker.check_room(conn, TextMessage("d"), Q)


def test_remove_low_priority_drops_the_oldest_of_the_lowest_priority(broker):
    broker.configure_destination(Q, DestinationLimits(max_num_msgs=3, limit_behavior=LimitBehavior.REMOVE_LOW_PRIORITY))
    session = _session(broker)
    producer = session.create_producer(Q)
    for text, priority in (("p4-old", 4), ("p1-old", 1), ("p1-new", 1), ("p9", 9), ("p4-new", 4)):
        producer.send(TextMessage(text), priority=priority)
    consumer = session.create_consumer(Q)
    assert [consumer.receive(0.2).text for _ in range(3)] == ["p9", "p4-old", "p4-new"]
    dmq = session.create_consumer(Queue("mq.sys.dmq"))
    dead = [dmq.receive(0.2) for _ in range(2)]
    assert [m.text for m in dead] == ["p1-old", "p1-new"]
    assert dead[0].get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "REMOVE_LOW_PRIORITY"


def test_the_system_limits_count_messages_held_in_memory_only(tmp_path):
    broker = Broker(tmp_path / "s", system=SystemUsage(max_count=2, max_size=-1))
    try:
        session = _session(broker)
        _send(session, "a", "b", delivery_mode=DeliveryMode.NON_PERSISTENT)
        with pytest.raises(ResourceAllocationException, match=r"imq.system.max_count=2"):
            _send(session, "c", delivery_mode=DeliveryMode.NON_PERSISTENT)
        _send(session, "stored", delivery_mode=DeliveryMode.PERSISTENT)  # in the store: not counted
        assert session.create_consumer(Q).receive(0.2).text == "a"
        _send(session, "c", delivery_mode=DeliveryMode.NON_PERSISTENT)  # room again
        assert broker.usage.count == 2
    finally:
        broker.close()
    sized = Broker(system=SystemUsage(max_size=3000))
    try:
        session = _session(sized)
        _send(sized_session := session, "x" * 1000, "y" * 1000)
        with pytest.raises(ResourceAllocationException, match=r"imq.system.max_size=3000"):
            _send(sized_session, "z" * 1000)
    finally:
        sized.close()


def test_a_body_over_the_message_max_size_is_refused():
    broker = Broker(max_message_size=100)
    try:
        session = _session(broker)
        _send(session, "x" * 100)
        with pytest.raises(ResourceAllocationException, match=r"101 bytes is larger than imq.message.max_size=100"):
            _send(session, "x" * 101)
    finally:
        broker.close()


def test_memory_states_rise_with_use_log_their_changes_and_size_the_batches(caplog):
    used = [10]
    monitor = MemoryMonitor(MemoryConfig(counts=(5000, 3, 1, 0), budget=100), measure=lambda: used[0])
    try:
        producer = object()
        assert monitor.state_name == "green"
        used[0] = 85
        with caplog.at_level(logging.INFO, logger="bridgemgr.providers.embedded.memory"):
            monitor.sample()
        assert monitor.state_name == "yellow"
        assert "memory state green -> yellow: 0 MB in use, 85% of 0 MB" in caplog.text
        assert [monitor.admit(producer) for _ in range(4)] == [True, True, True, False]
        assert monitor.admit(object())  # another producer has its own batch
        used[0] = 99
        woken = threading.Event()
        monitor.on_sample(woken.set)
        assert woken.wait(1)  # the timer sampled: red
        assert monitor.state_name == "red" and not monitor.admit(producer)
        used[0] = 10
        woken.clear()
        monitor.on_sample(woken.set)
        assert woken.wait(1) and monitor.state_name == "green" and monitor.admit(producer)
    finally:
        monitor.close()


def test_a_broker_in_red_holds_its_producers_until_the_state_drops():
    broker = Broker(memory=MemoryConfig(budget=1))  # any RSS is far over 98% of one byte
    try:
        conn = EmbeddedConnectionFactory(broker).create_connection()
        with pytest.raises(ProducerFlowControl, match="memory state is red"):
            broker.send(conn, TextMessage("x"), Q)
        assert broker.memory is not None
        broker.memory.budget = 1 << 50
        started = time.monotonic()
        _send(_session(broker), "x")  # held until the timer's next sample sees green
        assert time.monotonic() - started < 2
    finally:
        broker.close()


def test_destination_attributes_parse_with_the_properties_kinds():
    base = DestinationAttributes()
    got = _updated(
        base, {"maxNumMsgs": "1000", "maxTotalMsgBytes": "10m", "limitBehavior": "remove_oldest", "useDMQ": "false"}
    )
    assert got == DestinationAttributes(1000, 10 * 1024 * 1024, -1, "REMOVE_OLDEST", False)
    with pytest.raises(ValueError, match="unknown destination attribute 'maxMsgs'"):
        _updated(base, {"maxMsgs": "1"})
    with pytest.raises(ValueError, match="limitBehavior='DROP': write one of FLOW_CONTROL"):
        _updated(base, {"limitBehavior": "DROP"})
    assert Command("QUERY_DST", dst_type="q", destination="x").to_json()["destination"] == "x"


def test_a_stomp_send_the_broker_holds_waits_without_a_thread():
    from bridgemgr.stompbridge.frames import Frame
    from bridgemgr.stompbridge.session import PendingCall, SessionConfig, StompSession

    class Host:
        client_id = None
        held = True

        def send(self, message, destination):
            if self.held:
                raise ProducerFlowControl("full", lambda callback: None)
            return None

    session = StompSession(SessionConfig(), authenticate=lambda *a: None, open_host=lambda *a: None, session_id="s")
    host = session.host = Host()
    from bridgemgr.stompbridge.convert import Destinations
    from bridgemgr.stompbridge.session import State

    session.destinations = Destinations(lambda topic: None)
    session.state = State.CONNECTED
    session.version = "1.2"
    result = session._on_send(Frame("SEND", {"destination": "/queue/q", "receipt": "r1"}, b"x"))
    assert isinstance(result, Held)
    session._confirm(Frame("SEND", {"destination": "/queue/q", "receipt": "r1"}, b"x"), result, State.CONNECTED)
    call = session.take_call()
    assert isinstance(call, PendingCall) and call.wait is not None and session.waiting
    session.tick(100.0)  # not reading: no heart-beat failure
    host.held = False
    session.complete_call(None)
    assert b"receipt-id:r1" in session.data_to_send(0.0)
