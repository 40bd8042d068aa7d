"""HostBroker.receive_many (the STOMP subscribers' batch take): each delivery exactly as
receive() gives it (selector, expiry, backout threshold, delivery counts recorded, a
closed consumer, a stopped connection), in order, bounded by count and body bytes, and
nothing lost or doubled when the consumer closes while batches are being taken."""

from __future__ import annotations

import random
import threading
import time

import pytest

from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import ProducerFlowControl
from bridgemgr.jms.hostbroker import DestinationAttributes, HostBroker, Principal
from bridgemgr.providers.embedded.broker import Broker
from bridgemgr.providers.embedded.host import EmbeddedHostBroker

Q = Queue("rm.in")
POISON = Queue("rm.poison")
P = Principal("alice")


def text(i: int, **props) -> TextMessage:
    msg = TextMessage(f"m{i}")
    for key, value in props.items():
        msg.set_string_property(key, value)
    return msg


def send(host: HostBroker, client, msg: TextMessage) -> None:
    """Send as a front end does: a send held by pacing (a consumer is taking) waits for
    room and is made again."""
    while True:
        try:
            host.send(P, client, msg, Q)
            return
        except ProducerFlowControl as held:
            room = threading.Event()
            held.on_room(room.set)
            assert room.wait(10), "the paced producer was never let go"


def open_host(tmp_path, stored: bool) -> EmbeddedHostBroker:
    return EmbeddedHostBroker(Broker(tmp_path / "store") if stored else Broker())


def drain(host: HostBroker, queue: Queue) -> list[str]:
    client = host.connect(P)
    consumer = host.subscribe(P, client, queue)
    texts: list[str] = []
    while got := host.receive_many(P, consumer, 10_000, 0):  # a batch is at most consumerFlowLimit
        host.acknowledge(P, got)
        texts += [d.message.text for d in got]  # type: ignore[attr-defined]
    host.disconnect(P, client)
    return texts


def scenario(tmp_path, stored: bool, seed: int, take) -> list:
    """A random workload (priorities, a selector, expired messages, redeliveries up to a
    backout threshold) consumed in batches by ``take``: what was seen, in order."""
    host = open_host(tmp_path, stored)
    rng = random.Random(seed)
    log: list = []
    try:
        host.configure_destination(P, Q, DestinationAttributes(backout_threshold=3, backout_queue=POISON.name))
        client = host.connect(P)
        consumer = host.subscribe(P, client, Q, "color <> 'blue'")
        for i in range(60):
            msg = text(i, color=rng.choice(["red", "blue", "green"]))
            msg.priority = rng.choice([4, 4, 4, 7])
            if rng.random() < 0.15:
                msg.expiration = 1  # long past: dropped when taken
            host.send(P, client, msg, Q)
        while True:
            limit = rng.choice([1, 2, 5, 64])
            got = take(host, consumer, limit)
            if not got:
                break
            log.append([(d.message.text, d.delivery_count) for d in got])
            back = [d for d in got if d.message.text.endswith("7") or rng.random() < 0.3]  # m7, m17, ...: poison
            host.redeliver(P, back)
            host.acknowledge(P, [d for d in got if d not in back])
        log.append(("left", sorted(drain(host, Q)), sorted(drain(host, POISON))))
        host.disconnect(P, client)
    finally:
        host.close()
    return log


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_a_batch_take_sees_what_receive_one_at_a_time_sees(tmp_path, stored, seed):
    one_by_one = scenario(
        tmp_path / "a", stored, seed, lambda h, c, n: HostBroker.receive_many(h, P, c, n, 0)
    )  # the loop over receive
    batched = scenario(tmp_path / "b", stored, seed, lambda h, c, n: h.receive_many(P, c, n, 0))
    assert batched == one_by_one
    seen = {name for batch in batched[:-1] for name, _ in batch}
    assert any(count > 1 for batch in batched[:-1] for _, count in batch)  # redeliveries happened
    assert batched[-1][2], "some message reached the backout threshold"
    assert len(seen) < 60  # the selector and expiry kept some back


def test_order_count_and_byte_bounds(tmp_path):
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    for i in range(10):
        host.send(P, client, TextMessage(f"{i}" * 100), Q)  # 100-character bodies
    first = host.receive_many(P, consumer, 4, 0)
    assert [d.message.text[0] for d in first] == ["0", "1", "2", "3"]  # type: ignore[attr-defined]
    sized = host.receive_many(P, consumer, 64, 0, first[0].message.body_size() * 2 + 1)
    assert [d.message.text[0] for d in sized] == ["4", "5", "6"]  # type: ignore[attr-defined]
    rest = host.receive_many(P, consumer, 64, 0)
    assert [d.message.text[0] for d in rest] == ["7", "8", "9"]  # type: ignore[attr-defined]
    assert all(d.delivery_count == 1 for d in first + sized + rest)
    assert host.receive_many(P, consumer, 64, 0) == []
    host.close()


