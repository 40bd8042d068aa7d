"""kill -9 of a STOMP bridge whose store syncs: what was consumed and acknowledged before
its batch was written stays consumed (its insert and delete cancelled in memory, never
written), and every persistent message a RECEIPT confirmed survives, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bridgemgr.jms import Queue
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.stompbridge.frames import Frame, encode_frame
from stomp_support import Raw, make_users

ROOT = Path(__file__).resolve().parents[1]
N = 200


@pytest.mark.slow
def test_consumed_messages_stay_consumed_and_confirmed_ones_survive_kill9(tmp_path):
    make_users(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    child = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "stomp_crash_child.py"),
            str(tmp_path / "store"),
            str(tmp_path / "passwd"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = int(child.stdout.readline())
        producer, consumer = Raw(port), Raw(port)
        producer.connect()
        consumer.connect()
        consumer.frame("SUBSCRIBE", {"destination": "/queue/consumed", "id": "1", "ack": "auto"})
        for i in range(N):  # no receipts: nobody waits, so the store's writer thread lingers
            producer.frame("SEND", {"destination": "/queue/consumed", "persistent": "true"}, f"c{i}".encode())
        consumer.wait(lambda f: f.body == f"c{N - 1}".encode())
        for i in range(N):
            headers = {"destination": "/queue/kept", "persistent": "true"}
            if i == N - 1:
                headers["receipt"] = "last"  # confirms every earlier SEND of the connection too
            producer.frame("SEND", headers, f"k{i}".encode())
        producer.wait(lambda f: f.command == "RECEIPT")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert [f.body for f in consumer.frames if f.command == "MESSAGE"] == [f"c{i}".encode() for i in range(N)]
    with Broker(tmp_path / "store", sync=True) as broker:
        conn = EmbeddedConnectionFactory(broker).create_connection()
        conn.start()
        session = conn.create_session()
        kept, consumed = session.create_consumer(Queue("kept")), session.create_consumer(Queue("consumed"))
        assert consumed.receive(0.2) is None, "a consumed and acknowledged message came back"
        got = []
        while (m := kept.receive(1)) is not None:
            body = m.get_body()
            got.append(body.encode() if isinstance(body, str) else bytes(body))
        conn.close()
    assert got == [f"k{i}".encode() for i in range(N)], "confirmed messages lost or out of order"


@pytest.mark.slow
def test_a_paced_producer_loses_nothing_its_receipt_confirmed_to_kill9(tmp_path):
    """A producer paced to a slower consumer (client-individual acks, each message acked
    as it arrives): after the RECEIPT of its last SEND and kill -9, every message is
    either acknowledged by the consumer or in the store (none consumed before its batch
    was cut is lost, none still pending at the receipt is missing)."""
    count = 2000
    make_users(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    child = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "stomp_crash_child.py"),
            str(tmp_path / "store"),
            str(tmp_path / "passwd"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    acked: list[bytes] = []
    try:
        port = int(child.stdout.readline())
        producer, consumer = Raw(port), Raw(port, rcvbuf=16384)
        producer.connect()
        consumer.connect()
        consumer.frame(
            "SUBSCRIBE", {"destination": "/queue/paced", "id": "1", "ack": "client-individual", "receipt": "subscribed"}
        )
        consumer.wait(lambda f: f.command == "RECEIPT")
        producer.send(
            b"".join(
                encode_frame(
                    Frame(
                        "SEND",
                        {
                            "destination": "/queue/paced",
                            "persistent": "true",
                            **({"receipt": "last"} if i == count - 1 else {}),
                        },
                        f"p{i}".encode(),
                    ),
                    "1.2",
                )
                for i in range(count)
            )
        )
        seen = 0
        while not any(f.command == "RECEIPT" for f in producer.frames):
            producer._read(0.001)
            consumer._read(0.01)
            for f in consumer.frames[seen:]:
                if f.command == "MESSAGE":
                    consumer.frame("ACK", {"id": f.headers["ack"]})
                    acked.append(f.body)
            seen = len(consumer.frames)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert len(acked) > count // 2, f"{len(acked)} acknowledged at the receipt: the producer was not paced"
    with Broker(tmp_path / "store", sync=True) as broker:
        conn = EmbeddedConnectionFactory(broker).create_connection()
        conn.start()
        session = conn.create_session()
        paced = session.create_consumer(Queue("paced"))
        stored = []
        while (m := paced.receive(1)) is not None:
            stored.append(m.get_body().encode())
        conn.close()
    assert set(acked) | set(stored) == {f"p{i}".encode() for i in range(count)}, "confirmed messages lost"
