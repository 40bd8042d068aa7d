"""A store whose disk fills up: the producer gets "store full: <path>: no space left",
nothing stored or recorded is lost (acknowledgements made while full included), and
writes resume by themselves once space is back, without a restart.

The disk is a real one where the test may mount a 1 MiB tmpfs (root): SQLite's write
then fails with ENOSPC inside its WAL. Everywhere (and also as root), the same store runs
against SQLite's max_page_count, which fails the same write with the same SQLITE_FULL.
Before, the first such write left "cannot rollback - no transaction is active" and a
store that refused everything until a restart.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException, StoreFull, TransactionRolledBackException
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.providers.embedded.store import Store
from disk_support import mount_tmpfs, unmount
from waiting import wait_for

BLOB = b"m" * 1024


class Disk:
    """Where a store fills up: ``tmpfs`` (a real full filesystem, a filler file to delete
    to free space) or ``page_count`` (SQLite's max_page_count, raised to free space)."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind = kind
        self.directory = base / "fs"
        if kind == "tmpfs":
            # (a fsynced one-message batch appends about 50 KiB of 16 KiB WAL frames)
            if reason := mount_tmpfs(self.directory, "4m"):
                pytest.skip(reason)
            self.filler = self.directory / "filler"
            self.filler.write_bytes(b"f" * 1024 * 1024)

    def limit(self, store: Store) -> None:
        """Leave 800 KiB of room."""
        if self.kind == "page_count":
            db = store.database._db  # type: ignore[attr-defined]
            pages, size = (db.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "page_size"))
            db.execute(f"PRAGMA max_page_count={pages + 800 * 1024 // size}")

    def free(self, store: Store) -> None:
        if self.kind == "tmpfs":
            self.filler.unlink()
        else:
            store.database._db.execute("PRAGMA max_page_count=1000000")  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.kind == "tmpfs":
            unmount(self.directory)


@pytest.fixture(params=["tmpfs", "page_count"])
def disk(request, tmp_path):
    d = Disk(request.param, tmp_path)
    yield d
    d.close()


def full_error(store: Store) -> str:
    return rf"^store full: {re.escape(store.path)}: no space left$"


def reopened(directory: Path) -> dict[int, tuple[str, int, bytes]]:
    store = Store(directory)
    try:
        rows = {}
        for qkey in store.load().backlogs:  # every stored message, read back as a consumer would
            rows.update({seq: (qkey, dcount, blob) for seq, dcount, blob in store.page(qkey, 0, 1 << 30)})
        return rows
    finally:
        store.close()


def test_a_waiting_writer_is_told_store_full_and_writes_resume_by_themselves(disk, caplog):
    caplog.set_level(logging.INFO, "bridgemgr.providers.embedded.store")
    store = Store(disk.directory)
    store.load()
    disk.limit(store)
    durable: list[int] = []
    seq = 0
    with pytest.raises(StoreFull, match=full_error(store)):
        while True:
            seq += 1
            store.add_many([(seq, "q:a", BLOB, 0)])
            store.wait(store.ticket())
            durable.append(seq)
    failed = seq  # its caller was told; its row is kept and written once space is back
    assert len(durable) > 50 and store.full
    with pytest.raises(StoreFull, match=full_error(store)):
        store.check_room()
    for acked in durable[:10]:  # acknowledgements while full: kept, written later
        store.remove(acked)
    store.mark_delivered(durable[10], 3)
    time.sleep(0.5)  # several retries with the disk still full
    assert store.full
    disk.free(store)
    wait_for(lambda: not store.full, what="writes to resume once space was back")
    store.check_room()
    store.add_many([(failed + 1, "q:a", BLOB, 0)])
    store.wait(store.ticket())
    store.close()
    on_disk = reopened(disk.directory)
    assert set(on_disk) == {*durable[10:], failed, failed + 1}
    assert on_disk[durable[10]][1] == 3
    assert all(blob == BLOB for _, _, blob in on_disk.values())
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("store full:")]) == 1, messages
    assert len([m for m in messages if "space is back after" in m]) == 1, messages


