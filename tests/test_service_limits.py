"""Destination limits, system-wide limits and memory states through a real `imqbridgemgr
serve`: STOMP over plain sockets, mq:// through the remote client, the dst subcommands
through the CLI as a process.

A FLOW_CONTROL queue (auto-created with imq.autocreate.destination.maxNumMsgs=3: the
auto-create default behaviour) holds a STOMP producer (no RECEIPT) and an mq:// producer
(send does not return) until a consumer takes messages, while another client is served;
REMOVE_LOW_PRIORITY drops the oldest of the lowest priority to mq.sys.dmq;
imq.system.max_count refuses non-persistent messages past it, naming the limit; a small
memory budget (imq.system.max_memory) puts the broker in yellow (batches of
imq.yellow.count) and red (producers wait).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.jms.errors import ResourceAllocationException
from service_support import Daemon, cli, one_bridge_files, take

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Secret-1"


def _stomp_port(daemon: Daemon) -> int:
    from bridgemgr.admin.portmapper import find_service

    host, port = daemon.address.split(":")
    return find_service(host, int(port), ("stomp",)).port


def _serve(base: Path, *extra: str) -> tuple[Daemon, Path]:
    base.mkdir(exist_ok=True)
    props, passfile = one_bridge_files(
        base, base.name, "", PASSWORD, "imq.bridge.stomp.tcp.port=0", *extra, activelist="stomp"
    )
    return Daemon(props), passfile


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    daemon, passfile = _serve(
        tmp_path_factory.mktemp("limits"), "imq.autocreate.destination.maxNumMsgs=3", "imq.system.max_count=20"
    )
    try:
        assert daemon.bridges == {"stomp": "STARTED"}, daemon.lines
        yield daemon, passfile
    finally:
        daemon.stop()


class Stomp:
    """A STOMP 1.2 client on a raw socket (nothing in it waits for the server)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.data = bytearray()
        self.sock.sendall(f"CONNECT\naccept-version:1.2\nlogin:admin\npasscode:{PASSWORD}\n\n\0".encode())
        assert self.until(b"CONNECTED")

    def send(self, queue: str, body: str, receipt: str, persistent: bool = True) -> None:
        self.sock.sendall(
            f"SEND\ndestination:/queue/{queue}\nreceipt:{receipt}\npersistent:"
            f"{str(persistent).lower()}\n\n{body}\0".encode()
        )

    def until(self, needle: bytes, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while needle not in self.data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(min(remaining, 0.2))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return needle in self.data
            self.data += chunk
        return True

    def close(self) -> None:
        self.sock.close()


def _dst(daemon: Daemon, passfile: Path, *args: str) -> dict:
    r = cli(daemon, passfile, *args, "--json")
    return {"rc": r.returncode, **json.loads(r.stdout)}


def test_a_flow_controlled_queue_holds_stomp_and_mq_producers_until_a_consumer_makes_room(service):
    daemon, passfile = service
    port = _stomp_port(daemon)
    producer = Stomp(port)
    for i in range(3):
        producer.send("fc", f"m{i}", f"r{i}")
    assert producer.until(b"receipt-id:r2")
    producer.send("fc", "m3", "r3")  # the queue is full: held, no RECEIPT
    assert not producer.until(b"receipt-id:r3", timeout=1.0)

    sent = threading.Event()

    def mq_send() -> None:
        with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
            conn.create_session().create_producer(Queue("fc")).send(
                TextMessage("m4"), delivery_mode=DeliveryMode.PERSISTENT
            )
            sent.set()

    thread = threading.Thread(target=mq_send, daemon=True)
    thread.start()
    assert not sent.wait(1.0)  # held too

    other = Stomp(port)  # another client is served meanwhile, on STOMP ...
    other.send("elsewhere", "x", "rx")
    assert other.until(b"receipt-id:rx", timeout=3.0)
    other.close()
    query = _dst(daemon, passfile, "query", "dst", "-t", "q", "-n", "fc")  # ... and on the admin port
    assert query["rc"] == 0 and query["data"]["pending"] == 3, query
    assert query["data"]["attributes"]["limitBehavior"] == "FLOW_CONTROL"
    assert query["data"]["producers_waiting"] >= 1

    got = take(daemon, PASSWORD, "fc", expect=5, wait=20, quiet=1.0)  # room: both go on
    assert sorted(m.text for m in got) == ["m0", "m1", "m2", "m3", "m4"]
    assert producer.until(b"receipt-id:r3")
    assert sent.wait(5)
    producer.close()


def test_remove_low_priority_drops_the_oldest_of_the_lowest_priority_to_the_dmq(service):
    daemon, passfile = service
    created = _dst(
        daemon,
        passfile,
        "create",
        "dst",
        "-t",
        "q",
        "-n",
        "lowp",
        "-o",
        "maxNumMsgs=3",
        "-o",
        "limitBehavior=REMOVE_LOW_PRIORITY",
    )
    assert created["rc"] == 0, created
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        producer = conn.create_session().create_producer(Queue("lowp"))
        for text, priority in (("p5", 5), ("p1-old", 1), ("p1-new", 1), ("p9", 9)):
            producer.send(TextMessage(text), delivery_mode=DeliveryMode.PERSISTENT, priority=priority)
    assert [m.text for m in take(daemon, PASSWORD, "lowp", expect=3)] == ["p9", "p5", "p1-new"]
    dead = take(daemon, PASSWORD, "mq.sys.dmq", expect=1)
    assert [m.text for m in dead] == ["p1-old"]
    assert dead[0].get_string_property("JMS_SUN_DMQ_UNDELIVERED_REASON") == "REMOVE_LOW_PRIORITY"


def test_the_system_max_count_refuses_messages_held_in_memory_past_it(service):
    daemon, passfile = service
    assert _dst(daemon, passfile, "create", "dst", "-t", "q", "-n", "big", "-o", "maxNumMsgs=-1")["rc"] == 0
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD, sync_sends=True) as conn:
        producer = conn.create_session().create_producer(Queue("big"))
        for i in range(20):
            producer.send(TextMessage(f"n{i}"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        with pytest.raises(ResourceAllocationException, match=r"imq.system.max_count=20"):
            producer.send(TextMessage("one too many"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        producer.send(TextMessage("persistent"), delivery_mode=DeliveryMode.PERSISTENT)  # in the store: not counted
    assert len(take(daemon, PASSWORD, "big", expect=21)) == 21


NO_BACKOUT = {
    "backoutThreshold": 0,
    "backoutQueue": "",
    "backoutDisposition": "dmq",
    "localDeliveryPreferred": False,
    "isLocalOnly": False,
    "maxNumProducers": 100,
    "maxNumActiveConsumers": -1,
    "maxNumBackupConsumers": 0,
    "consumerFlowLimit": 1000,
}


def test_the_dst_subcommands_create_update_query_and_list(service):
    daemon, passfile = service
    created = _dst(daemon, passfile, "create", "dst", "-t", "q", "-n", "orders", "-o", "maxTotalMsgBytes=10m")
    assert created["rc"] == 0 and created["data"]["attributes"] == {
        "maxNumMsgs": 3,
        "maxTotalMsgBytes": 10 * 1024 * 1024,
        "maxBytesPerMsg": -1,
        "limitBehavior": "FLOW_CONTROL",
        "useDMQ": True,
        **NO_BACKOUT,
    }, created  # imq.autocreate.destination.*
    again = _dst(daemon, passfile, "create", "dst", "-t", "q", "-n", "orders")
    assert again["rc"] == 1 and "already exists" in again["message"]
    updated = _dst(
        daemon,
        passfile,
        "update",
        "dst",
        "-t",
        "q",
        "-n",
        "orders",
        "-o",
        "maxNumMsgs=1000",
        "-o",
        "limitBehavior=remove_oldest",
        "-f",
    )
    assert updated["rc"] == 0 and updated["data"]["attributes"]["maxNumMsgs"] == 1000
    query = _dst(daemon, passfile, "query", "dst", "-t", "q", "-n", "orders")
    assert query["data"]["attributes"] == {
        "maxNumMsgs": 1000,
        "maxTotalMsgBytes": 10 * 1024 * 1024,
        "maxBytesPerMsg": -1,
        "limitBehavior": "REMOVE_OLDEST",
        "useDMQ": True,
        **NO_BACKOUT,
    }
    # the DMQ as the chapter recommends
    dmq = _dst(
        daemon,
        passfile,
        "update",
        "dst",
        "-t",
        "q",
        "-n",
        "mq.sys.dmq",
        "-o",
        "maxNumMsgs=1000",
        "-o",
        "limitBehavior=REMOVE_OLDEST",
        "-o",
        "maxTotalMsgBytes=10m",
        "-f",
    )
    assert dmq["rc"] == 0, dmq
    held = _dst(
        daemon, passfile, "update", "dst", "-t", "q", "-n", "mq.sys.dmq", "-o", "limitBehavior=FLOW_CONTROL", "-f"
    )
    assert held["rc"] == 1 and "cannot use limitBehavior=FLOW_CONTROL" in held["message"]
    bad = _dst(daemon, passfile, "update", "dst", "-t", "q", "-n", "orders", "-o", "maxNumMsgs=lots", "-f")
    assert bad["rc"] == 1 and "maxNumMsgs='lots'" in bad["message"]
    missing = _dst(daemon, passfile, "query", "dst", "-t", "q", "-n", "nosuch")
    assert missing["rc"] == 1 and missing["status"] == 404
    names = [row["name"] for row in _dst(daemon, passfile, "list", "dst")["data"]["destinations"]]
    assert {"orders", "mq.sys.dmq"} <= set(names)
    table = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", "orders")
    assert table.returncode == 0 and "REMOVE_OLDEST" in table.stdout, table.stdout + table.stderr


def test_memory_states_throttle_producers_and_red_holds_them(tmp_path):
    # yellow from 1% of a 1 GB budget (the service's RSS is more), 5 messages per batch
    daemon, _ = _serve(
        tmp_path / "yellow",
        "imq.system.max_memory=1g",
        "imq.yellow.threshold=1",
        "imq.orange.threshold=99",
        "imq.red.threshold=100",
        "imq.yellow.count=5",
    )
    try:
        producer = Stomp(_stomp_port(daemon))
        started = time.monotonic()
        for i in range(30):
            producer.send("mem", f"m{i}", f"r{i}", persistent=False)
        assert producer.until(b"receipt-id:r29", timeout=20)
        assert time.monotonic() - started > 0.4  # 6 batches, each ends at a sample 0.1 s apart
        producer.close()
    finally:
        daemon.stop()
    assert any("memory state green -> yellow" in line for line in daemon.lines), daemon.lines  # at start

    daemon, _ = _serve(tmp_path / "red", "imq.system.max_memory=1m")  # far over 98%: red
    try:
        producer = Stomp(_stomp_port(daemon))
        producer.send("mem", "held", "r0", persistent=False)
        assert not producer.until(b"receipt-id:r0", timeout=1.5)
        producer.close()
    finally:
        daemon.stop()
