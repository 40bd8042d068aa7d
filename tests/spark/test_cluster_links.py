"""A real serve's Spark links on the standalone cluster (the `cluster` fixture): the session
takes one core per Spark link, also for a bridge made runner=spark by SIGHUP after it
started (it starts again with more cores and the running link carries on)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from bridgemgr.spark.options import SOURCE_ID_PROPERTY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cluster import PASSWORD, XML, master_state, spark_service

from service_support import cli, send, take
from test_service_reload import wait_line
from waiting import wait_for

pytestmark = pytest.mark.slow
XML2 = (
    XML.replace('name="jb"', 'name="jb2"')
    .replace('"l1"', '"l2"')
    .replace('"c.src"', '"c2.src"')
    .replace('"c.dst"', '"c2.dst"')
)


def service_cores(cluster) -> list[int]:
    """The cores of each running application of the service."""
    return [a["cores"] for a in master_state(cluster)["activeapps"] if a["name"].startswith("imqbridge jb")]


def moves(daemon, source: str, target: str, tag: str) -> None:
    ids = send(daemon, PASSWORD, source, *(f"{tag}{i}" for i in range(10)))
    got = take(daemon, PASSWORD, target, expect=10, wait=120)
    assert {m.get_string_property(SOURCE_ID_PROPERTY) for m in got} == set(ids), "\n".join(daemon.lines[-30:])


def test_a_bridge_made_runner_spark_by_sighup_gets_its_core(tmp_path, cluster):
    (tmp_path / "jb2.xml").write_text(XML2)
    daemon, passfile = spark_service(
        tmp_path,
        cluster,
        "imq.bridge.activelist=jb,jb2",
        "imq.bridge.jb2.type=jms",
        "imq.bridge.jb2.xmlurl=jb2.xml",
        "imq.bridge.jb2.autostart=false",
        "imq.bridge.jb2.runner=local",
    )
    try:
        moves(daemon, "c.src", "c.dst", "a")
        assert service_cores(cluster) == [1]
        props = tmp_path / "broker.properties"
        props.write_text(props.read_text().replace("jb2.runner=local", "jb2.runner=spark"))
        daemon.proc.send_signal(signal.SIGHUP)
        assert "reloaded" in wait_line(daemon, r"SIGHUP: bridge jb2 (reloaded|keeps)")
        r = cli(daemon, passfile, "start", "bridge", "-bn", "jb2", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        moves(daemon, "c2.src", "c2.dst", "b")
        moves(daemon, "c.src", "c.dst", "c")  # l1 runs on the new session
        wait_for(lambda: service_cores(cluster) == [2], 30, "the new session's 2 cores", interval=0.5)
        rows = cli(daemon, passfile, "list", "link", "-bn", "jb").stdout
        assert any(line.startswith("l1 ") and " STARTED" in line for line in rows.splitlines()), rows
    finally:
        daemon.stop()