def test_a_stopped_connection_gets_nothing_until_it_starts(tmp_path):
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    host.send(P, client, text(1), Q)
    client.stop()  # type: ignore[attr-defined]
    assert host.receive_many(P, consumer, 64, 0.05) == []
    threading.Timer(0.05, client.start).start()  # type: ignore[attr-defined]
    got = host.receive_many(P, consumer, 64, 5)
    assert [d.message.text for d in got] == ["m1"]  # type: ignore[attr-defined]
    host.close()


def test_a_closed_consumer_gets_nothing_and_a_waiting_take_returns(tmp_path):
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    threading.Timer(0.05, host.close_consumer, (P, consumer)).start()
    started = time.monotonic()
    assert host.receive_many(P, consumer, 64, None) == []  # woken by the close
    assert time.monotonic() - started < 5
    host.send(P, client, text(1), Q)
    assert host.receive_many(P, consumer, 64, 0) == []
    assert drain(host, Q) == ["m1"]
    host.close()


def test_the_first_delivery_is_waited_for(tmp_path):
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    threading.Timer(0.05, lambda: host.send(P, client, text(1), Q)).start()
    got = host.receive_many(P, consumer, 64, 5)
    assert [d.message.text for d in got] == ["m1"]  # type: ignore[attr-defined]
    host.close()


def test_delivery_counts_are_recorded_for_a_restart(tmp_path):
    host = open_host(tmp_path, True)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    for i in range(5):
        msg = text(i)
        msg.delivery_mode = 2  # persistent
        host.send(P, client, msg, Q)
    assert len(host.receive_many(P, consumer, 64, 0)) == 5  # taken, never acknowledged
    host.close()
    again = open_host(tmp_path, True)
    client = again.connect(P)
    consumer = again.subscribe(P, client, Q)
    got = again.receive_many(P, consumer, 64, 0)
    assert [(d.message.text, d.delivery_count) for d in got] == [(f"m{i}", 2) for i in range(5)]  # type: ignore[attr-defined]
    again.close()


def test_a_batch_records_its_delivery_counts_in_one_store_call(tmp_path, monkeypatch):
    """The store's lock is taken once for a batch's delivery counts, not once a message
    (what the restart test above checks survives; a STOMP subscriber's persistent take)."""
    host = open_host(tmp_path, True)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    for i in range(10):
        msg = text(i)
        msg.delivery_mode = 2  # persistent
        host.send(P, client, msg, Q)
    store = host.broker.store
    calls: list[object] = []
    monkeypatch.setattr(store, "mark_delivered", lambda *args: calls.append(("one", args)))
    record = store.mark_delivered_all
    monkeypatch.setattr(
        store, "mark_delivered_all", lambda marks, wake=False: (calls.append(("all", list(marks))), record(marks, wake))
    )
    got = host.receive_many(P, consumer, 64, 0)
    assert len(got) == 10
    assert calls == [("all", [(d.seq, 1) for d in got])]  # type: ignore[attr-defined]
    host.close()


def test_nothing_is_lost_or_doubled_when_the_consumer_closes_between_batches(tmp_path):
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumer = host.subscribe(P, client, Q)
    taken: list[str] = []

    def take() -> None:
        while True:
            got = host.receive_many(P, consumer, 7, None)
            if not got:
                return
            taken.extend(d.message.text for d in got)  # type: ignore[attr-defined]

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    for i in range(2000):
        send(host, client, text(i))
        if i == 1000:
            host.close_consumer(P, consumer)
    thread.join(5)
    assert not thread.is_alive()
    left = drain(host, Q)
    assert taken == [f"m{i}" for i in range(len(taken))]  # in order
    assert len(taken) + len(left) == 2000 and not set(taken) & set(left)
    host.close()


def test_competing_batch_takers_leave_nothing_waiting(tmp_path):
    """Each put wakes one waiter; a taker that empties the queue in a batch must not
    leave another asleep while messages wait (no lost wake-ups), and none is taken twice."""
    host = open_host(tmp_path, False)
    client = host.connect(P)
    consumers = [host.subscribe(P, client, Q) for _ in range(3)]
    taken: list[str] = []
    lock = threading.Lock()

    def take(consumer, limit: int) -> None:
        while True:
            got = host.receive_many(P, consumer, limit, None)
            if not got:
                return
            with lock:
                taken.extend(d.message.text for d in got)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=take, args=(c, n), daemon=True) for c, n in zip(consumers, (1, 3, 64))]
    for thread in threads:
        thread.start()
    for i in range(3000):
        send(host, client, text(i))
    deadline = time.monotonic() + 10
    while len(taken) < 3000 and time.monotonic() < deadline:
        time.sleep(0.01)
    for consumer in consumers:
        host.close_consumer(P, consumer)
    for thread in threads:
        thread.join(5)
    assert sorted(taken) == sorted(f"m{i}" for i in range(3000))
    host.close()
