"""The STOMP session state machine without sockets, on a real embedded broker: CONNECT and
versions, heart-beats, every row of Table 12-11, acknowledgement modes, transactions,
flow control, conversion, and the bad-input cases of the issue."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from bridgemgr.jms import AckMode, BytesMessage, DeliveryMode, MapMessage, Queue, TextMessage, Topic
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory, LimitBehavior
from bridgemgr.stompbridge.frames import ERROR, RECEIPT, Limits
from bridgemgr.stompbridge.session import SessionConfig, State
from bridgemgr.transform import MessageTransformer
from stomp_support import Driver, pending


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    yield b
    b.close()


@pytest.fixture
def jms(broker):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    yield conn.create_session()
    conn.close()


@pytest.fixture
def drivers(broker):
    made: list[Driver] = []

    def make(version: str | None = "1.2", config: SessionConfig = SessionConfig(), **headers: str) -> Driver:
        d = Driver(broker, config, name=f"s{len(made) + 1}")
        made.append(d)
        if version is not None:
            d.connect(version, **headers)
        return d

    yield make
    for d in made:
        d.close()
    assert broker.connections == set()  # nothing leaks


def error_of(frames):
    errors = [f for f in frames if f.command == ERROR]
    assert errors, f"expected an ERROR, got {frames}"
    e = errors[0]
    assert e.headers["content-length"] == str(len(e.body))
    return e


def expect_error(driver, frames, message):
    e = error_of(frames)
    assert e.headers["message"] == message, (e.headers, e.body)
    assert driver.session.state is State.ERROR
    return e


# --- CONNECT, versions, login --------------------------------------------------------------


@pytest.mark.parametrize(
    "accept,version", [(None, "1.0"), ("1.0", "1.0"), ("1.0,1.1", "1.1"), ("1.1,1.2", "1.2"), ("1.2,2.0", "1.2")]
)
def test_version_negotiation(drivers, accept, version):
    d = drivers(None)
    headers = {"login": "admin", "passcode": "secret"}
    if accept:
        headers["accept-version"] = accept
    connected = d.send("CONNECT", headers)[0]
    assert connected.command == "CONNECTED"
    assert connected.headers["version"] == version
    assert connected.headers["session"] == "s1"
    assert connected.headers["server"].startswith("imqbridge/")


def test_unsupported_version_is_an_error_listing_ours(drivers):
    d = drivers(None)
    e = expect_error(
        d,
        d.send("CONNECT", {"accept-version": "2.0,3.1", "login": "admin", "passcode": "secret"}),
        "unsupported version",
    )
    assert e.headers["version"] == "1.0,1.1,1.2"


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
@pytest.mark.parametrize(
    "headers,message",
    [
        ({"passcode": "secret"}, "missing login"),
        ({"login": "admin"}, "missing passcode"),
        ({}, "missing login"),
        ({"login": "admin", "passcode": "wrong"}, "authentication failed"),
        ({"login": "nobody", "passcode": "secret"}, "authentication failed"),
    ],
)
def test_login_and_passcode_are_required_and_checked(drivers, command, headers, message):
    d = drivers(None)
    e = expect_error(d, d.send(command, {"accept-version": "1.2", **headers}), message)
    assert b"secret" not in e.body and b"wrong" not in e.body  # never echo a password


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE", "ACK", "BEGIN", "DISCONNECT", "MESSAGE"])
def test_commands_before_connect_are_errors(drivers, command):
    d = drivers(None)
    e = expect_error(d, d.send(command, {"destination": "/queue/a", "transaction": "t"}), f"unexpected {command}")
    assert b"send CONNECT first" in e.body or command == "MESSAGE"


def test_connect_twice_is_an_error(drivers):
    d = drivers()
    expect_error(d, d.send("CONNECT", {"login": "admin", "passcode": "secret"}), "unexpected CONNECT")


def test_frames_after_an_error_are_ignored(drivers):
    d = drivers()
    d.send("SEND", {})  # no destination
    assert d.session.state is State.ERROR
    assert d.send("SEND", {"destination": "/queue/a"}, b"x") == []


def test_error_frames_carry_receipt_id_message_and_content_length(drivers):
    d = drivers()
    e = error_of(d.send("BEGIN", {"receipt": "r-7"}))
    assert e.headers["receipt-id"] == "r-7"
    assert e.headers["message"] == "missing transaction"
    assert e.headers["content-length"] == str(len(e.body)) and e.body


def test_frames_pipelined_behind_connect_wait_for_authentication(drivers, broker):
    d = drivers(None)
    data = (
        b"CONNECT\naccept-version:1.2\nlogin:admin\npasscode:secret\n\n\0"
        b"SEND\ndestination:/queue/pipe\nreceipt:r1\n\nhi\0"
    )
    frames = d.feed(data)
    assert [f.command for f in frames] == ["CONNECTED", "RECEIPT"]
    assert broker.queue_depth("pipe") == 1


# --- heart-beats ---------------------------------------------------------------------------


def test_heart_beat_negotiation_sending_and_enforcement(drivers):
    d = drivers(None, SessionConfig(heart_beat=(1000, 1000)))
    d.version = None
    connected = d.send(
        "CONNECT", {"accept-version": "1.1", "login": "admin", "passcode": "secret", "heart-beat": "500,2000"}
    )[0]
    assert connected.headers["heart-beat"] == "1000,1000"
    s = d.session
    assert (s.send_every, s.expect_every) == (2000, 1000)
    assert s.tick_interval == 0.5
    t0 = d.now
    s.tick(t0 + 1.0)
    assert s.data_to_send(t0 + 1.0) == b""
    s.receive_data(b"\n", t0 + 1.5)  # the client's heart-beat
    s.tick(t0 + 2.5)
    assert s.data_to_send(t0 + 2.5) == b"\n"  # ours, after 2 s of silence
    s.tick(t0 + 3.4)
    assert s.state is State.CONNECTED  # 1.9 s < 2 intervals of 1 s
    s.tick(t0 + 3.6)
    e = error_of(list(d._drain()) or d.received)
    assert e.headers["message"] == "heart-beat timeout"
    assert s.state is State.ERROR


@pytest.mark.parametrize(
    "version,header,expected",
    [("1.0", "100,100", (0, 0)), ("1.2", "0,0", (0, 0)), ("1.2", None, (0, 0)), ("1.2", "0,5000", (5000, 0))],
)
def test_heart_beats_off(drivers, version, header, expected):
    d = drivers(None)
    headers = {"accept-version": version, "login": "admin", "passcode": "secret"}
    if header:
        headers["heart-beat"] = header
    d.send("CONNECT", headers)
    assert (d.session.send_every, d.session.expect_every) == expected


def test_invalid_heart_beat(drivers):
    d = drivers(None)
    expect_error(
        d,
        d.send("CONNECT", {"accept-version": "1.2", "login": "admin", "passcode": "secret", "heart-beat": "fast"}),
        "invalid heart-beat",
    )


# --- SEND: conversion (processing sequence, inbound) ---------------------------------------


def test_send_without_content_length_is_a_text_message_with_defaults(drivers, jms):
    d = drivers()
    assert d.send("SEND", {"destination": "/queue/in", "receipt": "1"}, "héllo".encode())[0].command == RECEIPT
    msg = jms.create_consumer(Queue("in")).receive(2)
    assert isinstance(msg, TextMessage) and msg.text == "héllo"
    assert msg.delivery_mode == DeliveryMode.PERSISTENT and msg.priority == 4 and msg.expiration == 0
    assert msg.message_id.startswith("ID:") and msg.timestamp > 0


def test_send_with_content_length_is_a_bytes_message(drivers, jms):
    d = drivers()
    d.send("SEND", {"destination": "/queue/in", "content-length": "3"}, b"\x00\xff\x00")
    msg = jms.create_consumer(Queue("in")).receive(2)
    assert isinstance(msg, BytesMessage) and msg.get_body() == b"\x00\xff\x00"


def test_send_headers_become_jms_headers_and_string_properties(drivers, jms):
    d = drivers()
    d.send(
        "SEND",
        {
            "destination": "/topic/x",
            "persistent": "false",
            "priority": "7",
            "expires": "4102444800000",
            "correlation-id": "c-1",
            "type": "kind",
            "reply-to": "/queue/answers",
            "color": "blue",
            "JMSXGroupID": "g1",
            "content-type": "application/json",
            "message-id": "ignored",
        },
        b"{}",
    )
    consumer = jms.create_consumer(Topic("x"))
    d.send(
        "SEND",
        {
            "destination": "/topic/x",
            "persistent": "false",
            "priority": "7",
            "expires": "4102444800000",
            "correlation-id": "c-1",
            "type": "kind",
            "reply-to": "/queue/answers",
            "color": "blue",
            "JMSXGroupID": "g1",
            "content-type": "application/json",
        },
        b"{}",
    )
    msg = consumer.receive(2)
    assert msg.delivery_mode == DeliveryMode.NON_PERSISTENT and msg.priority == 7
    assert msg.expiration == 4102444800000 and msg.correlation_id == "c-1" and msg.type == "kind"
    assert msg.reply_to == Queue("answers")
    assert msg.get_string_property("color") == "blue" and msg.get_string_property("JMSXGroupID") == "g1"
    assert msg.get_string_property("JMS_STOMP_CONTENT_TYPE") == "application/json"


@pytest.mark.parametrize(
    "headers,message",
    [
        ({}, "missing destination"),
        ({"destination": ""}, "missing destination"),
        ({"destination": "queue/x"}, "invalid destination"),
        ({"destination": "/queue/"}, "invalid destination"),
        ({"destination": "/exchange/x"}, "invalid destination"),
        ({"destination": "/queue/x", "priority": "10"}, "invalid priority"),
        ({"destination": "/queue/x", "persistent": "yes"}, "invalid persistent"),
        ({"destination": "/queue/x", "expires": "soon"}, "invalid expires"),
        ({"destination": "/queue/x", "reply-to": "nowhere"}, "invalid reply-to"),
        ({"destination": "/queue/x", "transaction": "nope"}, "unknown transaction"),
    ],
)
def test_send_bad_input(drivers, broker, headers, message):
    d = drivers()
    expect_error(d, d.send("SEND", {"receipt": "r", **headers}, b"x"), message)
    assert broker.queue_depth("x") == 0


def test_text_body_must_be_utf8(drivers):
    d = drivers()
    expect_error(d, d.send("SEND", {"destination": "/queue/x"}, b"\xff\xfe"), "body is not UTF-8")


# --- MESSAGE: conversion (processing sequence, outbound) --------------------------------------


def test_message_frames_carry_every_header(drivers, jms):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/out", "id": "s", "ack": "client"})
    producer = jms.create_producer(Queue("out"))
    m = TextMessage("täxt")
    m.correlation_id, m.type, m.reply_to = "c", "t", Topic("back")
    m.set_int_property("n", 42)
    m.set_boolean_property("flag", True)
    producer.send(m, priority=6)
    b = BytesMessage(b"\x00\x01")
    producer.send(b, delivery_mode=DeliveryMode.NON_PERSISTENT)
    text, data = d.messages(2)
    h = text.headers
    assert text.body == "täxt".encode()
    assert h["subscription"] == "s" and h["destination"] == "/queue/out"
    assert h["message-id"] == m.message_id and h["content-length"] == str(len(text.body))
    assert h["priority"] == "6" and h["redelivered"] == "false" and h["expires"] == "0"
    assert h["persistent"] == "true" and int(h["timestamp"]) > 0
    assert h["correlation-id"] == "c" and h["type"] == "t" and h["reply-to"] == "/topic/back"
    assert h["n"] == "42" and h["flag"] == "true"
    assert h["ack"] == "1"  # 1.2, not auto
    assert data.body == b"\x00\x01" and data.headers["persistent"] == "false"


def test_a_map_message_closes_the_connection_and_stays_queued(drivers, jms, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/maps"})
    jms.create_producer(Queue("maps")).send(MapMessage({"a": 1}))
    frames = []
    for _ in range(40):
        frames += d.pump(0.05)
        if d.session.closed:
            break
    expect_error(d, frames, "message not deliverable")
    assert pending(broker, "maps") == 1


class Upper(MessageTransformer):
    """Test transformer: text to upper case both ways; maps become text; collects headers."""

    seen: ClassVar[list[dict]] = []

    def transform(self, message, read_only, charset_name, source, target, properties):
        Upper.seen.append(
            {
                "read_only": read_only,
                "charset": charset_name,
                "source": source,
                "target": target,
                "properties": dict(properties) if properties else None,
            }
        )
        if isinstance(message, MapMessage):
            out = self.create_message("TEXT")
            out.text = repr(sorted(message.get_body().items()))
            return out
        if isinstance(message, TextMessage):
            out = self.create_message("TEXT")
            out.text = message.text.upper()
            return out
        return message


def test_message_transformer_hook_both_ways(drivers, jms):
    Upper.seen = []
    d = drivers(config=SessionConfig(transformer=Upper))
    d.send("SUBSCRIBE", {"destination": "/queue/tr"})
    d.send("SEND", {"destination": "/queue/tr", "bad-name": "v", "ok": "1"}, b"abc")
    assert d.messages(1)[0].body == b"ABC"
    inbound, outbound = Upper.seen[0], Upper.seen[1]
    assert inbound == {
        "read_only": False,
        "charset": "UTF-8",
        "source": "STOMP",
        "target": "SUN_MQ",
        "properties": {"bad-name": "v"},
    }
    assert outbound == {"read_only": True, "charset": None, "source": "SUN_MQ", "target": "STOMP", "properties": None}
    jms.create_producer(Queue("tr")).send(MapMessage({"k": 1}))  # deliverable once transformed
    assert d.messages(1)[0].body == b"[('k', 1)]"


class Fresh(MessageTransformer):
    """Test transformer: outbound, a new message that sets only its body, a property and
    (when the text says so) its own correlation id."""

    def transform(self, message, read_only, charset_name, source, target, properties):
        if source == "STOMP":
            return message
        out = self.create_message("TEXT")
        out.text = message.text.upper()
        out.set_string_property("fresh", "yes")
        if message.text == "own":
            out.correlation_id = "from-transformer"
        return out


def test_a_new_message_from_the_transformer_keeps_the_deliverys_headers(drivers, jms, broker):
    d = drivers("1.0", config=SessionConfig(transformer=Fresh))
    d.send("SUBSCRIBE", {"destination": "/queue/fresh", "ack": "client"})
    producer = jms.create_producer(Queue("fresh"))
    sent = TextMessage("abc")
    sent.correlation_id, sent.type, sent.reply_to = "c1", "kind", Queue("replies")
    sent.set_string_property("lost", "x")  # the transformer's message has its own properties
    producer.send(sent, priority=7)
    frame = d.messages(1)[0]
    h = frame.headers
    assert frame.body == b"ABC" and h["fresh"] == "yes" and "lost" not in h
    assert (h["destination"], h["message-id"], h["timestamp"], h["priority"]) == (
        "/queue/fresh",
        sent.message_id,
        str(sent.timestamp),
        "7",
    )
    assert (h["correlation-id"], h["type"], h["reply-to"]) == ("c1", "kind", "/queue/replies")
    own = TextMessage("own")
    producer.send(own)
    assert d.messages(1)[0].headers["correlation-id"] == "from-transformer"
    assert d.send("ACK", {"message-id": own.message_id}) == []  # client ack: covers both
    assert pending(broker, "fresh") == 0


# --- SUBSCRIBE, UNSUBSCRIBE, ack modes ---------------------------------------------------------


def test_subscribe_without_id_gets_the_default_id(drivers):
    d = drivers("1.0")
    d.send("SUBSCRIBE", {"destination": "/queue/q"})
    d.send("SEND", {"destination": "/queue/q"}, b"x")
    assert d.messages(1)[0].headers["subscription"] == "/subscription-to//queue/q"


@pytest.mark.parametrize(
    "headers,message",
    [
        ({"destination": "/queue/q", "ack": "sometimes"}, "invalid ack"),
        ({"destination": "/queue/q", "selector": "a = "}, "subscribe failed"),
        ({"destination": "/queue/q", "transaction": "t9"}, "unknown transaction"),
        ({"destination": "/queue/q", "durable-subscriber-name": "d"}, "invalid durable subscription"),
        ({"destination": "/topic/t", "durable-subscriber-name": "d"}, "no client-id"),
        ({"destination": "/temp-queue/temporary_destination://queue/gone"}, "subscribe failed"),
    ],
)
def test_subscribe_bad_input(drivers, headers, message):
    d = drivers()
    expect_error(d, d.send("SUBSCRIBE", headers), message)


def test_subscription_ids_are_unique_per_connection(drivers):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/a", "id": "x"})
    expect_error(d, d.send("SUBSCRIBE", {"destination": "/queue/b", "id": "x"}), "duplicate subscription")


def test_selector(drivers):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/sel", "id": "1", "selector": "color = 'red'"})
    d.send("SEND", {"destination": "/queue/sel", "color": "blue"}, b"b")
    d.send("SEND", {"destination": "/queue/sel", "color": "red"}, b"r")
    assert [m.body for m in d.messages(1)] == [b"r"]
    assert d.pump(0.1) == []


def test_ack_auto_consumes_on_delivery(drivers, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/auto", "id": "1"})
    for i in range(5):
        d.send("SEND", {"destination": "/queue/auto"}, b"%d" % i)
    msgs = d.messages(5)
    assert "ack" not in msgs[0].headers
    assert pending(broker, "auto") == 0
    expect_error(d, d.send("ACK", {"id": "1"}), "unknown message")


def send_n(d, queue, n):
    for i in range(n):
        d.send("SEND", {"destination": f"/queue/{queue}"}, b"m%d" % i)


def test_ack_client_is_cumulative_and_the_rest_return_on_close(drivers, broker):
    d = drivers("1.1")
    d.send("SUBSCRIBE", {"destination": "/queue/cum", "id": "1", "ack": "client"})
    send_n(d, "cum", 5)
    msgs = d.messages(5)
    d.send("ACK", {"subscription": "1", "message-id": msgs[2].headers["message-id"]})
    assert pending(broker, "cum") == 2
    d.close()
    other = drivers("1.1")
    other.send("SUBSCRIBE", {"destination": "/queue/cum", "id": "1"})
    again = other.messages(2)
    assert [m.body for m in again] == [b"m3", b"m4"]
    assert all(m.headers["redelivered"] == "true" for m in again)


def test_ack_client_individual_acks_one(drivers, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/ind", "id": "1", "ack": "client-individual"})
    send_n(d, "ind", 3)
    msgs = d.messages(3)
    d.send("ACK", {"id": msgs[1].headers["ack"]})
    assert pending(broker, "ind") == 2
    d.send("ACK", {"id": msgs[0].headers["ack"]})
    d.send("ACK", {"id": msgs[2].headers["ack"], "receipt": "done"})
    assert d.received[-1].headers == {"receipt-id": "done"}
    assert pending(broker, "ind") == 0


def test_nack_returns_the_message(drivers, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/nack", "id": "1", "ack": "client-individual"})
    send_n(d, "nack", 2)
    first, second = d.messages(2)
    d.send("NACK", {"id": first.headers["ack"]})
    again = d.messages(1)[0]
    assert again.body == first.body and again.headers["redelivered"] == "true"
    assert again.headers["message-id"] == first.headers["message-id"]
    d.send("ACK", {"id": again.headers["ack"]})
    d.send("ACK", {"id": second.headers["ack"]})
    assert pending(broker, "nack") == 0


def test_nack_client_mode_is_cumulative(drivers, broker):
    d = drivers("1.1")
    d.send("SUBSCRIBE", {"destination": "/queue/nc", "id": "1", "ack": "client"})
    send_n(d, "nc", 3)
    msgs = d.messages(3)
    d.send("NACK", {"subscription": "1", "message-id": msgs[1].headers["message-id"]})
    assert sorted(m.body for m in d.messages(2)) == [b"m0", b"m1"]


def test_nack_needs_1_1(drivers):
    d = drivers("1.0")
    expect_error(d, d.send("NACK", {"message-id": "x"}), "unexpected NACK")


def test_ack_1_0_without_subscription_finds_the_default_id_subscription(drivers, broker):
    d = drivers("1.0")
    d.send("SUBSCRIBE", {"destination": "/queue/ten", "ack": "client"})
    send_n(d, "ten", 1)
    msg = d.messages(1)[0]
    d.send("ACK", {"message-id": msg.headers["message-id"], "receipt": "r"})
    assert d.received[-1].command == RECEIPT
    assert pending(broker, "ten") == 0


@pytest.mark.parametrize(
    "version,headers,message",
    [
        ("1.1", {"subscription": "nope", "message-id": "ID:x"}, "unknown subscription"),
        ("1.1", {"subscription": "1", "message-id": "ID:x"}, "unknown message"),
        ("1.1", {"subscription": "1"}, "missing message-id"),
        ("1.2", {"id": "999"}, "unknown message"),
        ("1.2", {"id": "abc"}, "unknown message"),
        ("1.2", {}, "missing id"),
    ],
)
def test_ack_bad_input(drivers, version, headers, message):
    d = drivers(version)
    d.send("SUBSCRIBE", {"destination": "/queue/bad", "id": "1", "ack": "client"})
    expect_error(d, d.send("ACK", headers), message)


def test_ack_with_transaction_on_a_plain_subscription_is_an_error(drivers):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/p", "id": "1", "ack": "client"})
    send_n(d, "p", 1)
    msg = d.messages(1)[0]
    d.send("BEGIN", {"transaction": "t"})
    expect_error(d, d.send("ACK", {"id": msg.headers["ack"], "transaction": "t"}), "not a transacted subscription")


def test_unsubscribe(drivers, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/u", "id": "1", "ack": "client"})
    send_n(d, "u", 2)
    d.messages(2)
    d.send("UNSUBSCRIBE", {"id": "1", "receipt": "r"})
    assert d.received[-1].command == RECEIPT
    assert pending(broker, "u") == 2 and broker.queue_depth("u") == 2  # unacked went back
    expect_error(d, d.send("UNSUBSCRIBE", {"id": "1"}), "unknown subscription")


def test_unsubscribe_1_0_by_destination(drivers):
    d = drivers("1.0")
    d.send("SUBSCRIBE", {"destination": "/queue/u10"})
    d.send("UNSUBSCRIBE", {"destination": "/queue/u10", "receipt": "r"})
    assert d.received[-1].command == RECEIPT


def test_durable_subscriptions(drivers, broker):
    d = drivers(**{"client-id": "c1"})
    d.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "durable-subscriber-name": "dur"})
    d.close()
    pub = drivers()
    pub.send("SEND", {"destination": "/topic/news", "receipt": "r"}, b"while away")
    back = drivers(**{"client-id": "c1"})
    back.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "durable-subscriber-name": "dur"})
    assert back.messages(1)[0].body == b"while away"
    # UNSUBSCRIBE closes the active subscriber first, then deletes the subscription
    back.send("UNSUBSCRIBE", {"durable-subscriber-name": "dur", "id": "ignored", "receipt": "u"})
    assert back.received[-1].headers == {"receipt-id": "u"}
    assert back.session.subscriptions == {}
    assert not any(k.startswith("durable:c1") for k in broker.destinations())
    expect_error(back, back.send("UNSUBSCRIBE", {"durable-subscriber-name": "dur"}), "unsubscribe failed")


def test_durable_unsubscribe_needs_a_client_id(drivers):
    d = drivers()
    expect_error(d, d.send("UNSUBSCRIBE", {"durable-subscriber-name": "x"}), "no client-id")


def test_client_id_in_use(drivers):
    drivers(**{"client-id": "same"})
    d = drivers(None)
    expect_error(
        d,
        d.send("CONNECT", {"accept-version": "1.2", "login": "admin", "passcode": "secret", "client-id": "same"}),
        "connect failed",
    )


# --- transactions ----------------------------------------------------------------------------


def test_transactional_sends(drivers, broker):
    d = drivers()
    d.send("BEGIN", {"transaction": "t1"})
    d.send("SEND", {"destination": "/queue/tx", "transaction": "t1"}, b"a")
    d.send("SEND", {"destination": "/queue/tx", "transaction": "t1"}, b"b")
    assert broker.queue_depth("tx") == 0
    d.send("COMMIT", {"transaction": "t1", "receipt": "c"})
    assert d.received[-1].headers == {"receipt-id": "c"}
    assert broker.queue_depth("tx") == 2
    d.send("BEGIN", {"transaction": "t2"})
    d.send("SEND", {"destination": "/queue/tx", "transaction": "t2"}, b"c")
    d.send("ABORT", {"transaction": "t2"})
    assert broker.queue_depth("tx") == 2


@pytest.mark.parametrize(
    "frames,message",
    [
        ([("BEGIN", {"transaction": "a"}), ("BEGIN", {"transaction": "b"})], "nested transaction"),
        ([("BEGIN", {"transaction": "a"}), ("BEGIN", {"transaction": "a"})], "nested transaction"),
        ([("COMMIT", {"transaction": "a"})], "unknown transaction"),
        ([("BEGIN", {"transaction": "a"}), ("ABORT", {"transaction": "b"})], "unknown transaction"),
        ([("ABORT", {})], "missing transaction"),
    ],
)
def test_transaction_bad_input(drivers, frames, message):
    d = drivers()
    out = []
    for command, headers in frames:
        out = d.send(command, headers)
    expect_error(d, out, message)


@pytest.mark.slow
def test_transacted_subscription(drivers, broker):
    d = drivers("1.1")
    send_n(d, "ts", 4)
    d.send("BEGIN", {"transaction": "t1"})
    d.send("SUBSCRIBE", {"destination": "/queue/ts", "id": "1", "transaction": "t1"})
    msgs = d.messages(4)
    # ACK without transaction header joins the open transaction; cumulative
    d.send("ACK", {"subscription": "1", "message-id": msgs[1].headers["message-id"]})
    assert pending(broker, "ts") == 4  # consumed only at COMMIT
    d.send("COMMIT", {"transaction": "t1"})
    assert pending(broker, "ts") == 2
    # delivery pauses until the next BEGIN
    send_n(d, "ts", 1)
    assert d.pump(0.2) == []
    expect_error(d, d.send("ACK", {"subscription": "1", "message-id": msgs[2].headers["message-id"]}), "no transaction")


@pytest.mark.slow
def test_abort_restarts_delivery_of_unconsumed_messages_at_the_next_begin(drivers, broker):
    d = drivers("1.2")
    send_n(d, "ab", 3)
    d.send("BEGIN", {"transaction": "t1"})
    d.send("SUBSCRIBE", {"destination": "/queue/ab", "id": "1", "transaction": "t1"})
    msgs = d.messages(3)
    d.send("ACK", {"id": msgs[0].headers["ack"], "transaction": "t1"})
    d.send("ABORT", {"transaction": "t1"})
    assert d.pump(0.2) == []  # stopped
    assert pending(broker, "ab") == 3
    d.send("BEGIN", {"transaction": "t2"})
    again = d.messages(3)
    assert [m.body for m in again] == [b"m0", b"m1", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    d.send("ACK", {"id": again[2].headers["ack"]})
    d.send("COMMIT", {"transaction": "t2"})
    assert pending(broker, "ab") == 0


def test_disconnect_rolls_back_an_open_transaction(drivers, broker):
    d = drivers()
    send_n(d, "dr", 1)
    d.send("BEGIN", {"transaction": "t"})
    d.send("SUBSCRIBE", {"destination": "/queue/dr", "id": "1", "transaction": "t"})
    msg = d.messages(1)[0]
    d.send("ACK", {"id": msg.headers["ack"]})
    d.send("SEND", {"destination": "/queue/dr2", "transaction": "t"}, b"x")
    d.send("DISCONNECT", {"receipt": "bye"})
    assert d.received[-1].headers == {"receipt-id": "bye"}
    assert d.session.state is State.CLOSED
    assert broker.queue_depth("dr") == 1 and broker.queue_depth("dr2") == 0


# --- flow control -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_consumer_flow_limit_bounds_unacknowledged_deliveries(drivers, ack):
    d = drivers(config=SessionConfig(consumer_flow_limit=3))
    d.send("SUBSCRIBE", {"destination": "/queue/flow", "id": "1", "ack": ack})
    send_n(d, "flow", 10)
    first = d.messages(3)
    assert d.pump(0.2) == []
    d.send("ACK", {"id": first[0].headers["ack"]})
    assert len(d.messages(1)) == 1
    assert d.pump(0.2) == []


@pytest.mark.slow
def test_consumer_flow_limit_on_transacted_subscriptions_frees_at_commit(drivers):
    d = drivers(config=SessionConfig(consumer_flow_limit=2))
    send_n(d, "tflow", 5)
    d.send("BEGIN", {"transaction": "t"})
    d.send("SUBSCRIBE", {"destination": "/queue/tflow", "id": "1", "transaction": "t"})
    msgs = d.messages(2)
    d.send("ACK", {"id": msgs[1].headers["ack"]})
    assert d.pump(0.2) == []  # acked but not committed: still counted
    d.send("COMMIT", {"transaction": "t"})
    d.send("BEGIN", {"transaction": "t2"})
    assert len(d.messages(2)) == 2


# --- temporary destinations and reply-to ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_request_reply_through_temporary_destinations(drivers, kind):
    requester, server = drivers(), drivers()
    server.send("SUBSCRIBE", {"destination": "/queue/requests", "id": "1"})
    requester.send("SUBSCRIBE", {"destination": f"/temp-{kind}/mine", "id": "r"})
    requester.send("SEND", {"destination": "/queue/requests", "reply-to": f"/temp-{kind}/mine"}, b"ping")
    request = server.messages(1)[0]
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith(f"/temp-{kind}/temporary_destination://{kind}/")
    server.send("SEND", {"destination": reply_to}, b"pong")
    answer = requester.messages(1)[0]
    assert answer.body == b"pong" and answer.headers["destination"] == f"/temp-{kind}/mine"
    # the same session may use the reserved form too
    requester.send("SEND", {"destination": reply_to}, b"self")
    assert requester.messages(1)[0].body == b"self"


def test_temporary_destinations_die_with_their_connection(drivers):
    a, b = drivers(), drivers()
    a.send("SUBSCRIBE", {"destination": "/temp-queue/t", "id": "1"})
    a.send("SEND", {"destination": "/queue/who", "reply-to": "/temp-queue/t"}, b"x")
    b.send("SUBSCRIBE", {"destination": "/queue/who", "id": "1"})
    reply_to = b.messages(1)[0].headers["reply-to"]
    a.close()
    expect_error(b, b.send("SEND", {"destination": reply_to}, b"late"), "send failed")


# --- limits and durability --------------------------------------------------------------------------


def test_oversize_frame(drivers, broker):
    d = drivers(config=SessionConfig(limits=Limits(max_frame_size=1000)))
    expect_error(d, d.send("SEND", {"destination": "/queue/big"}, b"x" * 2000), "frame too large")
    assert broker.queue_depth("big") == 0


def test_receipts_wait_for_the_store_when_it_syncs(tmp_path):
    broker = Broker(tmp_path / "sync", sync=True)
    try:
        d = Driver(broker)
        d.connect()
        d.session.receive_data(b"SEND\ndestination:/queue/s\nreceipt:r\n\nx\0", d.now)
        call = d.session.take_call()
        assert call is not None and d.session.data_to_send(d.now) == b""  # no receipt yet
        call.fn()  # the durable wait
        d.session.complete_call(None)
        assert b"RECEIPT" in d.session.data_to_send(d.now)
        d.close()
    finally:
        broker.close()


def test_connection_loss_returns_unacknowledged_messages(drivers, broker):
    d = drivers()
    d.send("SUBSCRIBE", {"destination": "/queue/loss", "id": "1", "ack": "client-individual"})
    send_n(d, "loss", 3)
    d.messages(3)
    d.close()
    assert broker.queue_depth("loss") == 3


def test_a_jms_client_and_a_stomp_client_share_a_queue(drivers, jms):
    d = drivers()
    consumer = jms.create_consumer(Queue("shared"))
    d.send("SEND", {"destination": "/queue/shared", "content-length": "2"}, b"ok")
    assert consumer.receive(2).get_body() == b"ok"
    jms.create_producer(Queue("shared2")).send(TextMessage("back"))
    d.send("SUBSCRIBE", {"destination": "/queue/shared2"})
    assert d.messages(1)[0].body == b"back"
    assert jms.ack_mode is AckMode.AUTO_ACKNOWLEDGE


@pytest.mark.slow
def test_no_message_is_written_after_disconnect(tmp_path):
    """A client need not wait for DISCONNECT's receipt (stomp.py's disconnect() does not):
    a message that arrives while the receipt waits for the store stays queued instead of
    being written, and with ack:auto consumed, after the client has gone."""
    broker = Broker(tmp_path / "sync", sync=True)
    try:
        d = Driver(broker)
        d.connect()
        d.send("SUBSCRIBE", {"destination": "/queue/bye", "id": "1", "ack": "auto"})
        d.send("SEND", {"destination": "/queue/other", "receipt": "r"}, b"x")
        d.session.receive_data(b"DISCONNECT\nreceipt:bye\n\n\0", d.now)
        call = d.session.take_call()
        assert call is not None  # the receipt waits for the store
        jms = EmbeddedConnectionFactory(broker).create_connection().create_session()
        jms.create_producer(Queue("bye")).send(TextMessage("late"))
        d.pump(0.3)  # whatever a subscriber posts now
        call.fn()
        d.session.complete_call(None)
        d.pump(0.1)
        assert [f.command for f in d.received[-1:]] == [RECEIPT]
        assert not [f for f in d.received if f.body == b"late"]
        assert d.session.state is State.CLOSED
        assert broker.queue_depth("bye") == 1
        d.close()
    finally:
        broker.close()


class Counting(MessageTransformer):
    """Test transformer: counts the SENDs it converts (inbound), passes every message on."""

    inbound: ClassVar[int] = 0

    def transform(self, message, read_only, charset_name, source, target, properties):
        if target == "SUN_MQ":
            Counting.inbound += 1
        return message


def test_a_send_the_broker_holds_is_converted_once(drivers, jms, broker):
    """A SEND held by a full FLOW_CONTROL queue is sent again once there is room: its
    message as converted the first time (the transformer sees each SEND once), in order,
    and its RECEIPT follows."""
    broker.configure_destination(
        Queue("held"), DestinationLimits(max_num_msgs=1, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )
    Counting.inbound = 0
    d = drivers(config=SessionConfig(transformer=Counting))
    consumer = jms.create_consumer(Queue("held"))
    taken: list[str] = []
    room = threading.Timer(0.3, lambda: taken.append(consumer.receive(5).text))  # frees the room
    room.start()
    d.send("SEND", {"destination": "/queue/held"}, b"one")
    frames = d.send("SEND", {"destination": "/queue/held", "receipt": "r2"}, b"two")  # held until then
    room.join()
    assert [f.headers.get("receipt-id") for f in frames if f.command == RECEIPT] == ["r2"]
    assert taken == ["one"] and consumer.receive(5).text == "two"
    assert Counting.inbound == 2
