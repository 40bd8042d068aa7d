"""HA takeover end to end (docs/ha.md): three `serve` instances of one cluster on a real
PostgreSQL server, each owning one JMS bridge; jb1's transacted link moves messages between
two queues of a fourth, plain broker M. Killed with SIGKILL mid-transfer, jb1's owner is taken
over: jb1 is STARTED on another instance within two monitor intervals and every message
arrives once, in order (the XA log is in the shared database, so recovery on the new owner
settles what the dead one left in doubt). A SIGSTOPped owner that comes back after the
takeover finds its lease gone, stops its bridge, learns it was taken over and ends (what
broker M had handed its frozen consumer comes back then, so that part may arrive out of
order, but once); started again, it runs nothing B owns. The taker also serves the dead
instance's store: its queues' messages, durable subscriptions and prepared XA branches, to
clients whose address list fails over to it. The XA log refuses a commit decision from a
broker that no longer owns the bridge (the fence)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue
from ha_support import MONITOR, PASSWORD, Cluster, host_xml, link_xml
from service_support import Daemon, one_bridge_files, send
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EMPTY = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb"/>
"""


@pytest.fixture(scope="module")
def m_service(tmp_path_factory):
    """Broker M, one for the module's tests (each moves messages on queues of its own)."""
    base = tmp_path_factory.mktemp("m")
    props, _ = one_bridge_files(base, "M", EMPTY, PASSWORD, activelist="")
    daemon = Daemon(props)
    yield daemon
    daemon.stop()


@dataclass(frozen=True)
class BrokerM:
    """Broker M and this test's queues on it: ``inq`` the link's source, ``outq`` its target."""

    daemon: Daemon
    inq: str
    outq: str

    @property
    def address(self) -> str:
        return self.daemon.address


@pytest.fixture
def broker_m(m_service) -> BrokerM:
    tag = uuid.uuid4().hex[:8]
    return BrokerM(m_service, f"ha.in.{tag}", f"ha.out.{tag}")


class Receiver:
    """Takes the test's ha.out queue of broker M on a thread of its own, keeping each text
    as it comes."""

    def __init__(self, m: BrokerM) -> None:
        self.texts: list[str] = []
        self._halt = threading.Event()
        self._conn = connect(f"mq://{m.address}", username="admin", password=PASSWORD)
        self._consumer = self._conn.create_session().create_consumer(Queue(m.outq))
        self._conn.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            message = self._consumer.receive(0.2)
            if message is not None:
                self.texts.append(message.text)

    def wait(self, count: int, timeout: float) -> list[str]:
        wait_for(lambda: len(self.texts) >= count, timeout, f"{count} texts on ha.out")
        quiet_for(lambda: len(self.texts), 1.5, timeout)  # anything more (a duplicate) shows up now
        return list(self.texts)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self._conn.close()


def sent(m: BrokerM, texts: list[str]) -> None:
    for i in range(0, len(texts), 500):
        send(m.daemon, PASSWORD, m.inq, *texts[i : i + 500])


def three_instances(tmp_path, postgresql, m: BrokerM) -> Cluster:
    return Cluster(
        tmp_path / "cluster",
        postgresql,
        {"jb1": link_xml("jb1", m.address, m.inq, m.outq), "jb2": host_xml("jb2"), "jb3": host_xml("jb3")},
    )