def test_what_nobody_waits_for_is_kept_while_full_and_written_once_space_is_back(disk):
    """What nobody waits for (a STOMP SEND without receipt): the writer thread meets the
    full disk; what it held stays pending and new messages are refused. Its linger is cut
    to 2 ms so that it writes small batches as this loop goes (at its 0.5 s the first
    batch alone would be about 2 MB, more than the freed space)."""
    store = Store(disk.directory)
    store.linger = 0.002
    store.load()
    disk.limit(store)
    recorded: list[int] = []
    seq = 0
    with pytest.raises(StoreFull, match=full_error(store)):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seq += 1
            store.check_room()
            store.add_many([(seq, "q:a", BLOB, 0)])
            recorded.append(seq)
            if seq % 20 == 0:
                time.sleep(0.005)  # let the writer thread take a batch
    store.remove(recorded[0])
    disk.free(store)
    wait_for(lambda: not store.full, what="writes to resume")
    store.close()
    assert set(reopened(disk.directory)) == set(recorded[1:])


def drain(broker: Broker) -> list[str]:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue("q"))
    got = []
    while (m := consumer.receive(0.2)) is not None:
        got.append(m.text)  # type: ignore[attr-defined]
    conn.close()
    return got


def test_a_full_broker_refuses_persistent_sends_only_and_acknowledgements_are_kept(tmp_path):
    """Broker level, on max_page_count: a persistent send (and a transaction holding one) gets
    StoreFull, a ResourceAllocationException, and is in no queue; non-persistent sends,
    receiving and acknowledging go on; after space is back and a restart, every accepted
    message is there and what was acknowledged while full stays consumed."""
    broker = Broker(tmp_path / "b")
    store = broker.store
    assert store is not None
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    session = conn.create_session()
    producer = session.create_producer(Queue("q"))
    db = store.database._db  # type: ignore[attr-defined]
    db.execute(f"PRAGMA max_page_count={db.execute('PRAGMA page_count').fetchone()[0] + 100}")
    sent: list[str] = []
    with pytest.raises(ResourceAllocationException, match=full_error(store)):
        for i in range(100_000):
            producer.send(TextMessage(f"p{i:05d}" + "x" * 1000))
            sent.append(f"p{i:05d}")
    assert broker.queue_depth("q") == len(sent)  # the refused one is in no queue
    producer.send(TextMessage("np"), delivery_mode=DeliveryMode.NON_PERSISTENT)
    tx = conn.create_session(transacted=True)
    tx.create_producer(Queue("q")).send(TextMessage("in a transaction"))
    with pytest.raises(TransactionRolledBackException, match="store full: "):
        tx.commit()
    consumer = session.create_consumer(Queue("q"))
    taken = [consumer.receive(1).text[:6] for _ in range(5)]  # type: ignore[union-attr]
    assert taken == sent[:5]
    conn.close()
    db.execute("PRAGMA max_page_count=1000000")
    wait_for(lambda: not store.full, what="writes to resume")
    broker.close()
    again = Broker(tmp_path / "b")
    try:
        assert [t[:6] for t in drain(again)] == sent[5:]
    finally:
        again.close()


def test_postgresql_disk_full_is_no_space_and_other_errors_are_not():
    """SQLSTATE 53100 ("could not extend file ...: No space left on device") is a full store
    (retried); a lost connection or a constraint is not (the store fails as before)."""
    psycopg_errors = pytest.importorskip("psycopg.errors")
    from bridgemgr.providers.embedded.pgstore import PostgresDatabase

    database = PostgresDatabase.__new__(PostgresDatabase)  # no server: only the classification
    assert database.no_space(psycopg_errors.DiskFull('could not extend file "base/1/2": No space left'))
    assert not database.no_space(psycopg_errors.OperationalError("server closed the connection"))
    assert not database.no_space(psycopg_errors.UniqueViolation("duplicate key"))


def test_messages_of_a_batch_that_found_the_disk_full_are_still_paged_in(tmp_path):
    """A batch that found no space goes back in front of what is pending; the broker pages
    a queue's messages in through ``page``, which merges the pending inserts of the queues
    that have some: the returned batch's queues count too, so its messages are not missing
    from the queue until the disk has room again."""
    disk = Disk("page_count", tmp_path)
    store = Store(disk.directory)
    store.load()
    try:
        disk.limit(store)
        with store.lock:  # one batch, more than the 800 KiB left
            for seq in range(1, 2001):
                store.add_many([(seq, "q:a", BLOB, 0)])
        with pytest.raises(StoreFull):
            store.flush()
        assert [seq for seq, _, _ in store.page("q:a", 0, 5000)] == list(range(1, 2001))
        disk.free(store)
        wait_for(lambda: not store.full, what="writes to resume")
    finally:
        store.close()
