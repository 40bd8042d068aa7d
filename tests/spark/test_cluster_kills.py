"""A drain on the standalone cluster (the `cluster` fixture) whose workers are killed with
SIGKILL mid-transfer: it takes nothing more from its source, stops, and run again
delivers every message, a duplicate only with the same JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID,
nothing in the DMQ. It leaves the cluster with two live workers for the tests after it.
(A killed executor or worker under a link: test_cluster.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bridgemgr.jms.errors import TransportException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cluster import BUILTIN_DMQ, PASSWORD, Collector, pending, spark_service

from service_support import ROOT, Daemon, send, take
from waiting import quiet_for

pytestmark = pytest.mark.slow


class Feeder(threading.Thread):
    """Sends to the link's source at a steady pace (rounds of 20 every 0.4 s: ~50 a second,
    hundreds in the seconds the drain has no executor; at 0.1 s the drains and the
    collector took four times the messages for the same checks) until told."""

    def __init__(self, daemon: Daemon) -> None:
        super().__init__(daemon=True)
        self.daemon_ = daemon
        self.ids: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            n = len(self.ids)
            try:
                self.ids.extend(send(self.daemon_, PASSWORD, "c.src", *(f"f{i}" for i in range(n, n + 20))))
            except TransportException:  # (a loaded machine: the next round tries again)
                pass
            time.sleep(0.4)


def test_a_drain_that_loses_its_executors_holds_and_stops_and_a_rerun_finishes(tmp_path, cluster):
    """Both workers die under a drain while its source is fed: the drain takes nothing more
    from the source (nothing could deliver it), fails after --timeout with one line naming
    its checkpoint, and run again on a cluster with workers it delivers every message."""
    from test_master import job

    daemon, passfile = spark_service(tmp_path, cluster, "imq.bridge.jb.autostart=false")
    passfile.chmod(0o600)
    collector, feeder = Collector(daemon), Feeder(daemon)
    checkpoint = tmp_path / "drain-checkpoint"
    args = [
        "drain",
        "-bn",
        "jb",
        "-ln",
        "l1",
        "--batch",
        "20000",
        "--master",
        cluster.url,
        "--checkpoint",
        str(checkpoint),
    ]
    drain = None
    try:
        collector.start()
        feeder.start()
        try:
            drain = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bridgemgr.cli",
                    *args,
                    "--timeout",
                    "10",
                    "-b",
                    daemon.address,
                    "-u",
                    "admin",
                    "-passfile",
                    str(passfile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / "drain.err").open("w"),
                start_new_session=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path)),
            )
            collector.wait_for(300, 120)  # the drain delivers
            assert len(collector.source_ids) >= 300, drain.poll()
            for worker in cluster.procs[1:]:
                if worker.poll() is None:
                    os.kill(worker.pid, signal.SIGKILL)
                    worker.wait(10)
            sent, waiting = len(feeder.ids), pending(daemon, passfile, "c.src")
            drain.wait(60)  # the executors ended with their workers: nothing delivers (the
            # drain gives up 10 s after they ended)
            sent_since = len(feeder.ids) - sent
            taken = sent_since - (pending(daemon, passfile, "c.src") - waiting)
            assert taken < sent_since / 4, f"the drain took {taken} of {sent_since} sent while it had no executor"
            err = (tmp_path / "drain.err").read_text()
            assert drain.returncode == 1, err
            assert f"the drain lost its executors on {cluster.url}: none for 10 s" in err, err
            assert str(checkpoint) in err.strip().splitlines()[-1], err
        finally:
            feeder.done.set()
            if drain is not None and drain.poll() is None:
                os.killpg(drain.pid, signal.SIGKILL)
                drain.wait()
            cluster.restore_workers(2)
        feeder.join(10)
        r = job(daemon, passfile, tmp_path, *args, "--timeout", "60", timeout=180)
        assert r.returncode == 0, r.stderr
        collector.wait_for(len(feeder.ids), 60)
        quiet_for(lambda: len(collector.source_ids), 1.0, 60, "late duplicates")
        collector.done.set()
        collector.join(10)
        got = Counter(collector.source_ids)
        assert not set(feeder.ids) - set(got), f"{len(set(feeder.ids) - set(got))} lost"
        assert None not in got, "a message without its source message id"
        assert take(daemon, PASSWORD, BUILTIN_DMQ, quiet=0.5) == []
    finally:
        collector.done.set()
        feeder.done.set()
        daemon.stop()
