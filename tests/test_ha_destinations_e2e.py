"""An HA cluster's destinations as one broker's (docs/ha.md, Table 4-2 and 4-1 of the
original's Technical Overview): three real `serve` instances over one real PostgreSQL
database. A queue created with `create dst` on B1 exists on B2 and B3 when the command
returns (auto-create is off: a send there proves it), keeps its attributes there and
through a restart of all three until `destroy dst` on B2 removes it everywhere, an
instance that was down included; maxNumMsgs is counted per instance, maxBytesPerMsg
applies to all; `list dst -v` on any instance shows each instance's counts. Auto-created
queues: a producer's stays on its home, a consumer's is made on every instance, and both
go when idle (imq.autocreate.reaptime). A takeover does not bring back a destroyed queue;
an instance that stalls is named by create dst and catches up."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jms.errors import JMSException
from ha_support import PASSWORD, Cluster, Instance
from service_support import cli
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def listed(instance: Instance, *args: str) -> dict[str, dict[str, Any]]:
    """`list dst -t q --json` on ``instance``: queue name -> row."""
    r = cli(instance, instance.passfile, "list", "dst", "-t", "q", "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)["data"]["destinations"]}


def where(instance: Instance, name: str) -> list[str]:
    """The instances ``instance``'s list dst shows queue ``name`` on."""
    row = listed(instance).get(name)
    return [] if row is None else [i["broker_id"] for i in row["instances"]]


