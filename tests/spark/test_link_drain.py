"""imqbridgemgr drain against a running service: the link is paused through the admin port
around the drain (and only when it runs), and the drain empties the source with Spark batch
jobs (no streaming query) into the target, each message stamped with its source id, with a
summary; a drain killed with kill -9 mid-run loses nothing when it is run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
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
    # the drain's Spark event log tells what it ran (jobs, streaming queries)
    props, passfile = one_bridge_files(
        tmp_path,
        "drain",
        XML,
        PASSWORD,
        "imq.bridge.spark.master=local[2]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=2",
        "imq.bridge.spark.conf.spark.driver.memory=512m",
        "imq.bridge.spark.conf.spark.eventLog.enabled=true",
        "imq.bridge.spark.conf.spark.eventLog.compress=false",
        f"imq.bridge.spark.conf.spark.eventLog.dir={tmp_path / 'events'}",
    )
    (tmp_path / "events").mkdir()
    daemon = Daemon(props)
    yield daemon, passfile
    daemon.stop()


def link_state(admin: _Admin) -> str:
    return admin._request("LIST", "jb", "l1").data["links"][0]["state"]


def spark_events(folder: Path) -> list[str]:
    """The event types of the Spark applications' event logs in ``folder``."""
    return [
        json.loads(line)["Event"]
        for log in sorted(folder.rglob("events_*"))
        for line in log.read_text().splitlines()
        if line.strip()
    ]


def run_drain(daemon: Daemon, passfile: Path, home: Path, checkpoint: Path, *args: str) -> subprocess.Popen:
    """`imqbridgemgr drain -bn jb -ln l1 --json` as a process of its own session (a kill
    takes its JVM and Python workers too)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "drain",
            "-bn",
            "jb",
            "-ln",
            "l1",
            "-b",
            daemon.address,
            "-u",
            "admin",
            "-passfile",
            str(passfile),
            "--checkpoint",
            str(checkpoint),
            "--json",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(home)),
    )


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
            [
                sys.executable,
                "-m",
                "bridgemgr.cli",
                "drain",
                "-bn",
                "jb",
                "-ln",
                "l1",
                "-b",
                daemon.address,
                "-u",
                "admin",
                "-passfile",
                str(passfile),
                "--batch",
                "400",
                "--checkpoint",
                str(checkpoint),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path)),
        )
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
        # plain Spark jobs, one per batch: no streaming query (its Python data source's
        # helper processes cost a query seconds before its first message)
        events = spark_events(tmp_path / "events")
        assert events.count("SparkListenerJobStart") == summary["batches"], events
        assert not [e for e in events if "StreamingQueryListener" in e], events
        assert "paused for the drain" not in out.stderr  # it was paused already

        conn.start()
        consumer = conn.create_session().create_consumer(Queue("drain.dst"))
        got = []
        while (m := consumer.receive(0.5)) is not None:  # (the drain has ended, the link is
            got.append(m)  # paused: nothing more comes)
        assert {m.get_string_property(SOURCE_ID_PROPERTY) for m in got} == ids
        assert len(got) == N
    finally:
        conn.close()
    admin.resume("jb", "l1")
    assert link_state(admin) == "STARTED"


@pytest.mark.timeout(600)
def test_a_drain_killed_mid_run_loses_nothing_when_run_again(service, tmp_path):
    """kill -9 of the drain's process group (the CLI, its JVM, the Python workers) while it
    sends; the same drain again finishes from its checkpoint: every message reaches the
    target, and one that arrives twice carries its source message id."""
    daemon, passfile = service
    admin = _Admin(daemon.address, "admin", PASSWORD, False, None, 10, 2)
    assert admin.pause_if_running("jb", "l1") is True  # the messages wait for the drain
    n = 3000  # 10 batches of 300: killed after the first 500 arrived
    sent = {}
    conn = RemoteConnectionFactory(f"mq://{daemon.address}").create_connection("admin", PASSWORD)
    try:
        producer = conn.create_session().create_producer(Queue("drain.src"))
        for i in range(n):
            message = TextMessage(f"m{i}")
            producer.send(message, delivery_mode=DeliveryMode.PERSISTENT)
            sent[message.message_id] = message.text
        conn.start()
        consumer = conn.create_session().create_consumer(Queue("drain.dst"))
        checkpoint = tmp_path / "drain-checkpoint"
        first = run_drain(daemon, passfile, tmp_path, checkpoint, "--batch", "300")
        got = []
        try:
            deadline = time.monotonic() + 240
            while len(got) < n // 6 and time.monotonic() < deadline and first.poll() is None:
                if (m := consumer.receive(0.1)) is not None:
                    got.append(m)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        assert n // 6 <= len(got) < n, f"killed after {len(got)} of {n}"
        gone = time.monotonic() + 10  # nothing of the killed drain is left running
        while time.monotonic() < gone:
            try:
                os.killpg(first.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail("processes of the killed drain are still running")
        assert any(checkpoint.iterdir())  # what it had taken and not sent is there

        again = run_drain(daemon, passfile, tmp_path, checkpoint)
        _, err = again.communicate(timeout=300)
        assert again.returncode == 0, err[-3000:]
        assert not checkpoint.exists()
        while (m := consumer.receive(0.5)) is not None:  # (both drains have ended, the link
            got.append(m)  # is paused: nothing more comes)
    finally:
        conn.close()
    stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in got)
    assert set(stamps) == set(sent), f"lost: {sorted(set(sent) - set(stamps))[:5]}"
    assert all(sent[m.get_string_property(SOURCE_ID_PROPERTY)] == m.text for m in got)
