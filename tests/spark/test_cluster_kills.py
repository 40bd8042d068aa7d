"""A runner=spark link on the standalone cluster (the `cluster` fixture) while an executor,
or a whole worker, is killed with SIGKILL mid-transfer: every message reaches the target,
a duplicate only with the same JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID, nothing in the DMQ.
Each test leaves the cluster with two live workers for the tests after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue
from bridgemgr.jms.errors import TransportException
from bridgemgr.spark.options import SOURCE_ID_PROPERTY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cluster import PASSWORD, master_state, spark_service

from service_support import ROOT, Daemon, cli, send, take
from waiting import quiet_for, wait_for

pytestmark = pytest.mark.slow
MESSAGES = 3000
BUILTIN_DMQ = "imq.bridge.jms.dmq"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def executors(cluster, app_id: str) -> dict[int, int]:
    """The executor JVMs (CoarseGrainedExecutorBackend) of application ``app_id`` on the
    cluster's live workers: {executor pid: its worker's pid}."""
    found = {}
    for worker in cluster.procs[1:]:
        if worker.poll() is not None:
            continue
        for child in _children(worker.pid):
            line = _cmdline(child)
            if "CoarseGrainedExecutorBackend" in line and app_id in line:
                found[child] = worker.pid
    return found


def our_app(cluster) -> str:
    [app] = [a for a in master_state(cluster)["activeapps"] if a["name"] == "imqbridge jb"]
    return app["id"]


class Collector(threading.Thread):
    """Consumes the target queue for the whole test: every message's source message id."""

    def __init__(self, daemon: Daemon) -> None:
        super().__init__(daemon=True)
        self.address = daemon.address
        self.source_ids: list[str | None] = []
        self.done = threading.Event()

    def run(self) -> None:
        with connect(f"mq://{self.address}", username="admin", password=PASSWORD) as conn:
            conn.start()
            consumer = conn.create_session().create_consumer(Queue("c.dst"))
            while not self.done.is_set():
                if (m := consumer.receive(0.2)) is not None:
                    self.source_ids.append(m.get_string_property(SOURCE_ID_PROPERTY))

    def wait_for(self, n: int, timeout: float, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while len(set(self.source_ids)) < n and time.monotonic() < deadline:
            time.sleep(poll)


def sender(daemon: Daemon, ids: list[str], total: int) -> threading.Thread:
    """Sends ``total`` messages to the link's source, their ids into ``ids``."""

    def run() -> None:
        ids.extend(send(daemon, PASSWORD, "c.src", *(f"k{i}" for i in range(total))))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def moved_while_killing(daemon: Daemon, cluster, collector: Collector, kill, log: Path) -> list[str]:
    """``kill(app_id)`` runs as soon as the first of MESSAGES messages sent to the link's
    source arrive (a task is sending them); then every one of them arrives: their ids."""
    before = len(set(collector.source_ids))
    ids: list[str] = []
    sending = sender(daemon, ids, MESSAGES)
    collector.wait_for(before + 1, 120, poll=0.01)  # the first batch is being sent: kill now
    arrived = len(set(collector.source_ids)) - before
    kill(our_app(cluster))
    assert arrived < MESSAGES // 2, f"not mid-transfer: {arrived} had arrived"
    sending.join(120)
    collector.wait_for(before + MESSAGES, 100)
    missing = set(ids) - set(collector.source_ids)
    assert not missing, (
        f"{len(missing)} of {MESSAGES} lost",
        log.read_text()[-3000:],
    )
    return ids


def kill_executor(cluster, killed: list[int]):
    """SIGKILL the link's executor JVM: its tasks run again on the executor the master
    starts instead."""

    def kill(app_id: str) -> None:
        found = executors(cluster, app_id)
        assert found, "no executor of the service found"
        for pid in found:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return kill


def kill_worker(cluster):
    """SIGKILL the worker JVM that runs the link's executor (its executor ends with it); the
    master runs the link on the other worker."""

    def kill(app_id: str) -> None:
        found = executors(cluster, app_id)
        assert found, "no executor of the service found"
        worker_pid = next(iter(found.values()))
        [worker] = [p for p in cluster.procs if p.pid == worker_pid]
        os.kill(worker_pid, signal.SIGKILL)
        worker.wait(10)
        orphans = [pid for pid, w in found.items() if w == worker_pid]
        try:
            wait_for(lambda: not any(_cmdline(pid) for pid in orphans), 30, "the killed worker's executor ends")
        finally:
            for pid in [pid for pid in orphans if _cmdline(pid)]:  # (nothing must keep running after the test)
                os.kill(pid, signal.SIGKILL)

    return kill


def test_a_killed_executor_and_then_a_killed_worker_lose_nothing(tmp_path, cluster):
    """One serve with a Spark link on the cluster, a collector on its target throughout:
    SIGKILL the link's executor JVM mid-transfer, then (once every message of that round
    arrived) the worker JVM that runs its new executor, mid-transfer of a second round;
    every message of both rounds arrives, duplicates carry the same source id, the DMQ is
    empty. A replacement worker joins for the tests after it."""
    daemon, _ = spark_service(tmp_path, cluster)
    log = tmp_path / "var/instances/cluster/bridges/jb/log.txt"
    collector = Collector(daemon)
    killed: list[int] = []
    try:
        collector.start()
        warm_up = send(daemon, PASSWORD, "c.src", "warm-up")  # the query runs on an executor
        collector.wait_for(1, 120)
        assert collector.source_ids, "\n".join(daemon.lines[-40:])
        ids = moved_while_killing(daemon, cluster, collector, kill_executor(cluster, killed), log)
        assert killed
        ids += moved_while_killing(daemon, cluster, collector, kill_worker(cluster), log)
        quiet_for(lambda: len(collector.source_ids), 2.0, 60, "late duplicates")
        collector.done.set()
        collector.join(10)
        got = Counter(collector.source_ids)
        assert not set(ids) - set(got)
        assert None not in got, "a message without its source message id"
        assert set(got) <= {*ids, *warm_up}, "a message that was not sent"
        assert take(daemon, PASSWORD, BUILTIN_DMQ, quiet=0.5) == []
    finally:
        collector.done.set()
        daemon.stop()
        cluster.restore_workers(2)


def pending(daemon: Daemon, passfile: Path, queue: str) -> int:
    r = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", queue, "--json")
    reply = json.loads(r.stdout)
    assert "data" in reply, (reply, r.stderr)
    return reply["data"]["pending"]


class Feeder(threading.Thread):
    """Sends to the link's source at a steady pace (rounds of 20 every 0.1 s) until told."""

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
            time.sleep(0.1)


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
            collector.wait_for(500, 120)  # the drain delivers
            assert len(collector.source_ids) >= 500, drain.poll()
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
