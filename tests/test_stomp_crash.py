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
from stomp_support import Raw, make_users

ROOT = Path(__file__).resolve().parents[1]
N = 200


@pytest.mark.slow
def test_consumed_messages_stay_consumed_and_confirmed_ones_survive_kill9(tmp_path):
    make_users(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    child = subprocess.Popen([sys.executable, str(ROOT / "tests" / "stomp_crash_child.py"),
                              str(tmp_path / "store"), str(tmp_path / "passwd")],
                             stdout=subprocess.PIPE, text=True, env=env)
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
