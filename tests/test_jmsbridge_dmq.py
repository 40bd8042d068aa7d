"""The DMQ pipeline: the DMQ message (Table 12-1), body truncation, DMQ transformers,
send attempts, the order built-in DMQ -> file order (until one takes it) -> final log,
and readiness."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import BytesMessage, ObjectMessage, Queue, TextMessage, codec
from bridgemgr.jms.errors import JMSException
from bridgemgr.jms.message import DeliveryMode, PropertyType
from bridgemgr.jmsbridge import dmq as dmq_module
from bridgemgr.jmsbridge.bridge import BridgeStartError, JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.dmq import DeadLetter, describe, dmq_message
from bridgemgr.jmsbridge.pipeline import DMQReason
from bridgemgr.jmsbridge.states import State
from bridgemgr.providers.embedded import DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.transform import MessageTransformer
from jmsbridge_support import BUILTIN_DMQ, bridge_xml, drain, link_xml, make_bridge, send, wait_until

pytestmark = pytest.mark.timeout(60)


class AlwaysFails(MessageTransformer):
    def transform(self, message, read_only, charset_name, source, target, properties):
        raise ValueError("no")


class Tagging(MessageTransformer):
    """A DMQ transformer: a copy with the DMQ's <property> elements as properties."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        out = message.copy()
        for k, v in (properties or {}).items():
            out.set_string_property(k, v)
        return out


def letter(original, reason=DMQReason.SEND_FAILURE, exception="boom") -> DeadLetter:
    return DeadLetter(original, reason, exception, "b", "l", "src", "dst", "branch", "P1", "P2")


def original(**props) -> TextMessage:
    m = TextMessage("body")
    m.message_id, m.timestamp, m.correlation_id, m.type = "ID:7", 1234, "corr", "kind"
    for k, v in props.items():
        m.set_object_property(k, v)
    m.set_read_only()
    return m


# --- the DMQ message ---------------------------------------------------------------------------


def test_dmq_message_properties_and_body():
    orig = original(color="red", n=3)
    dead = dmq_message(letter(orig), orig, 99)
    p = "JMS_SUN_JMSBRIDGE_"
    assert dead.get_string_property("color") == "red" and dead.get_int_property("n") == 3
    expected = {
        "SOURCE_MESSAGEID": "ID:7",
        "SOURCE_CORRELATIONID": "corr",
        "SOURCE_JMSTYPE": "kind",
        "SOURCE_DESTINATION": "src",
        "TARGET_DESTINATION": "dst",
        "TARGET_CURRENT_DESTINATION": "branch",
        "SOURCE_PROVIDER": "P1",
        "TARGET_PROVIDER": "P2",
        "DMQ_REASON": "SEND_FAILURE",
        "DMQ_EXCEPTION": "boom",
        "DMQ_TIMESTAMP": "99",
    }
    for name, value in expected.items():
        assert dead.get_property_type(p + name) is PropertyType.STRING, name
        assert dead.get_string_property(p + name) == value, name
    assert dead.get_property_type(p + "SOURCE_TIMESTAMP") is PropertyType.LONG
    assert dead.get_long_property(p + "SOURCE_TIMESTAMP") == 1234
    assert not dead.property_exists(p + "DMQ_BODY_TRUNCATED")
    assert dead.object == orig


def test_missing_values_are_left_out():
    orig = TextMessage("x")
    dead = dmq_message(letter(orig, exception=None), orig, 1)
    for name in ("SOURCE_MESSAGEID", "SOURCE_CORRELATIONID", "SOURCE_JMSTYPE", "DMQ_EXCEPTION"):
        assert not dead.property_exists("JMS_SUN_JMSBRIDGE_" + name)


def test_body_that_cannot_be_encoded_is_truncated_to_str():
    weird = ObjectMessage({1, 2})  # a set: not serialisable
    dead = dmq_message(letter(weird), weird, 1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_BODY_TRUNCATED") == "true"
    assert dead.object == str(weird)
    codec.encode(dead)  # the DMQ message itself can always be sent


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    text=st.text(max_size=50),
    body=st.binary(max_size=50),
    props=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(
            lambda s: (
                s.upper() not in ("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE")
            )
        ),
        st.one_of(st.text(max_size=20), st.integers(-(2**31), 2**31 - 1), st.booleans()),
        max_size=5,
    ),
)
def test_dmq_message_round_trips_through_the_codec(text, body, props):
    for orig in (TextMessage(text), BytesMessage(body)):
        for k, v in props.items():
            orig.set_object_property(k, v)
        dead = codec.decode(codec.encode(dmq_message(letter(orig), orig, 5)))
        assert dead.object == orig
        assert {k: dead.get_object_property(k) for k in props} == props


