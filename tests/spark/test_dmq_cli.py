"""`imqbridgemgr dmq` end to end: a real `serve` process, the CLI as processes, dead
messages in the service's built-in DMQ: redrive (dry run, then for real), archive, report
from the archive (each Spark job is a JVM start: two of them here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import bridgemgr
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.jmsbridge.config import BUILTIN_DMQ_DESTINATION
from bridgemgr.jmsbridge.dmq import DeadLetter, dmq_message
from bridgemgr.jmsbridge.pipeline import DMQReason
from service_support import ROOT, Daemon, one_bridge_files

pytestmark = pytest.mark.timeout(300)

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="dmqcli.src"/>
  <destination ref-name="dst" name="dmqcli.dst"/>
</jmsbridge>
"""
PASSWORD = "Dmq-Secret-1"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base = tmp_path_factory.mktemp("dmqcli")
    props, passfile = one_bridge_files(
        base,
        "dmqcli",
        XML,
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.spark.master=local[1]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=2",
        "imq.bridge.spark.conf.spark.driver.memory=512m",
    )
    daemon = Daemon(props)
    yield daemon, passfile, base
    daemon.stop()


def dmq(service, *args: str) -> subprocess.CompletedProcess:
    daemon, passfile, _ = service
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "dmq",
            *args,
            "-b",
            daemon.address,
            "-u",
            "admin",
            "-passfile",
            str(passfile),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


def connect(service):
    conn = bridgemgr.connect(f"mq://{service[0].address}", "admin", PASSWORD)
    conn.start()
    return conn


def put_dead(service, reasons) -> None:
    """Dead messages as the service's bridge writes them, marked with its key."""
    key = bytes.fromhex((service[2] / "var" / "instances" / "dmqcli" / "etc" / "dmq.key").read_text())
    now = int(time.time() * 1000)
    with connect(service) as conn:
        producer = conn.create_session().create_producer(Queue(BUILTIN_DMQ_DESTINATION))
        for n, reason in enumerate(reasons):
            original = TextMessage(f"order {n}")
            original.message_id = f"ID:cli-{n}"
            original.set_int_property("n", n)
            letter = DeadLetter(
                original,
                reason,
                None,
                "jb",
                "l1",
                "dmqcli.src",
                "dmqcli.dst",
                None,
                "imqbridge embedded broker",
                "imqbridge embedded broker",
            )
            producer.send(dmq_message(letter, original, now - 60_000, key))


def received(service, name: str) -> list:
    with connect(service) as conn:
        consumer = conn.create_session().create_consumer(Queue(name))
        out = []
        while (m := consumer.receive(1)) is not None:
            out.append(m)
        return out


@pytest.mark.slow
def test_redrive_archive_and_report_through_the_cli(service, tmp_path):
    put_dead(service, [DMQReason.SEND_FAILURE, DMQReason.SEND_FAILURE, DMQReason.MESSAGE_EXPIRED])

    dry = dmq(service, "redrive", "-bn", "jb", "--reason", "SEND_FAILURE", "--since", "1h", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[1].split()[:2] == ["would-send", "2"]  # a summary line (no -v)
    assert "queue:dmqcli.dst" in dry.stdout
    assert dry.stdout.splitlines()[-1] == "dry run: 2 chosen: 2 would-send"

    done = dmq(service, "redrive", "-bn", "jb", "--reason", "SEND_FAILURE", "--since", "1h", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sent"] == 2
    assert sorted(m.text for m in received(service, "dmqcli.dst")) == ["order 0", "order 1"]

    path = tmp_path / "archive"
    archived = dmq(service, "archive", "-bn", "jb", str(path), "--json")
    assert archived.returncode == 0, archived.stderr
    assert json.loads(archived.stdout)["messages"] == 1
    assert "DMQ built-in-dmq: 1/1 messages (100%)" in archived.stderr  # progress: the DMQ's depth
    assert received(service, BUILTIN_DMQ_DESTINATION) == []

    page, data = tmp_path / "report.html", tmp_path / "report.json"
    offline = dmq(
        service,
        "report",
        "--archive",
        str(path),
        "--csv",
        "--json",  # no -bn needed
        str(data),
        "--html",
        str(page),
    )
    assert offline.returncode == 0, offline.stderr
    lines = offline.stdout.splitlines()
    assert lines[0] == "hour,reason,link,source,target,verified,messages,bytes"
    assert lines[1].split(",")[1:7] == ["MESSAGE_EXPIRED", "l1", "dmqcli.src", "dmqcli.dst", "True", "1"]
    assert json.loads(data.read_text())["total"]["messages"] == 1
    assert "<svg" in page.read_text()


def test_bad_requests_are_named(service, tmp_path):
    nobridge = dmq(service, "redrive", "-bn", "nope", "--reason", "SEND_FAILURE", "--since", "1h")
    assert nobridge.returncode == 1 and "no bridge named nope" in nobridge.stderr
    nodmq = dmq(service, "redrive", "-bn", "jb", "--dmq", "audit", "--reason", "SEND_FAILURE", "--since", "1h")
    assert nodmq.returncode == 1 and "bridge jb has no DMQ named 'audit'" in nodmq.stderr
    badtime = dmq(service, "redrive", "-bn", "jb", "--reason", "SEND_FAILURE", "--since", "lately")
    assert badtime.returncode == 1 and "'lately' is not a time" in badtime.stderr
    badreason = dmq(service, "redrive", "-bn", "jb", "--reason", "LATE", "--since", "1h")
    assert badreason.returncode == 1 and "'LATE' is not a DMQ reason" in badreason.stderr
    noarchive = dmq(service, "report", "-bn", "jb", "--archive", str(tmp_path / "none"))
    assert noarchive.returncode == 1 and "cannot be read" in noarchive.stderr
    nothing = dmq(service, "report")
    assert nothing.returncode == 2 and "(-bn), or give --archive" in nothing.stderr