def kill_the_owner_mid_transfer(tmp_path, postgresql, m: BrokerM, count: int) -> None:
    cluster = three_instances(tmp_path, postgresql, m)
    receiver = Receiver(m)
    try:
        b, c = cluster.start("B", "jb2"), cluster.start("C", "jb3")
        texts = [f"m{i:05d}" for i in range(count)]
        sent(m, texts)
        a = cluster.start("A", "jb1")
        assert a.bridges == {"jb1": "STARTED"}, a.lines
        wait_for(lambda: len(receiver.texts) >= count // 5, 120)
        killed = time.monotonic()
        a.kill()
        assert len(receiver.texts) < count, "the link moved everything before the kill"
        started = wait_for(
            lambda: b.when("bridge jb1 (JMS): STARTED") or c.when("bridge jb1 (JMS): STARTED"), 4 * MONITOR
        )
        assert started - killed <= 2 * MONITOR, f"jb1 started {started - killed:.1f} s after the kill"
        owner = b if b.when("bridge jb1 (JMS): STARTED") else c
        assert {n: (r["state"], r["owner"]) for n, r in owner.listed().items()}["jb1"] == ("STARTED", owner.brokerid)
        got = receiver.wait(count, 120 + count / 50)
        assert len(got) == count and got == texts, (len(got), len(set(got)), count)
    finally:
        receiver.close()
        cluster.stop()


def test_kill_9_of_the_owner_mid_transfer(tmp_path, postgresql, broker_m):
    kill_the_owner_mid_transfer(tmp_path, postgresql, broker_m, 600)


@pytest.mark.timeout(1800)
def test_kill_9_of_the_owner_moving_3000_messages(tmp_path, postgresql, broker_m):
    kill_the_owner_mid_transfer(tmp_path, postgresql, broker_m, 3_000)


def test_a_stopped_owner_that_comes_back_does_not_run_its_bridge(tmp_path, postgresql, broker_m):
    cluster = Cluster(
        tmp_path / "cluster",
        postgresql,
        {"jb1": link_xml("jb1", broker_m.address, broker_m.inq, broker_m.outq), "jb2": host_xml("jb2")},
    )
    receiver = Receiver(broker_m)
    try:
        a, b = cluster.start("A", "jb1"), cluster.start("B", "jb2")
        texts = [f"m{i:05d}" for i in range(300)]
        sent(broker_m, texts[:100])
        receiver.wait(100, 60)
        a.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: b.when("bridge jb1 (JMS): STARTED"), 4 * MONITOR)
        sent(broker_m, texts[100:200])
        # B moves what M gives its consumer; what M handed the frozen A's consumer (whose
        # connection is still open) comes back when A, resumed, stops its bridge.
        wait_for(lambda: len(receiver.texts) > 100, 60)
        a.proc.send_signal(signal.SIGCONT)
        # Resumed, A finds its lease gone: it stops its bridge, learns it was taken over
        # (its store too: its writes are fenced) and ends; B runs jb1 alone.
        assert a.proc.wait(6 * MONITOR) == 1
        a.stop()
        out = "\n".join(a.lines)
        assert "broker A generation 1 was taken over by broker B of HA cluster" in out
        assert out.endswith("start it again to rejoin")
        assert "bridge jb1 (JMS): STARTED" not in "\n".join(line for t, line in a.seen if t > stopped)
        sent(broker_m, texts[200:])
        got = receiver.wait(300, 60)
        assert len(got) == 300 and sorted(got) == texts
        assert got[:100] == texts[:100] and got[200:] == texts[200:]
        assert {n: (r["state"], r["owner"]) for n, r in b.listed().items()} == {
            "jb1": ("STARTED", "B"),
            "jb2": ("STARTED", "B"),
        }
        assert b.when("took over broker A") - stopped <= 2 * MONITOR + 1
        # Started again, A joins afresh: jb1 stays B's (rule 2), A runs nothing.
        a = cluster.start("A", "jb1")
        assert a.bridges == {}, a.lines
        assert {n: (r["state"], r["owner"]) for n, r in a.listed().items()} == {"jb1": ("-", "B"), "jb2": ("-", "B")}
    finally:
        if cluster.instances:
            cluster.instances[0].proc.send_signal(signal.SIGCONT)
        receiver.close()
        cluster.stop()


def test_the_store_and_the_xa_log_fence_an_owner_that_was_taken_over(postgresql):
    from bridgemgr.jms.errors import StoreError
    from bridgemgr.jms.xa import Xid
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster, store_settings
    from bridgemgr.providers.embedded.pgstore import PostgresDatabase
    from bridgemgr.xa.sqllog import SqlTxLog
    from bridgemgr.xa.txlog import CommitRecord, Participant, TxLogError

    database = postgresql.create_database("fence" + str(int(time.time() * 1000)))

    def props(brokerid: str):
        return load_properties(
            [],
            [
                "imq.cluster.ha=true",
                "imq.cluster.clusterid=f1",
                f"imq.brokerid={brokerid}",
                "imq.persist.store=jdbc",
                f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
            ],
            environ={},
        )

    def record(gtrid: bytes) -> CommitRecord:
        return CommitRecord(gtrid, (Participant("jb1:m", Xid(1, gtrid, b"m#1")),))

    a, b = open_cluster(props("A"), "a", {}), open_cluster(props("B"), "b", {})
    assert a.claim(["jb1"]) == ["jb1"] and b.claim(["jb1"]) == []
    store_a = PostgresDatabase(store_settings(props("A"), a.generation), sync=True)  # A's host broker store
    store_a.write({1: ["q:x", 0, b"one"]}, set(), {}, [])
    connect_a, style = store_settings(props("A"), a.generation).txlog_sql()
    connect_b, _ = store_settings(props("B"), b.generation).txlog_sql()
    log_a, log_b = SqlTxLog(connect_a, "jb1", style), SqlTxLog(connect_b, "jb1", style)
    try:
        log_a.open()
        log_a.log_commits([record(b"g1")])
        assert list(log_b.open()) == [b"g1"]  # reading is not fenced; writing is
        with pytest.raises(TxLogError, match="fenced: bridge jb1 is not owned by broker B"):
            log_b.log_commits([record(b"g0")])
        # A's lease runs out (A paused); B takes A over, and with it jb1 and its decisions.
        a._transaction(
            lambda cur: cur.execute(
                "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 second' WHERE brokerid = 'A'"
            )
        )
        assert b.take_over() == ("A", ["jb1"])
        assert b.owners() == {"jb1": "B"}
        assert list(log_b.open()) == [b"g1"]
        with pytest.raises(TxLogError, match="fenced: broker A generation 1 was replaced"):
            log_a.log_commits([record(b"g2")])
        assert not a.renew()
        with pytest.raises(StoreError, match=r"fenced: broker A generation 1 was replaced by generation 2 \(taken"):
            store_a.write({2: ["q:x", 0, b"two"]}, set(), {}, [])
        assert store_a.page("q:x", 0, 10) == [(1, 0, b"one")]  # (B has no broker to move it into)
        log_b.log_commits([record(b"g3")], forget=[b"g1"])
        assert list(log_b.open()) == [b"g3"]
    finally:
        log_a.close()
        log_b.close()
        store_a.close()
        a.leave()
        b.leave()


