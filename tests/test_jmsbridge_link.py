"""A link's transfer sequence end to end on embedded brokers: the chapter's eight steps,
transformers (branch_to, no_transfer, failures), the DMQ reasons, transacted (XA) links,
the backout threshold, acknowledge batches and the per-transfer log."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import pytest

from bridgemgr.jms import DeliveryMode, ObjectMessage, Queue, TextMessage, Topic
from bridgemgr.jms.spi import ConnectionMetaData, XAConnectionFactory
from bridgemgr.jmsbridge import link as link_module
from bridgemgr.jmsbridge.bridge import BridgeStartError, JMSBridge
from bridgemgr.jmsbridge.config import parse_bridge_config
from bridgemgr.jmsbridge.link import LinkTuning
from bridgemgr.jmsbridge.pipeline import keeps_reply_to
from bridgemgr.jmsbridge.states import State
from bridgemgr.props import BrokerProperties, load_properties
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory, open_broker
from bridgemgr.providers.embedded.client import EmbeddedConnection
from bridgemgr.transform import MessageTransformer
from jmsbridge_support import (
    BUILTIN_DMQ,
    FAST,
    bridge_xml,
    drain,
    host,
    link_xml,
    make_bridge,
    send,
    texts,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


# --- transformers used by the tests (loaded by dotted path from this module) -------------


class Recorder(MessageTransformer):
    calls: ClassVar[list[tuple[Any, ...]]] = []

    def transform(self, message, read_only, charset_name, source, target, properties):
        Recorder.calls.append((message.text, read_only, charset_name, source, target, dict(properties or {})))
        return message


class Failing(MessageTransformer):
    """Fails on messages whose text starts with 'bad', returns None for 'none'."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        if message.text.startswith("bad"):
            raise ValueError("cannot transform " + message.text)
        if message.text.startswith("none"):
            return None
        return message


class Brancher(MessageTransformer):
    """'ref:X' -> branch_to ref-name X; 'q:X' -> branch_to Queue(X); 'drop' -> no_transfer."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        text = message.text
        if text.startswith("ref:"):
            self.branch_to(text[4:])
        elif text.startswith("q:"):
            self.branch_to(self.create_queue(text[2:]))
        elif text.startswith("drop"):
            self.no_transfer()
        return message


class Slow(MessageTransformer):
    def transform(self, message, read_only, charset_name, source, target, properties):
        time.sleep(0.3)
        return message


def window_props(window: int) -> BrokerProperties:
    """Bridge b's properties with imq.bridge.b.link.window set."""
    return load_properties([], [f"imq.bridge.b.link.window={window}"], environ={})


def run(broker: Broker, xml: bytes, **kw: Any) -> JMSBridge:
    bridge = make_bridge(broker, xml, **kw)
    assert bridge.start() is State.STARTED
    return bridge


@pytest.fixture
def bridges():
    started: list[JMSBridge] = []
    yield started
    for b in started:
        b.stop()


def dmq_letters(broker: Broker, expect: int | None = None) -> list[ObjectMessage]:
    return drain(broker, BUILTIN_DMQ, expect=expect)  # type: ignore[return-value]


# --- steps 1, 6, 7, 8: transfer, order, headers --------------------------------------------


@pytest.mark.slow
def test_transfers_in_order_with_mode_priority_and_properties(broker, bridges):
    sent = []
    for i in range(60):
        m = TextMessage(f"m{i}")
        m.set_int_property("n", i)
        m.correlation_id = f"c{i}"
        sent.append(m)
    send(broker, "src", sent[:30])
    send(broker, "src", sent[30:], delivery_mode=DeliveryMode.NON_PERSISTENT, priority=4)
    bridges.append(b := run(broker, bridge_xml(link_xml())))
    got = drain(broker, "dst", expect=60)
    assert texts(got) == [f"m{i}" for i in range(60)]
    assert [m.get_int_property("n") for m in got] == list(range(60))
    assert [m.correlation_id for m in got] == [f"c{i}" for i in range(60)]
    assert {m.delivery_mode for m in got[:30]} == {DeliveryMode.PERSISTENT}
    assert {m.delivery_mode for m in got[30:]} == {DeliveryMode.NON_PERSISTENT}
    assert drain(broker, "src") == []
    c = b.links[0].counters
    wait_until(lambda: c.transferred == 60, what="counters")
    assert c.received == 60 and c.to_dmq == 0


