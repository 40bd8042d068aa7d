"""The embedded store's leader/follower group commit: durable when wait() returns, the
waiting caller writes, concurrent waiters share batches, a failed write fails them all."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from bridgemgr.providers.embedded.store import Store, StoreError, delete_runs
from waiting import wait_for


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    s.load()
    yield s
    s.close()


def rows_on_disk(store: Store) -> set[int]:
    """What another connection reads: only committed batches."""
    with sqlite3.connect(store.path) as db:
        return {seq for (seq,) in db.execute("SELECT seq FROM msgs")}


def test_the_waiting_caller_writes_its_batch_itself(store, monkeypatch):
    writers: list[str] = []
    write = store._write
    monkeypatch.setattr(store, "_write", lambda *a: (writers.append(threading.current_thread().name), write(*a))[1])
    store.add_many([(1, "q:a", b"one", 0)])
    store.wait(store.ticket())
    assert writers == [threading.current_thread().name]
    assert rows_on_disk(store) == {1}


def test_concurrent_waiters_are_all_durable_and_share_batches(store):
    threads, per_thread = 8, 50
    barrier = threading.Barrier(threads)
    failures: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                seq = t * 1000 + i + 1
                store.add_many([(seq, "q:a", b"x" * 100, 0)])
                store.wait(store.ticket())
                assert seq in rows_on_disk(store)
        except BaseException as exc:  # reported below
            failures.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failures
    assert len(rows_on_disk(store)) == threads * per_thread
    assert store.stats()["batches"] <= threads * per_thread


def test_a_ticket_taken_while_a_batch_is_written_waits_for_that_batch(store, monkeypatch):
    started, release = threading.Event(), threading.Event()
    write = store._write

    def slow_write(*args):
        started.set()
        release.wait(5)
        write(*args)

    monkeypatch.setattr(store, "_write", slow_write)
    store.add_many([(1, "q:a", b"one", 0)])
    leader = threading.Thread(target=store.flush)
    leader.start()
    assert started.wait(5)
    ticket = store.ticket()  # nothing pending: the batch in flight holds row 1
    done = threading.Event()
    follower = threading.Thread(target=lambda: (store.wait(ticket), done.set()))
    follower.start()
    assert not done.wait(0.2)  # not before the batch in flight is committed
    release.set()
    leader.join(5)
    follower.join(5)
    assert done.is_set() and rows_on_disk(store) == {1}


def test_a_cancelled_insert_leaves_nothing_to_wait_for(store):
    store.add_many([(1, "q:a", b"one", 0)])
    ticket = store.ticket()
    store.remove(1)
    store.wait(ticket, timeout=1)
    assert rows_on_disk(store) == set()


def test_a_failed_write_fails_the_waiter_and_every_later_change(store, monkeypatch):
    def broken(*args):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "_write", broken)
    store.add_many([(1, "q:a", b"one", 0)])
    with pytest.raises(StoreError, match="disk is full"):
        store.wait(store.ticket())
    with pytest.raises(StoreError, match="failed"):
        store.add_many([(2, "q:a", b"two", 0)])


def test_what_nobody_waits_for_is_written_by_the_writer_thread(store):
    store.add_many([(1, "q:a", b"one", 0)])
    store.remove(2)  # an acknowledgement of an older row: nobody waits for it
    for _ in range(500):
        if store.stats()["batches"]:
            break
        threading.Event().wait(0.01)
    assert rows_on_disk(store) == {1}


def test_an_op_its_caller_waits_for_leaves_the_writer_thread_asleep(store):
    """XA prepares and commits are written by their waiting caller: waking the writer
    thread for them cost two context switches each (a third of a 2PC's CPU)."""
    wait_for(lambda: store._idle, 5, "the writer thread idle")
    assert store._idle
    store.prepare_xa("x1", [(7, "q:a", b"blob")], [], waited=True)
    assert store._idle  # not woken: the caller writes it
    store.wait(store.ticket())
    store.op("xa_commit", "x1", waited=True)
    store.wait(store.ticket())
    assert rows_on_disk(store) == {7}
    store.add_many([(8, "q:a", b"other", 0)])  # nobody waits for this one: the writer thread's
    wait_for(lambda: rows_on_disk(store) == {7, 8}, 5, "rows 7 and 8 on disk")
    assert rows_on_disk(store) == {7, 8}


def test_a_syncing_store_never_writes_a_message_consumed_while_its_batch_lingers(tmp_path):
    """With sync every promise is waited for, so the writer thread lingers SYNC_LINGER: a
    row added and removed meanwhile (a STOMP SEND without receipt, consumed at once) is
    neither inserted nor deleted; one nobody removes is still written without a waiter."""
    store = Store(tmp_path, sync=True)
    store.load()
    try:
        store.add_many([(1, "q:a", b"consumed", 0)])
        store.add_many([(2, "q:a", b"kept", 0)])
        time.sleep(0.05)  # far longer than LINGER: the 2 ms linger wrote both by now
        store.remove(1)
        deadline = time.monotonic() + 5
        while rows_on_disk(store) != {2} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rows_on_disk(store) == {2}
        assert store.stats()["rows"] == 1  # row 1 never touched the disk
    finally:
        store.close()


def test_deletes_go_as_runs_of_consecutive_seqs_and_remove_exactly_those_rows(store):
    assert delete_runs({9, 1, 2, 3, 5, 7, 8}) == ([(5,)], [(1, 3), (7, 9)])
    assert delete_runs({4}) == ([(4,)], [])
    for seq in range(1, 13):
        store.add_many([(seq, "q:a", b"x", 0)])
    store.flush()
    for seq in (2, 3, 4, 6, 8, 9, 11):
        store.remove(seq)
    store.flush()
    assert rows_on_disk(store) == {1, 5, 7, 10, 12}


def test_the_wal_is_checkpointed_every_forty_megabytes(store):
    """Inserts and their deletes seconds later dirty the same pages: a longer WAL copies
    each page once per checkpoint (measured: a fifth less writer CPU per message). The
    store runs them; SQLite's own is there for one that falls four intervals behind."""
    assert store.database._checkpoint_frames == 10000  # 4 KiB pages
    assert store.database._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (40000,)


def checkpoint_every(monkeypatch, frames: int) -> None:
    """New stores checkpoint every ``frames`` frames of WAL (4 KiB pages)."""
    from bridgemgr.providers.embedded import store as module

    monkeypatch.setattr(module, "WAL_CHECKPOINT_BYTES", frames * 4096)


def recording_checkpoints(store: Store, monkeypatch) -> list[str]:
    """The names of the threads that run ``store``'s checkpoints, in order."""
    threads: list[str] = []
    checkpoint = store.database.checkpoint
    monkeypatch.setattr(
        store.database, "checkpoint", lambda: (threads.append(threading.current_thread().name), checkpoint())[1]
    )
    return threads


def test_a_checkpoint_due_after_a_write_on_an_event_loop_is_run_by_the_writer_thread(tmp_path, monkeypatch):
    """SQLite's automatic checkpoint ran in the commit that crossed the interval, on the
    thread that committed: a STOMP or mq:// send written on the event loop (write_now)
    waited 7-10 ms for the WAL to be copied. The writer thread runs it now, and write_now
    leaves the writes to a waiting thread until it has (the loop never waits for one)."""
    checkpoint_every(monkeypatch, 40)
    store = Store(tmp_path)
    store.linger = 60.0  # the writer thread writes nothing of its own meanwhile
    store.load()
    threads = recording_checkpoints(store, monkeypatch)
    try:
        seq, refused = 0, 0
        while not store.checkpoints:
            seq += 1
            store.add_many([(seq, "q:a", b"x" * 1000, 0)])
            if seq > 1:
                store.remove(seq - 1)
            if not store.write_now(store.ticket()):  # a checkpoint wanted: the pool waits
                refused += 1
                wait_for(lambda: store.checkpoints, what="the writer thread's checkpoint")
            assert seq < 2000, "no checkpoint after 2,000 writes of 40 frames' interval"
        assert refused == 1
        assert threads == [f"store-writer:{store.path}"]
        store.add_many([(seq + 1, "q:a", b"x", 0)])
        assert store.write_now(store.ticket())  # written on the loop again, the WAL started over
        assert not store.database.checkpoint_due()
        assert rows_on_disk(store) == {seq, seq + 1}
    finally:
        store.close()


def test_a_waiting_sender_runs_a_due_checkpoint_itself(tmp_path, monkeypatch):
    """Off an event loop the writer of the batch that made a checkpoint due runs it at
    once (as SQLite's own did), and the WAL starts over at the next write."""
    checkpoint_every(monkeypatch, 40)
    store = Store(tmp_path)
    store.load()
    threads = recording_checkpoints(store, monkeypatch)
    try:
        seq = 0
        while not store.checkpoints:
            seq += 1
            store.add_many([(seq, "q:a", b"x" * 1000, 0)])
            store.wait(store.ticket())
            assert seq < 2000, "no checkpoint after 2,000 writes of 40 frames' interval"
        assert threads == [threading.current_thread().name]
        store.add_many([(seq + 1, "q:a", b"x", 0)])
        store.wait(store.ticket())
        assert not store.database.checkpoint_due()
        assert len(rows_on_disk(store)) == seq + 1
    finally:
        store.close()


def test_a_new_store_has_4_kib_pages_and_one_with_16_kib_pages_keeps_them(tmp_path):
    """A producer waiting for each send commits one message at a time, and each commit
    writes its dirty pages whole to the WAL: 16 KiB pages cost a one-message commit
    about 1.6 times the CPU of 4 KiB ones. A store made with 16 KiB pages (versions of
    2026-11-27 to 2026-12-07) opens as it is, its rows intact, and is checkpointed after
    as many bytes of WAL."""
    new = Store(tmp_path / "new")
    new.load()
    new.close()
    with sqlite3.connect(tmp_path / "new" / "store.db") as db:
        assert db.execute("PRAGMA page_size").fetchone() == (4096,)
    (tmp_path / "old").mkdir()
    with sqlite3.connect(tmp_path / "old" / "store.db") as db:  # as a store made before
        db.execute("PRAGMA page_size=16384")
        db.execute("PRAGMA journal_mode=WAL")
    old = Store(tmp_path / "old")
    old.load()
    old.add_many([(1, "q:a", b"kept", 0)])
    old.close()
    old = Store(tmp_path / "old")
    try:
        assert old.load().backlogs == {"q:a": 1}
        assert old.page("q:a", 0, 10) == [(1, 0, b"kept")]
        assert old.database._db.execute("PRAGMA page_size").fetchone() == (16384,)
        assert old.database._checkpoint_frames == 2500
        assert old.database._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (10000,)
    finally:
        old.close()


def test_a_batch_inserts_its_messages_in_multi_row_statements(store):
    """sqlite3 lets go of the GIL around each statement it steps: a statement per message
    handed the GIL to the event loop and back once per row. 600 messages (two full
    statements and a shorter last one) take three INSERTs, and every row and its
    delivery count, queue and blob land as recorded."""
    steps: list[str] = []
    store.database._db.set_trace_callback(steps.append)
    with store.lock:  # one batch: the writer thread cannot take part of it meanwhile
        for seq in range(1, 601):
            store.add_many([(seq, f"q:{seq % 3}", f"m{seq}".encode(), seq % 2)])
    store.flush()
    store.database._db.set_trace_callback(None)
    assert sum(s.startswith("INSERT INTO msgs") for s in steps) == 3
    with sqlite3.connect(store.path) as db:
        rows = db.execute("SELECT seq, qkey, dcount, blob FROM msgs ORDER BY seq").fetchall()
    assert rows == [(seq, f"q:{seq % 3}", seq % 2, f"m{seq}".encode()) for seq in range(1, 601)]


def test_a_consumed_message_no_longer_counts_as_pending_bytes(tmp_path):
    """Removing a message whose insert is still pending cancels it, and its bytes stop
    counting towards BEHIND: senders are not made to wait (nor the linger cut short) for
    messages that are already consumed and will never be written."""
    store = Store(tmp_path, sync=True)
    store.load()
    try:
        blob = b"m" * (1 << 20)
        for seq in range(1, 41):  # 40 MiB sent and consumed within the linger
            store.add_many([(seq, "q:a", blob, 0)])
            store.remove(seq)
        assert not store.behind
        store.remove_all([])  # nothing: no change
        for seq in range(41, 81):  # 40 MiB sent and waiting: behind
            store.add_many([(seq, "q:a", blob, 0)])
        assert store.behind
        store.remove_all(range(41, 81))
        assert not store.behind
    finally:
        store.close()


@pytest.mark.slow
def test_senders_writing_batch_after_batch_leave_the_writer_thread_asleep(store):
    """While senders write their own batches (a persistent send waits for its batch), each
    taking what the acknowledgements left, the writer thread sleeps through its lingers:
    it was woken by every batch, about once per message (17,777 wake-ups in 20,000 sends
    of benchmarks/broker.py)."""
    wakes: list[int] = []
    wait = store._written.wait

    def counted(timeout=None):
        if threading.current_thread() is store._writer:
            wakes.append(1)
        return wait(timeout)

    store._written.wait = counted
    sent = [0, 0]
    until = time.monotonic() + 1.2  # past two lingers: the writer thread's turns come

    def send(t: int) -> None:
        while time.monotonic() < until:
            sent[t] += 1
            seq = sent[t] * 2 + t
            store.add_many([(seq, "q:a", b"x" * 100, 0)])
            if sent[t] > 1:
                store.remove(seq - 2)  # an acknowledgement nobody waits for: wakes the writer
            store.wait(store.ticket())

    senders = [threading.Thread(target=send, args=(t,)) for t in range(2)]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    assert min(sent) > 50 and len(wakes) <= 10, (sent, len(wakes))
    store.remove_all(sent[t] * 2 + t for t in range(2))  # left for the writer thread
    deadline = time.monotonic() + 5
    while rows_on_disk(store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rows_on_disk(store) == set()


@pytest.mark.slow
def test_a_sender_waiting_for_each_batch_does_not_wake_the_writer_thread_each_time(store):
    """Each send woke the idle writer thread, which found its batch taken by the sender
    and slept again: a wake-up per message. Once woken for nothing it looks again only
    after a linger; what nobody waits for is still written within a linger or two."""
    wakes: list[int] = []
    wait = store._work.wait

    def counted(timeout=None):
        if threading.current_thread() is store._writer:
            wakes.append(1)
        return wait(timeout)

    store._work.wait = counted
    seq, until = 0, time.monotonic() + 1.2
    while time.monotonic() < until:
        seq += 1
        store.add_many([(seq, "q:a", b"x" * 100, 0)])
        store.wait(store.ticket())
    assert seq > 100 and len(wakes) <= 10, (seq, len(wakes))
    store.add_many([(seq + 1, "q:a", b"nobody waits", 0)])
    deadline = time.monotonic() + 5
    while seq + 1 not in rows_on_disk(store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(rows_on_disk(store)) == seq + 1


def test_a_batch_of_one_statement_is_written_without_begin_and_commit(store):
    """A single statement is atomic by itself: a send or an acknowledgement written alone
    skips two round trips, a send with the acknowledgements recorded beside it goes as one
    INSERT into the send_acks view (its trigger does both); any other batch of more is
    one transaction."""
    seen: list[str] = []
    store.database._db.set_trace_callback(seen.append)
    store.add_many([(1, "q:a", b"one", 0)])
    store.wait(store.ticket())
    assert [s.split()[0] for s in seen] == ["INSERT"]
    assert rows_on_disk(store) == {1}
    for seq in (2, 3, 4):
        store.add_many([(seq, "q:a", b"x", 0)])
    store.flush()
    seen.clear()
    store.add_many([(5, "q:a", b"five", 0)])
    store.remove(1)
    store.remove(3)
    store.wait(store.ticket())
    assert len(set(seen)) == 1  # (the trigger's statements are traced as the INSERT's text)
    assert seen[0].startswith("INSERT INTO send_acks(") and seen[0].endswith(("'[1,3]')", "'[3,1]')"))
    assert rows_on_disk(store) == {2, 4, 5}
    seen.clear()
    store.add_many([(6, "q:a", b"six", 0), (7, "q:a", b"seven", 0)])
    store.remove(2)
    store.wait(store.ticket())
    assert [s.split()[0] for s in seen] == ["BEGIN", "INSERT", "DELETE", "COMMIT"]
    assert rows_on_disk(store) == {4, 5, 6, 7}


def test_a_send_whose_insert_fails_leaves_the_acknowledgements_beside_it_unwritten(tmp_path):
    """The send_acks statement is atomic: when its row cannot go in, the deletes of the
    trigger are rolled back with it (the waiter hears the error; nothing half-written)."""
    store = Store(tmp_path)
    store.load()
    try:
        store.add_many([(1, "q:a", b"one", 0), (2, "q:a", b"two", 0)])
        store.flush()
        with sqlite3.connect(store.path) as other:  # seq 3 taken behind the broker's back
            other.execute("INSERT INTO msgs(seq, qkey, dcount, blob) VALUES (3, 'q:b', 0, x'00')")
        store.add_many([(3, "q:a", b"three", 0)])
        store.remove(1)
        with pytest.raises(StoreError, match="UNIQUE"):
            store.wait(store.ticket())
        assert rows_on_disk(store) == {1, 2, 3}  # 1 still there: its delete rolled back
    finally:
        store.close()


def test_many_acknowledgements_beside_a_send_take_a_transaction(store):
    """Past SEND_ACKS_MAX deletes (a consumer that caught up on a backlog) the batch is
    BEGIN..COMMIT with runs of deletes, not a long JSON list."""
    from bridgemgr.providers.embedded.store import SEND_ACKS_MAX

    for seq in range(1, SEND_ACKS_MAX + 2):
        store.add_many([(seq, "q:a", b"x", 0)])
    store.flush()
    seen: list[str] = []
    store.database._db.set_trace_callback(seen.append)
    store.add_many([(1000, "q:a", b"y", 0)])
    for seq in range(1, SEND_ACKS_MAX + 2):
        store.remove(seq)
    store.wait(store.ticket())
    assert seen[0] == "BEGIN IMMEDIATE"
    assert rows_on_disk(store) == {1000}


def test_a_failed_checkpoint_fails_no_write_and_leaves_them_to_sqlite(tmp_path, monkeypatch, caplog):
    """A checkpoint that fails is not the batch's failure: the waiter hears nothing of it,
    one warning is logged, and SQLite's own automatic checkpoint is left to do them."""
    checkpoint_every(monkeypatch, 40)
    store = Store(tmp_path)
    store.load()
    tried: list[int] = []

    def broken() -> None:
        tried.append(1)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store.database, "checkpoint", broken)
    try:
        for seq in range(1, 400):
            store.add_many([(seq, "q:a", b"x" * 1000, 0)])
            store.wait(store.ticket())
        assert tried == [1]
        assert [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()] == [
            f"store {store.path}: a WAL checkpoint failed (disk I/O error); SQLite's own checkpoints take over"
        ]
        assert len(rows_on_disk(store)) == 399
    finally:
        store.close()


def test_a_checkpoint_no_longer_due_stops_being_wanted_at_the_next_write_off_the_loop(tmp_path):
    """Wanted by a write on a loop, then made needless (SQLite's own checkpoint ran, or
    another writer's): the next write off the loop forgets it, so write_now writes on the
    loop again and the writer thread does not write empty batches for it."""
    store = Store(tmp_path)
    store.linger = 60.0
    store.load()
    try:
        with store.lock:
            store._checkpoint_wanted = True  # (as write_now leaves it)
        store.add_many([(1, "q:a", b"x", 0)])
        store.wait(store.ticket())  # the pool's write (or the writer thread's): nothing is due
        assert not store._checkpoint_wanted and store.checkpoints == 0
        store.add_many([(2, "q:a", b"y", 0)])
        assert store.write_now(store.ticket())
        assert rows_on_disk(store) == {1, 2}
    finally:
        store.close()
