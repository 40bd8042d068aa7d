"""Paging: a destination keeps a window of its messages in memory; persistent messages
beyond it wait only in the store and come back in order, through selectors, expiry,
browsing, redelivery, XA and restarts. The windows here are tiny so every test crosses
the boundary many times."""

from __future__ import annotations

import stat
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms import AckMode, DeliveryMode, Queue, TextMessage, Topic, codec, xa
from bridgemgr.jms.xa import Xid
from bridgemgr.props import load_properties
from bridgemgr.providers.embedded import DMQ_NAME, Broker, DestinationLimits, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.host import open_host_broker
from stores import open_at

Q = Queue("backlog")
WINDOW = 5


def started(broker: Broker, client_id: str | None = None):
    conn = EmbeddedConnectionFactory(broker).create_connection()
    if client_id is not None:
        conn.client_id = client_id
    conn.start()
    return conn


def put(conn, n: int, start: int = 0, dest=Q, **kw) -> None:
    producer = conn.create_session().create_producer(dest)
    for i in range(start, start + n):
        m = TextMessage(str(i))
        m.set_int_property("n", i)
        producer.send(m, **kw)


def drain(consumer, timeout: float = 0.2) -> list[str]:
    out = []
    while (m := consumer.receive(timeout)) is not None:
        out.append(m.text)
    return out


def in_memory(broker: Broker, name: str = Q.name) -> int:
    return len(broker.queues[name].browse())


def test_a_backlog_beyond_the_window_waits_in_the_store_and_comes_back_in_order(store_spec):
    broker = open_at(store_spec, memory_window=WINDOW)
    conn = started(broker)
    put(conn, 60)
    assert in_memory(broker) == WINDOW
    depth = broker.destinations()[f"queue:{Q.name}"]
    assert (depth["pending"], depth["unacked"]) == (60, 0) and depth["bytes"] > 60 * 100  # paged ones too
    consumer = conn.create_session().create_consumer(Q)
    got = [consumer.receive(1).text for _ in range(30)]
    put(conn, 20, start=60)  # arrives behind the paged-out ones
    got += drain(consumer)
    assert got == [str(i) for i in range(80)]
    assert in_memory(broker) == 0 and broker.destinations()[f"queue:{Q.name}"]["pending"] == 0
    broker.close()


def test_restart_reads_counts_not_messages(tmp_path, monkeypatch):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    put(started(broker), 500)
    broker.close()
    decoded = []
    decode = codec.decode
    monkeypatch.setattr(codec, "decode", lambda blob: (decoded.append(1), decode(blob))[1])
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    assert decoded == [] and in_memory(broker) == 0
    assert broker.destinations()[f"queue:{Q.name}"]["pending"] == 500
    consumer = started(broker).create_session().create_consumer(Q)
    assert consumer.receive(1).text == "0"
    assert len(decoded) <= WINDOW
    broker.close()


@pytest.mark.slow
def test_the_default_window_holds_a_benchmark_sized_backlog_in_memory(tmp_path):
    """Reading a message back costs a few microseconds: the default window keeps a
    backlog of 20,000 (persistent or not) in memory, none in the store or swap.db."""
    broker = Broker(tmp_path / "s")
    conn = started(broker)
    put(conn, 10_000)
    put(conn, 10_000, start=10_000, delivery_mode=DeliveryMode.NON_PERSISTENT)
    mq = broker.queues[Q.name]
    assert (in_memory(broker), mq.paged, mq.swapped) == (20_000, 0, 0)
    broker.close()


@pytest.mark.slow
def test_a_large_window_is_read_back_a_chunk_at_a_time(tmp_path, monkeypatch):
    """After a restart the first delivery reads one chunk (1,000), not a whole window."""
    broker = Broker(tmp_path / "s", memory_window=50_000)
    put(started(broker), 5_000)
    broker.close()
    decoded = []
    decode = codec.decode
    monkeypatch.setattr(codec, "decode", lambda blob: (decoded.append(1), decode(blob))[1])
    broker = Broker(tmp_path / "s", memory_window=50_000)
    consumer = started(broker).create_session().create_consumer(Q)
    assert consumer.receive(1).text == "0"
    assert len(decoded) == 1_000
    assert drain(consumer) == [str(i) for i in range(1, 5_000)]
    broker.close()


