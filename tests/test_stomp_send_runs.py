"""A read's SEND frames go to the broker together (HostBroker.send_many: one broker lock,
one store call), each frame keeping what it means alone: per-SEND authorization, receipts
in order, the ERROR of a bad frame after the sends before it, transactions, and a held
send holding only the frames after it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bridgemgr.accesscontrol import AccessControl, AccessControls
from bridgemgr.jms import DeliveryMode, Queue, TextMessage, Topic
from bridgemgr.jms.errors import ProducerFlowControl
from bridgemgr.jms.hostbroker import HostBroker, Principal
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory, LimitBehavior
from bridgemgr.providers.embedded.host import EmbeddedHostBroker
from bridgemgr.stompbridge.frames import ERROR, RECEIPT, Frame, encode_frame
from bridgemgr.stompbridge.host import HostConnection
from bridgemgr.stompbridge.session import SessionConfig, State
from jmsbridge_support import drain, texts
from stomp_support import Driver
from test_stomp_session import Counting


def persistent_run(count: int, queue: str) -> list[tuple[TextMessage, Queue]]:
    """A run for send_many: persistent texts m0, m1, ... to one queue."""
    run = []
    for i in range(count):
        m = TextMessage(f"m{i}")
        m.delivery_mode = DeliveryMode.PERSISTENT
        run.append((m, Queue(queue)))
    return run


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store", sync=True)
    yield b
    b.close()


def sends(*frames: tuple[str, dict[str, str], bytes]) -> bytes:
    """Frames as one read (STOMP 1.2)."""
    return b"".join(encode_frame(Frame(command, headers, body), "1.2") for command, headers, body in frames)


def send(queue: str, body: str, **headers: str) -> tuple[str, dict[str, str], bytes]:
    return ("SEND", {"destination": f"/queue/{queue}", "persistent": "true", **headers}, body.encode())


def arrived(broker: Broker, name: str) -> list[str]:
    """The texts on queue ``name``, taken."""
    return texts(drain(broker, name, 0.2))


def spy_store(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows per call of the store's add_many (the one call a run of sends makes)."""
    assert broker.store is not None
    calls: list[int] = []
    add_many = broker.store.add_many

    def counted(rows: Any) -> int:
        rows = list(rows)
        calls.append(len(rows))
        return add_many(rows)

    monkeypatch.setattr(broker.store, "add_many", counted)
    return calls


def test_a_reads_sends_reach_the_store_in_one_call(broker, monkeypatch):
    d = Driver(broker)
    d.connect()
    calls = spy_store(broker, monkeypatch)
    frames = d.feed(sends(*(send("run", f"m{i}") for i in range(10)), send("run", "last", receipt="r")))
    assert [f.headers["receipt-id"] for f in frames if f.command == RECEIPT] == ["r"]
    assert calls == [11]
    assert arrived(broker, "run") == [f"m{i}" for i in range(10)] + ["last"]
    d.close()


@pytest.mark.parametrize("sync", [False, True])
def test_a_pipelining_clients_receipts_share_one_store_write(tmp_path, monkeypatch, sync):
    """Ten SENDs of one read, each asking a receipt (a client that does not wait for one
    before its next SEND): one store call, one wait for its write, then the ten receipts
    in frame order. Before, each receipt ended the run and waited alone: ten writes."""
    broker = Broker(tmp_path / "store", sync=sync)
    try:
        d = Driver(broker)
        d.connect()
        calls = spy_store(broker, monkeypatch)
        waits: list[object] = []
        wait_all = broker.wait_all
        monkeypatch.setattr(broker, "wait_all", lambda tickets: (waits.append(tickets), wait_all(tickets))[1])
        frames = d.feed(sends(*(send("piped", f"m{i}", receipt=f"r{i}") for i in range(10))))
        assert [f.headers["receipt-id"] for f in frames if f.command == RECEIPT] == [f"r{i}" for i in range(10)]
        assert calls == [10] and len(waits) == 1
        d.close()
        assert arrived(broker, "piped") == [f"m{i}" for i in range(10)]
    finally:
        broker.close()


def test_host_broker_send_many_routes_a_run_in_one_store_call(broker, monkeypatch):
    host = EmbeddedHostBroker(broker)
    principal = Principal("admin")
    client = host.connect(principal)
    calls = spy_store(broker, monkeypatch)
    ticket, sent, refused = host.send_many(principal, client, persistent_run(5, "h"))
    assert (sent, refused) == (5, None) and ticket is not None and calls == [5]
    host.wait_durable(principal, ticket)
    host.disconnect(principal, client)
    assert arrived(broker, "h") == [f"m{i}" for i in range(5)]


