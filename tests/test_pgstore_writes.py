"""The jdbc store's batches on a real PostgreSQL: a batch's messages go as one statement
of arrays (not a statement per row), its lone deletes as one, and every row lands or
leaves exactly as recorded; a batch with a row that cannot be written writes nothing."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_store(postgresql, monkeypatch):
    """A jdbc store in a schema of its own, and the statements its writes send."""
    schema = f"imq_t_{uuid.uuid4().hex[:12]}"
    db = PostgresDatabase(JdbcSettings(postgresql.conninfo(), schema), False)
    sent: list[str] = []
    executemany = psycopg.Cursor.executemany

    def recording(self, query, params_seq, **kwargs):
        sent.append(str(query))
        return executemany(self, query, params_seq, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "executemany", recording)
    try:
        yield db, sent, lambda: rows(postgresql, schema)
    finally:
        db.close()


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
