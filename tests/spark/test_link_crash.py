"""A Spark link's driver killed mid-stream (kill -9 of its process group: driver, JVM,
workers), then the query restarted from its checkpoint in another driver: every message
reaches the target (nothing lost), and a message that arrives twice carries the same
stamped source message id (JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bridgemgr.jms import Queue
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from bridgemgr.spark.options import SOURCE_ID_PROPERTY
from bridgemgr.spark.runner import start_query

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "remote")]
from support import Harness  # noqa: E402

from jmsbridge_support import bridge_xml, link_xml, send  # noqa: E402
from link_crash_child import crash_options  # noqa: E402

N = 1500  # the first driver is killed once N // 4 arrived: the restart moves the rest


class Collector:
    """Everything that arrives on the target, as it arrives."""

    def __init__(self, broker: Broker) -> None:
        self.conn = EmbeddedConnectionFactory(broker).create_connection()
        self.conn.start()
        self.consumer = self.conn.create_session().create_consumer(Queue("dst"))
        self.got: list = []

    def until(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            m = self.consumer.receive(0.2)
            if m is not None:
                self.got.append(m)

    def idle(self, quiet: float = 3.0) -> None:
        while (m := self.consumer.receive(quiet)) is not None:
            self.got.append(m)


@pytest.mark.parametrize("shipped", [False, True], ids=["shared log", "shipped records"])
def test_killed_driver_restarts_from_its_checkpoint_and_loses_nothing(tmp_path, spark, shipped):
    """(shipped: the replay's records reach the executors from the driver, as on a
    cluster whose executors cannot read the log)"""
    broker = Broker(tmp_path / "store")
    harness = Harness(broker)
    xml = tmp_path / "b.xml"
    xml.write_bytes(bridge_xml(link_xml("l")))
    checkpoint = tmp_path / "checkpoint"
    sent = {m.message_id: m.text for m in send(broker, "src", [f"m{i}" for i in range(N)])}
    collector = Collector(broker)
    child = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "link_crash_child.py"),
            str(xml),
            harness.url,
            str(checkpoint),
            *(["shipped"] if shipped else []),
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        collector.until(N // 4, timeout=240)
        assert len(collector.got) >= N // 4, "the first driver transferred too little"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    before = len(collector.got)
    assert before < N, "the first driver finished before it was killed"
    try:
        query = start_query(
            spark, crash_options(checkpoint, str(xml), harness.url, shipped), checkpoint, available_now=True
        )
        assert query.awaitTermination(240), "the restarted query did not finish"
        assert query.exception() is None
        collector.idle(0.5)  # (the query has ended and the first driver is dead: all is sent)
        stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in collector.got)
        assert set(stamps) == set(sent), f"lost: {sorted(set(sent) - set(stamps))[:5]}"
        assert all(sent[m.get_string_property(SOURCE_ID_PROPERTY)] == m.text for m in collector.got)
        duplicates = sum(n - 1 for n in stamps.values())
        assert len(collector.got) == N + duplicates
        assert broker.queue_depth("src") == 0
        print(f"killed after {before} of {N}; {duplicates} duplicate(s), all stamped")
    finally:
        collector.conn.close()
        harness.close()
        broker.close()
