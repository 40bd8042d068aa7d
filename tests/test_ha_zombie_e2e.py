"""A zombie HA instance end to end (docs/ha.md#fencing), real `serve` processes on a real
PostgreSQL server: A is paused (SIGSTOP) past the monitor interval and taken over by B; a
new process of broker id A is started (accepted: the row says taken) and takes sends;
the old A, resumed (SIGCONT), shares broker id, state and store schema with the new one,
yet writes nothing: its producer hears an error for every send it is not told was stored,
it exits 1, and each acknowledged persistent message is there exactly once."""

from __future__ import annotations

import signal

import pytest

from bridgemgr.jms import DeliveryMode, JMSException, Queue, TextMessage
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory
from ha_support import MONITOR, PASSWORD, Cluster
from service_support import send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_resumed_zombie_exits_1_and_loses_nothing(tmp_path, postgresql):
    cluster = Cluster(tmp_path / "cluster", postgresql, {})
    old = None
    try:
        old, b = cluster.start("A", ""), cluster.start("B", "")
        conn = RemoteConnectionFactory(f"mq://{old.address}").create_connection("admin", PASSWORD)
        producer = conn.create_session().create_producer(Queue("z"))
        acknowledged = []
        for i in range(10):
            producer.send(TextMessage(f"old{i}"), delivery_mode=DeliveryMode.PERSISTENT)
            acknowledged.append(f"old{i}")
        old.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: b.when("took over broker A"), 4 * MONITOR)
        new = cluster.start("A", "", home="A2")  # the store it opens is empty: its seqs are the old A's
        acknowledged += [f"new{i}" for i in range(20)]
        send(new, PASSWORD, "z", *acknowledged[10:])
        old.proc.send_signal(signal.SIGCONT)
        for i in range(10, 20):
            try:
                producer.send(TextMessage(f"old{i}"), delivery_mode=DeliveryMode.PERSISTENT)
                acknowledged.append(f"old{i}")
            except JMSException:
                pass
        assert old.proc.wait(6 * MONITOR) == 1
        old.stop()
        said = [line for _, line in old.seen if "ERROR bridgemgr.service" in line]
        assert len(said) == 1 and "broker A generation 1 was replaced by generation 3" in said[0], said
        # The cluster's queue z is served by every instance: B may hand out the new A's too.
        got = [m.text for m in take(b, PASSWORD, "z", 10)]
        got += [m.text for m in take(new, PASSWORD, "z", len(acknowledged) - len(got))]
        assert sorted(got) == sorted(acknowledged), (len(got), len(acknowledged))
        assert acknowledged[30:] == []  # (the old A stored none: the fence, not luck)
    finally:
        if old is not None and old.proc.poll() is None:
            old.proc.send_signal(signal.SIGCONT)
        cluster.stop()