def subscription_owners(cluster: Cluster, brokerid: str) -> list[tuple[str, str, str | None]]:
    """(client id, name, owner) of the durable subscriptions in ``brokerid``'s store."""
    import psycopg

    from bridgemgr.providers.embedded.cluster import instance_schema

    with psycopg.connect(**cluster.postgresql.conninfo(cluster.database)) as db:
        return db.execute(
            f'SELECT client_id, name, owner FROM "{instance_schema(cluster.clusterid, brokerid)}".subs'
        ).fetchall()


def test_the_taker_serves_the_dead_instances_store_and_clients_fail_over(tmp_path, postgresql):
    from bridgemgr import connect_xa
    from bridgemgr.jms import TextMessage, Topic, xa
    from bridgemgr.jms.xa import Xid

    cluster = Cluster(tmp_path / "cluster", postgresql, {"jb1": host_xml("jb1")})
    try:
        a, b = cluster.start("A", "jb1"), cluster.start("B", "")
        both = f"mq://{a.address},mq://{b.address}"  # a client's address list: A first
        with connect(both, username="admin", password=PASSWORD) as conn:
            conn.client_id = "c1"
            session = conn.create_session()
            session.create_durable_subscriber(Topic("news"), "d1").close()
            publisher = session.create_producer(Topic("news"))
            for i in range(20):
                publisher.send(TextMessage(f"n{i}"))
        send(a, PASSWORD, "orders", *(f"o{i}" for i in range(200)))
        send(a, PASSWORD, "held", "h0", "h1")
        xid = Xid(7, b"ha-branch", b"rm")
        xconn = connect_xa(f"mq://{a.address}", username="admin", password=PASSWORD)
        xconn.start()
        xs = xconn.create_xa_session()
        xs.xa_resource.start(xid, xa.TMNOFLAGS)
        assert xs.create_consumer(Queue("held")).receive(5).text == "h0"
        xs.create_producer(Queue("orders")).send(TextMessage("o-xa"))
        xs.xa_resource.end(xid, xa.TMSUCCESS)
        xs.xa_resource.prepare(xid)
        killed = time.monotonic()
        a.kill()
        xconn.close()
        wait_for(lambda: b.when("bridge jb1 (JMS): STARTED"), 4 * MONITOR)
        assert b.when("took over broker A") - killed <= 2 * MONITOR
        # The list fails over to B, which has A's messages, subscription and prepared branch.
        with connect(both, username="admin", password=PASSWORD, connect_timeout=2) as conn:
            conn.client_id = "c1"
            conn.start()
            session = conn.create_session()
            orders = session.create_consumer(Queue("orders"))
            got = [m.text for m in iter(lambda: orders.receive(2), None)]
            assert got == [f"o{i}" for i in range(200)]
            news = session.create_durable_subscriber(Topic("news"), "d1")
            assert [m.text for m in iter(lambda: news.receive(2), None)] == [f"n{i}" for i in range(20)]
            held = session.create_consumer(Queue("held"))
            assert [m.text for m in iter(lambda: held.receive(1), None)] == ["h1"]  # h0: the branch's
        assert subscription_owners(cluster, "B") == [("c1", "d1", "admin")]  # its owner came along
        xconn = connect_xa(both, username="admin", password=PASSWORD)
        try:
            resource = xconn.create_xa_session().xa_resource
            assert xid in resource.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN)
            resource.commit(xid, False)
        finally:
            xconn.close()
        with connect(both, username="admin", password=PASSWORD) as conn:
            conn.start()
            session = conn.create_session()
            assert session.create_consumer(Queue("orders")).receive(5).text == "o-xa"
            assert session.create_consumer(Queue("held")).receive(1) is None
    finally:
        cluster.stop()
