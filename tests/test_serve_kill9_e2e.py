"""kill -9 of a real `imqbridgemgr serve`, default settings (the store does not fsync),
many times under STOMP and mq:// load: every message a producer was told is kept (a
STOMP RECEIPT, an mq:// send that returned) is consumed or still there afterwards.

Load per round: two STOMP producers pipelining SENDs that each ask a receipt (not
waiting for one before the next, as a fast client does), two mq:// producers sending
PERSISTENT messages, and one mq:// consumer taking from the same queue, so inserts,
deletes and receipts share the store's batches. Each round kills the service once its
producers were confirmed a random number of messages, then starts it again. Before
confirms waited for the store write, about 1% of receipted messages were gone.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable

import pytest

from bridgemgr import connect
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from service_support import Daemon, Stomp, one_bridge_files, stomp_port
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "Secret-1"
QUEUE = "kept"
KILLS = 6
IN_FLIGHT = 64  # SENDs a STOMP producer has out before its oldest receipt comes back


class Load:
    """The producers and the consumer of one round, each a thread, until the service dies."""

    def __init__(self, daemon: Daemon, rnd: int) -> None:
        self.daemon, self.rnd = daemon, rnd
        self.lock = threading.Lock()
        self.confirmed: set[str] = set()
        self.consumed: set[str] = set()
        self.dead = threading.Event()
        self.errors: list[BaseException] = []
        port = stomp_port(daemon)
        workers: list[Callable[[], None]] = [lambda k=k: self.stomp_producer(port, k) for k in range(2)]
        workers += [lambda k=k: self.mq_producer(k) for k in range(2)]
        workers.append(self.consumer)
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True) for w in workers]
        for t in self.threads:
            t.start()

    def run(self, worker: Callable[[], None]) -> None:
        try:
            worker()
        except Exception as exc:  # the service was killed under it, or a real failure
            if not self.dead.is_set():
                self.errors.append(exc)

    def confirm(self, ids: list[str]) -> None:
        with self.lock:
            self.confirmed.update(ids)

    def stomp_producer(self, port: int, k: int) -> None:
        client = Stomp(port, "admin", PASSWORD)
        client.sock.settimeout(None)
        sent: dict[str, str] = {}  # receipt id -> message id, in order
        room = threading.Semaphore(IN_FLIGHT)

        def read_receipts() -> None:
            try:
                while True:
                    command, headers, body = client.frame()
                    if command != "RECEIPT":
                        raise AssertionError(f"{command} {headers} {body}")
                    self.confirm([sent.pop(headers["receipt-id"])])
                    room.release()
            finally:
                room.release(IN_FLIGHT)  # the writer waiting for room finds the socket gone

        reader = threading.Thread(target=self.run, args=(read_receipts,), daemon=True)
        reader.start()
        i = 0
        while not self.dead.is_set() and reader.is_alive():
            room.acquire()
            mid = f"{self.rnd}:s{k}:{i}"
            sent[f"r{i}"] = mid
            client.write("SEND", {"destination": f"/queue/{QUEUE}", "receipt": f"r{i}", "persistent": "true"}, mid)
            i += 1

    def mq_producer(self, k: int) -> None:
        with connect(f"mq://{self.daemon.address}", username="admin", password=PASSWORD) as conn:
            producer = conn.create_session().create_producer(Queue(QUEUE))
            i = 0
            while not self.dead.is_set():
                mid = f"{self.rnd}:m{k}:{i}"
                producer.send(TextMessage(mid), delivery_mode=DeliveryMode.PERSISTENT)
                self.confirm([mid])
                i += 1

    def consumer(self) -> None:
        with connect(f"mq://{self.daemon.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            consumer = conn.create_session().create_consumer(Queue(QUEUE))
            while not self.dead.is_set():
                if (m := consumer.receive(0.2)) is not None:
                    with self.lock:
                        self.consumed.add(m.text)  # type: ignore[attr-defined]

    def kill_at(self, confirmed: int) -> None:
        """SIGKILL the service once ``confirmed`` messages were confirmed this round."""

        def reached() -> bool:
            assert self.daemon.proc.poll() is None, self.daemon.lines
            return len(self.confirmed) >= confirmed

        wait_for(reached, 60, f"{confirmed} confirmed this round", interval=0.005)
        self.dead.set()
        os.kill(self.daemon.proc.pid, signal.SIGKILL)
        self.daemon.proc.wait(30)
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads)
        assert not self.errors, self.errors


def drain(daemon: Daemon) -> list[str]:
    """Everything left in the queue, over mq://, until it says it is empty."""
    got: list[str] = []
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue(QUEUE))
        while (m := consumer.receive_no_wait()) is not None:
            got.append(m.text)  # type: ignore[attr-defined]
    return got


def test_kill9_of_serve_loses_no_acknowledged_message_at_default_settings(tmp_path):
    props, _ = one_bridge_files(tmp_path, "kill9", "", PASSWORD, "imq.bridge.stomp.tcp.port=0", activelist="stomp")
    assert "sync" not in props.read_text()  # the default: the store does not fsync
    confirmed: set[str] = set()
    consumed: set[str] = set()
    for rnd in range(KILLS):
        load = Load(Daemon(props), rnd)
        load.kill_at(random.randint(300, 3000))
        confirmed |= load.confirmed
        consumed |= load.consumed
    daemon = Daemon(props)
    try:
        left = drain(daemon)
    finally:
        daemon.stop()
    kept = set(left) | consumed
    lost = confirmed - kept
    assert not lost, f"{len(lost)} of {len(confirmed)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
    assert len(left) == len(set(left)), "a message was stored twice"
    assert len(confirmed) >= KILLS * 300
