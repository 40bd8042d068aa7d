"""A Spark job that fails the way users hit it prints one line on stderr (after the one
naming its master) saying what failed and what to do, no stack trace (that only with
--debug): a drain of a link whose message transformer module is not on the plugin path. (A job that
cannot reach the service at all is in tests/test_jobs.py: no Spark starts for it.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service_support import ROOT, Daemon, one_bridge_files, send

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "Fail-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"
            message-transformer-class="nowhere_plugin.Upper"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="fail.src"/>
  <destination ref-name="dst" name="fail.dst"/>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base = tmp_path_factory.mktemp("jobfail")
    props, passfile = one_bridge_files(
        base,
        "jobfail",
        XML,
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.spark.master=local[1]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=2",
        "imq.bridge.spark.conf.spark.driver.memory=512m",
    )
    passfile.chmod(0o600)
    daemon = Daemon(props)
    send(daemon, PASSWORD, "fail.src", "a", "b", "c")
    yield daemon, passfile, base
    daemon.stop()


def drain(service, *args: str) -> subprocess.CompletedProcess:
    daemon, passfile, base = service
    return subprocess.run(
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
            str(base / "checkpoint"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(base)),
    )


def test_a_transformer_not_on_the_plugin_path_is_one_line_and_the_trace_only_with_debug(service):
    out = drain(service)
    assert out.returncode == 1, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr[-3000:]
    assert lines[0] == "running on local[1]"  # the master, named (the service's)
    assert lines[1].startswith("Error: the drain failed: the module nowhere_plugin cannot be imported")
    assert "plugin path" in lines[1] and "--debug" in lines[1]
    assert "Traceback" not in out.stderr and "py4j" not in out.stderr

    debug = drain(service, "--debug")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "nowhere_plugin" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("Error: the drain failed: the module nowhere_plugin")
