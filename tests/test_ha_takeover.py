"""HA takeover end to end (docs/ha.md): three `serve` instances of one cluster on a real
PostgreSQL server, each owning one JMS bridge; jb1's transacted link moves messages between
two queues of a fourth, plain broker M. Killed with SIGKILL mid-transfer, jb1's owner is taken
over: jb1 is STARTED on another instance within two monitor intervals and every message
arrives once, in order (the XA log is in the shared database, so recovery on the new owner
settles what the dead one left in doubt). A SIGSTOPped owner that comes back after the
takeover finds its lease gone, stops its bridge and does not run it again (what broker M had
handed its frozen consumer comes back then, so that part may arrive out of order, but once);
the XA log refuses
a commit decision from a broker that no longer owns the bridge (the fence)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue
from ha_support import MONITOR, PASSWORD, Cluster, host_xml, link_xml, wait_for
from service_support import Daemon, one_bridge_files, send

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EMPTY = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb"/>
"""


@pytest.fixture
def broker_m(tmp_path):
    (tmp_path / "m").mkdir()
    props, _ = one_bridge_files(tmp_path / "m", "M", EMPTY, PASSWORD, activelist="")
    daemon = Daemon(props)
    yield daemon
    daemon.stop()


class Receiver:
    """Takes ha.out of broker M on a thread of its own, keeping each text as it comes."""

    def __init__(self, m: Daemon, queue: str = "ha.out") -> None:
        self.texts: list[str] = []
        self._halt = threading.Event()
        self._conn = connect(f"mq://{m.address}", username="admin", password=PASSWORD)
        self._consumer = self._conn.create_session().create_consumer(Queue(queue))
        self._conn.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            message = self._consumer.receive(0.2)
            if message is not None:
                self.texts.append(message.text)

    def wait(self, count: int, timeout: float) -> list[str]:
        wait_for(lambda: len(self.texts) >= count, timeout)
        time.sleep(1.5)  # anything more (a duplicate) shows up now
        return list(self.texts)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self._conn.close()


def sent(m: Daemon, texts: list[str]) -> None:
    for i in range(0, len(texts), 500):
        send(m, PASSWORD, "ha.in", *texts[i:i + 500])


def three_instances(tmp_path, postgresql, m: Daemon) -> Cluster:
    return Cluster(tmp_path / "cluster", postgresql, {
        "jb1": link_xml("jb1", m.address, "ha.in", "ha.out"), "jb2": host_xml("jb2"), "jb3": host_xml("jb3")})


def kill_the_owner_mid_transfer(tmp_path, postgresql, m: Daemon, count: int) -> None:
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
        started = wait_for(lambda: b.when("bridge jb1 (JMS): STARTED") or c.when("bridge jb1 (JMS): STARTED"),
                           4 * MONITOR)
        assert started - killed <= 2 * MONITOR, f"jb1 started {started - killed:.1f} s after the kill"
        owner = b if b.when("bridge jb1 (JMS): STARTED") else c
        assert {n: (r["state"], r["owner"]) for n, r in owner.listed().items()}["jb1"] == ("STARTED",
                                                                                          owner.brokerid)
        got = receiver.wait(count, 120 + count / 50)
        assert len(got) == count and got == texts, (len(got), len(set(got)), count)
    finally:
        receiver.close()
        cluster.stop()


def test_kill_9_of_the_owner_mid_transfer(tmp_path, postgresql, broker_m):
    kill_the_owner_mid_transfer(tmp_path, postgresql, broker_m, 600)


@pytest.mark.timeout(1800)
def test_kill_9_of_the_owner_moving_10000_messages(tmp_path, postgresql, broker_m):
    kill_the_owner_mid_transfer(tmp_path, postgresql, broker_m, 10_000)


def test_a_stopped_owner_that_comes_back_does_not_run_its_bridge(tmp_path, postgresql, broker_m):
    cluster = Cluster(tmp_path / "cluster", postgresql, {
        "jb1": link_xml("jb1", broker_m.address, "ha.in", "ha.out"), "jb2": host_xml("jb2")})
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
        wait_for(lambda: a.when("lost its lease"), 3 * MONITOR)
        sent(broker_m, texts[200:])
        got = receiver.wait(300, 60)
        assert len(got) == 300 and sorted(got) == texts
        assert got[:100] == texts[:100] and got[200:] == texts[200:]
        assert {n: (r["state"], r["owner"]) for n, r in a.listed().items()} == {
            "jb1": ("-", "B"), "jb2": ("-", "B")}
        assert {n: (r["state"], r["owner"]) for n, r in b.listed().items()} == {
            "jb1": ("STARTED", "B"), "jb2": ("STARTED", "B")}
        assert b.when("took over broker A") - stopped <= 2 * MONITOR + 1
    finally:
        if cluster.instances:
            cluster.instances[0].proc.send_signal(signal.SIGCONT)
        receiver.close()
        cluster.stop()


def test_the_xa_log_fences_an_owner_that_was_taken_over(postgresql):
    from bridgemgr.jms.xa import Xid
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster, store_settings
    from bridgemgr.xa.sqllog import SqlTxLog
    from bridgemgr.xa.txlog import CommitRecord, Participant, TxLogError

    database = postgresql.create_database("fence" + str(int(time.time() * 1000)))

    def props(brokerid: str):
        return load_properties([], ["imq.cluster.ha=true", "imq.cluster.clusterid=f1",
                                    f"imq.brokerid={brokerid}", "imq.persist.store=jdbc",
                                    f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}"],
                               environ={})

    def record(gtrid: bytes) -> CommitRecord:
        return CommitRecord(gtrid, (Participant("jb1:m", Xid(1, gtrid, b"m#1")),))

    a, b = open_cluster(props("A"), "a"), open_cluster(props("B"), "b")
    assert a.claim(["jb1"]) == ["jb1"] and b.claim(["jb1"]) == []
    connect_a, style = store_settings(props("A")).txlog_sql()
    connect_b, _ = store_settings(props("B")).txlog_sql()
    log_a, log_b = SqlTxLog(connect_a, "jb1", style), SqlTxLog(connect_b, "jb1", style)
    try:
        log_a.open()
        log_a.log_commits([record(b"g1")])
        assert list(log_b.open()) == [b"g1"]  # reading is not fenced; writing is
        with pytest.raises(TxLogError, match="fenced: bridge jb1 is not owned by broker B"):
            log_b.log_commits([record(b"g0")])
        # A's lease runs out (A paused); B takes A over, and with it jb1 and its decisions.
        a._transaction(lambda cur: cur.execute(
            "UPDATE imq_ha_brokers SET lease_expires = now() - interval '1 second' WHERE brokerid = 'A'"))
        assert b.take_over() == ("A", ["jb1"])
        assert b.owners() == {"jb1": "B"}
        assert list(log_b.open()) == [b"g1"]
        with pytest.raises(TxLogError, match="fenced: bridge jb1 is not owned by broker A"):
            log_a.log_commits([record(b"g2")])
        assert not a.renew()
        log_b.log_commits([record(b"g3")], forget=[b"g1"])
        assert list(log_b.open()) == [b"g3"]
    finally:
        log_a.close()
        log_b.close()
        a.leave()
        b.leave()