def test_byte_counts_of_paged_messages_stay_right_across_restarts(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    broker.configure_destination(Q, DestinationLimits(max_total_msg_bytes=10**9))
    conn = started(broker)
    put(conn, 30)
    depth = broker.destinations()[f"queue:{Q.name}"]
    assert depth["pending"] == 30 and depth["bytes"] > 30 * 40
    broker.close()
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    assert broker.destinations()[f"queue:{Q.name}"] == depth
    assert len(drain(started(broker).create_session().create_consumer(Q))) == 30
    assert broker.destinations()[f"queue:{Q.name}"] == {"pending": 0, "unacked": 0, "bytes": 0}
    broker.close()


def test_delivery_counts_and_redelivery_cross_the_window_and_restarts(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 12)
    session = conn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(Q)
    assert [consumer.receive(1).text for _ in range(8)] == [str(i) for i in range(8)]
    session.recover()
    again = [consumer.receive(1) for _ in range(9)]
    assert [m.text for m in again] == [str(i) for i in range(9)]
    assert [m.redelivered for m in again] == [True] * 8 + [False]
    broker.store.flush()
    broker.close()  # never acknowledged
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    msgs = []
    consumer = started(broker).create_session().create_consumer(Q)
    while (m := consumer.receive(0.2)) is not None:
        msgs.append(m)
    assert [m.text for m in msgs] == [str(i) for i in range(12)]
    assert [m.delivery_count for m in msgs] == [3] * 8 + [2] + [1] * 3
    broker.close()


def test_a_selector_finds_matches_beyond_the_window_and_leaves_the_rest(store_spec):
    broker = open_at(store_spec, memory_window=WINDOW)
    conn = started(broker)
    put(conn, 100)
    session = conn.create_session()
    assert session.create_consumer(Q, "n = 97").receive(1).text == "97"
    picky = session.create_consumer(Q, "n >= 40 AND n < 43")
    assert drain(picky) == ["40", "41", "42"]
    put(conn, 3, start=100)
    assert session.create_consumer(Q, "n = 101").receive(1).text == "101"
    assert broker.destinations()[f"queue:{Q.name}"]["pending"] == 98
    rest = drain(session.create_consumer(Q))
    assert rest == [str(i) for i in range(103) if i not in (97, 40, 41, 42, 101)]
    broker.close()


def test_a_selector_match_taken_out_of_order_is_redelivered_once(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 30)
    tx = conn.create_session(transacted=True)
    assert tx.create_consumer(Q, "n = 20").receive(1).text == "20"
    tx.rollback()
    tx.close()
    got = drain(conn.create_session().create_consumer(Q))
    assert sorted(got, key=int) == [str(i) for i in range(30)] and len(got) == 30
    broker.close()


def test_paged_messages_that_expired_go_to_the_dmq_when_paged_in(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 10)
    put(conn, 20, start=10, time_to_live=50)
    put(conn, 10, start=30)
    time.sleep(0.1)
    assert drain(conn.create_session().create_consumer(Q)) == [str(i) for i in (*range(10), *range(30, 40))]
    dead = drain(conn.create_session().create_consumer(Queue(DMQ_NAME)))
    assert dead == [str(i) for i in range(10, 30)]
    broker.close()


def test_browsing_reads_paged_messages_a_chunk_at_a_time(store_spec):
    broker = open_at(store_spec, memory_window=WINDOW)
    conn = started(broker)
    put(conn, 40)
    session = conn.create_session()
    browser = iter(session.create_browser(Q))
    assert [next(browser).text for _ in range(12)] == [str(i) for i in range(12)]
    assert in_memory(broker) == WINDOW  # browsing pages nothing in
    assert [m.text for m in browser] == [str(i) for i in range(12, 40)]
    assert [m.text for m in session.create_browser(Q, "n >= 35")] == [str(i) for i in range(35, 40)]
    consumer = session.create_consumer(Q)
    assert [consumer.receive(1).text for _ in range(7)] == [str(i) for i in range(7)]
    assert [m.text for m in session.create_browser(Q)] == [str(i) for i in range(7, 40)]
    broker.close()


def test_a_durable_subscription_pages_and_survives_restart(tmp_path):
    topic = Topic("news")
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker, client_id="c1")
    conn.create_session().create_durable_subscriber(topic, "sub").close()
    put(conn, 40, dest=topic)
    assert broker.destinations()["durable:c1:sub"]["pending"] == 40
    assert len(broker.durable[("c1", "sub")].queue.browse()) == WINDOW
    broker.close()
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    sub = started(broker, client_id="c1").create_session().create_durable_subscriber(topic, "sub")
    assert drain(sub) == [str(i) for i in range(40)]
    broker.close()