@pytest.mark.slow
def test_a_moving_link_publishes_what_a_reader_that_must_not_block_answers(broker, bridges, monkeypatch):
    """info_now(): info() with the backlog the link's own thread read while it moved, for
    a reader that must not wait for the broker (the management port's loop); nothing
    before it moved, when that is no longer fresh (PUBLISHED_FRESH), paused or stopped."""
    bridges.append(b := run(broker, bridge_xml(link_xml())))
    (link,) = b.links
    assert link.info_now() is None  # nothing published yet: ask info()
    monkeypatch.setattr(link_module, "PUBLISHED_FRESH", 60.0)
    send(broker, "src", [TextMessage(f"m{i}") for i in range(20)])
    drain(broker, "dst", expect=20)
    now = link.info_now()
    assert now is not None and now.keys() == link.info().keys() and 0 <= now["backlog"] < 20
    assert now["counters"]["received"] == 20 and b.link_info("l", now=True) == now
    monkeypatch.setattr(link_module, "PUBLISHED_FRESH", 0.0)
    assert link.info_now() is None and b.link_info("l", now=True) is None  # no longer fresh
    assert b.link_info("l")["backlog"] == 0  # (read live)
    monkeypatch.setattr(link_module, "PUBLISHED_FRESH", 60.0)
    b.pause_link("l")
    assert link.info_now() is None
    b.resume_link("l")
    b.stop()
    assert link.info_now() is None and b.link_info("l")["state"] == "STOPPED"
    with pytest.raises(KeyError):
        b.link_info("nosuch")


def test_same_priority_as_the_original(broker, bridges):
    send(broker, "src", ["low"], priority=1)
    send(broker, "src", ["high"], priority=9)
    bridges.append(run(broker, bridge_xml(link_xml())))
    got = drain(broker, "dst", expect=2)
    assert {m.text: m.priority for m in got} == {"low": 1, "high": 9}


@pytest.mark.slow
def test_remaining_time_to_live(broker, bridges):
    sent = send(broker, "src", ["ttl"], time_to_live=60_000)[0]
    bridges.append(run(broker, bridge_xml(link_xml())))
    got = drain(broker, "dst", expect=1)[0]
    assert abs(got.expiration - sent.expiration) < 200  # now + (expiration - now)
    never = send(broker, "src", ["forever"])[0]
    assert never.expiration == 0
    assert drain(broker, "dst", expect=1)[0].expiration == 0


@pytest.mark.slow
def test_selector_and_the_rest_stays(broker, bridges):
    msgs = []
    for i in range(10):
        m = TextMessage(f"m{i}")
        m.set_int_property("n", i)
        msgs.append(m)
    send(broker, "src", msgs)
    bridges.append(run(broker, bridge_xml(link_xml(source_attrs='selector="n &gt;= 5"'))))
    assert texts(drain(broker, "dst", expect=5)) == [f"m{i}" for i in range(5, 10)]
    bridges[0].stop()
    assert texts(drain(broker, "src")) == [f"m{i}" for i in range(5)]


@pytest.mark.slow
def test_durable_subscription_keeps_messages_while_stopped(broker, bridges):
    xml = bridge_xml(
        link_xml(src="t", source_attrs='durable-sub="sub1" clientid="bridge-c1"'),
        dests='<destination ref-name="t" name="news" type="topic"/>',
    )
    b = run(broker, xml)
    bridges.append(b)
    send(broker, Topic("news"), ["one"])
    assert texts(drain(broker, "dst", expect=1)) == ["one"]
    b.stop()
    send(broker, Topic("news"), ["two", "three"])  # kept by the durable subscription
    b.start()
    assert texts(drain(broker, "dst", expect=2)) == ["two", "three"]