def test_describe_shows_headers_and_properties_but_no_secrets():
    orig = original(color="red", dbPassword="hunter2")
    text = describe(letter(orig), 5)
    assert "message_id='ID:7'" in text and "color='red'" in text
    assert "JMS_SUN_JMSBRIDGE_DMQ_REASON='SEND_FAILURE'" in text
    assert "hunter2" not in text and "dbPassword=********" in text


# --- the chain, on a running bridge ---------------------------------------------------------------

DMQS = (
    '<dmq name="first" connection-factory-ref="host" destination-ref="d1" send-attempts="2" '
    'send-attempt-interval-in-seconds="0"/>'
    '<dmq name="off" connection-factory-ref="host" destination-ref="d0" enabled="false"/>'
    '<dmq name="second" connection-factory-ref="host" destination-ref="d2" send-attempts="1" '
    'time-to-live-in-millis="600000"/>'
)
DESTS = "".join(f'<destination ref-name="{d}" name="{d}"/>' for d in ("d0", "d1", "d2"))
FAILING_LINK = link_xml(
    target_attrs=f'message-transformer-class="{__name__}.AlwaysFails" consume-no-transfer-on-transform-error="true"'
)


def full(broker, name):
    broker.configure_destination(Queue(name), DestinationLimits(max_num_msgs=0))


@pytest.mark.slow
def test_builtin_first_then_the_first_user_dmq_that_takes_it(broker):
    """Step 5: the built-in DMQ taking the message does not end the sequence; the first
    user DMQ that takes it does (the second one never sees it)."""
    send(broker, "src", ["x"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=DMQS, dests=DESTS))
    b.start()
    try:
        (dead,) = drain(broker, BUILTIN_DMQ, expect=1)
        (copy,) = drain(broker, "d1", expect=1)
        counters = b.links[0].counters
        wait_until(lambda: counters.to_dmq == 1, what="counted")
        assert counters.dmq_lost == 0 and counters.dmq_reasons == {"TRANSFORM_FAILURE": 1}
    finally:
        b.stop()
    for m in (dead, copy):
        assert m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "TRANSFORM_FAILURE"
        assert "ValueError: no" in m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
        assert m.object.text == "x"
    assert drain(broker, "d2") == drain(broker, "src") == []


@pytest.mark.slow
def test_file_order_until_one_takes_it_with_ttl_mode_and_priority(broker, caplog):
    full(broker, BUILTIN_DMQ)
    full(broker, "d1")
    send(broker, "src", ["x"], priority=8, delivery_mode=DeliveryMode.NON_PERSISTENT)
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=DMQS, dests=DESTS))
    b.start()
    try:
        (dead,) = drain(broker, "d2", expect=1)
    finally:
        b.stop()
    assert dead.priority == 8 and dead.delivery_mode == DeliveryMode.NON_PERSISTENT
    assert 0 < dead.expiration - dead.timestamp <= 600_000
    assert drain(broker, "d0") == []  # disabled
    attempts = [r for r in caplog.records if "send attempt" in r.getMessage()]
    assert len([r for r in attempts if "DMQ built-in-dmq" in r.getMessage()]) == 2
    assert len([r for r in attempts if "DMQ first" in r.getMessage()]) == 2  # send-attempts


