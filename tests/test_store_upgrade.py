"""docs/upgrade.md, done: a store of schema version 1 (that version's tables,
tests/data/store-schema-1.sql, holding queue messages and a durable subscription with
messages waiting) opened by today's `serve`, migrated with every message kept; then the
page's in-place downgrade, after which the store is version 1's again and is migrated
again on the next start, the messages sent in between kept too."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import DeliveryMode, TextMessage, Topic
from service_support import Daemon, one_bridge_files, send, take

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "Upgrade-Secret-1"
CID, SUB, NEWS = "upgrade-cid", "upgrade-sub", Topic("upg.news")
IDLE = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="upg.idle"/>
  <destination ref-name="dst" name="upg.idle.out"/>
</jmsbridge>
"""


def store_db(daemon: Daemon) -> Path:
    """store.db of the serve's host broker (its start-up line names the store)."""
    found = next(m for line in daemon.lines if (m := re.search(r", store (\S+store\.db)", line)))
    return Path(found.group(1))


def subscribe(daemon: Daemon) -> None:
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        conn.client_id = CID
        conn.create_session().create_durable_subscriber(NEWS, SUB).close()


def publish(daemon: Daemon, *texts: str) -> None:
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        producer = conn.create_session().create_producer(NEWS)
        for text in texts:
            producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT)


def durable_texts(daemon: Daemon, expect: int) -> list[str]:
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        conn.client_id = CID
        conn.start()
        consumer = conn.create_session().create_durable_subscriber(NEWS, SUB)
        got = []
        while len(got) < expect and (m := consumer.receive(10)) is not None:
            got.append(m.text)
        return got


def make_schema_1(db: Path) -> None:
    """Rewrite the stopped store ``db`` as a store of schema version 1: that version's
    tables, every row copied (subs without its owner), meta's schema '1'."""
    old = sqlite3.connect(db)
    tables = {t: old.execute(f"SELECT * FROM {t}").fetchall() for t in ("meta", "msgs", "dests", "xa", "xa_sends")}
    tables["xa_acks"] = old.execute("SELECT * FROM xa_acks").fetchall()
    subs = old.execute("SELECT client_id, name, topic, selector, no_local FROM subs").fetchall()
    old.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    new = sqlite3.connect(db)
    new.executescript((ROOT / "tests" / "data" / "store-schema-1.sql").read_text())
    for table, rows in tables.items():
        for row in rows:
            new.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
    new.executemany("INSERT INTO subs VALUES (?, ?, ?, ?, ?)", subs)
    new.execute("UPDATE meta SET v = '1' WHERE k = 'schema'")
    new.commit()
    new.close()
    db.chmod(0o600)


def schema(db: Path) -> tuple[str, list[str]]:
    """(meta's schema version, the columns of subs)."""
    conn = sqlite3.connect(db)
    try:
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()[0]
        return version, [row[1] for row in conn.execute("PRAGMA table_info(subs)")]
    finally:
        conn.close()


def version_1_columns() -> list[str]:
    conn = sqlite3.connect(":memory:")
    conn.executescript((ROOT / "tests" / "data" / "store-schema-1.sql").read_text())
    return [row[1] for row in conn.execute("PRAGMA table_info(subs)")]


def downgrade_sql() -> str:
    """The in-place downgrade of docs/upgrade.md#rolling-back, as the page gives it."""
    page = (ROOT / "docs" / "upgrade.md").read_text()
    found = re.search(r"^## Rolling back\n.*?^```sql\n(.*?)^```", page, re.S | re.M)
    assert found, "docs/upgrade.md has no sql block under Rolling back"
    return found.group(1)


def test_a_schema_1_store_is_migrated_with_every_message_and_rolled_back_in_place(tmp_path):
    props, _ = one_bridge_files(tmp_path, "upgrade", IDLE, PASSWORD)
    daemon = Daemon(props)
    try:
        subscribe(daemon)
        send(daemon, PASSWORD, "upg.a", *(f"a{i}" for i in range(10)))
        send(daemon, PASSWORD, "upg.b", *(f"b{i}" for i in range(5)))
        publish(daemon, "n0", "n1", "n2")
    finally:
        daemon.stop()
    db = store_db(daemon)
    make_schema_1(db)
    assert schema(db) == ("1", version_1_columns())

    daemon = Daemon(props)  # today's code opens the version 1 store
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        assert [m.text for m in take(daemon, PASSWORD, "upg.a", 10, quiet=0.2)] == [f"a{i}" for i in range(10)]
        assert durable_texts(daemon, 3) == ["n0", "n1", "n2"]
        send(daemon, PASSWORD, "upg.c", "sent after the upgrade")
    finally:
        daemon.stop()
    assert schema(db) == ("2", [*version_1_columns(), "owner"])
    logged = "\n".join(f.read_text() for f in (tmp_path / "var").rglob("log.txt*") if f.is_file())
    assert f"store {db}: upgraded from schema version 1 to 2" in logged

    conn = sqlite3.connect(db)  # rolled back in place, as the page says
    conn.executescript(downgrade_sql())
    conn.close()
    assert schema(db) == ("1", version_1_columns())

    daemon = Daemon(props)  # and upgraded again: nothing lost either way
    try:
        assert [m.text for m in take(daemon, PASSWORD, "upg.b", 5, quiet=0.2)] == [f"b{i}" for i in range(5)]
        assert [m.text for m in take(daemon, PASSWORD, "upg.c", 1, quiet=0.2)] == ["sent after the upgrade"]
        publish(daemon, "n3")
        assert durable_texts(daemon, 1) == ["n3"]
    finally:
        daemon.stop()
    assert schema(db) == ("2", [*version_1_columns(), "owner"])
