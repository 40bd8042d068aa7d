"""A read's ACK frames are acknowledged together (one host broker call, one store call),
each frame keeping what it means alone: client-individual acknowledges that message,
client every earlier one of its subscription, an unknown or repeated id gets its ERROR
after the ACKs before it are done, a receipt comes after its ACK's work, a transacted
subscription's ACK joins its transaction, and each subscription gets its credit back."""

from __future__ import annotations

from typing import Any

import pytest

from bridgemgr.providers.embedded import Broker
from bridgemgr.stompbridge.frames import ERROR, MESSAGE, RECEIPT, Frame, encode_frame
from bridgemgr.stompbridge.session import SessionConfig, State
from jmsbridge_support import drain, texts
from stomp_support import Driver, pending


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    yield b
    b.close()


def spy_removals(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows per call of the store's remove_all (the one store call of an acknowledgement)."""
    assert broker.store is not None
    calls: list[int] = []
    remove_all = broker.store.remove_all

    def counted(seqs: Any) -> None:
        seqs = list(seqs)
        calls.append(len(seqs))
        remove_all(seqs)

    monkeypatch.setattr(broker.store, "remove_all", counted)
    return calls


def acks(*headers: dict[str, str]) -> bytes:
    """ACK frames as one read (STOMP 1.2)."""
    return b"".join(encode_frame(Frame("ACK", h), "1.2") for h in headers)


def delivered(d: Driver, queue: str, n: int, ack: str, sub_id: str = "1") -> list[Frame]:
    """Subscribe to ``queue`` with ``ack``, send it m0 .. m(n-1) persistent, take them."""
    d.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": sub_id, "ack": ack})
    d.feed(
        b"".join(
            encode_frame(Frame("SEND", {"destination": f"/queue/{queue}", "persistent": "true"}, b"m%d" % i), "1.2")
            for i in range(n)
        )
    )
    return d.messages(n)


def left_over(broker: Broker, d: Driver, queue: str) -> list[str]:
    """Close ``d``: what it had not acknowledged goes back; the queue's texts, taken."""
    d.close()
    return texts(drain(broker, queue, 0.2))


def test_a_reads_individual_acks_acknowledge_exactly_those_in_one_call(broker, monkeypatch):
    d = Driver(broker)
    d.connect()
    msgs = delivered(d, "ind", 10, "client-individual")
    calls = spy_removals(broker, monkeypatch)
    assert d.feed(acks(*({"id": m.headers["ack"]} for m in msgs[::2]))) == []
    assert calls == [5]
    assert pending(broker, "ind") == 5
    assert left_over(broker, d, "ind") == ["m1", "m3", "m5", "m7", "m9"]


def test_a_reads_cumulative_acks_acknowledge_every_earlier_message_in_one_call(broker, monkeypatch):
    d = Driver(broker)
    d.connect()
    msgs = delivered(d, "cum", 8, "client")
    calls = spy_removals(broker, monkeypatch)
    d.feed(acks({"id": msgs[2].headers["ack"]}, {"id": msgs[5].headers["ack"]}))
    assert calls == [6]
    assert left_over(broker, d, "cum") == ["m6", "m7"]


@pytest.mark.parametrize(
    "bad,message", [({"id": "999"}, "unknown message"), ({}, "missing id"), ({"id": "again"}, "unknown message")]
)
def test_a_bad_ack_among_good_ones_fails_after_the_good_ones_are_acknowledged(broker, monkeypatch, bad, message):
    d = Driver(broker)
    d.connect()
    msgs = delivered(d, "bad", 5, "client-individual")
    if bad.get("id") == "again":  # an ACK of a message the same read has acknowledged
        bad = {"id": msgs[1].headers["ack"]}
    calls = spy_removals(broker, monkeypatch)
    out = d.feed(
        acks({"id": msgs[0].headers["ack"]}, {"id": msgs[1].headers["ack"]}, bad, {"id": msgs[3].headers["ack"]})
    )
    assert [f.command for f in out] == [ERROR]
    assert out[0].headers["message"] == message
    assert d.session.state is State.ERROR
    assert calls == [2]  # the two before it, together; m3's ACK after the ERROR is not read
    assert left_over(broker, d, "bad") == ["m2", "m3", "m4"]


def test_a_receipt_ends_the_run_and_comes_after_its_ack(broker, monkeypatch):
    d = Driver(broker)
    d.connect()
    msgs = delivered(d, "rcpt", 4, "client-individual")
    calls = spy_removals(broker, monkeypatch)
    out = d.feed(
        acks(
            {"id": msgs[0].headers["ack"]},
            {"id": msgs[1].headers["ack"]},
            {"id": msgs[2].headers["ack"], "receipt": "r"},
            {"id": msgs[3].headers["ack"]},
        )
    )
    assert [(f.command, f.headers) for f in out] == [(RECEIPT, {"receipt-id": "r"})]
    assert calls == [2, 1, 1]  # the run before it, the receipt's own ACK, then the next run
    assert pending(broker, "rcpt") == 0


def test_each_subscription_of_a_run_gets_its_credit_back(broker, monkeypatch):
    """Two subscriptions at their consumerFlowLimit; one read ACKs some of each: each gets
    as many new deliveries as it had acknowledged, no more."""
    d = Driver(broker, SessionConfig(consumer_flow_limit=3))
    d.connect()
    a = delivered(d, "fa", 3, "client-individual", "a")
    b = delivered(d, "fb", 3, "client", "b")
    d.feed(
        b"".join(
            encode_frame(Frame("SEND", {"destination": f"/queue/{q}", "persistent": "true"}, b"n%d" % i), "1.2")
            for q in ("fa", "fb")
            for i in range(3)
        )
    )
    assert [f for f in d.pump(0.2) if f.command == MESSAGE] == []  # no credit
    calls = spy_removals(broker, monkeypatch)
    d.feed(acks({"id": a[2].headers["ack"]}, {"id": b[1].headers["ack"]}, {"id": a[0].headers["ack"]}))
    assert calls == [4]  # a's m2 and m0, b's m0 and m1 (cumulative)
    more = [f for f in d.pump(0.3) if f.command == MESSAGE]
    by_sub = sorted((f.headers["subscription"], f.body) for f in more)
    assert by_sub == [("a", b"n0"), ("a", b"n1"), ("b", b"n0"), ("b", b"n1")]


def test_a_transacted_subscriptions_ack_in_a_run_joins_its_transaction(broker, monkeypatch):
    d = Driver(broker)
    d.connect()
    plain = delivered(d, "plain", 3, "client-individual", "p")
    d.feed(
        b"".join(
            encode_frame(Frame("SEND", {"destination": "/queue/tx", "persistent": "true"}, b"t%d" % i), "1.2")
            for i in range(2)
        )
    )
    d.send("BEGIN", {"transaction": "t"})
    d.send("SUBSCRIBE", {"destination": "/queue/tx", "id": "t", "transaction": "t"})
    held = d.messages(2)
    calls = spy_removals(broker, monkeypatch)
    assert (
        d.feed(
            acks(
                {"id": plain[0].headers["ack"]},
                {"id": plain[1].headers["ack"]},
                {"id": held[1].headers["ack"]},
                {"id": plain[2].headers["ack"]},
            )
        )
        == []
    )
    assert calls == [2, 1]  # the plain ACKs before the transacted one, then the one after it
    assert pending(broker, "plain") == 0 and pending(broker, "tx") == 2  # held until COMMIT
    d.send("ABORT", {"transaction": "t"})
    assert left_over(broker, d, "tx") == ["t0", "t1"]


@pytest.mark.parametrize("limit,wakes", [(10, 0), (3, 1)])
def test_an_ack_wakes_the_subscriber_thread_only_when_its_credit_was_used_up(broker, limit, wakes):
    """A thread switch per ACK for nothing, otherwise: with credit left, credit is not
    what the subscriber thread waits for."""
    d = Driver(broker, SessionConfig(consumer_flow_limit=limit))
    d.connect()
    msgs = delivered(d, "wake", 3, "client-individual")
    handle = d.session.subscriptions["1"].handle
    assert handle is not None
    notified: list[int] = []
    notify = handle._cond.notify
    handle._cond.notify = lambda n=1: (notified.append(n), notify(n))  # type: ignore[method-assign]
    for m in msgs:
        d.send("ACK", {"id": m.headers["ack"]})
    assert len(notified) == wakes
    d.send("SEND", {"destination": "/queue/wake"}, b"next")
    assert [f.body for f in d.messages(1)] == [b"next"]  # credit came back all the same
