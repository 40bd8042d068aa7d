"""Which Spark master runs a job or a link: a master that nobody answers at is one line
("cannot reach spark://host:port: connection refused") within seconds for drain and the DMQ
jobs, never a silent local run; a Spark link stays STARTING and retries with that line as
its last error while the service's other bridges move messages. (No Spark starts here.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service_support import ROOT, Daemon, cli, link_row, one_bridge_files, send, take  # noqa: I001
from spark_cluster import free_port

pytestmark = pytest.mark.slow
PASSWORD = "Master-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="{name}">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="{name}.src"/>
  <destination ref-name="dst" name="{name}.dst"/>
</jmsbridge>
"""


def job(daemon: Daemon, passfile: Path, home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A drain or DMQ job against ``daemon``, as a process."""
    return subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", *args, "-b", daemon.address, "-u", "admin", "-passfile", str(passfile)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(home)),
    )


def test_an_unreachable_master_is_one_line_and_holds_up_nothing(tmp_path):
    master = f"spark://127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / "lb.xml").write_text(XML.format(name="lb"))
    props, passfile = one_bridge_files(
        tmp_path,
        "nomaster",
        XML.format(name="jb"),
        PASSWORD,
        "imq.bridge.jb.runner=spark",
        f"imq.bridge.spark.master={master}",
        "imq.bridge.lb.type=jms",
        "imq.bridge.lb.xmlurl=lb.xml",
        activelist="jb,lb",
    )
    passfile.chmod(0o600)
    daemon = Daemon(props, settle=False)  # (jb stays STARTING: its link waits for the master)
    try:
        send(daemon, PASSWORD, "lb.src", "other bridge")  # the local bridge is not held up
        assert [m.text for m in take(daemon, PASSWORD, "lb.dst", expect=1)] == ["other bridge"]
        row = " ".join(link_row(daemon, passfile, "l1"))
        assert "STARTING" in row and f"cannot reach {master}: connection refused" in row, row
        time.sleep(2)  # it retries: still STARTING, still that one line
        row = " ".join(link_row(daemon, passfile, "l1"))
        assert "STARTING" in row and f"cannot reach {master}: connection refused" in row, row

        other = f"spark://127.0.0.1:{free_port()}"
        for args, want in (
            (("dmq", "report", "-bn", "jb"), master),
            (("dmq", "archive", "-bn", "jb", str(tmp_path / "archive")), master),
            (("drain", "-bn", "jb", "-ln", "l1", "--checkpoint", str(tmp_path / "cp")), master),
            (("dmq", "report", "-bn", "jb", "--master", other), other),
        ):
            began = time.monotonic()
            r = job(daemon, passfile, tmp_path, *args)
            assert r.returncode == 1, r.stdout + r.stderr
            assert r.stderr.strip().splitlines() == [f"Error: cannot reach {want}: connection refused"], r.stderr
            assert time.monotonic() - began < 20
        r = cli(daemon, passfile, "list", "link", "-bn", "jb")
        assert "l1 " in r.stdout and "STARTING" in r.stdout  # the drain paused nothing
    finally:
        daemon.stop()
