"""A real `imqbridgemgr serve` whose bridge link is held by its target, a host queue at its
FLOW_CONTROL limit (maxNumMsgs=3): `stop link`, `stop bridge` and SIGTERM give the held
send up at once instead of waiting for room that never comes. The held message, never
sent, stays on the source unacknowledged and is sent at the next start: nothing is lost
(the unacknowledged messages sent before it may come again: at-least-once)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from service_support import Daemon, cli, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Secret-1"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="fc.src"/>
  <destination ref-name="dst" name="fc.dst"/>
</jmsbridge>
"""


def pending(daemon: Daemon, passfile: Path, queue: str) -> int:
    r = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", queue, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["data"]["pending"]


def wait_full(daemon: Daemon, passfile: Path) -> None:
    """Until fc.dst holds its 3 messages (the link's next send is held)."""
    wait_for(lambda: pending(daemon, passfile, "fc.dst") >= 3, 30, "fc.dst to fill up", interval=0.2)
    time.sleep(0.5)  # the link is in its held send now (no count or state shows that)


def timed(daemon: Daemon, passfile: Path, *args: str) -> float:
    started = time.monotonic()
    r = cli(daemon, passfile, *args, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return time.monotonic() - started


def test_stopping_a_link_held_by_a_full_flow_control_target_returns_and_loses_nothing(tmp_path):
    props, passfile = one_bridge_files(tmp_path, "fcstop", XML, PASSWORD, "imq.bridge.jb.autostart=false")
    texts = [f"m{i}" for i in range(6)]
    daemon = Daemon(props)
    try:
        r = cli(
            daemon,
            passfile,
            "create",
            "dst",
            "-t",
            "q",
            "-n",
            "fc.dst",
            "-o",
            "maxNumMsgs=3",
            "-o",
            "limitBehavior=FLOW_CONTROL",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        send(daemon, PASSWORD, "fc.src", *texts)
        assert cli(daemon, passfile, "start", "bridge", "-bn", "jb").returncode == 0
        wait_full(daemon, passfile)
        assert timed(daemon, passfile, "stop", "link", "-bn", "jb", "-ln", "l1") < 8
        assert cli(daemon, passfile, "start", "link", "-bn", "jb", "-ln", "l1").returncode == 0
        time.sleep(1)  # held again (the target is still full; no count or state shows that)
        assert timed(daemon, passfile, "stop", "bridge", "-bn", "jb") < 8
        assert cli(daemon, passfile, "start", "bridge", "-bn", "jb").returncode == 0
        time.sleep(1)  # held again
        started = time.monotonic()
        daemon.stop()  # SIGTERM
        assert daemon.proc.returncode is not None and time.monotonic() - started < 8, daemon.lines[-20:]
    finally:
        daemon.stop()
    daemon = Daemon(props)  # the next start: the held message is still on the source
    try:
        assert pending(daemon, passfile, "fc.dst") == 3
        assert cli(daemon, passfile, "start", "bridge", "-bn", "jb").returncode == 0
        got = [m.text for m in take(daemon, PASSWORD, "fc.dst", expect=6, quiet=2.0)]
        assert set(got) == set(texts), got  # every one (those sent before the held one may repeat)
        assert take(daemon, PASSWORD, "fc.src", quiet=0.5) == []
    finally:
        daemon.stop()
