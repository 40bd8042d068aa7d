"""imqcmd's destination commands in imqbridgemgr, through the CLI as a process against a
real `imqbridgemgr serve`: list dst lists topics with their subscribers; pause dst holds
consumers (mq:// and STOMP ones, existing and new, get nothing; STOMP producers go on) or
producers (STOMP SENDs get no RECEIPT, an mq:// send does not return) until resume dst,
and every message arrives once (a bridge link, too, waits on a paused target or source);
destroy dst removes a queue with its messages or a topic with its durable subscriptions,
asks unless -f, refuses one in use and unknown names; list cxn and list svc show the
connections and ports; each is admin-only and takes --json; list bridge takes -nocheck."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import DeliveryMode, Queue, TextMessage, Topic
from service_support import Daemon, cli, one_bridge_files, send, take
from test_service_dst_purge_browse import run
from test_service_limits import Stomp, _stomp_port
from waiting import quiet_for, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Secret-1"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base = tmp_path_factory.mktemp("dstcmds")
    props, passfile = one_bridge_files(base, "dstcmds", "", PASSWORD, "imq.bridge.stomp.tcp.port=0", activelist="stomp")
    daemon = Daemon(props)
    try:
        yield daemon, passfile, props
    finally:
        daemon.stop()


def as_json(daemon: Daemon, passfile: Path, *args: str) -> tuple[int, dict]:
    r = cli(daemon, passfile, *args, "--json")
    return r.returncode, json.loads(r.stdout)


def mq(daemon: Daemon, client_id: str | None = None):
    conn = connect(f"mq://{daemon.address}", username="admin", password=PASSWORD)
    if client_id:
        conn.client_id = client_id
    conn.start()
    return conn


def rows(daemon: Daemon, passfile: Path, *args: str) -> dict[tuple[str, str], dict]:
    rc, listed = as_json(daemon, passfile, "list", "dst", *args)
    assert rc == 0, listed
    return {(r["type"], r["name"]): r for r in listed["data"]["destinations"]}


def test_list_dst_lists_topics_with_their_subscribers(service):
    daemon, passfile, _ = service
    send(daemon, PASSWORD, "listed.q", "a", "b")
    with mq(daemon, "lister") as conn:
        session = conn.create_session()
        session.create_durable_subscriber(Topic("listed.t"), "sub1")
        session.create_consumer(Topic("listed.t"))
        session.create_producer(Topic("listed.t")).send(TextMessage("x"), delivery_mode=DeliveryMode.PERSISTENT)
        both = rows(daemon, passfile)
        topic = both[("t", "listed.t")]
        assert (topic["subscriptions"], topic["durable_subscriptions"], topic["consumers"]) == (2, 1, 2)
        assert topic["pending"] + topic["unacked"] == 2 and topic["state"] == "RUNNING"
        assert both[("q", "listed.q")]["pending"] == 2
        assert all(kind == "t" for kind, _ in rows(daemon, passfile, "-t", "t"))
        assert all(kind == "q" for kind, _ in rows(daemon, passfile, "-t", "q"))
        text = cli(daemon, passfile, "list", "dst", "-t", "t")
        assert text.returncode == 0, text.stderr
        line = next(x for x in text.stdout.splitlines() if x.startswith("listed.t "))
        assert line.split()[1:5] == ["topic", "RUNNING", "1", "2"] and "2 (1 durable)" in line
        assert "The operation [list] on the destinations was successful." in text.stdout


def test_list_dst_v_without_ha_shows_the_one_instance(service):
    daemon, passfile, _ = service
    send(daemon, PASSWORD, "single.q", "a", "b", "c")
    row = rows(daemon, passfile, "-t", "q")[("q", "single.q")]
    assert row["instances"] == [
        {
            "broker_id": "dstcmds",
            "age": 0.0,
            **{k: row[k] for k in ("pending", "unacked", "bytes", "producers_waiting", "producers", "consumers")},
        }
    ]
    assert row["pending"] == 3
    text = cli(daemon, passfile, "list", "dst", "-t", "q", "-v")
    assert text.returncode == 0, text.stderr
    mine = [line.split() for line in text.stdout.splitlines() if line.startswith("single.q ")]
    assert mine[1:] == [
        ["single.q", "queue", "dstcmds", "0.0", "0", "0", "3", "0", str(row["bytes"])],
        ["single.q", "queue", "(total)", "0", "0", "3", "0", str(row["bytes"])],
    ]


def test_paused_consumers_get_nothing_until_resume_and_every_message_arrives_once(service):
    daemon, passfile, _ = service
    got: list[str] = []
    stop = threading.Event()
    with mq(daemon) as conn:
        consumer = conn.create_session().create_consumer(Queue("held.c"))

        def consume() -> None:
            while not stop.is_set():
                if (m := consumer.receive(0.1)) is not None:
                    got.append(m.text)

        reader = threading.Thread(target=consume)
        reader.start()
        subscriber = Stomp(_stomp_port(daemon))  # a STOMP consumer of the same queue
        subscriber.sock.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/held.c\nack:auto\nreceipt:s1\n\n\0")
        assert subscriber.until(b"receipt-id:s1")

        def stomp_got() -> list[str]:
            subscriber.until(b"\0never", timeout=0.05)  # read what has come
            frames = [f.lstrip(b"\r\n") for f in bytes(subscriber.data).split(b"\0")[:-1]]  # complete ones
            return [f.partition(b"\n\n")[2].decode() for f in frames if f.startswith(b"MESSAGE\n")]

        try:
            rc, paused = as_json(daemon, passfile, "pause", "dst", "-t", "q", "-n", "held.c", "-pst", "CONSUMERS")
            assert rc == 0 and paused["data"]["destinations"] == [
                {"type": "q", "name": "held.c", "state": "CONSUMERS_PAUSED"}
            ], paused
            producer = Stomp(_stomp_port(daemon))
            for i in range(20):
                producer.send("held.c", f"m{i}", f"r{i}")
            assert producer.until(b"receipt-id:r19")  # producers go on
            producer.close()
            assert quiet_for(lambda: len(got) + len(stomp_got()), 0.5) == 0
            with mq(daemon) as other:  # a new consumer gets nothing either
                assert other.create_session().create_consumer(Queue("held.c")).receive(0.3) is None
            rc, query = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "held.c")
            assert (query["data"]["pending"], query["data"]["state"]) == (20, "CONSUMERS_PAUSED")
            text = cli(daemon, passfile, "resume", "dst", "-t", "q", "-n", "held.c")
            assert text.returncode == 0, text.stderr
            assert (
                "RUNNING" in text.stdout and "The operation [resume] on the destination was successful." in text.stdout
            )
            wait_for(lambda: len(got) + len(stomp_got()) == 20)
            got += stomp_got()
        finally:
            stop.set()
            reader.join(10)
            subscriber.close()
    assert sorted(got, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(20)]  # each once
    assert take(daemon, PASSWORD, "held.c", quiet=0.3) == []


def test_paused_producers_wait_stomp_and_mq_alike_and_nothing_is_lost(service):
    daemon, passfile, _ = service
    send(daemon, PASSWORD, "held.p", "m0")  # the queue exists
    rc, paused = as_json(daemon, passfile, "pause", "dst", "-t", "q", "-n", "held.p", "-pst", "PRODUCERS")
    assert rc == 0 and paused["data"]["destinations"][0]["state"] == "PRODUCERS_PAUSED"
    producer = Stomp(_stomp_port(daemon))
    for i in range(1, 6):
        producer.send("held.p", f"m{i}", f"r{i}")
    sent = threading.Event()

    def mq_send() -> None:
        with mq(daemon) as conn:
            conn.create_session().create_producer(Queue("held.p")).send(
                TextMessage("m6"), delivery_mode=DeliveryMode.PERSISTENT
            )
        sent.set()

    thread = threading.Thread(target=mq_send, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: (
                as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "held.p")[1]["data"]["producers_waiting"]
                == 2
            )
        )
        assert not producer.until(b"receipt-id:r1", timeout=0.5) and not sent.is_set()  # held, not refused
        rc, query = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "held.p")
        assert (query["data"]["pending"], query["data"]["state"]) == (1, "PRODUCERS_PAUSED")
        rc, resumed = as_json(daemon, passfile, "resume", "dst")  # every destination
        assert rc == 0 and {"type": "q", "name": "held.p", "state": "RUNNING"} in resumed["data"]["destinations"]
        assert producer.until(b"receipt-id:r5") and b"ERROR" not in producer.data
        assert sent.wait(10)
    finally:
        producer.close()
        thread.join(10)
    texts = sorted(m.text for m in take(daemon, PASSWORD, "held.p", expect=7, quiet=0.3))
    assert texts == [f"m{i}" for i in range(7)]


def test_destroy_removes_a_queue_with_its_messages_and_a_topic_with_its_durables(service):
    daemon, passfile, _ = service
    send(daemon, PASSWORD, "doomed", *[f"m{i}" for i in range(5)])
    asked = run(
        "destroy", "dst", "-t", "q", "-n", "doomed", "-b", daemon.address, "-u", "admin", "-passfile", str(passfile),
        stdin="n\n",
    )  # fmt: skip
    assert "Are you sure you want to perform operation [destroy] on this destination ? (y/n)[n]" in asked.stdout
    assert "was not performed" in asked.stdout and asked.returncode == 0
    with mq(daemon) as conn:
        conn.create_session().create_consumer(Queue("doomed"), "n = 1")  # (a selector: it takes nothing)
        rc, busy = as_json(daemon, passfile, "destroy", "dst", "-t", "q", "-n", "doomed")
        assert rc == 1 and busy["error"]["code"] == 400 and "1 active consumer" in busy["error"]["message"]
    destroyed = cli(daemon, passfile, "destroy", "dst", "-t", "q", "-n", "doomed")
    assert destroyed.returncode == 0, destroyed.stderr
    assert "Destroyed with 5 message(s)." in destroyed.stdout
    assert "The operation [destroy] on the destination was successful." in destroyed.stdout
    rc, query = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "doomed")
    assert rc == 1 and query["error"]["code"] == 404
    rc, missing = as_json(daemon, passfile, "destroy", "dst", "-t", "q", "-n", "nosuch")
    assert rc == 1 and missing["error"] == {"message": "queue nosuch does not exist", "code": 404}
    text = cli(daemon, passfile, "destroy", "dst", "-t", "q", "-n", "mq.sys.dmq")
    assert text.returncode == 1 and "mq.sys.dmq cannot be destroyed" in text.stderr
    assert take(daemon, PASSWORD, "doomed", quiet=0.3) == []

    with mq(daemon, "d1") as conn:
        conn.create_session().create_durable_subscriber(Topic("doomed.t"), "s1").close()
        conn.create_session().create_producer(Topic("doomed.t")).send(TextMessage("old"))
    rc, gone = as_json(daemon, passfile, "destroy", "dst", "-t", "t", "-n", "doomed.t")
    assert rc == 0 and gone["data"]["removed"] == 1, gone
    with mq(daemon, "d1") as conn:  # a new subscription of that name: the old message is gone
        assert conn.create_session().create_durable_subscriber(Topic("doomed.t"), "s1").receive(0.3) is None


def test_list_cxn_and_list_svc_show_connections_and_ports(service):
    daemon, passfile, _ = service
    with mq(daemon, "lister.cxn") as conn:
        conn.create_session().create_consumer(Queue("cxn.q"))
        rc, listed = as_json(daemon, passfile, "list", "cxn", "-svn", "jms")
        assert rc == 0, listed
        mine = [c for c in listed["data"]["connections"] if c["client_id"] == "lister.cxn"]
        assert len(mine) == 1 and mine[0]["user"] == "admin" and mine[0]["consumers"] == 1
        assert mine[0]["host"].startswith("127.0.0.1:") and mine[0]["service"] == "jms"  # address:port
        assert all(c["service"] == "jms" for c in listed["data"]["connections"])
        text = cli(daemon, passfile, "list", "cxn")
        assert text.returncode == 0 and "Connection ID" in text.stdout and "lister.cxn" in text.stdout
    rc, none = as_json(daemon, passfile, "list", "cxn", "-svn", "stomp")
    assert rc == 0 and none["data"]["connections"] == []

    from bridgemgr.admin.portmapper import lookup_services

    host, port = daemon.address.split(":")
    rc, svc = as_json(daemon, passfile, "list", "svc")
    assert rc == 0
    table = {(e.name, e.port) for e in lookup_services(host, int(port))}
    assert {(s["name"], s["port"]) for s in svc["data"]["services"]} == table
    assert {"portmapper", "jms", "bridgeadmin", "stomp"} <= {name for name, _ in table}
    assert {s["state"] for s in svc["data"]["services"]} == {"RUNNING"}
    text = cli(daemon, passfile, "list", "svc")
    assert text.returncode == 0 and "Service Name" in text.stdout and "bridgeadmin" in text.stdout


def test_only_the_admin_may_use_them_and_list_bridge_takes_nocheck(service, tmp_path):
    daemon, passfile, props = service
    userpw = tmp_path / "bob.properties"
    userpw.write_text("imq.imqusermgr.password=Bob-pw1\nimq.imqbridgemgr.password=Bob-pw1\n")
    userpw.chmod(0o600)
    added = run("user", "add", "-props", str(props), "-u", "bob", "-g", "user", "-passfile", str(userpw))
    assert added.returncode == 0, added.stderr
    for args in (
        ["destroy", "dst", "-t", "q", "-n", "x", "-f"],
        ["pause", "dst", "-f"],
        ["resume", "dst", "-t", "q", "-n", "x", "-f"],
        ["list", "cxn"],
        ["list", "svc"],
        ["list", "dst", "-t", "t"],
    ):
        refused = run(*args, "-b", daemon.address, "-u", "bob", "-passfile", str(userpw), "--json")
        assert refused.returncode == 1, args
        assert json.loads(refused.stdout)["error"]["code"] == 400 and "authentication failed" in refused.stdout
    nocheck = cli(daemon, passfile, "list", "bridge", "-nocheck")
    assert nocheck.returncode == 0, nocheck.stderr
    assert "The operation [list] on the bridge(s) was successful." in nocheck.stdout


BRIDGE_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="p.src"/>
  <destination ref-name="dst" name="p.dst"/>
</jmsbridge>
"""


