"""runner=spark links, drain and the DMQ jobs on a Spark standalone cluster (a master and two
1-core workers on loopback: the `cluster` fixture): a real `serve` whose
imq.bridge.spark.master is the cluster's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bridgemgr.spark.options import SOURCE_ID_PROPERTY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service_support import Daemon, cli, one_bridge_files, send, take

pytestmark = pytest.mark.slow
PASSWORD = "Cluster-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="c.src"/>
  <destination ref-name="dst" name="c.dst"/>
</jmsbridge>
"""


def spark_service(tmp_path: Path, cluster, *extra: str, xml: str = XML) -> tuple[Daemon, Path]:
    props, passfile = one_bridge_files(
        tmp_path,
        "cluster",
        xml,
        PASSWORD,
        "imq.bridge.jb.runner=spark",
        f"imq.bridge.spark.master={cluster.url}",
        "imq.bridge.spark.conf.spark.driver.host=127.0.0.1",
        "imq.bridge.spark.conf.spark.driver.memory=512m",
        "imq.bridge.spark.conf.spark.executor.memory=512m",
        *extra,
    )
    return Daemon(props), passfile


def state(daemon: Daemon, passfile: Path) -> str:
    r = cli(daemon, passfile, "list", "link", "-bn", "jb")
    return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("l1 "))


def test_a_link_started_with_the_service_pauses_resumes_stops_and_starts_again(tmp_path, cluster):
    daemon, passfile = spark_service(tmp_path, cluster)
    try:
        ids = send(daemon, PASSWORD, "c.src", *(f"a{i}" for i in range(20)))
        got = take(daemon, PASSWORD, "c.dst", expect=20, wait=120)
        assert {m.get_string_property(SOURCE_ID_PROPERTY) for m in got} == set(ids)
        for stop, start in (("pause", "resume"), ("stop", "start")):
            r = cli(daemon, passfile, stop, "link", "-bn", "jb", "-ln", "l1", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            r = cli(daemon, passfile, start, "link", "-bn", "jb", "-ln", "l1", timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            ids = send(daemon, PASSWORD, "c.src", *(f"{start}{i}" for i in range(10)))
            got = take(daemon, PASSWORD, "c.dst", expect=10, wait=120)
            assert {m.get_string_property(SOURCE_ID_PROPERTY) for m in got} == set(ids), "\n".join(daemon.lines[-40:])
            assert state(daemon, passfile) == "STARTED"
    finally:
        daemon.stop()


def test_a_resume_whose_query_cannot_start_fails_with_one_line(tmp_path, cluster):
    """A resume that leaves the link STOPPED is an error naming why, not "successful";
    `list link -v` shows that one line."""
    daemon, passfile = spark_service(tmp_path, cluster)
    try:
        assert cli(daemon, passfile, "pause", "link", "-bn", "jb", "-ln", "l1", timeout=120).returncode == 0
        checkpoint = tmp_path / "var/instances/cluster/bridges/jb/spark/l1/checkpoint"
        shutil.rmtree(checkpoint)
        checkpoint.write_text("not a folder")
        r = cli(daemon, passfile, "resume", "link", "-bn", "jb", "-ln", "l1", timeout=120)
        assert r.returncode != 0, r.stdout
        assert "did not take effect: the link is STOPPED" in r.stdout + r.stderr
        assert "cannot start the Spark query" in r.stdout + r.stderr
        r = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
        out = f"{r.returncode} {r.stdout} {r.stderr}"
        line = next((x for x in out.splitlines() if x.startswith("l1 ")), out)
        assert "cannot start the Spark query: " in line and "not a directory" in line
        assert "STOPPED" in line
    finally:
        daemon.stop()


PLUGIN = """from bridgemgr.transform import MessageTransformer


class Shout(MessageTransformer):
    def transform(self, message, *args):
        message.text = message.text.upper() + "!"
        return message
"""


def test_a_transformer_only_in_the_plugin_folder_reaches_the_executors(tmp_path, cluster):
    """A plugin folder the executors cannot see (an empty tmpfs over it in the workers'
    mount namespace): the service ships its modules to Spark."""
    if not cluster.hidden_works:
        pytest.skip("cannot hide a folder from the workers here (no mount namespace)")
    ext = cluster.hidden / "ext"
    ext.mkdir(exist_ok=True)
    (ext / "cluster_only_plugin.py").write_text(PLUGIN)
    xml = XML.replace(
        'destination-ref="dst"/>', 'destination-ref="dst" message-transformer-class="cluster_only_plugin.Shout"/>'
    )
    daemon, _ = spark_service(tmp_path, cluster, f"imq.bridge.transformer.path={ext}", xml=xml)
    try:
        send(daemon, PASSWORD, "c.src", *(f"t{i}" for i in range(10)))
        got = take(daemon, PASSWORD, "c.dst", expect=10, wait=120)
        assert sorted(m.text for m in got) == sorted(f"T{i}!" for i in range(10)), (
            tmp_path / "var/instances/cluster/bridges/jb/log.txt"
        ).read_text()[-3000:]
    finally:
        daemon.stop()


HOLDER = """import sys, time
from pyspark.sql import SparkSession
(SparkSession.builder.master(sys.argv[1]).appName("holder").config("spark.ui.enabled", "false")
 .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "512m")
 .config("spark.executor.memory", "512m")
 .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1").getOrCreate())
time.sleep(600)
"""


def master_state(cluster) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.master_ui}/json/", timeout=5) as r:
        return json.load(r)


def test_the_service_leaves_cores_to_jobs_and_a_job_with_none_times_out(tmp_path, cluster):
    """The service's session takes one core per Spark link (Spark's default: all of them);
    a job that gets no executor says so once and fails after --timeout."""
    from test_master import job

    daemon, passfile = spark_service(
        tmp_path, cluster, f"imq.bridge.spark.conf.spark.master.ui.port={cluster.master_ui}"
    )
    passfile.chmod(0o600)
    holder = None
    try:
        send(daemon, PASSWORD, "c.src", "x")
        assert len(take(daemon, PASSWORD, "c.dst", expect=1, wait=120)) == 1
        [ours] = [a for a in master_state(cluster)["activeapps"] if a["name"] == "imqbridge jb"]
        assert ours["cores"] == 1, ours
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, cluster.url],  # the other core
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
        )
        deadline = time.monotonic() + 120
        while master_state(cluster)["coresused"] < 2:
            assert time.monotonic() < deadline, master_state(cluster)
            time.sleep(1)
        began = time.monotonic()
        r = job(daemon, passfile, tmp_path, "dmq", "report", "-bn", "jb", "--timeout", "4", timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1, r.stderr
        assert lines[0] == f"running on {cluster.url}", r.stderr
        assert lines.count(f"waiting for executors on {cluster.url}: 2 of 2 cores in use by other applications") == 1, (
            r.stderr
        )
        assert lines[-1].startswith(f"Error: no executor on {cluster.url} after 4 s"), r.stderr
        assert time.monotonic() - began < 60
    finally:
        if holder is not None:
            os.killpg(holder.pid, signal.SIGTERM)
            holder.wait(timeout=30)
        daemon.stop()