def test_final_log_when_no_dmq_takes_it(broker, caplog):
    for name in (BUILTIN_DMQ, "d1", "d2"):
        full(broker, name)
    m = TextMessage("x")
    m.set_string_property("color", "blue")
    send(broker, "src", [m, "y"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=DMQS, dests=DESTS))
    b.start()
    try:
        counters = b.links[0].counters
        wait_until(lambda: counters.to_dmq == 2, what="both dead")
        assert counters.dmq_lost == 2 and b.links[0].state is State.STARTED
    finally:
        b.stop()
    finals = [r for r in caplog.records if r.levelno == logging.ERROR and "no DMQ took" in r.getMessage()]
    assert len(finals) == 2
    text = finals[0].getMessage()
    assert "color='blue'" in text and "TRANSFORM_FAILURE" in text and "message_id=" in text
    assert drain(broker, "src") == []  # consumed: the chapter's sequence ends with the log


@pytest.mark.slow
def test_dmq_transformer_is_applied_and_its_failure_keeps_the_original(broker):
    dmqs = (
        f'<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="d1" '
        f'send-attempt-interval-in-seconds="0" message-transformer-class="{__name__}.Tagging">'
        '<property name="audit" value="yes"/></dmq>'
    )
    send(broker, "src", ["x"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=dmqs, dests=DESTS))
    b.start()
    try:
        (dead,) = drain(broker, BUILTIN_DMQ, expect=1)
    finally:
        b.stop()
    assert dead.object.get_string_property("audit") == "yes"
    assert not dead.property_exists("audit")  # the DMQ message carries the original's only
    dmqs = dmqs.replace("Tagging", "AlwaysFails")
    send(broker, "src", ["y"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=dmqs, dests=DESTS))
    b.start()
    try:
        (dead,) = drain(broker, BUILTIN_DMQ, expect=1)
    finally:
        b.stop()
    assert dead.object.text == "y"


def test_builtin_dmq_must_be_ready_at_start(broker):
    class Down(EmbeddedConnectionFactory):
        def create_connection(self, username=None, password=None):
            raise JMSException("host broker unreachable")

    xml = bridge_xml(
        link_xml(),
        cfs='<connection-factory ref-name="host"><property name="imqDefaultUsername" value="u"/></connection-factory>',
    )
    b = JMSBridge(
        parse_bridge_config(xml), host_factory=lambda env: EmbeddedConnectionFactory(broker) if env else Down(broker)
    )
    with pytest.raises(BridgeStartError, match="built-in DMQ"):
        b.start()
    assert b.state is State.STOPPED
    assert b.links == [] and not broker.connections  # step 9 never ran; nothing left open


def test_dmq_failures_are_never_raised(broker, monkeypatch):
    def explode(*a, **k):
        raise RuntimeError("bug in the DMQ message")

    monkeypatch.setattr(dmq_module, "dmq_message", explode)
    send(broker, "src", ["x", "y"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK))
    b.start()
    try:
        wait_until(lambda: b.links[0].counters.to_dmq == 2)
        assert b.links[0].state is State.STARTED
    finally:
        b.stop()


@pytest.mark.slow
def test_stop_during_a_user_dmq_retry_consumes_what_the_builtin_dmq_has(broker):
    """A stop cuts the user DMQ's attempts short; the built-in DMQ has the message, so it
    is consumed rather than copied to the built-in DMQ again when it comes back."""
    full(broker, "d1")
    dmqs = (
        '<dmq name="slow" connection-factory-ref="host" destination-ref="d1" '
        'send-attempts="100" send-attempt-interval-in-seconds="30"/>'
    )
    send(broker, "src", ["x"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=dmqs, dests=DESTS))
    b.start()
    (dead,) = drain(broker, BUILTIN_DMQ, expect=1)
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive()
    assert dead.object.text == "x"
    assert b.links[0].counters.to_dmq == 1 and b.links[0].counters.dmq_lost == 0
    assert drain(broker, "src") == drain(broker, BUILTIN_DMQ) == []


def test_stop_interrupts_dmq_retries_and_keeps_the_message(broker):
    full(broker, BUILTIN_DMQ)
    dmqs = (
        '<dmq name="built-in-dmq" connection-factory-ref="host" destination-ref="src" '
        'send-attempts="100" send-attempt-interval-in-seconds="30"/>'
    )
    send(broker, "src", ["x"])
    b = make_bridge(broker, bridge_xml(FAILING_LINK, dmqs=dmqs))
    b.start()
    wait_until(lambda: b.links[0].counters.received == 1)
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive()
    assert [m.text for m in drain(broker, "src")] == ["x"]  # not consumed