def test_receipts_of_a_run_come_in_order_each_after_its_frames_work(broker):
    d = Driver(broker)
    d.connect()
    frames = d.feed(
        sends(
            send("r", "a"),
            send("r", "b", receipt="r1"),
            send("r", "c"),
            send("r", "d", receipt="r2"),
            ("SEND", {"destination": "/queue/r"}, b"e"),
        )
    )
    assert [f.headers["receipt-id"] for f in frames if f.command == RECEIPT] == ["r1", "r2"]
    frames = d.feed(sends(("DISCONNECT", {"receipt": "bye"}, b"")))
    assert [f.headers["receipt-id"] for f in frames] == ["bye"]
    assert arrived(broker, "r") == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize(
    "bad,message",
    [
        (("SEND", {"destination": "/queue/q"}, b"\xff"), "body is not UTF-8"),  # converting
        (("SEND", {"destination": "/queue/full"}, b"x"), "send failed"),  # the broker refuses
        (("SEND", {"destination": "/queue/q", "transaction": "none"}, b"x"), "unknown transaction"),
        (("SEND", {}, b"x"), "missing destination"),
    ],
)
def test_a_bad_frame_in_a_run_fails_after_the_sends_before_it(broker, bad, message):
    broker.configure_destination(Queue("full"), DestinationLimits(max_num_msgs=0))
    d = Driver(broker)
    d.connect()
    frames = d.feed(
        sends(send("q", "one"), send("q", "two"), (bad[0], {**bad[1], "receipt": "bad"}, bad[2]), send("q", "after"))
    )
    errors = [f for f in frames if f.command == ERROR]
    assert [e.headers["message"] for e in errors] == [message]
    assert errors[0].headers["receipt-id"] == "bad"
    if message == "send failed":
        assert "/queue/full" in errors[0].body.decode()
    assert d.session.state is State.ERROR
    assert arrived(broker, "q") == ["one", "two"]


def test_a_frame_that_does_not_parse_fails_after_the_sends_before_it(broker):
    d = Driver(broker)
    d.connect()
    frames = d.feed(sends(send("p", "one"), send("p", "two")) + b"SEND\ndestination:/queue/p\ncontent-length:x\n\n\0")
    assert [f.command for f in frames] == [ERROR]
    assert arrived(broker, "p") == ["one", "two"]


def test_each_send_of_a_run_is_authorized(broker, tmp_path):
    rules = tmp_path / "acl.properties"
    rules.write_text(
        "version=JMQFileAccessControlModel/100\nconnection.NORMAL.allow.user=*\n"
        "queue.*.produce.allow.user=*\nqueue.create.allow.user=*\n"
        "queue.secret.produce.deny.user=*\n"
    )
    host = EmbeddedHostBroker(broker, AccessControls(stomp=AccessControl("stomp", rules)))

    class Checked(Driver):
        def _open_host(self, client_id: str | None, user: str) -> HostConnection:
            return HostConnection(
                host, Principal(user, service="stomp"), lambda fn, *args: self.posted.put((fn, args)), client_id
            )

    d = Checked(broker)
    d.connect()
    frames = d.feed(sends(send("open", "one"), send("secret", "no"), send("open", "two")))
    errors = [f for f in frames if f.command == ERROR]
    assert [e.headers["message"] for e in errors] == ["send failed"]
    assert "/queue/secret" in errors[0].body.decode()
    assert arrived(broker, "open") == ["one"] and arrived(broker, "secret") == []


def test_a_transaction_in_a_run(broker):
    d = Driver(broker)
    d.connect()
    frames = d.feed(
        sends(
            send("t", "a"),
            ("BEGIN", {"transaction": "tx"}, b""),
            send("t", "in tx", transaction="tx"),
            send("t", "b"),
            ("COMMIT", {"transaction": "tx", "receipt": "c"}, b""),
            send("t", "c", receipt="r"),
        )
    )
    assert [f.headers["receipt-id"] for f in frames if f.command == RECEIPT] == ["c", "r"]
    assert arrived(broker, "t") == ["a", "b", "in tx", "c"]
    d.close()


