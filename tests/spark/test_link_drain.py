"""imqbridgemgr drain against a running service: the link is paused through the admin port
around the drain (and only when it runs), and the drain empties the source with Spark
(AvailableNow) into the target, each message stamped with its source id, with a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.providers.embedded.remote import RemoteConnectionFactory
from bridgemgr.spark.drain import _Admin
from bridgemgr.spark.options import SOURCE_ID_PROPERTY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service_support import ROOT, Daemon, one_bridge_files

N = 1000
PASSWORD = "Drain-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="drain.src"/>
  <destination ref-name="dst" name="drain.dst"/>
</jmsbridge>
"""


@pytest.fixture
def service(tmp_path):
    props, passfile = one_bridge_files(
        tmp_path, "drain", XML, PASSWORD, "imq.bridge.spark.master=local[2]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=2", "imq.bridge.spark.conf.spark.driver.memory=512m")
    daemon = Daemon(props)
    yield daemon, passfile
    daemon.stop()


def link_state(admin: _Admin) -> str:
    return admin._request("LIST", "jb", "l1").data["links"][0]["state"]


def test_drain_empties_the_source_with_the_link_paused(service, tmp_path):
    daemon, passfile = service
    admin = _Admin(daemon.address, "admin", PASSWORD, False, None, 10, 2)
    assert link_state(admin) == "STARTED"
    assert admin.pause_if_running("jb", "l1") is True  # what the drain does first
    assert link_state(admin) == "PAUSED"
    assert admin.pause_if_running("jb", "l1") is False  # not running: left alone

    conn = RemoteConnectionFactory(f"mq://{daemon.address}").create_connection("admin", PASSWORD)
    try:
        producer = conn.create_session().create_producer(Queue("drain.src"))
        ids = set()
        for i in range(N):
            message = TextMessage(f"m{i}")
            producer.send(message, delivery_mode=DeliveryMode.PERSISTENT)
            ids.add(message.message_id)
        checkpoint = tmp_path / "drain-checkpoint"
        out = subprocess.run(
            [sys.executable, "-m", "bridgemgr.cli", "drain", "-bn", "jb", "-ln", "l1",
             "-b", daemon.address, "-u", "admin", "-passfile", str(passfile), "--batch", "400",
             "--checkpoint", str(checkpoint), "--json"],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path)))
        assert out.returncode == 0, out.stderr[-3000:]
        # Spark's own start-up lines are in its log file, not on the console
        for noise in ("log4j", "Setting default log level", "NativeCodeLoader", "WARN "):
            assert noise not in out.stderr, out.stderr
        spark_log = tmp_path / ".imqbridge" / "logs" / "spark.log"
        assert "Setting default log level" in spark_log.read_text()
        assert spark_log.stat().st_mode & 0o777 == 0o600
        summary = json.loads(out.stdout)
        assert summary["transferred"] == N and summary["to_dmq"] == 0 and summary["batches"] >= 3
        assert summary["msg_per_s"] > 0 and "batch" in out.stderr
        # not a terminal: plain progress lines, the last with the backlog the host broker told
        assert f"{N:,}/{N:,} messages (100%)" in out.stderr and "ETA 0:00" in out.stderr
        assert not checkpoint.exists()  # a clean drain leaves nothing behind
        assert "paused for the drain" not in out.stderr  # it was paused already

        conn.start()
        consumer = conn.create_session().create_consumer(Queue("drain.dst"))
        got = []
        while (m := consumer.receive(2)) is not None:
            got.append(m)
        assert {m.get_string_property(SOURCE_ID_PROPERTY) for m in got} == ids
        assert len(got) == N
    finally:
        conn.close()
    admin.resume("jb", "l1")
    assert link_state(admin) == "STARTED"