def test_priorities_order_the_window_and_seq_orders_beyond(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 10)
    put(conn, 2, start=10, priority=9)
    got = drain(conn.create_session().create_consumer(Q))
    assert got == [str(i) for i in range(12)]  # the urgent two were paged out: seq order
    put(conn, 3)
    put(conn, 1, start=3, priority=9)
    assert drain(conn.create_session().create_consumer(Q)) == ["3", "0", "1", "2"]
    broker.close()


def xid(n: int) -> Xid:
    return Xid(1, f"g{n}".encode(), b"b")


def test_prepared_xa_branches_over_paged_messages_survive_restart(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=3)
    xconn = EmbeddedConnectionFactory(broker).create_xa_connection()
    xconn.start()
    put(xconn, 10)
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(xid(1), xa.TMNOFLAGS)
    consumer = xs.create_consumer(Q)
    taken = [consumer.receive(1).text for _ in range(4)]
    xs.create_producer(Q).send(TextMessage("sent in the branch"))
    res.end(xid(1), xa.TMSUCCESS)
    res.prepare(xid(1))
    broker.close()
    broker = Broker(tmp_path / "s", memory_window=3)
    xconn = EmbeddedConnectionFactory(broker).create_xa_connection()
    xconn.start()
    assert taken == ["0", "1", "2", "3"]
    # 6 waiting; 4 locked by the branch and its prepared send holding its room
    assert broker.destinations()[f"queue:{Q.name}"] == {"pending": 6, "unacked": 5, "bytes": 0}
    session = xconn.create_session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(Q)
    assert [consumer.receive(1).text for _ in range(3)] == ["4", "5", "6"]
    res = xconn.create_xa_session().xa_resource
    res.commit(xid(1), False)
    session.recover()
    assert drain(consumer) == ["4", "5", "6", "7", "8", "9", "sent in the branch"]
    broker.close()


def test_the_window_is_a_broker_property(tmp_path):
    (tmp_path / "broker.properties").write_text(f"imq.varhome={tmp_path / 'var'}\nimq.destination.memory.window=7\n")
    host = open_host_broker(load_properties([tmp_path / "broker.properties"]))
    try:
        assert host.broker.memory_window == 7
    finally:
        host.broker.close()


@pytest.mark.slow
def test_a_flood_waits_for_the_store_instead_of_piling_up_in_memory(tmp_path, monkeypatch):
    from bridgemgr.providers.embedded import store as store_module

    monkeypatch.setattr(store_module, "BEHIND", 64 << 10)
    broker = Broker(tmp_path / "s")
    producer = started(broker).create_session().create_producer(Q)
    most = 0
    for _ in range(5000):
        producer.send(TextMessage("x" * 1024))
        most = max(most, len(broker.store._inserts))
    assert most <= 64 + 2
    assert broker.destinations()[f"queue:{Q.name}"]["pending"] == 5000
    broker.close()


# --- non-persistent messages: the swap file ------------------------------------------------


def swapped(broker: Broker) -> int:
    """Rows in the swap file (read on its own connection: it never commits)."""
    assert broker.swap is not None
    return broker.swap._db.execute("SELECT COUNT(*) FROM swapped").fetchone()[0]


NP = DeliveryMode.NON_PERSISTENT


def test_non_persistent_messages_beyond_the_window_go_to_a_private_swap_file(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 30, delivery_mode=NP)
    put(conn, 10, start=30)  # persistent ones behind them, in the store
    put(conn, 10, start=40, delivery_mode=NP)
    assert in_memory(broker) == WINDOW and swapped(broker) == 35
    assert stat.S_IMODE(broker.swap.path.stat().st_mode) == 0o600
    assert broker.destinations()[f"queue:{Q.name}"]["pending"] == 50
    session = conn.create_session()
    assert session.create_consumer(Q, "n = 45").receive(1).text == "45"
    assert drain(session.create_consumer(Q)) == [str(i) for i in range(50) if i != 45]
    assert swapped(broker) == 0
    broker.close()