def test_a_held_send_holds_only_the_frames_after_it(broker):
    """A full FLOW_CONTROL queue holds the third SEND of a read: the two before it are
    sent, the rest wait (converted once: the transformer sees each SEND once) and go,
    in order, once a consumer makes room; the receipt comes after them."""
    broker.configure_destination(
        Queue("held"), DestinationLimits(max_num_msgs=2, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )
    Counting.inbound = 0
    d = Driver(broker, SessionConfig(transformer=Counting))
    d.connect()
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue("held"))
    taken: list[str] = []

    def take_all() -> None:  # frees the room while the session's held call waits
        while len(taken) < 5 and (m := consumer.receive(5)) is not None:
            taken.append(m.text)

    def depth() -> int:
        with broker.lock:
            return broker.queues["held"].count

    seen: list[int] = []
    room = threading.Timer(0.3, lambda: (seen.append(depth()), take_all()))
    room.start()
    frames = d.feed(sends(*(send("held", f"m{i}") for i in range(4)), send("held", "m4", receipt="r")))
    room.join()
    conn.close()
    assert seen == [2]  # the two before the held one went; nothing after it passed it
    assert taken == [f"m{i}" for i in range(5)]
    assert [f.headers["receipt-id"] for f in frames if f.command == RECEIPT] == ["r"]
    assert Counting.inbound == 5
    d.close()


def test_a_run_into_a_remove_oldest_queue_leaves_no_removed_row_behind(tmp_path):
    """A send of a run that removes an earlier message of the same run (REMOVE_OLDEST):
    that message's row is recorded before it is removed, so the removal cancels it (never
    written), instead of a delete recorded before its insert (a batch cut between them
    would bring the message back at the next start)."""
    broker = Broker(tmp_path / "store", sync=True)
    broker.configure_destination(
        Queue("ro"), DestinationLimits(max_num_msgs=2, use_dmq=False, limit_behavior=LimitBehavior.REMOVE_OLDEST)
    )
    d = Driver(broker)
    d.connect()
    assert broker.store is not None
    rows = broker.store.stats()["rows"]
    frames = d.feed(sends(*(send("ro", f"m{i}") for i in range(4)), send("ro", "m4", receipt="r")))
    assert [f.command for f in frames] == [RECEIPT]
    assert broker.store.stats()["rows"] == rows + 2  # m3 and m4 inserted; m0-m2 never written
    d.close()
    broker.close()
    broker = Broker(tmp_path / "store", sync=True)
    try:
        assert arrived(broker, "ro") == ["m3", "m4"]
    finally:
        broker.close()


def test_a_run_to_several_destinations_routes_each_send_to_its_own(broker):
    """A run's sends to one queue share its lookup; a send to another queue, a topic
    (its subscribers' selectors decide per message) or back again routes as alone."""
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    session = conn.create_session()
    reds = session.create_consumer(Topic("t"), "colour = 'red'")
    d = Driver(broker)
    d.connect()
    d.feed(
        sends(
            send("a", "a1"),
            send("a", "a2"),
            send("b", "b1"),
            ("SEND", {"destination": "/topic/t", "colour": "blue"}, b"blue"),
            ("SEND", {"destination": "/topic/t", "colour": "red"}, b"red"),
            send("a", "a3", receipt="r"),
        )
    )
    assert reds.receive(1).text == "red" and reds.receive(0.1) is None
    conn.close()
    assert arrived(broker, "a") == ["a1", "a2", "a3"] and arrived(broker, "b") == ["b1"]
    d.close()


@pytest.mark.parametrize("one_by_one", [False, True], ids=["embedded", "interface default"])
def test_send_many_stops_at_the_first_refused_send(broker, one_by_one):
    """Both the embedded send_many and the interface's default (send() each): the sends
    before a refused one go, it and those after it do not, and its error comes back."""
    broker.configure_destination(
        Queue("fc"), DestinationLimits(max_num_msgs=2, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )

    class PerSend(EmbeddedHostBroker):
        send_many = HostBroker.send_many

    host = (PerSend if one_by_one else EmbeddedHostBroker)(broker)
    principal = Principal("admin")
    client = host.connect(principal)
    ticket, sent, refused = host.send_many(principal, client, persistent_run(4, "fc"))
    assert sent == 2 and isinstance(refused, ProducerFlowControl) and ticket is not None
    host.wait_durable(principal, ticket)
    host.disconnect(principal, client)
    assert arrived(broker, "fc") == ["m0", "m1"]
