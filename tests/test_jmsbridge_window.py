"""The confirm window: MessageProducer.send_async()/flush() (JMS 2.0's CompletionListener
shape) per provider, the in-order tracking of outcomes a link relies on (ConfirmWindow),
and a link that acknowledges once per window instead of once per message."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgemgr.jms import DeliveryMode, JMSException, Message, Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException, TransportException
from bridgemgr.jmsbridge.states import State
from bridgemgr.jmsbridge.transfer import ClientAcknowledge
from bridgemgr.jmsbridge.window import ConfirmWindow
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import Broker, DestinationLimits, EmbeddedConnectionFactory
from jmsbridge_support import bridge_xml, drain, link_xml, make_bridge, send, texts, wait_until
from remote.support import Harness
from test_jmsbridge_send_confirm import stomp_far

pytestmark = pytest.mark.timeout(60)
__all__ = ["stomp_far"]  # the fixture

BIG = "x" * 4096


# --- the in-order tracking ------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_order_of_answers_settles_only_the_answered_prefix_each_once(data):
    """N sends outstanding; their listeners are called in any order, some twice (the
    second call ignored), some failing; settled() is taken between any two calls. What
    comes back is always the prefix of sends answered so far, in send order, each once,
    with its first outcome: a link acknowledges only what was confirmed before it."""
    n = data.draw(st.integers(1, 12), label="outstanding")
    window: ConfirmWindow[int] = ConfirmWindow()
    listeners = [window.add(i) for i in range(n)]
    calls = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.booleans(), st.booleans()), max_size=3 * n), label="calls"
    )
    calls += [(i, True, False) for i in range(n)]  # eventually everyone answers
    first: dict[int, JMSException | None] = {}
    taken: list[tuple[int, JMSException | None]] = []
    message = Message()
    for i, ok, take_now in calls:
        if ok:
            listeners[i].on_completion(message)
        else:
            listeners[i].on_exception(message, JMSException(f"refused {i}"))
        first.setdefault(i, None if ok else JMSException(f"refused {i}"))
        if take_now:
            got = window.settled()
            answered = next((k for k in range(len(taken), n) if k not in first), n)
            assert [i for i, _ in got] == list(range(len(taken), answered))
            taken += got
    taken += window.settled()
    assert len(window) == 0
    assert [i for i, _ in taken] == list(range(n))
    assert [None if e is None else str(e) for _, e in taken] == [
        None if first[i] is None else str(first[i]) for i in range(n)
    ]


def test_a_send_that_raised_leaves_the_window():
    window: ConfirmWindow[str] = ConfirmWindow()
    a, b = window.add("a"), window.add("b")
    window.cancel(b)
    a.on_completion(Message())
    assert window.settled() == [("a", None)] and len(window) == 0


# --- providers --------------------------------------------------------------------------------


class Recorder:
    """A CompletionListener that records (text, error) in the order it is called."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, JMSException | None]] = []
        self.lock = threading.Lock()

    def on_completion(self, message: Message) -> None:
        with self.lock:
            self.outcomes.append((message.text, None))  # type: ignore[attr-defined]

    def on_exception(self, message: Message, exception: JMSException) -> None:
        with self.lock:
            self.outcomes.append((message.text, exception))  # type: ignore[attr-defined]


@pytest.fixture
def far(tmp_path):
    broker = Broker(tmp_path / "far")
    broker.configure_destination(Queue("dst"), DestinationLimits(max_bytes_per_msg=1024))
    with Harness(broker) as harness:
        yield broker, harness
    broker.close()


@pytest.mark.parametrize("mode", [DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT])
def test_mq_send_async_attributes_a_refusal_to_its_own_message(far, mode):
    """mq://: the sends are pipelined; the refused one hears its refusal, the next one
    its success: no refusal fails another message's send."""
    broker, harness = far
    conn = harness.factory().create_connection()
    try:
        producer = conn.create_session().create_producer(Queue("dst"))
        producer.delivery_mode = mode
        listener = Recorder()
        for text in ("a", BIG, "b", "c"):
            producer.send_async(TextMessage(text), listener)
        producer.flush()
        assert [(t[:3], type(e).__name__ if e else None) for t, e in listener.outcomes] == [
            ("a", None),
            ("xxx", "ResourceAllocationException"),
            ("b", None),
            ("c", None),
        ]
        assert isinstance(listener.outcomes[1][1], ResourceAllocationException)
        producer.send(TextMessage("d"))  # the refusal does not fail a later send either
    finally:
        conn.close()
    assert texts(drain(broker, "dst", expect=4)) == ["a", "b", "c", "d"]


