"""The jms service's wire protocol without sockets: frames, the handshake rules, limits,
and what garbage does to a reader (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import Queue, TextMessage, Topic, codec, xa
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidSelectorError,
    JMSException,
    JMSSecurityException,
    StoreUnavailable,
    TransactionRolledBackException,
    TransportException,
    XAException,
)
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import wire
from bridgemgr.providers.embedded.wire import Op, ProtocolError, Role, Wire

HELLO = wire.request(1, Op.HELLO, "user", "pw", 30000, "test")


def server(opened=True) -> Wire:
    w = Wire(Role.SERVER)
    w.receive_data(wire.PREAMBLE + HELLO)
    assert w.next_event().op is Op.HELLO
    if opened:
        w.open()
    return w


def client(opened=True) -> Wire:
    w = Wire(Role.CLIENT)
    w.receive_data(wire.PREAMBLE + wire.reply(1, {"rm_id": "x"}))
    assert isinstance(w.next_event(), wire.Reply)
    if opened:
        w.open()
    return w


def events(w: Wire) -> list:
    out = []
    while (e := w.next_event()) is not None:
        out.append(e)
    return out


def test_every_request_round_trips_with_checked_arguments():
    w = server()
    x = Xid(0x1234, b"gtrid", b"bq")
    message = TextMessage("hi")
    message.destination = Queue("q")
    blob = codec.encode(message)
    w.receive_data(
        wire.request(2, Op.CONSUMER, 1, 2, Topic("t"), "a > 1", False, "sub", 100)
        + wire.send_request(3, 1, blob)
        + wire.consumed_request(1, 2, [5, 6, 2**63])
        + wire.request(4, Op.XA_START, 1, x, xa.TMJOIN)
        + wire.request(0, Op.RETURN, 1, 2, [7], True)
        + wire.HEARTBEAT
    )
    got = events(w)
    assert got[0] == wire.Request(2, Op.CONSUMER, (1, 2, Topic("t"), "a > 1", False, "sub", 100))
    assert got[1] == wire.Request(3, Op.SEND, (1, blob))
    assert got[2] == wire.Request(0, Op.CONSUMED, (1, 2, [5, 6, 2**63]))
    assert got[3] == wire.Request(4, Op.XA_START, (1, x, xa.TMJOIN))
    assert got[4] == wire.Request(0, Op.RETURN, (1, 2, [7], True))
    assert got[5] == wire.Heartbeat()
    assert codec.decode(got[1].args[1]).text == "hi"


def test_every_op_has_an_argument_row():
    assert set(wire.ARGS) | {Op.SEND, Op.CONSUMED} == set(Op)


def test_answers_round_trip_on_the_client():
    w = client()
    w.receive_data(
        wire.reply(9, [1, b"x", None])
        + wire.failure(10, XAException("nota", xa.XAER_NOTA))
        + wire.failure(0, IllegalStateException("async"), session=4)
        + wire.failure(0, JMSSecurityException("no"), fatal=True)
        + wire.delivery(3, 17, 2, b"blob")
    )
    reply, xa_failure, async_failure, fatal, delivery = events(w)
    assert reply == wire.Reply(9, [1, b"x", None])
    assert isinstance(xa_failure.error, XAException) and xa_failure.error.errorcode == xa.XAER_NOTA
    assert type(async_failure.error) is IllegalStateException and async_failure.session == 4
    assert not async_failure.fatal
    assert type(fatal.error) is JMSSecurityException and fatal.fatal
    assert delivery == wire.Delivery(3, 17, 2, b"blob")


def test_an_error_code_maps_back_to_its_class_without_its_extra_arguments():
    exc = wire.error_from_value({"code": InvalidSelectorError.code, "message": "bad at 3"})
    assert type(exc) is InvalidSelectorError and str(exc) == "bad at 3"
    assert type(wire.error_from_value({"code": "NO-SUCH-CODE", "message": "m"})) is JMSException
    with pytest.raises(ProtocolError):
        wire.error_from_value({"message": "no code"})


def test_an_errors_causes_cross_the_wire():
    """A commit the store rolled back because its database could not be reached says so
    to a remote client too (before, only the outermost error crossed: a rollback of no
    known cause, which a link counted toward its backout threshold)."""
    store = StoreUnavailable("store unavailable: its database cannot be reached")
    branch = XAException("commit: branch rolled back", xa.XA_RBROLLBACK)
    branch.__cause__ = store
    exc = TransactionRolledBackException("the transaction was rolled back")
    exc.__cause__ = branch
    w = client()
    w.receive_data(wire.failure(5, exc) + wire.failure(6, IllegalStateException("alone")))
    failed, alone = events(w)
    got = failed.error
    assert type(got) is TransactionRolledBackException and str(got) == str(exc)
    assert type(got.__cause__) is XAException and got.__cause__.errorcode == xa.XA_RBROLLBACK
    assert type(got.__cause__.__cause__) is StoreUnavailable
    assert str(got.__cause__.__cause__) == str(store) and got.__cause__.__cause__.__cause__ is None
    assert alone.error.__cause__ is None


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [JMSException, StoreUnavailable, TransportException, TransactionRolledBackException, XAException]
            ),
            st.text(max_size=8),
            st.integers(-10, 110),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_up_to_max_causes_cross_the_wire_by_class_message_and_xa_code(chain):
    errors = [cls(text, code) if cls is XAException else cls(text) for cls, text, code in chain]
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    w = client()
    w.receive_data(wire.failure(1, errors[0]))
    got = events(w)[0].error
    for sent in errors[: wire.MAX_CAUSES + 1]:
        assert (type(got), str(got), getattr(got, "errorcode", None)) == (
            type(sent),
            str(sent),
            getattr(sent, "errorcode", None),
        )
        got = got.__cause__
    assert got is None


@pytest.mark.parametrize(
    "causes",
    [
        "x",
        [1],
        [{"message": "no code"}],
        [{"code": "X", "message": "m", "xa": "7"}],
        [{"code": "X", "message": "m"}] * (wire.MAX_CAUSES + 1),
    ],
)
def test_causes_that_are_not_the_protocol_are_refused(causes):
    with pytest.raises(ProtocolError):
        wire.error_from_value({"code": "X", "message": "m", "causes": causes})


@pytest.mark.parametrize(
    "data, match",
    [
        (b"GET / HTTP/1.1\r\n", "does not speak the imqbridge jms protocol"),
        (b"IMQJ\x09", r"protocol version 9 is not supported \(this server speaks \[1\]\)"),
        (wire.PREAMBLE + wire.request(1, Op.START), "only one HELLO .* not START"),
        (wire.PREAMBLE + HELLO + HELLO, "only one HELLO"),
        (wire.PREAMBLE + wire.reply(1, None), "a REPLY frame is not allowed in state HANDSHAKE"),
        (wire.PREAMBLE + b"\x00\x01\x00\x01", "size 65537 is outside 5..65536"),
        (wire.PREAMBLE + b"\x00\x00\x00\x05\x09\x00\x00\x00\x00", "unknown frame kind 9"),
        (wire.PREAMBLE + b"\x00\x00\x00\x02", "size 2 is outside"),
        (wire.PREAMBLE + b"\x00\x00\x00\x06\x01\x00\x00\x00\x01\xee", "unknown op 238"),
        (
            wire.PREAMBLE + wire.request(1, Op.HELLO, "u", "p", True, "bool is not an int"),
            "HELLO argument 3: bool is the wrong type",
        ),
        (wire.PREAMBLE + wire.request(1, Op.HELLO, "u"), "HELLO takes 5 arguments"),
        (wire.PREAMBLE + b"\x00\x00\x00\x08\x01\x00\x00\x00\x01\x01IM", "undecodable arguments"),
    ],
)
def test_a_server_refuses_what_is_not_the_protocol(data, match):
    w = Wire(Role.SERVER)
    w.receive_data(data)
    with pytest.raises(ProtocolError, match=match):
        events(w)
    assert w.state is wire.State.ERROR
    with pytest.raises(ProtocolError, match="already failed"):
        w.next_event()


@pytest.mark.parametrize(
    "frame, match",
    [
        (HELLO, "HELLO after the handshake"),
        (wire.delivery(1, 1, 1, b""), "a DELIVER frame is not allowed"),
        (wire.request(3, Op.XA_PREPARE, [1, b"", b""]), "XA_PREPARE argument 1: not an Xid"),
        (wire.request(3, Op.RETURN, 1, 2, ["x"], True), "not a list of integers"),
        (wire.request(3, Op.SESSION, 1, True, 1, "no"), "SESSION argument 4"),
        (b"\x00\x00\x00\x09\x01\x00\x00\x00\x00" + bytes([Op.CONSUMED]) + b"\x00\x00\x00", "malformed CONSUMED"),
        (b"\x00\x00\x00\x07\x01\x00\x00\x00\x00" + bytes([Op.SEND]) + b"\x00", "truncated SEND"),
    ],
)
def test_an_open_server_refuses_bad_frames(frame, match):
    w = server()
    w.receive_data(frame)
    with pytest.raises(ProtocolError, match=match):
        events(w)


def test_the_frame_limit_is_checked_on_the_header_before_the_body_arrives():
    w = server()
    w.max_frame = 1000
    w.receive_data(b"\x00\x00\x10\x00\x01\x00\x00\x00\x01")  # says 4096 bytes follow
    with pytest.raises(ProtocolError, match=r"size 4096 is outside 5..1000"):
        w.next_event()


def test_a_client_refuses_an_unknown_server_version():
    w = Wire(Role.CLIENT)
    w.receive_data(b"IMQJ\x02")
    with pytest.raises(ProtocolError, match=r"version 2 is not supported \(this client speaks \[1\]\)"):
        w.next_event()


def test_open_is_only_legal_during_the_handshake():
    with pytest.raises(ProtocolError):
        Wire(Role.SERVER).open()


STREAM = (
    wire.PREAMBLE
    + HELLO
    + wire.request(2, Op.START)
    + wire.send_request(3, 1, b"IMQB\x01xyz")
    + wire.consumed_request(1, 1, [1, 2])
    + wire.HEARTBEAT
    + wire.request(4, Op.CLOSE)
)


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_of_a_stream_gives_the_same_events(cuts):
    w = Wire(Role.SERVER)
    got = []
    pieces = [*sorted(set(cuts)), len(STREAM)]
    start = 0
    for end in pieces:
        w.receive_data(STREAM[start:end])
        start = end
        while (e := w.next_event()) is not None:
            got.append(e)
            if e.__class__ is wire.Request and e.op is Op.HELLO:
                w.open()
    assert [e.op if e.__class__ is wire.Request else e for e in got] == [
        Op.HELLO,
        Op.START,
        Op.SEND,
        Op.CONSUMED,
        wire.Heartbeat(),
        Op.CLOSE,
    ]


@settings(max_examples=300)
@given(st.binary(max_size=400), st.booleans(), st.sampled_from([Role.SERVER, Role.CLIENT]))
def test_garbage_only_ever_raises_protocol_errors(data, after_handshake, role):
    w = (server() if role is Role.SERVER else client()) if after_handshake else Wire(role)
    w.receive_data(data)
    try:
        for _ in range(len(data) + 1):
            if w.next_event() is None:
                break
    except ProtocolError:
        assert w.state is wire.State.ERROR


@pytest.mark.slow
@settings(max_examples=200)
@given(
    st.lists(st.sampled_from(list(wire.ARGS)), min_size=1, max_size=5),
    st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-5, 2**40),
            st.text(max_size=5),
            st.binary(max_size=5),
            st.just(Queue("q")),
        ),
        max_size=8,
    ),
)
def test_requests_with_arbitrary_arguments_are_checked_not_trusted(ops, args):
    w = server()
    for op in ops:
        if op is Op.HELLO:
            continue
        w.receive_data(wire.request(5, op, *args))
        try:
            event = w.next_event()
        except ProtocolError:
            return
        assert event.op is op and len(event.args) == len(wire.ARGS[op])