def test_the_swap_file_is_emptied_at_start(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    put(conn, 20, delivery_mode=NP)
    put(conn, 3, start=20)
    broker.store.flush()
    swap = broker.swap.path
    broker.swap._db.close()  # a crash: nothing cleans up
    broker.swap = None
    broker.close()
    assert swap.exists()
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    assert swapped(broker) == 0
    assert drain(started(broker).create_session().create_consumer(Q)) == ["20", "21", "22"]
    broker.close()
    assert not swap.exists()


def test_topic_subscribers_and_temporary_queues_swap_too(tmp_path):
    broker = Broker(tmp_path / "s", memory_window=WINDOW)
    conn = started(broker)
    session = conn.create_session()
    topic = Topic("ticks")
    subscriber = session.create_consumer(topic)
    temp = session.create_temporary_queue()
    put(conn, 20, dest=topic, delivery_mode=NP)
    put(conn, 20, dest=temp, delivery_mode=NP)
    assert swapped(broker) == 30
    assert drain(subscriber) == [str(i) for i in range(20)]
    subscriber.close()
    assert drain(session.create_consumer(temp), 0.05)[:3] == ["0", "1", "2"]
    assert swapped(broker) == 0
    broker.close()


# --- a model: random sends, receives, rollbacks, recovers and restarts --------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 12)),
        st.tuples(st.just("receive"), st.integers(1, 12)),
        st.tuples(st.sampled_from(["commit", "rollback", "restart", "send_np"]), st.just(0)),
    ),
    max_size=30,
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, window=st.integers(1, 4))
def test_random_traffic_matches_a_simple_model(tmp_path_factory, ops, window):
    """All at one priority, so the broker must hand out exactly the oldest waiting message
    each time; committed ones never come back, rolled-back ones come back redelivered, with
    their delivery counts; non-persistent ones die with a restart; none appear twice."""
    path = tmp_path_factory.mktemp("model") / "s"
    broker = Broker(path, memory_window=window)
    conn = started(broker)
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(Q)
    producer = conn.create_session().create_producer(Q)
    waiting: dict[int, int] = {}  # number -> deliveries so far
    persistent: set[int] = set()
    held: list[int] = []
    counter = 0
    try:
        for op, n in ops:
            if op in ("send", "send_np"):
                for _ in range(n if op == "send" else 1):
                    mode = DeliveryMode.PERSISTENT if op == "send" else DeliveryMode.NON_PERSISTENT
                    producer.send(TextMessage(str(counter)), delivery_mode=mode)
                    waiting[counter] = 0
                    if op == "send":
                        persistent.add(counter)
                    counter += 1
            elif op == "receive":
                for _ in range(n):
                    free = sorted(set(waiting) - set(held))
                    # (the broker hands out what is waiting at once, paged out or not: a
                    # receive with nothing free need not wait 50 ms to show it gets nothing)
                    m = consumer.receive(0.05 if free else 0.001)
                    if not free:
                        assert m is None
                        continue
                    assert m is not None and int(m.text) == free[0], (m and m.text, free[:5])
                    waiting[free[0]] += 1
                    assert m.delivery_count == waiting[free[0]]
                    assert m.redelivered == (waiting[free[0]] > 1)
                    held.append(free[0])
            elif op == "commit":
                tx.commit()
                for k in held:
                    del waiting[k]
                held = []
            elif op == "rollback":
                tx.rollback()
                held = []
            else:  # restart: held ones return; non-persistent ones are gone
                broker.close()
                broker = Broker(path, memory_window=window)
                conn = started(broker)
                tx = conn.create_session(transacted=True)
                consumer = tx.create_consumer(Q)
                producer = conn.create_session().create_producer(Q)
                held = []
                waiting = {k: d for k, d in waiting.items() if k in persistent}
        tx.rollback()
        rest = [int(t) for t in drain(conn.create_session().create_consumer(Q), 0.05)]
        assert rest == sorted(waiting)
    finally:
        broker.close()


