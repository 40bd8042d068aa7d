"""End to end: a non-transacted link with imq.bridge.jb.link.l.parallelism=2 and
ordered=false runs in two worker processes (a transformer stamps its process id on each
message): every message arrives once, both workers took some, `list link` counts them
all, and a stop ends the workers. Without ordered=false the bridge refuses to start. A
SIGHUP that makes the link of a stopped bridge parallel gives it counters of its own:
`list link` counts what the workers report."""

from __future__ import annotations

import os
import signal

import pytest

from service_support import Daemon, cli, link_row, one_bridge_files, send, take
from test_service_reload import wait_line
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PASSWORD = "Parallel-Secret-1"

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"
            message-transformer-class="stamp.StampPid"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="par.src"/>
  <destination ref-name="dst" name="par.dst"/>
</jmsbridge>
"""

TRANSFORMER = """
import os, time
from bridgemgr.transform import MessageTransformer


class StampPid(MessageTransformer):
    def transform(self, message, *args):
        out = message.copy()
        out.set_int_property("worker_pid", os.getpid())
        time.sleep(0.002)
        return out
"""


def _files(tmp_path, *extra, parallelism=2):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "stamp.py").write_text(TRANSFORMER)
    return one_bridge_files(
        tmp_path,
        "par",
        XML,
        PASSWORD,
        "imq.bridge.stomp.tcp.port=0",
        f"imq.bridge.transformer.path={tmp_path / 'plugins'}",
        f"imq.bridge.jb.link.l.parallelism={parallelism}",
        *extra,
    )


def wait_transferred(daemon, passfile, count):
    """The link's `list link` row once it shows ``count`` transferred."""
    return wait_for(
        lambda: (row := link_row(daemon, passfile, "l"))[5] == str(count) and row,
        10,
        f"link l to show {count} transferred",
        interval=0.3,
    )  # the workers report their counters twice a second


def test_a_parallel_link_spreads_over_two_worker_processes(tmp_path):
    props, passfile = _files(tmp_path, "imq.bridge.jb.link.l.ordered=false")
    daemon = Daemon(props)
    try:
        assert daemon.bridges.get("jb") == "STARTED", daemon.lines
        texts = [f"m{i}" for i in range(400)]
        send(daemon, PASSWORD, "par.src", *texts)
        got = take(daemon, PASSWORD, "par.dst", expect=400, quiet=1.0)
        assert sorted(m.text for m in got) == sorted(texts)
        pids = {m.get_int_property("worker_pid") for m in got}
        assert len(pids) == 2 and daemon.proc.pid not in pids, pids
        row = wait_transferred(daemon, passfile, 400)
        assert row[1:2] + row[5:6] == ["STARTED", "400"], row
        stop = cli(daemon, passfile, "stop", "link", "-bn", "jb", "-ln", "l")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        daemon.stop()


def test_parallelism_needs_ordered_false(tmp_path):
    props, _ = _files(tmp_path)
    daemon = Daemon(props)
    try:
        assert daemon.bridges.get("jb") != "STARTED"
        text = "\n".join(daemon.lines)
        assert "imq.bridge.jb.link.l.parallelism=2" in text and "ordered=false" in text, text
    finally:
        daemon.stop()


def test_a_sighup_that_makes_a_stopped_bridges_link_parallel_counts_its_workers(tmp_path):
    props, passfile = _files(tmp_path, "imq.bridge.jb.link.l.ordered=false", parallelism=1)
    daemon = Daemon(props)
    try:
        assert daemon.bridges.get("jb") == "STARTED", daemon.lines
        send(daemon, PASSWORD, "par.src", *[f"local{i}" for i in range(10)])
        assert len(take(daemon, PASSWORD, "par.dst", expect=10, quiet=0.2)) == 10
        assert wait_transferred(daemon, passfile, 10)[5] == "10"  # the local runner's thread
        assert cli(daemon, passfile, "stop", "bridge", "-bn", "jb").returncode == 0

        props.write_text(props.read_text().replace("link.l.parallelism=1", "link.l.parallelism=2"))
        daemon.proc.send_signal(signal.SIGHUP)
        wait_line(daemon, r"SIGHUP: bridge jb reloaded")
        r = cli(daemon, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        texts = [f"m{i}" for i in range(40)]
        send(daemon, PASSWORD, "par.src", *texts)
        got = take(daemon, PASSWORD, "par.dst", expect=40, quiet=0.5)
        assert sorted(m.text for m in got) == sorted(texts)
        assert daemon.proc.pid not in {m.get_int_property("worker_pid") for m in got}  # by workers
        # new counters of the parallel runner's kind (the local runner's dropped every report)
        row = wait_transferred(daemon, passfile, 40)
        assert row[1:2] + row[5:6] == ["STARTED", "40"], row
    finally:
        daemon.stop()
