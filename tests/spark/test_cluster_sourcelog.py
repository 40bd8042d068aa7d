"""A Spark link and a drain on a standalone cluster whose executors cannot read the
service's var folder (an empty tmpfs over it in the workers' mount namespace:
`Cluster.hidden`), as on workers of other machines or another user: the driver ships each
slice's records (imq.bridge.spark.sourcelog=auto on a spark:// master), and every message
moves once."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from test_cluster import PASSWORD, spark_service, state

from bridgemgr.spark.options import SOURCE_ID_PROPERTY
from service_support import cli, link_row, send, take

pytestmark = pytest.mark.slow
N = 600


def take_within(daemon, n: int, wait: float) -> list:
    """What reaches c.dst within ``wait`` s (at least ``n`` expected), in short takes."""
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got += take(daemon, PASSWORD, "c.dst", expect=n - len(got), wait=10, quiet=0.5)
    return got + take(daemon, PASSWORD, "c.dst", quiet=3.0)


def test_a_link_moves_every_message_when_the_executors_cannot_read_the_drivers_var(tmp_path, cluster):
    if not cluster.hidden_works:
        pytest.skip(
            "cannot hide a folder from the workers here (no mount namespace: "
            "neither root nor unprivileged user namespaces)"
        )
    var = cluster.hidden / f"var-{tmp_path.name}"
    daemon, passfile = spark_service(tmp_path, cluster, f"imq.varhome={var}")
    try:
        ids = send(daemon, PASSWORD, "c.src", *(f"h{i}" for i in range(N // 2)))
        got = take_within(daemon, N // 2, 180)
        assert len(got) == N // 2, f"{len(got)} of {N // 2} moved; l1: {link_row(daemon, passfile, 'l1')}"
        # a second round through the same query: later batches, the log trimmed meanwhile
        ids += send(daemon, PASSWORD, "c.src", *(f"h{i}" for i in range(N // 2, N)))
        got += take_within(daemon, N // 2, 120)
        stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in got)
        assert set(stamps) == set(ids), f"{len(set(ids) - set(stamps))} of {N} missing"
        assert len(got) == N, f"{len(got) - N} duplicate(s)"
        assert sorted(m.text for m in got) == sorted(f"h{i}" for i in range(N))
        assert (var / "instances/cluster/bridges/jb/spark/l1/checkpoint/sourcelog").is_dir()
        assert state(daemon, passfile) == "STARTED"
        r = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
        assert r.returncode == 0 and "l1 " in r.stdout
    finally:
        daemon.stop()


def test_a_drain_moves_every_message_when_the_executors_cannot_read_its_checkpoint(tmp_path, cluster):
    """`drain --master spark://...` with its checkpoint (and the service's var) where the
    workers see an empty folder: the batch jobs carry each slice's records, every message
    reaches the target once, stamped."""
    from test_master import job

    if not cluster.hidden_works:
        pytest.skip(
            "cannot hide a folder from the workers here (no mount namespace: "
            "neither root nor unprivileged user namespaces)"
        )
    var = cluster.hidden / f"var-{tmp_path.name}"
    daemon, passfile = spark_service(tmp_path, cluster, f"imq.varhome={var}", "imq.bridge.jb.autostart=false")
    passfile.chmod(0o600)
    checkpoint = var / "drain-checkpoint"
    try:
        ids = send(daemon, PASSWORD, "c.src", *(f"d{i}" for i in range(N)))
        r = job(
            daemon,
            passfile,
            tmp_path,
            "drain",
            "-bn",
            "jb",
            "-ln",
            "l1",
            "--batch",
            "200",
            "--master",
            cluster.url,
            "--checkpoint",
            str(checkpoint),
            "--json",
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        summary = json.loads(r.stdout)
        assert summary["transferred"] == N and summary["batches"] >= 3, summary
        got = take_within(daemon, N, 60)
        stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in got)
        assert set(stamps) == set(ids), f"{len(set(ids) - set(stamps))} of {N} missing"
        assert len(got) == N, f"{len(got) - N} duplicate(s)"
        assert sorted(m.text for m in got) == sorted(f"d{i}" for i in range(N))
        assert not checkpoint.exists()  # a drain that ends cleanly removes it
    finally:
        daemon.stop()
