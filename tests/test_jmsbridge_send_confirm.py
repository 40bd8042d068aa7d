"""A bridge's sends to a provider that answers later (a NON_PERSISTENT send over mq://):
a refusal is the failure of the message refused, never of the next one, and nothing is
consumed or counted as sent before the provider has answered for it. The target is a
second embedded broker behind its jms connection service on a real socket (the tests'
Harness), reached through a lookup-name connection factory as a bridge XML names it;
tests/test_bridge_refusal_e2e.py does the same between two serve processes."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException
from bridgemgr.providers.embedded import Broker, DestinationLimits
from bridgemgr.transform import MessageTransformer
from jmsbridge_support import BUILTIN_DMQ, FAST, bridge_xml, drain, link_xml, make_bridge, send, texts, wait_until
from remote.support import Harness

pytestmark = pytest.mark.timeout(60)

BIG = "x" * 4096


class Refusing(MessageTransformer):
    """Fails every message: each one is a dead message (TRANSFORM_FAILURE)."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        raise ValueError("no")


DEAD_LINK = link_xml(
    target_attrs=f'message-transformer-class="{__name__}.Refusing" consume-no-transfer-on-transform-error="true"'
)


@pytest.fixture
def far(tmp_path):
    """Another broker, reached over its jms service: queue dst takes at most 1 KiB per
    message, queue full takes nothing."""
    broker = Broker(tmp_path / "far")
    broker.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=1024))
    broker.configure_destination(Queue("full"), DestinationLimits(max_num_msgs=0))
    with Harness(broker) as harness:
        yield broker, harness
    broker.close()


def remote_cf(harness: Harness) -> str:
    return (
        '<connection-factory ref-name="far" lookup-name="XAConnectionFactory">'
        '<property name="java.naming.factory.initial" value="imq.embedded"/>'
        f'<property name="java.naming.provider.url" value="{harness.url}"/>'
        "</connection-factory>"
    )


@pytest.mark.slow
def test_the_refused_non_persistent_message_goes_to_the_dmq_and_the_next_one_is_sent(broker, far):
    far_broker, harness = far
    link = link_xml().replace('<target connection-factory-ref="host"', '<target connection-factory-ref="far"')
    sent = send(broker, "src", ["good 1"])
    sent += send(broker, "src", [BIG, "good 2"], delivery_mode=DeliveryMode.NON_PERSISTENT)
    sent += send(broker, "src", ["good 3"])
    b = make_bridge(broker, bridge_xml(link, cfs=remote_cf(harness)))
    b.start()
    try:
        delivered = drain(far_broker, "dst", expect=3)
        (dead,) = drain(broker, BUILTIN_DMQ, expect=1)
        counters = b.links[0].counters
        wait_until(lambda: counters.transferred + counters.to_dmq == 4, what="all four handled")
    finally:
        b.stop()
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") == sent[1].message_id
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "SEND_FAILURE"
    assert "maxBytesPerMsg=1024" in dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    assert texts(delivered) == ["good 1", "good 2", "good 3"]
    assert (counters.transferred, counters.to_dmq, counters.dmq_lost) == (3, 1, 0)
    assert drain(broker, "src") == []


@pytest.mark.slow
def test_a_dmq_that_refuses_a_non_persistent_message_has_not_taken_it(broker, far):
    """A DMQ send counts once the DMQ has the message: the sequence goes on to the next
    <dmq> when a remote one refuses it."""
    _, harness = far
    dmqs = (
        '<dmq name="faraway" connection-factory-ref="far" destination-ref="farfull" '
        'send-attempts="1" send-attempt-interval-in-seconds="0"/>'
        '<dmq name="near" connection-factory-ref="host" destination-ref="d2" send-attempts="1"/>'
    )
    dests = '<destination ref-name="farfull" name="full"/><destination ref-name="d2" name="d2"/>'
    send(broker, "src", ["x"], delivery_mode=DeliveryMode.NON_PERSISTENT)
    b = make_bridge(broker, bridge_xml(DEAD_LINK, dmqs=dmqs, cfs=remote_cf(harness), dests=dests))
    b.start()
    try:
        (builtin,) = drain(broker, BUILTIN_DMQ, expect=1)
        (near,) = drain(broker, "d2", expect=1)
    finally:
        b.stop()
    assert builtin.object.text == near.object.text == "x"
    assert near.delivery_mode == DeliveryMode.NON_PERSISTENT


def test_confirm_sends_makes_a_non_persistent_send_answer_for_itself(broker, far):
    """The mq:// producer's confirm_sends: the refusal is raised by the refused send."""
    _, harness = far
    conn = harness.factory().create_connection()
    try:
        producer = conn.create_session().create_producer(Queue("dst"))
        producer.delivery_mode = DeliveryMode.NON_PERSISTENT
        producer.confirm_sends = True
        producer.send(TextMessage("small"))
        with pytest.raises(ResourceAllocationException, match="maxBytesPerMsg=1024"):
            producer.send(TextMessage(BIG))
        producer.send(TextMessage("small again"))  # not failed by the refusal before it
    finally:
        conn.close()