def test_a_bridge_link_waits_on_a_paused_target_or_source_and_goes_on_at_resume(tmp_path):
    props, passfile = one_bridge_files(tmp_path, "dstlink", BRIDGE_XML, PASSWORD)
    daemon = Daemon(props)
    try:

        def query(name: str) -> dict:
            rc, reply = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", name)
            assert rc == 0, reply
            return reply["data"]

        assert as_json(daemon, passfile, "create", "dst", "-t", "q", "-n", "p.dst")[0] == 0
        assert as_json(daemon, passfile, "pause", "dst", "-t", "q", "-n", "p.dst", "-pst", "PRODUCERS")[0] == 0
        send(daemon, PASSWORD, "p.src", *[f"m{i}" for i in range(10)])
        wait_for(lambda: query("p.dst")["producers_waiting"] == 1, what="the link's send held by the pause")
        assert quiet_for(lambda: query("p.dst")["pending"], 0.5) == 0
        assert as_json(daemon, passfile, "resume", "dst", "-t", "q", "-n", "p.dst")[0] == 0
        wait_for(lambda: query("p.dst")["pending"] == 10, what="the link to go on")

        assert as_json(daemon, passfile, "pause", "dst", "-t", "q", "-n", "p.src", "-pst", "CONSUMERS")[0] == 0
        send(daemon, PASSWORD, "p.src", *[f"m{i}" for i in range(10, 15)])
        assert quiet_for(lambda: (query("p.src")["pending"], query("p.dst")["pending"]), 0.5) == (5, 10)
        assert as_json(daemon, passfile, "resume", "dst", "-t", "q", "-n", "p.src")[0] == 0
        texts = [m.text for m in take(daemon, PASSWORD, "p.dst", expect=15, quiet=0.5)]
        assert sorted(texts, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(15)]  # each once
    finally:
        daemon.stop()
