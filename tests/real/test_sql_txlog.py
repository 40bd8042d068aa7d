"""The XA transaction log's SQL flavour (bridgemgr/xa/sqllog.py) on a real PostgreSQL 15
through psycopg 3, as the host broker's jdbc store uses it: records survive close and
reopen (in the driver's own paramstyle and in the "format" one pgstore gives), DONE deletes
rows, a damaged row stops open naming the table and the gtrid, bridges sharing the table
never see each other's records, no transaction is left open between calls, bridges creating
the table at the same moment all start, a lost connection costs one write and not the
following ones, and a coordinator killed (SIGKILL, by its fault hook) after logging its
decision in PostgreSQL has that transaction committed by recovery at two embedded brokers,
while an unlogged prepared one is rolled back (presumed abort).

Each test has a schema of its own (the log's table starts absent, as in a new database).
Run as a script, this file is the coordinator process the crash test kills."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from bridgemgr.jms import Queue, TextMessage  # noqa: E402
from bridgemgr.jms.xa import Xid  # noqa: E402
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory  # noqa: E402
from bridgemgr.xa.coordinator import Coordinator, Faults  # noqa: E402
from bridgemgr.xa.recovery import Recovery  # noqa: E402
from bridgemgr.xa.registry import ResourceManager, rm_name  # noqa: E402
from bridgemgr.xa.sqllog import SqlTxLog  # noqa: E402
from bridgemgr.xa.txlog import CommitRecord, Participant, TxLogError, frame  # noqa: E402
from waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TABLE = "imq_bridge_txlog"
SRC, DST = Queue("src"), Queue("dst")
PG_ENV = "IMQTEST_SQL_TXLOG_PG"  # the crash child's connection settings (JSON)
LOG = logging.getLogger("test.sql_txlog")


def connector(conninfo: dict[str, str], schema: str, app: str = "imqtest") -> Callable[[], Any]:
    """A DB-API connect function whose connections use ``schema`` (as pgstore's do)."""

    def connect() -> Any:
        return psycopg.connect(**conninfo, options=f"-c search_path={schema}", application_name=app, connect_timeout=10)

    return connect


@dataclass
class Schema:
    """A schema of its own in the test database, and a way to look at it from outside."""

    conninfo: dict[str, str]
    name: str

    def log(self, bridge: str, paramstyle: str = psycopg.paramstyle, app: str = "imqtest") -> SqlTxLog:
        return SqlTxLog(connector(self.conninfo, self.name, app), bridge, paramstyle)

    def execute(self, sql: str, *args: Any) -> list[tuple]:
        with connector(self.conninfo, self.name, "imqtest-admin")() as conn:
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def rows(self, bridge: str) -> list[tuple[str, str]]:
        return self.execute(f"SELECT gtrid, record FROM {TABLE} WHERE bridge = %s ORDER BY gtrid", bridge)

    def sessions(self, app: str) -> list[str]:
        """The states of the server sessions of application ``app`` (pg_stat_activity)."""
        return [s for (s,) in self.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s", app)]


@pytest.fixture
def schema(postgresql) -> Schema:
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(**postgresql.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return Schema(postgresql.conninfo(), name)


def commit(n: int, bridge: str = "b") -> CommitRecord:
    """A commit record whose gtrid has a NUL and a high byte and whose RM names are not
    ASCII: the hex text must carry any bytes, which PostgreSQL's TEXT alone would not."""
    gtrid = bridge.encode() + b"|\x00\xff." + str(n).encode()
    return CommitRecord(
        gtrid,
        (
            Participant(f"{bridge}:quelle-ü", Xid(0x494D5142, gtrid, b"src#1")),
            Participant(f"{bridge}:ziel-✓", Xid(0x494D5142, gtrid, b"dst#2")),
        ),
    )


# --- the log on its own -----------------------------------------------------------------------------


@pytest.mark.parametrize("paramstyle", sorted({psycopg.paramstyle, "format"}))
def test_records_survive_close_and_reopen(schema, paramstyle):
    app = f"txlog-{uuid.uuid4().hex[:8]}"
    log = schema.log("b", paramstyle, app)
    assert log.open() == {}
    assert schema.sessions(app) == ["idle"], "open must not leave its read's transaction open"
    log.log_commit(commit(1))
    log.log_commits([commit(2), commit(3)])
    assert schema.sessions(app) == ["idle"]
    log.close()
    wait_for(lambda: schema.sessions(app) == [], 5, "the log's session to end at close")
    assert schema.rows("b") == sorted((r.gtrid.hex(), frame(r).hex()) for r in (commit(1), commit(2), commit(3)))
    types = schema.execute(
        "SELECT data_type FROM information_schema.columns WHERE "
        "table_schema = current_schema() AND table_name = %s AND "
        "column_name = 'record'",
        TABLE,
    )
    assert types == [("text",)]

    again = schema.log("b", paramstyle)
    assert again.open() == {r.gtrid: r for r in (commit(1), commit(2), commit(3))}
    with pytest.raises(TxLogError, match="cannot write"):
        again.log_commit(commit(2))  # the primary key refuses a second decision
    assert again.live() == {r.gtrid: r for r in (commit(1), commit(2), commit(3))}
    again.close()
    with pytest.raises(TxLogError, match="closed"):
        again.log_commit(commit(4))


def test_forget_deletes_rows(schema):
    log = schema.log("b")
    log.open()
    log.log_commit(commit(1))
    log.log_commit(commit(2), forget=[commit(1).gtrid])  # one transaction: forget + record
    assert [g for g, _ in schema.rows("b")] == [commit(2).gtrid.hex()]
    log.log_done([commit(2).gtrid])
    assert schema.rows("b") == [] and log.live() == {}
    log.log_done([b"never-logged"])  # forgetting what is not there is no error
    log.close()
    again = schema.log("b")
    assert again.open() == {}
    again.close()


def flip_a_digit(gtrid: str, record: str) -> tuple[str, str]:
    middle = len(record) // 2
    return gtrid, record[:middle] + ("0" if record[middle] != "0" else "1") + record[middle + 1 :]


DAMAGE: dict[str, Callable[[str, str], tuple[str, str]]] = {
    "a flipped digit": flip_a_digit,
    "cut short": lambda gtrid, record: (gtrid, record[:-6]),
    "not hex": lambda gtrid, record: (gtrid, "not a record"),
    "another gtrid's record": lambda gtrid, record: (gtrid, frame(commit(99)).hex()),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_row_stops_open_naming_it(schema, damage):
    log = schema.log("b")
    log.open()
    log.log_commits([commit(1), commit(2)])
    log.close()
    gtrid, record = schema.rows("b")[0]
    _new_gtrid, new_record = DAMAGE[damage](gtrid, record)
    schema.execute(f"UPDATE {TABLE} SET record = %s WHERE bridge = 'b' AND gtrid = %s", new_record, gtrid)
    app = f"txlog-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TxLogError) as err:
        schema.log("b", app=app).open()
    text = str(err.value)
    assert f"table {TABLE}" in text and f"gtrid {gtrid}" in text, text
    assert "not a valid commit record" in text and "recovery of bridge b stopped" in text and "list txn" in text, text
    wait_for(lambda: schema.sessions(app) == [], 5, "the refused log's connection to close")
    # other bridges' rows are not this bridge's business: their damage never stops it
    other = schema.log("other")
    assert other.open() == {}
    other.close()


def test_two_bridges_share_the_table_without_seeing_each_other(schema):
    one, two = schema.log("one"), schema.log("two")
    assert one.open() == {} and two.open() == {}
    shared = commit(1)  # the same gtrid in both: the key is (bridge, gtrid)
    one.log_commits([shared, commit(2, "one")])
    two.log_commits([shared, commit(3, "two")])
    one.log_done([shared.gtrid])
    assert two.live() == {shared.gtrid: shared, commit(3, "two").gtrid: commit(3, "two")}
    one.close()
    two.close()
    one, two = schema.log("one"), schema.log("two")
    assert one.open() == {commit(2, "one").gtrid: commit(2, "one")}
    assert two.open() == {shared.gtrid: shared, commit(3, "two").gtrid: commit(3, "two")}
    assert len(schema.execute(f"SELECT 1 FROM {TABLE}")) == 3
    one.close()
    two.close()


def test_bridges_creating_the_table_at_the_same_moment_all_open(postgresql):
    """PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic: of sessions creating the
    table at once, the losers fail on pg_type's unique index; before the fix at least one
    bridge failed to open in each of 20 rounds of 4 like these."""
    bridges = 4
    for _ in range(5):
        name = f"t{uuid.uuid4().hex[:12]}"
        with psycopg.connect(**postgresql.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        barrier = threading.Barrier(bridges, timeout=30)
        plain = connector(postgresql.conninfo(), name)

        def connect(plain: Any = plain, barrier: threading.Barrier = barrier) -> Any:
            conn = plain()
            barrier.wait()  # everyone connected: the CREATEs go together
            return conn

        errors: list[BaseException] = []

        def start(bridge: str, errors: list[BaseException] = errors) -> None:
            log = SqlTxLog(connect, bridge, psycopg.paramstyle)
            try:
                log.open()
                log.log_commit(commit(1, bridge))
            except BaseException as exc:
                errors.append(exc)
            finally:
                log.close()

        threads = [threading.Thread(target=start, args=(f"b{i}",)) for i in range(bridges)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(Schema(postgresql.conninfo(), name).execute(f"SELECT 1 FROM {TABLE}")) == bridges


def test_a_lost_connection_costs_one_write_only(schema):
    """The server ends the log's session (a restart, an administrator, a timeout): the write
    in flight fails, as a TxLogError (presumed abort for that transaction), and the next one
    goes through a new connection instead of failing until the bridge restarts."""
    app = f"txlog-{uuid.uuid4().hex[:8]}"
    log = schema.log("b", app=app)
    log.open()
    log.log_commit(commit(1))
    assert schema.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", app
    ) == [(True,)]
    wait_for(lambda: schema.sessions(app) == [], 5, "the session to end")
    with pytest.raises(TxLogError, match="cannot write"):
        log.log_commit(commit(2))
    log.log_commit(commit(3))
    assert schema.sessions(app) == ["idle"]
    assert log.live() == {commit(1).gtrid: commit(1), commit(3).gtrid: commit(3)}
    log.close()
    again = schema.log("b")
    assert again.open() == {commit(1).gtrid: commit(1), commit(3).gtrid: commit(3)}
    again.close()


# --- recovery from the log in PostgreSQL --------------------------------------------------------------


def put(broker: Broker, dest: Queue, *texts: str) -> None:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    producer = conn.create_session().create_producer(dest)
    for t in texts:
        producer.send(TextMessage(t))
    conn.close()


def take(broker: Broker, dest: Queue) -> list[str]:
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(dest)
    out = []
    while (m := consumer.receive(0.05)) is not None:
        out.append(m.text)
    conn.close()
    return out


def crash_child(a_dir: str, b_dir: str, fault: str) -> None:
    """The coordinator process: bridge "b" moves one message from broker a's src to broker
    b's dst in one two-phase XA transaction, its log in PostgreSQL; the fault hook kills it
    with SIGKILL at ``fault`` (prepared: nothing logged; logged: the decision is in the
    table, no branch committed)."""
    settings = json.loads(os.environ[PG_ENV])
    a, b = Broker(a_dir, sync=True), Broker(b_dir, sync=True)
    log = SqlTxLog(connector(settings["conninfo"], settings["schema"]), "b", psycopg.paramstyle)
    log.open()
    coordinator = Coordinator("b", log, Faults(f"{fault}:kill:1"))
    source = EmbeddedConnectionFactory(a).create_xa_connection()
    source.start()
    target = EmbeddedConnectionFactory(b).create_xa_connection()
    s_source, s_target = source.create_xa_session(), target.create_xa_session()
    tx = coordinator.begin()
    tx.enlist(s_source.xa_resource, rm_name("b", "a"), "a")
    tx.enlist(s_target.xa_resource, rm_name("b", "b"), "b")
    s_target.create_producer(DST).send(s_source.create_consumer(SRC).receive(5))
    tx.commit()
    print(f"the fault hook did not kill at {fault}", file=sys.stderr)
    sys.exit(3)


@pytest.mark.crash
def test_recovery_commits_what_postgresql_logged_and_rolls_back_the_rest(tmp_path, schema):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a, b = Broker(a_dir, sync=True), Broker(b_dir, sync=True)
    put(a, SRC, "undecided", "decided")
    a.close()
    b.close()
    here = Path(__file__).resolve()  # the child imports bridgemgr of this tree and tests/waiting.py
    env = {
        **os.environ,
        PG_ENV: json.dumps({"conninfo": schema.conninfo, "schema": schema.name}),
        "PYTHONPATH": os.pathsep.join([str(here.parents[2]), str(here.parents[1])]),
    }
    for fault in ("prepared", "logged"):  # each run takes the next message of src
        done = subprocess.run(
            [sys.executable, __file__, str(a_dir), str(b_dir), fault],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    [(gtrid_hex, _)] = schema.rows("b")  # only the second decision was logged

    a, b = Broker(a_dir, sync=True), Broker(b_dir, sync=True)
    assert len(a.xa_recover()) == 2 and len(b.xa_recover()) == 2
    log = schema.log("b")
    live = log.open()
    assert [g.hex() for g in live] == [gtrid_hex]
    [record] = live.values()
    assert {p.rm for p in record.participants} == {"b:a", "b:b"}
    assert {p.xid for p in record.participants} <= set(a.xa_recover()) | set(b.xa_recover())
    coordinator = Coordinator("b", log, Faults(""))
    rms = [
        ResourceManager(rm_name("b", ref), ref, EmbeddedConnectionFactory(broker))
        for ref, broker in (("a", a), ("b", b))
    ]
    recovery = Recovery(coordinator, rms, LOG)
    try:
        assert recovery.start() is True
        assert [(len(r.committed), len(r.rolled_back)) for r in recovery.last] == [(1, 1), (1, 1)]
        assert a.xa_recover() == [] and b.xa_recover() == []
        assert take(b, DST) == ["decided"] and take(a, SRC) == ["undecided"]
        assert log.live() == {}
    finally:
        recovery.close()
        coordinator.close()
        for rm in rms:
            rm.close()
        a.close()
        b.close()
    assert schema.rows("b") == [], "the settled decision is deleted from the table"


if __name__ == "__main__":
    crash_child(*sys.argv[1:4])