@pytest.mark.slow
def test_the_paging_model_holds_with_many_messages(tmp_path):
    """Thousands through a window of 10 with a consumer that rolls back every seventh."""
    broker = Broker(tmp_path / "s", memory_window=10)
    conn = started(broker)
    put(conn, 3000)
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(Q)
    got: list[str] = []
    batch = 0
    while True:
        msgs = []
        while len(msgs) < 13 and (m := consumer.receive(0.2)) is not None:
            msgs.append(m)  # (an empty receive ends the batch: the last one cost 13 x 0.2 s)
        if not msgs:
            break
        batch += 1
        if batch % 7 == 0:
            tx.rollback()
            continue
        tx.commit()
        got += [m.text for m in msgs]
    assert got == [str(i) for i in range(3000)]
    broker.close()


def test_a_stomp_flood_without_receipts_waits_for_the_store(tmp_path, monkeypatch):
    from bridgemgr.providers.embedded import store as store_module
    from bridgemgr.stompbridge.frames import Frame, encode_frame
    from stomp_support import Driver

    monkeypatch.setattr(store_module, "BEHIND", 64 << 10)
    broker = Broker(tmp_path / "s")
    most = [0]
    add = store_module.Store.add_many

    def counting_add(self, *args, **kw):
        ticket = add(self, *args, **kw)
        most[0] = max(most[0], len(self._inserts))
        return ticket

    monkeypatch.setattr(store_module.Store, "add_many", counting_add)
    driver = Driver(broker)
    driver.connect()
    frame = encode_frame(
        Frame("SEND", {"destination": "/queue/flood", "persistent": "true"}, b"x" * 1024), driver.version
    )
    for _ in range(10):
        driver.feed(frame * 300)
    assert 0 < most[0] <= 64 + 300  # (a read's SENDs are recorded together: one feed's 300)
    assert broker.destinations()["queue:flood"]["pending"] == 3000
    driver.close()
    broker.close()


def test_a_durable_subscription_and_its_paged_messages_survive_a_restart(store_spec):
    # The subscription's key holds a NUL (client id \0 name), which PostgreSQL text refuses.
    broker = open_at(store_spec, memory_window=WINDOW)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.client_id = "c1"
    session = conn.create_session()
    session.create_durable_subscriber(Topic("news"), "d1").close()
    producer = session.create_producer(Topic("news"))
    for i in range(60):
        producer.send(TextMessage(str(i)), delivery_mode=DeliveryMode.PERSISTENT)
    conn.close()
    broker.close()
    broker = open_at(store_spec, memory_window=WINDOW)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.client_id = "c1"
    conn.start()
    assert drain(conn.create_session().create_durable_subscriber(Topic("news"), "d1")) == [str(i) for i in range(60)]
    conn.close()
    broker.close()


def damage_row(store_spec: str, seq: int, blob: bytes, table: str = "msgs") -> None:
    """Overwrite the blob of row ``seq`` of ``table`` behind the broker's back (disk
    damage, or a row of a newer version)."""
    from stores import jdbc

    settings = jdbc(store_spec)
    if settings is None:
        import sqlite3

        with sqlite3.connect(f"{store_spec}/store.db") as db:
            assert db.execute(f"UPDATE {table} SET blob = ? WHERE seq = ?", (blob, seq)).rowcount == 1
        return
    conn = settings.connect()
    try:
        cur = conn.execute(f'UPDATE "{settings.schema}".{table} SET blob = %s WHERE seq = %s', (blob, seq))
        assert cur.rowcount == 1
        conn.commit()
    finally:
        conn.close()


def prepared_send_seqs(store_spec: str) -> list[int]:
    from stores import jdbc

    settings = jdbc(store_spec)
    if settings is None:
        import sqlite3

        with sqlite3.connect(f"{store_spec}/store.db") as db:
            return [seq for (seq,) in db.execute("SELECT seq FROM xa_sends")]
    conn = settings.connect()
    try:
        return [seq for (seq,) in conn.execute(f'SELECT seq FROM "{settings.schema}".xa_sends')]
    finally:
        conn.close()


def rejected_rows(broker: Broker) -> list[tuple]:
    """(seq, qkey, blob, reason) of the store's table rejected, read through its database."""
    db = broker.store.database
    if hasattr(db, "_reader"):
        rows = db._reader.execute("SELECT seq, qkey, blob, reason FROM rejected").fetchall()
    else:
        conn = db.settings.connect()
        try:
            rows = conn.execute(f'SELECT seq, qkey, blob, reason FROM "{db.settings.schema}".rejected').fetchall()
        finally:
            conn.close()
    return [(seq, qkey, bytes(blob), reason) for seq, qkey, blob, reason in rows]


