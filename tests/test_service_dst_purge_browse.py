"""`imqbridgemgr purge dst` and `browse dst` through the CLI as a process against a real
`imqbridgemgr serve`: browse shows headers, properties and previews of messages in
memory and paged out (a memory window of 5); purge asks unless -f, removes them all and
says how many; a STOMP producer held by a full FLOW_CONTROL queue goes on after a purge;
a user of group user cannot log in to the admin port; failures under --json are a JSON
error object on stdout with the exit status of the text form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from service_support import ROOT, Daemon, cli, one_bridge_files, take
from test_service_limits import Stomp, _stomp_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Secret-1"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base = tmp_path_factory.mktemp("purge")
    props, passfile = one_bridge_files(
        base,
        "purge",
        "",
        PASSWORD,
        "imq.bridge.stomp.tcp.port=0",
        "imq.destination.memory.window=5",
        activelist="stomp",
    )
    daemon = Daemon(props)
    try:
        yield daemon, passfile, props
    finally:
        daemon.stop()


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "bridgemgr", *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def as_json(daemon: Daemon, passfile: Path, *args: str) -> tuple[int, dict]:
    r = cli(daemon, passfile, *args, "--json")
    return r.returncode, json.loads(r.stdout)


def test_browse_shows_messages_paged_out_too_and_purge_removes_them_all(service):
    daemon, passfile, _ = service
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        producer = conn.create_session().create_producer(Queue("orders"))
        for i in range(30):
            m = TextMessage(f"order {i}\x01" + "x" * 100)
            m.set_int_property("n", i)
            m.set_string_property("region", "eu")
            m.correlation_id = f"c{i}"
            producer.send(m, delivery_mode=DeliveryMode.PERSISTENT, priority=4)
    rc, first = as_json(daemon, passfile, "browse", "dst", "-t", "q", "-n", "orders", "-c", "3")
    assert rc == 0, first
    msgs = first["data"]["messages"]
    assert [m["properties"] for m in msgs] == [{"n": i, "region": "eu"} for i in range(3)]
    m0 = msgs[0]
    assert m0["message_id"].startswith("ID:") and m0["timestamp"] > 0 and m0["priority"] == 4
    assert m0["persistent"] is True and m0["redelivered"] is False and m0["correlation_id"] == "c0"
    assert m0["body_type"] == "TEXT" and m0["body_size"] == len("order 0\x01" + "x" * 100)
    assert m0["body"] == "order 0\x01" + "x" * 100  # --json: the whole body
    assert m0["preview"].startswith("order 0.xxx") and m0["preview"].endswith("...")  # printable, short
    rc, every = as_json(daemon, passfile, "browse", "dst", "-t", "q", "-n", "orders", "-c", "100")
    assert [m["properties"]["n"] for m in every["data"]["messages"]] == list(range(30))  # beyond the window
    assert first["data"]["next"] == msgs[2]["message_id"] and every["data"]["next"] is None
    pages, after = [], first["data"]["next"]
    while after is not None:  # page by page, past the memory window
        rc, page = as_json(daemon, passfile, "browse", "dst", "-t", "q", "-n", "orders", "-c", "20", "-after", after)
        assert rc == 0, page
        pages.append([m["properties"]["n"] for m in page["data"]["messages"]])
        after = page["data"]["next"]
    assert pages == [list(range(3, 23)), list(range(23, 30))]
    rc, gone = as_json(daemon, passfile, "browse", "dst", "-t", "q", "-n", "orders", "-after", "ID:gone-1")
    assert rc == 1 and gone["error"]["code"] == 404 and "ID:gone-1 is no longer waiting" in gone["message"]

    table = cli(daemon, passfile, "browse", "dst", "-t", "q", "-n", "orders", "-c", "2")
    assert table.returncode == 0, table.stderr
    assert "Message 2: ID:" in table.stdout and "property region = 'eu'" in table.stdout
    assert "body TEXT, 108 bytes: order 1.xxx" in table.stdout
    assert "Message 3:" not in table.stdout
    assert f"add -after {every['data']['messages'][1]['message_id']} for the next page" in table.stdout

    asked = run(
        "purge",
        "dst",
        "-t",
        "q",
        "-n",
        "orders",
        "-b",
        daemon.address,
        "-u",
        "admin",
        "-passfile",
        str(passfile),
        stdin="n\n",
    )
    assert "Are you sure you want to perform operation [purge] on this destination ? (y/n)[n]" in asked.stdout
    assert "was not performed" in asked.stdout and asked.returncode == 0
    rc, query = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "orders")
    assert query["data"]["pending"] == 30

    purged = cli(daemon, passfile, "purge", "dst", "-t", "q", "-n", "orders")
    assert purged.returncode == 0, purged.stderr
    assert "Purged 30 message(s)." in purged.stdout
    assert "The operation [purge] on the destination was successful." in purged.stdout
    rc, query = as_json(daemon, passfile, "query", "dst", "-t", "q", "-n", "orders")
    assert query["data"]["pending"] == 0 and query["data"]["unacked"] == 0
    assert take(daemon, PASSWORD, "orders", quiet=0.5) == []
    rc, again = as_json(daemon, passfile, "purge", "dst", "-t", "q", "-n", "orders")
    assert rc == 0 and again["data"] == {"type": "q", "name": "orders", "purged": 0, "in_delivery": 0}


def test_a_purge_lets_a_producer_held_by_flow_control_go_on(service):
    daemon, passfile, _ = service
    rc, created = as_json(
        daemon,
        passfile,
        "create",
        "dst",
        "-t",
        "q",
        "-n",
        "held",
        "-o",
        "maxNumMsgs=3",
        "-o",
        "limitBehavior=FLOW_CONTROL",
    )
    assert rc == 0, created
    producer = Stomp(_stomp_port(daemon))
    try:
        for i in range(4):
            producer.send("held", f"m{i}", f"r{i}")
        assert producer.until(b"receipt-id:r2")
        assert not producer.until(b"receipt-id:r3", timeout=1.0)  # full: held
        rc, purged = as_json(daemon, passfile, "purge", "dst", "-t", "q", "-n", "held")
        assert rc == 0 and purged["data"]["purged"] == 3, purged
        assert producer.until(b"receipt-id:r3")  # room: it goes on
    finally:
        producer.close()
    assert [m.text for m in take(daemon, PASSWORD, "held", expect=1)] == ["m3"]


def test_only_the_admin_may_purge_or_browse_and_failures_are_json_under_json(service, tmp_path):
    daemon, passfile, props = service
    userpw = tmp_path / "alice.properties"
    userpw.write_text("imq.imqusermgr.password=Alice-pw1\nimq.imqbridgemgr.password=Alice-pw1\n")
    userpw.chmod(0o600)
    added = run("user", "add", "-props", str(props), "-u", "alice", "-g", "user", "-passfile", str(userpw))
    assert added.returncode == 0, added.stderr
    for args in (["purge", "dst", "-t", "q", "-n", "orders", "-f"], ["browse", "dst", "-t", "q", "-n", "orders"]):
        text = run(*args, "-b", daemon.address, "-u", "alice", "-passfile", str(userpw))
        assert text.returncode == 1 and "authentication failed" in text.stderr, text.stdout + text.stderr
        refused = run(*args, "-b", daemon.address, "-u", "alice", "-passfile", str(userpw), "--json")
        assert refused.returncode == 1
        assert json.loads(refused.stdout) == {
            "error": {"message": text.stderr.strip().removeprefix("Error: "), "code": 400}
        }

    rc, missing = as_json(daemon, passfile, "purge", "dst", "-t", "q", "-n", "nosuch")
    assert rc == 1 and missing["error"] == {"message": "queue nosuch does not exist", "code": 404}
    rc, topic = as_json(daemon, passfile, "browse", "dst", "-t", "t", "-n", "news")
    assert rc == 2 and topic["error"]["code"] == 400 and "-t" in topic["error"]["message"]
