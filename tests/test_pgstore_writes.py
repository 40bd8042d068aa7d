"""The jdbc store's batches on a real PostgreSQL: a batch's messages go as one statement
of arrays (not a statement per row), its lone deletes as one, and every row lands or
leaves exactly as recorded; a batch with a row that cannot be written writes nothing. A
waiting sender's batch (one message and the acknowledgements beside it) is one statement
in autocommit, and in an HA instance it writes nothing once the lease is another's."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from bridgemgr.jms.errors import StoreError
from bridgemgr.providers.embedded.cluster import lease_fence
from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_store(postgresql, monkeypatch):
    """A jdbc store in a schema of its own, and the statements its writes send."""
    schema = f"imq_t_{uuid.uuid4().hex[:12]}"
    db = PostgresDatabase(JdbcSettings(postgresql.conninfo(), schema), False)
    sent: list[str] = []
    record(monkeypatch, sent)
    try:
        yield db, sent, lambda: rows(postgresql, schema)
    finally:
        db.close()


def record(monkeypatch, sent: list[str]) -> None:
    """Note the text of each statement a cursor sends (execute or executemany)."""
    for name in ("execute", "executemany"):
        real = getattr(psycopg.Cursor, name)

        def recording(self, query, *args, _real=real, **kwargs):
            sent.append(str(query))
            return _real(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, name, recording)


def rows(postgresql, schema: str) -> dict[int, tuple[str, int, bytes]]:
    with psycopg.connect(**postgresql.conninfo()) as conn:
        found = conn.execute(f'SELECT seq, qkey, dcount, blob FROM "{schema}".msgs').fetchall()
    return {seq: (qkey, dcount, bytes(blob)) for seq, qkey, dcount, blob in found}


def test_a_batch_inserts_its_messages_in_one_statement_and_deletes_lone_rows_in_one(pg_store):
    db, sent, stored = pg_store
    keys = ("q:orders", "d:client\0sub", "t:prices")  # (a durable's key holds a NUL)
    batch = {seq: (keys[seq % 3], seq % 2, f"m{seq}".encode() * 40) for seq in range(1, 601)}
    db.write({seq: list(row) for seq, row in batch.items()}, set(), {}, [])
    assert len(sent) == 1 and "unnest" in sent[0]
    assert stored() == {seq: (key.replace("\0", "\ufffe"), d, blob) for seq, (key, d, blob) in batch.items()}
    sent.clear()
    gone = {2, 4, 6, 100, 300, 301, 302, 303, 599}
    db.write({}, gone, {}, [])
    assert sum("ANY" in s for s in sent) == 1 and sum("BETWEEN" in s for s in sent) == 1
    assert set(stored()) == set(range(1, 601)) - gone


def test_a_batch_with_a_row_already_there_fails_and_writes_none_of_its_rows(pg_store):
    db, _, stored = pg_store
    db.write({1: ["q:a", 0, b"one"]}, set(), {}, [])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.write({seq: ["q:a", 0, b"x"] for seq in (5, 1, 6)}, {1}, {}, [])
    assert stored() == {1: ("q:a", 0, b"one")}
    db.write({seq: ["q:a", 0, b"x"] for seq in (5, 6)}, {1}, {}, [])  # the connection is usable again
    assert set(stored()) == {5, 6}


def test_a_waiting_senders_batch_is_one_statement_without_begin_or_commit(pg_store):
    db, sent, stored = pg_store
    db.write({seq: ["q:a", 0, b"m%d" % seq] for seq in range(1, 5)}, set(), {}, [])
    sent.clear()
    db.write({5: ["d:c\0s", 2, b"five"]}, {1, 3, 4}, {}, [])
    assert len(sent) == 1 and sent[0].startswith("WITH gone AS (DELETE"), sent
    assert stored() == {2: ("q:a", 0, b"m2"), 5: ("d:c\ufffes", 2, b"five")}
    sent.clear()
    db.write({6: ["q:a", 0, b"six"]}, set(), {}, [])  # alone: a plain INSERT
    assert len(sent) == 1 and sent[0].startswith("INSERT INTO msgs"), sent
    assert db._conn.autocommit is False  # (the other batches are transactions)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.write({6: ["q:a", 0, b"again"]}, {2}, {}, [])
    assert stored() == {2: ("q:a", 0, b"m2"), 5: ("d:c\ufffes", 2, b"five"), 6: ("q:a", 0, b"six")}
    db.write({seq: ["q:a", 0, b"x"] for seq in (7, 8)}, {2}, {}, [])  # a transaction again
    assert set(stored()) == {5, 6, 7, 8}


def test_an_ha_instances_one_statement_batch_writes_nothing_once_its_lease_is_anothers(postgresql, monkeypatch):
    schema = f"imq_t_{uuid.uuid4().hex[:12]}"
    table = f'"{schema}".leases'
    with psycopg.connect(**postgresql.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f"CREATE TABLE {table}(brokerid TEXT PRIMARY KEY, state TEXT NOT NULL, generation BIGINT NOT NULL, "
            "taken_by TEXT)"
        )
        conn.execute(f"INSERT INTO {table} VALUES ('B1', 'live', 7, NULL)")
    settings = JdbcSettings(postgresql.conninfo(), schema, brokerid="B1", generation=7, fence=lease_fence(table))
    db = PostgresDatabase(settings, False)
    told: list[str] = []
    db.on_fenced = told.append
    sent: list[str] = []
    record(monkeypatch, sent)
    try:
        db.write({1: ["q:a", 0, b"one"]}, set(), {}, [])
        db.write({2: ["q:a", 0, b"two"]}, {1}, {}, [])
        assert len(sent) == 2 and all(s.startswith("WITH fence AS (SELECT 1 FROM") for s in sent), sent
        assert rows(postgresql, schema) == {2: ("q:a", 0, b"two")}
        with psycopg.connect(**postgresql.conninfo(), autocommit=True) as conn:
            conn.execute(f"UPDATE {table} SET generation = 8 WHERE brokerid = 'B1'")  # B1 started again
        for deletes in (set(), {2}):
            with pytest.raises(StoreError, match="generation 7 was replaced by generation 8"):
                db.write({3: ["q:a", 0, b"three"]}, deletes, {}, [])
        assert rows(postgresql, schema) == {2: ("q:a", 0, b"two")}
        assert len(told) == 2 and "replaced" in told[0]
    finally:
        db.close()