def test_a_stored_row_that_is_not_a_message_is_set_aside_and_the_rest_delivered(store_spec, caplog):
    """A damaged row (or one a newer version wrote) failed every page-in of its queue, so
    nothing behind it was delivered again. It is now moved to the store's table rejected
    with the reason and an ERROR line, leaves the queue's counts, and the rest come in
    order, across a restart too."""
    broker = open_at(store_spec, memory_window=WINDOW)
    put(started(broker), 12)
    seqs = sorted(seq for seq, _, _ in broker.store.page(f"q:{Q.name}", 0, 100))
    broker.close()
    damage_row(store_spec, seqs[7], b"\x7fnot a message")
    broker = open_at(store_spec, memory_window=WINDOW)
    try:
        consumer = started(broker).create_session().create_consumer(Q)
        assert drain(consumer) == [str(i) for i in range(12) if i != 7]
        depth = broker.destinations()[f"queue:{Q.name}"]
        assert (depth["pending"], depth["unacked"]) == (0, 0)
        broker.store.flush()
        assert broker.metrics()["store"]["rejected"] == 1  # (/metrics: imq_store_rows_rejected_total)
        ((seq, qkey, blob, reason),) = rejected_rows(broker)
        assert (seq, qkey, blob) == (seqs[7], f"q:{Q.name}", b"\x7fnot a message") and reason
        assert any(
            f"row {seqs[7]} of queue://{Q.name} is not a message" in r.getMessage() and r.levelname == "ERROR"
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
    finally:
        broker.close()
    broker = open_at(store_spec, memory_window=WINDOW)
    try:
        assert f"queue:{Q.name}" not in broker.destinations()  # no row of it left to recover
        assert len(rejected_rows(broker)) == 1
    finally:
        broker.close()


def test_rows_of_a_prepared_branch_that_are_not_messages_are_set_aside_and_the_broker_opens(store_spec, caplog):
    """A prepared XA branch's rows are read when the store opens: one that was not a
    message stopped the broker from opening at all. The message it acknowledged and its
    send are set aside (the table rejected, an ERROR line each), the broker opens, and the
    branch commits the rest."""
    broker = open_at(store_spec, memory_window=WINDOW)
    xconn = EmbeddedConnectionFactory(broker).create_xa_connection()
    xconn.start()
    put(xconn, 6)
    seqs = sorted(seq for seq, _, _ in broker.store.page(f"q:{Q.name}", 0, 100))
    xs = xconn.create_xa_session()
    res = xs.xa_resource
    res.start(xid(1), xa.TMNOFLAGS)
    consumer = xs.create_consumer(Q)
    assert [consumer.receive(1).text for _ in range(2)] == ["0", "1"]
    xs.create_producer(Q).send(TextMessage("sent in the branch"))
    res.end(xid(1), xa.TMSUCCESS)
    res.prepare(xid(1))
    broker.close()
    (send,) = prepared_send_seqs(store_spec)
    damage_row(store_spec, seqs[0], b"\x7fnot a message")  # "0", acknowledged in the branch
    damage_row(store_spec, send, b"\x7fnot one either", table="xa_sends")
    broker = open_at(store_spec, memory_window=WINDOW)
    try:
        xconn = EmbeddedConnectionFactory(broker).create_xa_connection()
        xconn.start()
        xconn.create_xa_session().xa_resource.commit(xid(1), False)
        assert drain(xconn.create_session().create_consumer(Q)) == ["2", "3", "4", "5"]
        broker.store.flush()
        assert sorted((seq, blob) for seq, _, blob, _ in rejected_rows(broker)) == [
            (seqs[0], b"\x7fnot a message"),
            (send, b"\x7fnot one either"),
        ]
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any(f"row {seqs[0]} of queue://{Q.name} is not a message" in e for e in errors), errors
        assert any(f"send {send} of prepared XA branch" in e for e in errors), errors
        assert broker.metrics()["store"]["rejected"] == 2
    finally:
        broker.close()
    broker = open_at(store_spec, memory_window=WINDOW)
    try:
        assert f"queue:{Q.name}" not in broker.destinations() and prepared_send_seqs(store_spec) == []
    finally:
        broker.close()