def test_durable_sub_needs_a_clientid(broker):
    xml = bridge_xml(
        link_xml(src="t", source_attrs='durable-sub="sub1"'),
        dests='<destination ref-name="t" name="news" type="topic"/>',
    )
    b = make_bridge(broker, xml)
    with pytest.raises(BridgeStartError, match="clientid"):
        b.start()
    assert b.state is State.STOPPED


@pytest.mark.slow
def test_transfer_log_lines(broker, bridges, caplog):
    caplog.set_level(logging.INFO, logger="imq.bridge")
    send(broker, "src", ["a", "b"])
    bridges.append(run(broker, bridge_xml(link_xml())))
    drain(broker, "dst", expect=2)
    wait_until(lambda: len([r for r in caplog.records if "transferred" in r.getMessage()]) == 2)
    quiet = run(broker, bridge_xml(link_xml(src="other", dst="dst"), name="q", log_message_transfer="false"))
    bridges.append(quiet)
    send(broker, "other", ["c"])
    drain(broker, "dst", expect=1)
    wait_until(lambda: quiet.links[0].counters.transferred == 1)
    assert not [r for r in caplog.records if r.name == "imq.bridge.q" and "transferred" in r.getMessage()]


# --- step 2: expiration --------------------------------------------------------------------------


@pytest.mark.slow
def test_expired_message_goes_to_the_dmq(broker, bridges, monkeypatch):
    send(broker, "src", ["late"], time_to_live=60_000)
    send(broker, "src", ["ok"])
    real = link_module.now_ms
    monkeypatch.setattr(link_module, "now_ms", lambda: real() + 120_000)  # the link's clock only
    b = run(broker, bridge_xml(link_xml()))
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=1)) == ["ok"]
    (dead,) = dmq_letters(broker, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "MESSAGE_EXPIRED"
    assert dead.object.text == "late"
    assert b.links[0].counters.dmq_reasons["MESSAGE_EXPIRED"] == 1
    assert drain(broker, "src") == []


# --- step 3: JMSReplyTo ------------------------------------------------------------------------------


class _OtherConnection(EmbeddedConnection):
    @property
    def metadata(self) -> ConnectionMetaData:
        return ConnectionMetaData("some other provider", "1")


class OtherProviderFactory(EmbeddedConnectionFactory):
    """The embedded broker, reporting another provider name."""

    def create_connection(self, username=None, password=None):
        conn = super().create_connection(username, password)
        conn.__class__ = _OtherConnection
        return conn


def _reply_to_bridge(broker: Broker, retain: bool, target: str = "host") -> JMSBridge:
    xml = bridge_xml(
        '<link name="l" transacted="false"><source connection-factory-ref="other" '
        f'destination-ref="src"/><target connection-factory-ref="{target}" destination-ref="dst" '
        f'retain-replyto="{str(retain).lower()}"/></link>',
        cfs='<connection-factory ref-name="other" lookup-name="X" >'
        '<property name="java.naming.factory.initial" value="x"/></connection-factory>'
        '<connection-factory ref-name="other-too" lookup-name="Y" >'
        '<property name="java.naming.factory.initial" value="x"/></connection-factory>',
    )
    lookup = lambda name, env: OtherProviderFactory(broker)  # noqa: E731
    return JMSBridge(parse_bridge_config(xml), host_factory=host(broker), lookup=lookup, tuning=FAST)


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("target", ["host", "other-too"])
def test_reply_to_cleared_unless_both_ends_are_message_queue_or_retained(broker, bridges, retain, target):
    """The chapter keeps JMSReplyTo by default only between Message Queue brokers: two
    ends of one other provider (both "some other provider") clear it too. (Before, one
    provider at both ends kept it.)"""
    m = TextMessage("ask")
    m.reply_to = Queue("answers")
    send(broker, "src", [m])
    b = _reply_to_bridge(broker, retain, target)
    b.start()
    bridges.append(b)
    got = drain(broker, "dst", expect=1)[0]
    assert got.reply_to == (Queue("answers") if retain else None)


@pytest.mark.parametrize(
    ("source", "target", "kept"),
    [
        ("imqbridge embedded broker", "imqbridge embedded broker", True),
        ("Open Message Queue", "imqbridge embedded broker", True),
        ("imqbridge embedded broker", "Oracle GlassFish(tm) Server Message Queue", True),
        ("ActiveMQ", "ActiveMQ", False),
        ("imqbridge embedded broker", "ActiveMQ", False),
        ("RabbitMQ", "imqbridge embedded broker", False),
    ],
)
def test_which_provider_pairs_keep_reply_to_by_default(source, target, kept):
    assert keeps_reply_to(False, source, target) is kept
    assert keeps_reply_to(True, source, target) is True


def test_reply_to_kept_between_message_queue_brokers(broker, bridges):
    m = TextMessage("ask")
    m.reply_to = Queue("answers")
    send(broker, "src", [m])
    bridges.append(run(broker, bridge_xml(link_xml())))
    assert drain(broker, "dst", expect=1)[0].reply_to == Queue("answers")


# --- step 4: transformers ------------------------------------------------------------------------------


def test_transformer_gets_target_properties_and_bridge_name(broker, bridges):
    Recorder.calls.clear()
    send(broker, "src", ["x"])
    xml = bridge_xml(
        link_xml(
            target_attrs=f'message-transformer-class="{__name__}.Recorder"',
            target_body='<property name="charset" value="UTF-8"/><property name="k" value="v"/>',
        )
    )
    bridges.append(run(broker, xml))
    drain(broker, "dst", expect=1)
    text, read_only, charset, source, target, props = Recorder.calls[0]
    assert text == "x" and read_only is True and charset is None
    assert source == target == Broker.provider_name
    assert props == {"charset": "UTF-8", "k": "v", "JMS_SUN_JMSBRIDGE_NAME": "b"}


@pytest.mark.slow
def test_transform_failure_with_consume_goes_to_the_dmq(broker, bridges):
    send(broker, "src", ["good1", "bad2", "none3", "good4"])
    xml = bridge_xml(
        link_xml(
            target_attrs=f'message-transformer-class="{__name__}.Failing" consume-no-transfer-on-transform-error="true"'
        )
    )
    b = run(broker, xml)
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=2)) == ["good1", "good4"]
    dead = dmq_letters(broker, expect=2)
    assert [d.object.text for d in dead] == ["bad2", "none3"]  # the untransformed message
    assert {d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") for d in dead} == {"TRANSFORM_FAILURE"}
    assert "cannot transform bad2" in dead[0].get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    assert "returned None" in dead[1].get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    assert b.links[0].state is State.STARTED
    # list link -v / --json / metrics: the last dead message's reason, why, and how often
    counters = b.links[0].counters
    assert counters.last_error is not None and counters.last_error.startswith("TRANSFORM_FAILURE: ")
    assert "returned None" in counters.last_error and counters.last_error.endswith("(2 times)")
    assert counters.transferred == 2 and sum(counters.latency_buckets) == 2
    assert counters.last_transfer_at is not None and counters.rate() > 0


@pytest.mark.slow
def test_transform_failure_without_consume_stops_the_link(broker, bridges):
    send(broker, "src", ["good1", "bad2", "good3"])
    xml = bridge_xml(link_xml(target_attrs=f'message-transformer-class="{__name__}.Failing"'))
    b = run(broker, xml)
    bridges.append(b)
    link = b.links[0]
    assert link.lifecycle.wait_for({State.STOPPED}, 5) is State.STOPPED
    assert "bad2" in link.counters.last_error
    assert texts(drain(broker, "dst", expect=1)) == ["good1"]
    assert dmq_letters(broker) == []
    b.start_link("l")  # the message is still there: the link stops again on it
    assert link.lifecycle.wait_for({State.STOPPED}, 5) is State.STOPPED
    b.stop()
    assert texts(drain(broker, "src")) == ["bad2", "good3"]


def test_a_link_that_may_halt_acknowledges_each_message(broker, bridges):
    send(broker, "src", ["good1", "good2", "bad3"])
    xml = bridge_xml(link_xml(target_attrs=f'message-transformer-class="{__name__}.Failing"'))
    tuning = LinkTuning(**{**FAST.__dict__, "ack_batch": 50})
    b = run(broker, xml, tuning=tuning)
    bridges.append(b)
    assert b.links[0].lifecycle.wait_for({State.STOPPED}, 5) is State.STOPPED
    b.start_link("l")  # stops on bad3 again; good1 and good2 were acknowledged, not resent
    assert b.links[0].lifecycle.wait_for({State.STOPPED}, 5) is State.STOPPED
    assert texts(drain(broker, "dst", expect=2)) == ["good1", "good2"]


@pytest.mark.slow
def test_backout_threshold_moves_a_poison_message_to_the_dmq(broker, bridges, tmp_path):
    props = load_properties([], [f"imq.varhome={tmp_path}", "imq.bridge.b.backoutThreshold=2"])
    send(broker, "src", ["bad-poison", "good"])
    xml = bridge_xml(link_xml(target_attrs=f'message-transformer-class="{__name__}.Failing"'))
    b = make_bridge(broker, xml, props=props)
    b.start()
    bridges.append(b)
    link = b.links[0]
    for _ in range(2):  # backed out twice: the third delivery reaches the threshold
        assert link.lifecycle.wait_for({State.STOPPED}, 5) is State.STOPPED
        b.start_link("l")
    assert texts(drain(broker, "dst", expect=1)) == ["good"]
    (dead,) = dmq_letters(broker, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "BACKOUT_THRESHOLD_REACHED"
    assert dead.object.text == "bad-poison"
    assert link.state is State.STARTED


@pytest.mark.slow
def test_branch_to_and_no_transfer_with_first_audit_copies(broker, bridges):
    send(broker, "src", ["plain", "ref:other", "q:elsewhere", "drop1", "drop2", "ref:other"])
    xml = bridge_xml(link_xml(target_attrs=f'message-transformer-class="{__name__}.Brancher"'))
    b = run(broker, xml)
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=1)) == ["plain"]
    assert texts(drain(broker, "other", expect=2)) == ["ref:other", "ref:other"]
    assert texts(drain(broker, "elsewhere", expect=1)) == ["q:elsewhere"]
    audit = dmq_letters(broker, expect=2)
    by_reason = {d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON"): d for d in audit}
    assert set(by_reason) == {"FIRST_TRANSFORMER_BRANCHTO", "FIRST_TRANSFORMER_NOTRANSFER"}
    branch = by_reason["FIRST_TRANSFORMER_BRANCHTO"]
    assert branch.object.text == "ref:other"
    assert branch.get_string_property("JMS_SUN_JMSBRIDGE_TARGET_DESTINATION") == "dst"
    assert branch.get_string_property("JMS_SUN_JMSBRIDGE_TARGET_CURRENT_DESTINATION") == "other"
    assert by_reason["FIRST_TRANSFORMER_NOTRANSFER"].object.text == "drop1"
    counters = b.links[0].counters
    wait_until(lambda: counters.transferred == 4 and counters.consumed_only == 2)
    assert drain(broker, "src") == []


def test_branch_to_an_unknown_ref_is_a_transform_failure(broker, bridges):
    send(broker, "src", ["ref:nowhere"])
    xml = bridge_xml(
        link_xml(
            target_attrs=f'message-transformer-class="{__name__}.Brancher" '
            'consume-no-transfer-on-transform-error="true"'
        )
    )
    bridges.append(run(broker, xml))
    (dead,) = dmq_letters(broker, expect=1)
    assert "nowhere" in dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")


# --- steps 5 and 6: tag, AS_SOURCE, send failures ---------------------------------------------------


def test_bridge_name_tag(broker, bridges):
    send(broker, "src", ["x"])
    bridges.append(run(broker, bridge_xml(link_xml(), message_transfer_tag_bridge_name="true")))
    got = drain(broker, "dst", expect=1)[0]
    assert got.get_string_property("JMS_SUN_JMSBRIDGE_NAME") == "b"


def test_as_source_target(tmp_path, bridges):
    a, other = Broker(tmp_path / "a"), open_broker(tmp_path / "b")
    try:
        xml = bridge_xml(
            '<link name="l" transacted="false"><source connection-factory-ref="host" '
            'destination-ref="src"/><target connection-factory-ref="remote" '
            'destination-ref="AS_SOURCE"/></link>',
            cfs='<connection-factory ref-name="remote" lookup-name="ConnectionFactory">'
            '<property name="java.naming.factory.initial" value="imq.embedded"/>'
            f'<property name="java.naming.provider.url" value="{tmp_path / "b"}"/>'
            "</connection-factory>",
        )
        send(a, "src", ["mirrored"])
        b = JMSBridge(parse_bridge_config(xml), host_factory=host(a), tuning=FAST)
        b.start()
        bridges.append(b)
        assert texts(drain(other, "src", expect=1)) == ["mirrored"]
        assert b.info()["links"][0]["target"] == "remote:D:AS_SOURCE"
        b.stop()
    finally:
        a.close()
        other.close()


@pytest.mark.slow
def test_send_failure_goes_to_the_dmq_and_the_link_goes_on(broker, bridges):
    broker.configure_destination(Queue("dst"), DestinationLimits(max_num_msgs=2))
    send(broker, "src", ["a", "b", "c", "d"])
    b = run(broker, bridge_xml(link_xml()))
    bridges.append(b)
    dead = dmq_letters(broker, expect=2)
    assert [d.object.text for d in dead] == ["c", "d"]
    assert {d.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") for d in dead} == {"SEND_FAILURE"}
    assert "full" in dead[0].get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    assert texts(drain(broker, "dst")) == ["a", "b"]
    assert drain(broker, "src") == []
    assert b.links[0].state is State.STARTED


@pytest.mark.slow
def test_acknowledge_failure_goes_to_the_dmq(broker, bridges, monkeypatch):
    from bridgemgr.jms.errors import JMSException
    from bridgemgr.jmsbridge.transfer import ClientAcknowledge

    real, calls = ClientAcknowledge.complete, []

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            raise JMSException("the provider refused the acknowledge")
        real(self)

    monkeypatch.setattr(ClientAcknowledge, "complete", flaky)
    send(broker, "src", ["a", "b"])
    # the chapter's acknowledge after each send (no confirm window): b acks a along
    b = run(broker, bridge_xml(link_xml()), props=window_props(1))
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=2)) == ["a", "b"]
    (dead,) = dmq_letters(broker, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "ACK_FAILURE"
    assert dead.object.text == "a"
    assert "refused the acknowledge" in dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_EXCEPTION")
    b.stop()
    assert drain(broker, "src") == []  # b's acknowledge took a along (CLIENT_ACKNOWLEDGE)


# --- transacted links (XA; in one embedded broker: one resource manager, one-phase commits) ---------


def test_transacted_link_within_one_embedded_broker(broker, bridges):
    send(broker, "src", [f"m{i}" for i in range(20)])
    b = run(broker, bridge_xml(link_xml(transacted="true")))
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=20)) == [f"m{i}" for i in range(20)]
    assert b.info()["links"][0]["transacted"] is True