@pytest.fixture
def stomp_far(tmp_path):
    """Another broker behind our STOMP bridge (which, like most STOMP brokers, closes the
    connection after it refused a frame): queue dst takes at most 1 KiB per message."""
    from bridgemgr.netloop import NetLoop
    from stomp_support import make_bridge as make_stomp_bridge
    from stomp_support import make_users

    broker = Broker(tmp_path / "stomp-far")
    broker.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=1024))
    with NetLoop("stomp-far") as loop:
        stomp_bridge = make_stomp_bridge(loop, broker, make_users(tmp_path))
        yield broker, stomp_bridge.tcp_port
        stomp_bridge.stop()
    broker.close()


@pytest.mark.slow
def test_a_stomp_target_that_refuses_and_disconnects_gets_each_message_once(broker, stomp_far):
    """Acknowledging in batches: the refused message goes to the DMQ once, and the link
    consumes it (with the batch before it) before the lost connection that follows the
    refusal sends the unacknowledged messages back: none is sent or dead-lettered twice."""
    far_broker, port = stomp_far
    cf = (
        '<connection-factory ref-name="far" lookup-name="ConnectionFactory" username="admin" '
        'password="secret"><property name="java.naming.factory.initial" value="imq.stomp"/>'
        f'<property name="java.naming.provider.url" value="stomp://127.0.0.1:{port}"/>'
        "</connection-factory>"
    )
    link = link_xml().replace('<target connection-factory-ref="host"', '<target connection-factory-ref="far"')
    sent = send(broker, "src", ["good 1"])
    sent += send(broker, "src", [BIG], delivery_mode=DeliveryMode.NON_PERSISTENT)
    sent += send(broker, "src", ["good 2", "good 3"])
    b = make_bridge(broker, bridge_xml(link, cfs=cf), tuning=replace(FAST, ack_batch=10))
    b.start()
    try:
        counters = b.links[0].counters
        wait_until(lambda: counters.transferred + counters.to_dmq == 4, what="all four handled")
        delivered = drain(far_broker, "dst", expect=3)
        dead = drain(broker, BUILTIN_DMQ, expect=1)
    finally:
        b.stop()
    assert [m.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") for m in dead] == [sent[1].message_id]
    assert texts(delivered) == ["good 1", "good 2", "good 3"]
    assert (counters.transferred, counters.to_dmq) == (3, 1)
    assert drain(broker, "src") == []


LOST = threading.Event()  # the far STOMP connection of the test below was lost


class LateAfterRefusal(MessageTransformer):
    """Passes every message; holds 'good 2' until the far STOMP bridge, which refused the
    message before it, has closed the connection (the interleaving of a loaded machine)."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        if isinstance(message, TextMessage) and message.text == "good 2":
            assert LOST.wait(10), "the far STOMP bridge did not close the connection"
        return message


@pytest.mark.slow
def test_a_connection_lost_before_the_next_send_still_takes_the_window_answers(broker, stomp_far, monkeypatch):
    """The far bridge answered good 1 (RECEIPT) and refused BIG, then closed the connection
    before the link sent good 2: the answers that came are taken (good 1 is acknowledged,
    BIG goes to the DMQ) and only good 2 and good 3 are sent again, not good 1."""
    from bridgemgr.providers.stomp.client import StompConnection

    far_broker, port = stomp_far
    LOST.clear()
    lost = StompConnection._lost

    def noted(self: StompConnection) -> None:
        lost(self)
        LOST.set()

    monkeypatch.setattr(StompConnection, "_lost", noted)
    cf = (
        '<connection-factory ref-name="far" lookup-name="ConnectionFactory" username="admin" '
        'password="secret"><property name="java.naming.factory.initial" value="imq.stomp"/>'
        f'<property name="java.naming.provider.url" value="stomp://127.0.0.1:{port}"/>'
        "</connection-factory>"
    )
    link = link_xml(
        target_attrs=f'message-transformer-class="{__name__}.LateAfterRefusal" '
        'consume-no-transfer-on-transform-error="true"'
    )
    link = link.replace('<target connection-factory-ref="host"', '<target connection-factory-ref="far"')
    sent = send(broker, "src", ["good 1"])
    sent += send(broker, "src", [BIG], delivery_mode=DeliveryMode.NON_PERSISTENT)
    sent += send(broker, "src", ["good 2", "good 3"])
    b = make_bridge(broker, bridge_xml(link, cfs=cf), tuning=replace(FAST, ack_batch=10))
    b.start()
    try:
        counters = b.links[0].counters
        wait_until(lambda: counters.transferred + counters.to_dmq == 4, what="all four handled")
        delivered = drain(far_broker, "dst", expect=3)
        dead = drain(broker, BUILTIN_DMQ, expect=1)
    finally:
        b.stop()
    assert [m.get_string_property("JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID") for m in dead] == [sent[1].message_id]
    assert texts(delivered) == ["good 1", "good 2", "good 3"]
    assert (counters.transferred, counters.to_dmq) == (3, 1)
    assert drain(broker, "src") == []
