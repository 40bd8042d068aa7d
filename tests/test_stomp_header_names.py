"""SEND headers whose names are no JMS property names (x-request-id, anchor-seq), without
sockets: the reversible encoding (property-based), and imq.bridge.stomp.invalidHeaderNames
encode / drop / error in the session on a real embedded broker."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import Queue
from bridgemgr.jms.message import is_valid_property_name
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.stompbridge.convert import ENCODED_PREFIX, header_to_property, property_to_header
from bridgemgr.stompbridge.frames import ERROR, RECEIPT
from bridgemgr.stompbridge.session import SessionConfig, State
from bridgemgr.transform import MessageTransformer
from stomp_support import Driver

# any header name a STOMP frame can carry: no NUL, not empty (the codec refuses both)
names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(names)
def test_the_encoding_is_reversible_and_a_valid_property_name(header):
    encoded = header_to_property(header)
    assert property_to_header(encoded) == header
    assert is_valid_property_name(encoded)  # a Java identifier, no selector keyword
    assert not encoded.startswith("JMS")  # neither the JMS nor the JMSX reserved prefix


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(names)
def test_no_legitimate_name_is_taken_for_an_encoding(name):
    """A name outside the reserved prefix comes back as itself; one inside it that is not
    the encoding of some header (a JMS client's own spelling) does too."""
    if not name.startswith(ENCODED_PREFIX):
        assert property_to_header(name) == name
    spelled = ENCODED_PREFIX + name
    decoded = property_to_header(spelled)
    assert decoded == spelled or header_to_property(decoded) == spelled


def test_encoded_names_read_like_the_header():
    assert header_to_property("x-request-id") == "stomp$x$2Drequest$2Did"
    assert header_to_property("anchor-seq") == "stomp$anchor$2Dseq"
    assert header_to_property("stomp$x") == "stomp$stomp$24x"  # the prefix itself is escaped
    assert header_to_property("n\u00e4me\u20ac\U0001f600") == "stomp$n$E4me$u20AC$U01F600"
    assert property_to_header("stomp$x$2d") == "stomp$x$2d"  # lower-case hex: not ours


# --- the session ---------------------------------------------------------------------------


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

    def make(mode: str | None = None, **config: Any) -> Driver:
        if mode is not None:
            config["invalid_header_names"] = mode
        d = Driver(broker, SessionConfig(**config), name=f"s{len(made) + 1}")
        made.append(d)
        d.connect("1.2")
        return d

    yield make
    for d in made:
        d.close()


HEADERS = {"x-request-id": "r-1", "anchor-seq": "7", "color": "blue", "stomp$own": "kept"}


def test_encode_is_the_default_jms_sees_valid_names_stomp_the_original(drivers, jms):
    sender, receiver = drivers(), drivers()
    receiver.send("SUBSCRIBE", {"destination": "/queue/enc", "id": "s"})
    frames = sender.send("SEND", {"destination": "/queue/enc", "receipt": "r", **HEADERS}, b"one")
    assert [f.command for f in frames] == [RECEIPT]
    got = receiver.messages(1)[0].headers
    assert {k: got[k] for k in HEADERS} == HEADERS
    receiver.close()

    sender.send("SEND", {"destination": "/queue/enc", "receipt": "r2", **HEADERS}, b"two")
    msg = jms.create_consumer(Queue("enc")).receive(2)
    assert msg is not None
    assert msg.get_string_property("stomp$x$2Drequest$2Did") == "r-1"
    assert msg.get_string_property("stomp$anchor$2Dseq") == "7"
    assert msg.get_string_property("stomp$stomp$24own") == "kept"
    assert msg.get_string_property("color") == "blue"
    assert all(is_valid_property_name(n) for n in msg.property_names)


def test_drop_leaves_them_out_and_logs_once_per_connection(drivers, jms, caplog):
    sender = drivers("drop")
    consumer = jms.create_consumer(Queue("drop"))
    with caplog.at_level(logging.WARNING, logger="bridgemgr.stompbridge.session"):
        for n in range(3):
            frames = sender.send("SEND", {"destination": "/queue/drop", "receipt": f"r{n}", **HEADERS}, b"x")
            assert [f.command for f in frames] == [RECEIPT]
    warnings = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
    assert len(warnings) == 1 and "'x-request-id'" in warnings[0], warnings
    msg = consumer.receive(2)
    assert msg is not None and sorted(msg.property_names) == ["color", "stomp$own"]


def test_error_is_the_chapters_rule(drivers, broker):
    sender = drivers("error")
    frames = sender.send("SEND", {"destination": "/queue/err", "receipt": "r", "x-request-id": "1"}, b"x")
    error = next(f for f in frames if f.command == ERROR)
    assert error.headers["message"] == "invalid header name" and error.headers["receipt-id"] == "r"
    assert b"'x-request-id'" in error.body and b"invalidHeaderNames" in error.body
    assert sender.session.state is State.ERROR and broker.queue_depth("err") == 0


class Keeps(MessageTransformer):
    seen: ClassVar[list[dict[str, str] | None]] = []

    def transform(self, message, read_only, charset, source, target, properties):
        Keeps.seen.append(dict(properties) if properties is not None else None)
        return message


@pytest.mark.parametrize("mode", ["encode", "drop", "error"])
def test_a_transformer_gets_them_in_properties_whatever_the_mode(drivers, jms, mode):
    Keeps.seen.clear()
    sender = drivers(mode, transformer=Keeps)
    frames = sender.send("SEND", {"destination": "/queue/tx" + mode, "receipt": "r", **HEADERS}, b"x")
    assert [f.command for f in frames] == [RECEIPT]
    assert Keeps.seen == [{"x-request-id": "r-1", "anchor-seq": "7"}]
    msg = jms.create_consumer(Queue("tx" + mode)).receive(2)
    assert msg is not None
    assert (msg.get_string_property("stomp$x$2Drequest$2Did") == "r-1") == (mode == "encode")