def dst(instance: Instance, *args: str) -> str:
    r = cli(instance, instance.passfile, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def send(instance: Instance, queue: str, *texts: str) -> None:
    with connect(f"mq://{instance.address}", username="admin", password=PASSWORD) as conn:
        producer = conn.create_session().create_producer(Queue(queue))
        for text in texts:
            producer.send(TextMessage(text))


def start_all(cluster: Cluster, *extra: str) -> list[Instance]:
    return [cluster.start(b, "", *extra) for b in ("B1", "B2", "B3")]


def test_an_admin_created_queue_is_every_instances_until_destroyed(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {})
    off = ("imq.autocreate.queue=false", "imq.cluster.monitor.interval=60")  # (a stopped one is taken over at once)
    try:
        b1, b2, b3 = start_all(cluster, *off)
        dst(b1, "create", "dst", "-t", "q", "-n", "adm", "-o", "maxNumMsgs=2", "-o", "limitBehavior=REJECT_NEWEST")
        for b in (b2, b3):  # at once: the command returned once every live instance had it
            assert listed(b)["adm"]["attributes"]["maxNumMsgs"] == 2
            send(b, "adm", f"on {b.brokerid}")
        with pytest.raises(JMSException, match="does not exist"):
            send(b2, "nothere", "x")  # (auto-create is off)
        # maxNumMsgs is per broker: counted for the messages whose home is that instance
        send(b1, "adm", "1", "2")
        with pytest.raises(JMSException, match="is full"):
            send(b1, "adm", "3")
        send(b2, "adm", "more")  # B2 holds 2 now
        with pytest.raises(JMSException, match="is full"):
            send(b2, "adm", "one too many")
        # maxBytesPerMsg is global: set on B3, it holds on B1 when update returns
        dst(b3, "update", "dst", "-t", "q", "-n", "adm", "-o", "maxBytesPerMsg=100")
        with pytest.raises(JMSException, match="100"):
            send(b1, "adm", "x" * 500)
        assert listed(b2)["adm"]["attributes"]["maxBytesPerMsg"] == 100

        def counts() -> dict[str, int] | None:
            row = listed(b3)["adm"]
            found = {i["broker_id"]: i["pending"] for i in row["instances"]}
            return found if found == {"B1": 2, "B2": 2, "B3": 1} and row["pending"] == 5 else None

        wait_for(counts, 20, "each instance's count in list dst on B3")
        ages = [i["age"] for i in listed(b1)["adm"]["instances"]]
        assert ages[0] == 0.0 and all(0 <= age < 10 for age in ages), ages  # B1's own: read now
        text = dst(b1, "list", "dst", "-t", "q", "-v")
        assert [line.split()[2] for line in text.splitlines() if line.startswith("adm ")][1:] == [
            "B1",
            "B2",
            "B3",
            "(total)",
        ]

        for b in cluster.instances:  # every instance restarts (at once: none takes another over)
            b.proc.terminate()
        cluster.stop()
        cluster.instances.clear()
        b1, b2, b3 = start_all(cluster, *off)
        for b in (b1, b2, b3):
            row = listed(b)["adm"]
            assert row["attributes"]["maxNumMsgs"] == 2 and row["attributes"]["maxBytesPerMsg"] == 100
        wait_for(lambda: listed(b2)["adm"]["pending"] == 5, 20, "the messages kept through the restart")

        # down while it is destroyed: it destroys it when it starts again, and an instance
        # that takes it over meanwhile (its clean stop ends its lease now) takes no queue
        # the cluster destroyed (before: one came back until the catalog was applied again)
        b3.stop()
        dst(b2, "destroy", "dst", "-t", "q", "-n", "adm")
        for b in (b1, b2):
            assert "adm" not in listed(b)
            with pytest.raises(JMSException, match="does not exist"):
                send(b, "adm", "x")
        b3 = cluster.start("B3", "", *off)
        assert "adm" not in listed(b3)
        with pytest.raises(JMSException, match="does not exist"):
            send(b3, "adm", "x")
    finally:
        cluster.stop()


def test_auto_created_queues_follow_table_4_2_and_go_when_idle(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {})
    try:
        b1, b2, b3 = start_all(cluster, "imq.autocreate.reaptime=2")
        send(b1, "auto.p", "kept")  # a producer's: made on its home broker only
        wait_for(lambda: where(b2, "auto.p") == ["B1"], 20, "auto.p listed on B2 as B1's")
        assert where(b3, "auto.p") == ["B1"]
        with connect(f"mq://{b3.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            conn.create_session().create_consumer(Queue("auto.c"))  # a consumer's: made everywhere
            wait_for(lambda: where(b1, "auto.c") == ["B1", "B2", "B3"], 20, "auto.c on every instance")
            assert where(b1, "auto.p") == ["B1"]  # still: nobody consumes it
            wait_for(lambda: listed(b1)["auto.c"]["consumers"] == 1, 20, "B3's consumer counted on B1")
            r = cli(b1, b1.passfile, "destroy", "dst", "-t", "q", "-n", "auto.c")
            assert r.returncode == 1 and "(1 on broker B3); close them first" in r.stderr, r.stdout + r.stderr
        # idle (no consumer, producer or message) for the reap time: gone from each instance
        wait_for(lambda: "auto.c" not in listed(b1) and "auto.c" not in listed(b2), 30, "auto.c deleted")
        assert where(b2, "auto.p") == ["B1"]  # it holds a message: it stays
        with connect(f"mq://{b1.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            message = conn.create_session().create_consumer(Queue("auto.p")).receive(10)
            assert message is not None and message.text == "kept"
        wait_for(lambda: "auto.p" not in listed(b3), 30, "auto.p deleted once empty and idle")
    finally:
        cluster.stop()


def test_a_takeover_does_not_bring_back_a_destroyed_queue(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {})
    try:
        b1, b2 = cluster.start("B1", ""), cluster.start("B2", "")
        dst(b1, "create", "dst", "-t", "q", "-n", "gone")
        send(b2, "gone", "held by B2")
        b2.kill()  # destroy waits for it while its lease runs, then goes on without it
        dst(b1, "destroy", "dst", "-t", "q", "-n", "gone")
        wait_for(lambda: b1.when("took over broker B2"), 30, "B1 takes B2 over")
        # B2's store, with queue gone and its message, is B1's now: the catalog says destroyed
        wait_for(lambda: "gone" not in listed(b1), 10, "the adopted queue destroyed again")
        with connect(f"mq://{b1.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            assert conn.create_session().create_consumer(Queue("gone")).receive(1) is None
    finally:
        cluster.stop()


def test_create_names_a_stalled_instance_which_catches_up(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {})
    slow = ("imq.cluster.monitor.interval=60",)  # (B2 stalls without losing its lease)
    try:
        b1, b2 = cluster.start("B1", "", *slow), cluster.start("B2", "", *slow)
        b2.proc.send_signal(signal.SIGSTOP)
        try:
            r = cli(b1, b1.passfile, "create", "dst", "-t", "q", "-n", "late")
        finally:
            b2.proc.send_signal(signal.SIGCONT)
        assert r.returncode == 0 and "Not yet done on broker B2 of the HA cluster" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: "B2" in where(b2, "late"), 20, "B2 has the queue once it runs again")
    finally:
        cluster.stop()