class Unsendable(MessageTransformer):
    """'bad...' becomes an ObjectMessage the codec cannot encode: the send fails."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        return ObjectMessage({1, 2}) if message.text.startswith("bad") else message


@pytest.mark.slow
def test_transacted_send_failure_rolls_back_instead_of_the_dmq(broker, bridges):
    """Not SEND_FAILURE: rolled back, tried again until the default backoutThreshold (5)
    is reached; then to the DMQ once, and the message behind it moves."""
    send(broker, "src", ["bad1", "ok"])
    xml = bridge_xml(link_xml(transacted="true", target_attrs=f'message-transformer-class="{__name__}.Unsendable"'))
    b = run(broker, xml)
    bridges.append(b)
    assert texts(drain(broker, "dst", expect=1)) == ["ok"]
    (dead,) = dmq_letters(broker, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "BACKOUT_THRESHOLD_REACHED"
    assert dead.object.text == "bad1" and b.links[0].counters.rolled_back == 5
    b.stop()
    assert drain(broker, "src") == [] and dmq_letters(broker) == []


@pytest.mark.slow
def test_transacted_commit_the_broker_rolls_back_is_backed_out_not_a_commit_failure(broker, bridges):
    """One broker, one branch: the one-phase commit that the full dst refuses is rolled
    back as a whole (nothing committed), so no COMMIT_FAILURE copy while "b" comes back;
    backed out backoutThreshold times, it goes to the DMQ once."""
    broker.configure_destination(Queue("dst"), DestinationLimits(max_num_msgs=1))
    send(broker, "src", ["a", "b"])
    b = run(broker, bridge_xml(link_xml(transacted="true")))
    bridges.append(b)
    (dead,) = dmq_letters(broker, expect=1)
    assert dead.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON") == "BACKOUT_THRESHOLD_REACHED"
    assert dead.object.text == "b"
    assert dict(b.links[0].counters.dmq_reasons) == {"BACKOUT_THRESHOLD_REACHED": 1}
    b.stop()
    assert drain(broker, "src") == [] and texts(drain(broker, "dst")) == ["a"]


@pytest.mark.slow
def test_transacted_link_across_embedded_brokers_runs_through_the_xa_coordinator(tmp_path):
    a = Broker(tmp_path / "a")
    try:
        xml = bridge_xml(
            '<link name="l"><source connection-factory-ref="host" destination-ref="src"/>'
            '<target connection-factory-ref="remote" destination-ref="dst"/></link>',
            cfs='<connection-factory ref-name="remote" lookup-name="XAConnectionFactory">'
            '<property name="java.naming.factory.initial" value="imq.embedded"/>'
            f'<property name="java.naming.provider.url" value="{tmp_path / "b"}"/>'
            "</connection-factory>",
        )
        send(a, "src", ["moves"])
        b = JMSBridge(parse_bridge_config(xml, "x.xml"), host_factory=host(a), tuning=FAST)
        b.start()
        assert texts(drain(open_broker(tmp_path / "b"), "dst", expect=1)) == ["moves"]
        b.stop()
        assert drain(a, "src") == []
    finally:
        a.close()
        open_broker(tmp_path / "b").close()


class Wrapped(XAConnectionFactory):
    """Some other XA-capable provider (here: the embedded broker behind a wrapper)."""

    def __init__(self, broker: Broker) -> None:
        self.inner = EmbeddedConnectionFactory(broker)

    def create_connection(self, username=None, password=None):
        return self.inner.create_connection(username, password)

    create_xa_connection = create_connection


def test_transacted_link_to_another_provider_runs_through_the_xa_coordinator(broker, bridges):
    xml = bridge_xml(
        '<link name="l"><source connection-factory-ref="host" destination-ref="src"/>'
        '<target connection-factory-ref="other" destination-ref="dst"/></link>',
        cfs='<connection-factory ref-name="other" lookup-name="XAConnectionFactory">'
        '<property name="java.naming.factory.initial" value="x"/></connection-factory>',
    )
    send(broker, "src", ["a", "b"])
    b = JMSBridge(
        parse_bridge_config(xml, "x.xml"),
        host_factory=host(broker),
        lookup=lambda name, env: Wrapped(broker),
        tuning=FAST,
    )
    bridges.append(b)
    b.start()
    assert texts(drain(broker, "dst", expect=2)) == ["a", "b"]


# --- acknowledge batches --------------------------------------------------------------------------------


@pytest.mark.slow
def test_acknowledge_batches(broker, bridges):
    send(broker, "src", [f"m{i}" for i in range(105)])
    b = run(broker, bridge_xml(link_xml()), tuning=LinkTuning(**{**FAST.__dict__, "ack_batch": 10}))
    bridges.append(b)
    assert len(drain(broker, "dst", expect=105)) == 105
    wait_until(lambda: b.links[0].counters.transferred == 105)
    b.stop()
    assert drain(broker, "src") == []  # the last, partial batch was acknowledged too


@pytest.mark.slow
def test_stop_finishes_the_message_in_flight(broker, bridges):
    send(broker, "src", ["one", "two"])
    xml = bridge_xml(link_xml(target_attrs=f'message-transformer-class="{__name__}.Slow"'))
    b = run(broker, xml)
    wait_until(lambda: b.links[0].counters.received >= 1)
    b.stop()
    got, left = texts(drain(broker, "dst")), texts(drain(broker, "src"))
    assert sorted(got + left) == ["one", "two"] and got  # none lost, none twice