class _CountingSocket:
    """A socket whose sendall() calls are counted (the rest passes through)."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.writes = 0

    def sendall(self, data) -> None:
        self.writes += 1
        self.sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_mq_send_async_writes_a_window_in_few_writes(far):
    """A window of send_async() over mq:// leaves in a few writes (kept until flush() or
    LAZY_LIMIT bytes), not one system call and one wake-up of the service per message;
    flush() still hears every answer, in order."""
    broker, harness = far
    conn = harness.factory().create_connection()
    try:
        producer = conn.create_session().create_producer(Queue("dst"))
        counting = conn.channel._sock = _CountingSocket(conn.channel._sock)
        listener = Recorder()
        for i in range(50):
            producer.send_async(TextMessage(f"m{i}"), listener)
        producer.flush()
        assert listener.outcomes == [(f"m{i}", None) for i in range(50)]
        assert counting.writes <= 3, counting.writes
    finally:
        conn.close()
    assert texts(drain(broker, "dst", expect=50)) == [f"m{i}" for i in range(50)]


def test_embedded_send_async_answers_durable_sends_after_their_store_batch(tmp_path):
    """In process, with a store that fsyncs: the listeners of persistent sends are called
    once the store batch holding them is on disk (flush() waits for it once)."""
    broker = Broker(tmp_path / "b", sync=True)
    try:
        conn = EmbeddedConnectionFactory(broker).create_connection()
        producer = conn.create_session().create_producer(Queue("q"))
        listener = Recorder()
        for text in ("a", "b", "c"):
            producer.send_async(TextMessage(text), listener)
        assert listener.outcomes == []  # waiting for the disk
        producer.flush()
        assert listener.outcomes == [("a", None), ("b", None), ("c", None)]
        producer.send_async(TextMessage("n"), listener, delivery_mode=DeliveryMode.NON_PERSISTENT)
        assert listener.outcomes[-1] == ("n", None)  # nothing to wait for
        conn.close()
    finally:
        broker.close()


@pytest.mark.slow
def test_stomp_send_async_pipelines_receipts_and_fails_the_refused_frame(stomp_far):
    """STOMP: every SEND asks for a receipt and nobody waits; the ERROR naming the refused
    frame fails that send (a refusal), and the broker's closing the connection after it
    fails the ones behind it as lost, not refused: through the listener, or at once when
    the close came before the send (the bridge answers a receipt as soon as its row is
    written, so the ERROR and the close can beat the client's next SEND)."""
    from bridgemgr.providers.stomp import StompConnectionFactory

    broker, port = stomp_far
    conn = StompConnectionFactory(f"stomp://127.0.0.1:{port}", "admin", "secret").create_connection()
    try:
        producer = conn.create_session().create_producer(Queue("dst"))
        listener = Recorder()
        for text in ("a", "b", BIG, "c"):
            try:
                producer.send_async(TextMessage(text), listener)
            except TransportException as exc:
                assert text == "c"  # the connection was already closed
                listener.on_exception(TextMessage(text), exc)
        producer.flush()
    finally:
        conn.close()
    outcomes = listener.outcomes
    assert [t[:3] for t, _ in outcomes] == ["a", "b", "xxx", "c"]
    assert outcomes[0][1] is None and outcomes[1][1] is None
    refusal, lost = outcomes[2][1], outcomes[3][1]
    assert type(refusal) is JMSException and "1024" in str(refusal)
    assert isinstance(lost, TransportException)
    assert texts(drain(broker, "dst", expect=2)) == ["a", "b"]


# --- the link ---------------------------------------------------------------------------------


def test_a_link_acknowledges_once_per_window(broker, monkeypatch):
    """imq.bridge.<name>.link.window=10: 30 messages are acknowledged in about 3
    acknowledgements, not 30 (the chapter's acknowledge after each send, window 1)."""
    real, acks = ClientAcknowledge.complete, []

    def counting(self):
        acks.append(1)
        return real(self)

    monkeypatch.setattr(ClientAcknowledge, "complete", counting)
    send(broker, "src", [f"m{i}" for i in range(30)])
    props = load_properties([], ["imq.bridge.b.link.window=10"], environ={})
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    try:
        counters = b.links[0].counters
        wait_until(lambda: counters.transferred == 30, what="30 transferred")
        assert texts(drain(broker, "dst", expect=30)) == [f"m{i}" for i in range(30)]
    finally:
        b.stop()
    assert len(acks) <= 6, acks


def test_a_link_whose_transformer_may_halt_it_still_acknowledges_once_per_window(broker, monkeypatch):
    """consume-no-transfer-on-transform-error=false: a failing transform stops the link
    without consuming the message. The source acknowledges its oldest messages alone, so
    the link keeps its window (not one acknowledgement per message); on the halt the
    messages before the failing one are acknowledged, it stays, nothing is sent twice."""
    acks = []
    for name in ("complete", "complete_oldest"):
        real = getattr(ClientAcknowledge, name)
        monkeypatch.setattr(
            ClientAcknowledge, name, lambda self, *a, _real=real, _name=name: acks.append(_name) or _real(self, *a)
        )
    good = [f"m{i}" for i in range(25)]
    send(broker, "src", [*good, "bad", "after"])
    props = load_properties([], ["imq.bridge.b.link.window=10"], environ={})
    failing = "test_jmsbridge_link.Failing"
    b = make_bridge(broker, bridge_xml(link_xml(target_attrs=f'message-transformer-class="{failing}"')), props=props)
    b.start()
    try:
        link = b.links[0]
        assert link.lifecycle.wait_for({State.STOPPED}, 10) is State.STOPPED
        assert "bad" in (link.counters.last_error or "")
        b.start_link("l")  # it stops on the same message again: nothing more is sent
        assert link.lifecycle.wait_for({State.STOPPED}, 10) is State.STOPPED
    finally:
        b.stop()
    assert texts(drain(broker, "dst", expect=25)) == good
    assert texts(drain(broker, "src")) == ["bad", "after"]
    assert len(acks) <= 8, acks
    assert acks[-1] == "complete_oldest"


def test_a_full_flow_control_target_holds_the_window_and_nothing_goes_to_the_dmq(broker):
    """A target at its FLOW_CONTROL limit holds the link's asynchronous sends as it holds a
    plain send: the link waits for room; a held send is not a refused one (no DMQ)."""
    from bridgemgr.providers.embedded import LimitBehavior

    broker.configure_destination(
        Queue("dst"), DestinationLimits(max_num_msgs=4, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )
    send(broker, "src", [f"m{i}" for i in range(20)])
    props = load_properties([], ["imq.bridge.b.link.window=10"], environ={})
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    try:
        counters = b.links[0].counters
        wait_until(lambda: broker.queue_depth("dst") == 4, what="the target full")
        got = []
        while len(got) < 20:  # room, a message at a time
            got += texts(drain(broker, "dst", expect=1))
        wait_until(lambda: counters.transferred == 20, what="20 transferred")
    finally:
        b.stop()
    assert got == [f"m{i}" for i in range(20)]
    assert counters.to_dmq == 0 and broker.queue_depth("imq.bridge.jms.dmq") == 0


@pytest.mark.parametrize("transacted", ["false", "true"])
def test_stopping_a_link_held_by_a_full_flow_control_target_gives_the_send_up(broker, transacted):
    """The held send waits for room that only a consumer makes: stop() gives it up at once
    (the session's cancel), nothing more is sent, and every message not acknowledged is
    back on the source (none lost; the next start sends it)."""
    import time

    from bridgemgr.providers.embedded import LimitBehavior

    broker.configure_destination(
        Queue("dst"), DestinationLimits(max_num_msgs=3, limit_behavior=LimitBehavior.FLOW_CONTROL)
    )
    send(broker, "src", [f"m{i}" for i in range(6)])
    b = make_bridge(broker, bridge_xml(link_xml(transacted=transacted)))
    b.start()
    wait_until(lambda: broker.queue_depth("dst") == 3, what="the target full")
    time.sleep(0.3)  # the link's next send is held
    started = time.monotonic()
    b.stop()
    assert time.monotonic() - started < 2
    assert b.links[0].state.value == "STOPPED"
    on_target = texts(drain(broker, "dst", expect=3))
    back = texts(drain(broker, "src"))
    assert set(on_target) | set(back) == {f"m{i}" for i in range(6)}
    assert "m3" in back and "m3" not in on_target
    assert broker.queue_depth("imq.bridge.jms.dmq") == 0


def test_a_window_property_on_a_link_sets_that_links_window(broker):
    """<property name="window" value="10"/> in a <link> (after its <target>) is that link's
    window, over imq.bridge.<name>.link.window (3 here), which the other link keeps."""
    send(broker, "src", [f"m{i}" for i in range(30)])
    windowed = link_xml("l1").replace("</link>", '<property name="window" value="10"/></link>')
    props = load_properties([], ["imq.bridge.b.link.window=3"], environ={})
    b = make_bridge(broker, bridge_xml(windowed + link_xml("l2", "other", "other")), props=props)
    assert b.config.link("l1").window == 10 and b.config.link("l2").window is None
    b.start()
    try:
        by_name = {link.name: link for link in b.links}
        assert (by_name["l1"].window, by_name["l2"].window) == (10, 3)
        wait_until(lambda: by_name["l1"].counters.transferred == 30, what="30 transferred")
        assert texts(drain(broker, "dst", expect=30)) == [f"m{i}" for i in range(30)]
    finally:
        b.stop()


@pytest.mark.parametrize("store", ["none", "nosync", "sync"])
def test_a_target_answering_when_sent_skips_the_window_bookkeeping(tmp_path, monkeypatch, store):
    """A host broker without a store answers a send when it returns: the link sends plainly
    (no send_async, no ConfirmWindow) and still acknowledges once per window; with a store,
    fsync or not, the window's sends wait for their store batch together (send_async)."""
    from bridgemgr.providers.embedded.client import EmbeddedProducer

    real, calls = EmbeddedProducer.send_async, []

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EmbeddedProducer, "send_async", counting)
    acks, complete = [], ClientAcknowledge.complete
    monkeypatch.setattr(ClientAcknowledge, "complete", lambda self: (acks.append(1), complete(self))[1])
    heads, head = [], ConfirmWindow.confirmed_head
    monkeypatch.setattr(ConfirmWindow, "confirmed_head", lambda self, t: (heads.append(t), head(self, t))[1])
    b_broker = Broker() if store == "none" else Broker(tmp_path / "store", sync=store == "sync")
    try:
        send(b_broker, "src", [f"m{i}" for i in range(30)])
        props = load_properties([], ["imq.bridge.b.link.window=10"], environ={})
        b = make_bridge(b_broker, bridge_xml(link_xml()), props=props)
        b.start()
        try:
            wait_until(lambda: b.links[0].counters.transferred == 30, what="30 transferred")
            assert texts(drain(b_broker, "dst", expect=30)) == [f"m{i}" for i in range(30)]
        finally:
            b.stop()
    finally:
        b_broker.close()
    assert len(calls) == (0 if store == "none" else 30)
    assert len(acks) <= 6, acks
    assert heads == []  # its source acknowledges whole sessions: no wait for a window's head


def test_confirmed_head_waits_for_the_oldest_and_stops_at_a_failure_or_a_gap():
    window: ConfirmWindow[str] = ConfirmWindow()
    slots = [window.add(x) for x in "abcde"]
    m = TextMessage("")
    assert window.confirmed_head(0.05) == []  # the oldest unanswered: nothing, in time
    slots[1].on_completion(m)
    threading.Timer(0.05, slots[0].on_completion, (m,)).start()
    assert window.confirmed_head(5) == ["a", "b"]  # waited for a; c is unanswered
    slots[3].on_completion(m)
    slots[2].on_exception(m, JMSException("refused"))
    assert window.confirmed_head(0) == ["a", "b"]  # c failed: the head ends before it
    window.confirmed(2)
    assert window.confirmed_head(0) == []
    assert window.settled()[0][0] == "c" and len(window) == 1


# --- the byte bound (imq.bridge.<name>.link.windowBytes) --------------------------------------

KIB16 = "y" * 16384  # with Message.size()'s 200 for headers: 4 of them reach 64k, 3 do not


@pytest.fixture
def stomp_target(tmp_path):
    """Another broker behind our STOMP bridge, taking any size: its answers come while
    nobody flushes, so a link's full window slides there (Link._slide)."""
    from bridgemgr.netloop import NetLoop
    from stomp_support import make_bridge as make_stomp_bridge
    from stomp_support import make_users

    far = Broker(tmp_path / "stomp-target")
    with NetLoop("stomp-target") as loop:
        stomp_bridge = make_stomp_bridge(loop, far, make_users(tmp_path))
        yield far, stomp_bridge.tcp_port
        stomp_bridge.stop()
    far.close()


@pytest.mark.parametrize("target", ["plain", "confirmed", "sliding"])
def test_big_messages_fill_a_unit_before_its_window_is_full(tmp_path, request, monkeypatch, target):
    """imq.bridge.<name>.link.windowBytes=64k with the window at its 1000: 40 messages of
    16 KiB make units of 4 (they hold 64k), not one of 40, whether the target answers
    when sent (the unit full), the link waits for its window's answers (the window
    full: flush, then acknowledge) or its window slides (acknowledge the confirmed head).
    Every message arrives once, in order."""
    acks: list[int] = []
    for name in ("complete", "complete_oldest"):
        real = getattr(ClientAcknowledge, name)
        monkeypatch.setattr(ClientAcknowledge, name, lambda self, *a, _real=real: acks.append(1) or _real(self, *a))
    source = Broker(tmp_path / "source", sync=target == "confirmed")
    far, cfs, link = source, "", link_xml()
    if target == "sliding":
        far, port = request.getfixturevalue("stomp_target")
        cfs = (
            '<connection-factory ref-name="far" lookup-name="ConnectionFactory" username="admin" '
            'password="secret"><property name="java.naming.factory.initial" value="imq.stomp"/>'
            f'<property name="java.naming.provider.url" value="stomp://127.0.0.1:{port}"/>'
            "</connection-factory>"
        )
        link = link.replace('<target connection-factory-ref="host"', '<target connection-factory-ref="far"')
    bodies = [f"{i:03d}{KIB16}" for i in range(40)]
    try:
        send(source, "src", bodies)
        props = load_properties([], ["imq.bridge.b.link.windowBytes=64k"], environ={})
        b = make_bridge(source, bridge_xml(link, cfs=cfs), props=props)
        b.start()
        try:
            assert b.links[0].window == 1000
            wait_until(lambda: b.links[0].counters.transferred == 40, what="40 transferred")
            assert texts(drain(far, "dst", expect=40)) == bodies
        finally:
            b.stop()
        assert source.queue_depth("src") == 0
    finally:
        source.close()
    assert len(acks) >= 10, acks  # at most 4 messages (64k) acknowledged together


def test_a_transacted_link_commits_at_the_byte_bound_before_its_batch_size(broker, monkeypatch):
    """transaction.batchSize=50 (the chapter's unit) with windowBytes=64k: 16 KiB
    messages commit 4 at a time; all arrive once, in order."""
    from bridgemgr.jmsbridge.transfer import LocalTransaction, XATransaction

    commits: list[int] = []
    for kind in (LocalTransaction, XATransaction):
        monkeypatch.setattr(kind, "complete", lambda self, _real=kind.complete: commits.append(1) or _real(self))
    bodies = [f"{i:03d}{KIB16}" for i in range(20)]
    send(broker, "src", bodies)
    props = load_properties(
        [], ["imq.bridge.b.transaction.batchSize=50", "imq.bridge.b.link.windowBytes=64k"], environ={}
    )
    b = make_bridge(broker, bridge_xml(link_xml(transacted="true")), props=props)
    b.start()
    try:
        wait_until(lambda: b.links[0].counters.transferred == 20, what="20 transferred")
        assert texts(drain(broker, "dst", expect=20)) == bodies
    finally:
        b.stop()
    assert len(commits) >= 5, commits  # at most 4 messages (64k) a transaction


def test_a_window_bytes_property_on_a_link_bounds_that_link_only(broker):
    """<property name="windowBytes" value="64k"/> in a <link> bounds that link's units by
    bytes, over imq.bridge.<name>.link.windowBytes=-1 (no byte bound), which the other
    link keeps; both move their 16 KiB messages in order."""
    bounded = link_xml("l1").replace("</link>", '<property name="windowBytes" value="64k"/></link>')
    props = load_properties([], ["imq.bridge.b.link.windowBytes=-1"], environ={})
    b = make_bridge(
        broker,
        bridge_xml(bounded + link_xml("l2", "other", "other2"), dests='<destination ref-name="other2" name="other2"/>'),
        props=props,
    )
    assert b.config.link("l1").window_bytes == 64 * 1024 and b.config.link("l2").window_bytes is None
    bodies = [f"{i:03d}{KIB16}" for i in range(20)]
    send(broker, "src", bodies)
    send(broker, "other", bodies)
    b.start()
    try:
        by_name = {link.name: link for link in b.links}
        assert by_name["l1"].batch.max_bytes == 64 * 1024
        assert by_name["l2"].batch.max_bytes == 0  # no byte bound
        wait_until(lambda: all(link.counters.transferred == 20 for link in b.links), what="20 each")
        assert texts(drain(broker, "dst", expect=20)) == bodies
        assert texts(drain(broker, "other2", expect=20)) == bodies
    finally:
        b.stop()


def record_prefetch(monkeypatch) -> list[tuple[int, int] | int]:
    """What links ask of their host broker source sessions: (count, max_bytes) of
    prefetch_at_least, count of prefetch_at_most."""
    from bridgemgr.providers.embedded.client import EmbeddedSession

    asked: list[tuple[int, int] | int] = []
    monkeypatch.setattr(
        EmbeddedSession, "prefetch_at_least", lambda self, count, max_bytes=0: asked.append((count, max_bytes))
    )
    monkeypatch.setattr(EmbeddedSession, "prefetch_at_most", lambda self, count: asked.append(count), raising=False)
    return asked


def test_a_link_that_saw_big_messages_asks_its_source_to_prefetch_fewer(broker, monkeypatch, tmp_path):
    """windowBytes=64k, window 1000: the first connection asks the source session for 3
    windows of 1000 (and at most 3 x 64k, which mq:// can bound); after 16 KiB messages
    (4 fill 64k) a restarted link asks for 3 x 4, and for at most that many whatever the
    provider URL says. Everything arrives once, in order."""
    asked = record_prefetch(monkeypatch)
    bodies = [f"{i:03d}{KIB16}" for i in range(20)]
    send(broker, "src", bodies[:10])
    props = load_properties([], [f"imq.varhome={tmp_path / 'var'}", "imq.bridge.b.link.windowBytes=64k"], environ={})
    b = make_bridge(broker, bridge_xml(link_xml()), props=props)
    b.start()
    try:
        link = b.links[0]
        wait_until(lambda: link.counters.transferred == 10, what="10 transferred")
        b.stop_link("l")
        send(broker, "src", bodies[10:])
        b.start_link("l")
        wait_until(lambda: link.counters.transferred == 20, what="20 transferred")
        assert texts(drain(broker, "dst", expect=20)) == bodies
    finally:
        b.stop()
    assert asked == [(3000, 3 * 65536), 12, (12, 3 * 65536), 12], asked


def test_a_restarted_service_remembers_the_largest_message_of_a_link(broker, monkeypatch, tmp_path):
    """The size of a link's largest message is kept in its bridge's folder (largest.<link>,
    0600), so a link made again, as a restart of the service does, asks its first
    connection for 3 windows of 4 messages of 16 KiB (64k each), not 3 of 1000."""
    asked = record_prefetch(monkeypatch)
    bodies = [f"{i:03d}{KIB16}" for i in range(20)]
    props = load_properties([], [f"imq.varhome={tmp_path / 'var'}", "imq.bridge.b.link.windowBytes=64k"], environ={})
    for run in (bodies[:10], bodies[10:]):
        send(broker, "src", run)
        b = make_bridge(broker, bridge_xml(link_xml()), props=props)
        b.start()
        try:
            wait_until(lambda b=b: b.links[0].counters.transferred == 10, what="10 transferred")
        finally:
            b.stop()
    assert texts(drain(broker, "dst", expect=20)) == bodies
    assert asked == [(3000, 3 * 65536), 12, (12, 3 * 65536), 12], asked
    kept = props.bridge_dir("b") / "largest.l"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert 16384 < int(kept.read_text()) < 65536 / 3  # the size, an eighth more: still 4 a window
