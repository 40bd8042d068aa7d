"""runner=spark links, drain and the DMQ jobs on a Spark standalone cluster (a master and two
1-core workers on loopback: the `cluster` fixture): a real `serve` whose
imq.bridge.spark.master is the cluster's. The tests share one such service (`service`: its
Spark application costs a driver, an executor and its Python workers to start), whose var
folder and plugin folder the executors cannot read (an empty tmpfs over them in the
workers' mount namespace: `Cluster.hidden`), as on workers of other machines: the driver
ships each slice's records (imq.bridge.spark.sourcelog=auto) and the plugins. Each test
finds l1 STARTED and c.dst empty (`link`), whatever the tests before it did (the one that
breaks l1's checkpoint runs last: a restart costs seconds). The kill test SIGKILLs the
link's executor JVM, then the worker JVM running its next one, mid-transfer: every
message arrives, a duplicate only with the same JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID; then,
the one core left being the link's, a DMQ job gets no executor (no application of its
own holds a core: each costs a driver and an executor JVM)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridgemgr import connect
from bridgemgr.jms import Queue
from bridgemgr.spark.options import SOURCE_ID_PROPERTY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service_support import ROOT, Daemon, cli, link_row, one_bridge_files, send, take
from waiting import quiet_for, wait_for

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
PLUGIN = """from bridgemgr.transform import MessageTransformer


class Shout(MessageTransformer):
    def transform(self, message, *args):
        message.text = message.text.upper() + "!"
        return message
"""
# the service's driver as the cluster's JVMs (conftest.CLUSTER_JAVA_OPTIONS): C1 only (as
# by default), and one GC thread
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
N = 600  # messages of the shipped-records tests
# messages the busy link has to move: three batches (maxPerBatch 10,000), so a pause sent
# as the first batch arrives finds two still to move: with 1.5 batches, the second was
# written before the pause landed once (CI, 2026-12-07)
BACKLOG = 30000
MESSAGES = 3000  # messages of each round of the kill test
BUILTIN_DMQ = "imq.bridge.jms.dmq"


def shout(text: str) -> str:
    """What the shared service's l1 delivers for ``text`` (PLUGIN's Shout)."""
    return text.upper() + "!"


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
        f"imq.bridge.spark.conf.spark.driver.extraJavaOptions={DRIVER_JAVA_OPTIONS}",
        *extra,
    )
    return Daemon(props), passfile


def state(daemon: Daemon, passfile: Path) -> str:
    r = cli(daemon, passfile, "list", "link", "-bn", "jb")
    return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("l1 "))


@dataclass
class Service:
    """The module's service: its daemon, admin passfile, var folder and a folder for files
    of its own (drain checkpoints, the jobs' HOME)."""

    daemon: Daemon
    passfile: Path
    var: Path
    base: Path
    ext: Path  # its plugin folder

    @property
    def checkpoint(self) -> Path:
        return self.var / "instances/cluster/bridges/jb/spark/l1/checkpoint"


@pytest.fixture(scope="module")
def service(tmp_path_factory, cluster):
    base = tmp_path_factory.mktemp("service")
    hidden = cluster.hidden if cluster.hidden_works else base
    var, ext = hidden / f"var-{base.name}", hidden / f"ext-{base.name}"
    ext.mkdir()
    (ext / "cluster_only_plugin.py").write_text(PLUGIN)
    xml = XML.replace(
        'destination-ref="dst"/>', 'destination-ref="dst" message-transformer-class="cluster_only_plugin.Shout"/>'
    )
    daemon, passfile = spark_service(
        base,
        cluster,
        f"imq.varhome={var}",
        f"imq.bridge.transformer.path={ext}",
        f"imq.bridge.spark.conf.spark.master.ui.port={cluster.master_ui}",
        xml=xml,
    )
    passfile.chmod(0o600)
    try:
        yield Service(daemon, passfile, var, base, ext)
    finally:
        daemon.stop()


@pytest.fixture
def link(service):
    """The shared service with l1 STARTED (a test before may have left it paused, stopped or
    with a broken checkpoint) and nothing left in c.dst."""
    now = state(service.daemon, service.passfile)
    if now != "STARTED":
        if service.checkpoint.is_file():
            service.checkpoint.unlink()
        command = "resume" if now == "PAUSED" else "start"
        r = cli(service.daemon, service.passfile, command, "link", "-bn", "jb", "-ln", "l1", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
    if pending(service.daemon, service.passfile, "c.src"):  # a test before failed midway
        wait_for(lambda: pending(service.daemon, service.passfile, "c.src") == 0, 180, "c.src moved", interval=0.5)
        quiet_for(lambda: pending(service.daemon, service.passfile, "c.dst"), 2.0, 120, "c.dst", interval=0.5)
    take(service.daemon, PASSWORD, "c.dst", quiet=0.2)
    return service


def test_a_link_started_with_the_service_pauses_resumes_stops_and_starts_again(link):
    daemon, passfile = link.daemon, link.passfile
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


def test_a_transformer_only_in_the_plugin_folder_reaches_the_executors(link, cluster):
    """A plugin folder the executors cannot see: the service ships its modules to Spark."""
    if not cluster.hidden_works:
        pytest.skip("cannot hide a folder from the workers here (no mount namespace)")
    send(link.daemon, PASSWORD, "c.src", *(f"t{i}" for i in range(10)))
    got = take(link.daemon, PASSWORD, "c.dst", expect=10, wait=120)
    assert sorted(m.text for m in got) == sorted(f"T{i}!" for i in range(10)), (
        link.var / "instances/cluster/bridges/jb/log.txt"
    ).read_text()[-3000:]


def master_state(cluster) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.master_ui}/json/", timeout=5) as r:
        return json.load(r)


def test_a_busy_link_pauses_and_resumes_within_seconds(link):
    """A backlog of 30,000 messages waits while l1 is paused; resume, and pause again once
    its first batch is arriving (it stops between batches, with a batch or more still to
    move), resume: each command takes seconds, and everything arrives, a duplicate only
    with its source id."""
    daemon, passfile = link.daemon, link.passfile

    def timed(op: str) -> None:
        began = time.monotonic()
        r = cli(daemon, passfile, op, "link", "-bn", "jb", "-ln", "l1", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert time.monotonic() - began < 10, f"{op} took {time.monotonic() - began:.1f} s"

    assert cli(daemon, passfile, "pause", "link", "-bn", "jb", "-ln", "l1", timeout=120).returncode == 0
    ids = send(daemon, PASSWORD, "c.src", *(f"b{i}" for i in range(BACKLOG)))
    timed("resume")
    wait_for(lambda: pending(daemon, passfile, "c.dst") > 0, 120, "the first batch", interval=0.2)
    timed("pause")
    arrived = pending(daemon, passfile, "c.dst")  # (the driver has taken the rest into its log)
    assert 0 < arrived < BACKLOG, f"{arrived} of {BACKLOG} had arrived at the pause"
    ids += send(daemon, PASSWORD, "c.src", *(f"c{i}" for i in range(10)))
    timed("resume")
    got = take(daemon, PASSWORD, "c.dst", expect=len(ids), wait=120, quiet=1.0)
    source_ids = {m.get_string_property(SOURCE_ID_PROPERTY) for m in got}
    assert source_ids == set(ids), f"{len(set(ids) - source_ids)} missing"


def pending(daemon: Daemon, passfile: Path, queue: str) -> int:
    """The messages waiting in ``queue`` of the service (`query dst`)."""
    r = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", queue, "--json")
    reply = json.loads(r.stdout)
    if reply.get("status") == 404:  # not made yet (the link's receiver makes c.src as it starts)
        return 0
    assert reply.get("data") is not None, (reply, r.stderr)
    return reply["data"]["pending"]


def take_within(daemon: Daemon, n: int, wait: float) -> list:
    """What reaches c.dst within ``wait`` s (at least ``n`` expected), in short takes."""
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got += take(daemon, PASSWORD, "c.dst", expect=n - len(got), wait=10, quiet=0.5)
    return got + take(daemon, PASSWORD, "c.dst", quiet=3.0)


def hidden_var(cluster) -> None:
    if not cluster.hidden_works:
        pytest.skip(
            "cannot hide a folder from the workers here (no mount namespace: "
            "neither root nor unprivileged user namespaces)"
        )


def test_a_link_moves_every_message_when_the_executors_cannot_read_the_drivers_var(link, cluster):
    hidden_var(cluster)
    daemon, passfile = link.daemon, link.passfile
    ids = send(daemon, PASSWORD, "c.src", *(f"h{i}" for i in range(N // 2)))
    got = take_within(daemon, N // 2, 180)
    assert len(got) == N // 2, f"{len(got)} of {N // 2} moved; l1: {link_row(daemon, passfile, 'l1')}"
    # a second round through the same query: later batches, the log trimmed meanwhile
    ids += send(daemon, PASSWORD, "c.src", *(f"h{i}" for i in range(N // 2, N)))
    got += take_within(daemon, N // 2, 120)
    stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in got)
    assert set(stamps) == set(ids), f"{len(set(ids) - set(stamps))} of {N} missing"
    assert len(got) == N, f"{len(got) - N} duplicate(s)"
    assert sorted(m.text for m in got) == sorted(shout(f"h{i}") for i in range(N))
    assert (link.checkpoint / "sourcelog").is_dir()
    assert state(daemon, passfile) == "STARTED"
    r = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
    assert r.returncode == 0 and "l1 " in r.stdout


def test_a_drain_moves_every_message_when_the_executors_cannot_read_its_checkpoint(link, cluster):
    """`drain --master spark://...` (it names that master first) with its checkpoint (and
    the service's var) where the workers see an empty folder (where this machine can hide
    one; elsewhere the same drain with the folder in sight): the batch jobs carry each
    slice's records (and the link's transformer, from $IMQ_BRIDGE_TRANSFORMER_PATH),
    every message reaches the target once, stamped."""
    daemon, passfile = link.daemon, link.passfile
    checkpoint = link.var / f"drain-checkpoint-{time.monotonic_ns()}"
    assert cli(daemon, passfile, "pause", "link", "-bn", "jb", "-ln", "l1", timeout=120).returncode == 0
    ids = send(daemon, PASSWORD, "c.src", *(f"d{i}" for i in range(N)))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
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
            "-b",
            daemon.address,
            "-u",
            "admin",
            "-passfile",
            str(passfile),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        # a drain ships the plugins of $IMQ_BRIDGE_TRANSFORMER_PATH (docs/spark.md)
        env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(link.base), IMQ_BRIDGE_TRANSFORMER_PATH=str(link.ext)),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr.splitlines()[0] == f"running on {cluster.url}", r.stderr
    summary = json.loads(r.stdout)
    assert summary["transferred"] == N and summary["batches"] >= 3, summary
    got = take_within(daemon, N, 60)
    stamps = Counter(m.get_string_property(SOURCE_ID_PROPERTY) for m in got)
    assert set(stamps) == set(ids), f"{len(set(ids) - set(stamps))} of {N} missing"
    assert len(got) == N, f"{len(got) - N} duplicate(s)"
    assert sorted(m.text for m in got) == sorted(shout(f"d{i}") for i in range(N))
    assert not checkpoint.exists()  # a drain that ends cleanly removes it


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


def test_a_killed_executor_and_worker_lose_nothing_and_a_job_left_no_core_times_out(link, cluster):
    """The shared service's link, a collector on its target throughout: SIGKILL the link's
    executor JVM mid-transfer, then (once every message of that round arrived) the worker
    JVM that runs its new executor, mid-transfer of a second round; every message of both
    rounds arrives, duplicates carry the same source id, nothing goes to the DMQ. The
    service's session takes one core per Spark link (Spark's default: all of them); with
    one worker left, whose core the link holds, a job gets no executor: it says so once
    and fails after --timeout. A replacement worker joins for the tests after it."""
    from test_master import job

    daemon, passfile = link.daemon, link.passfile
    log = link.var / "instances/cluster/bridges/jb/log.txt"
    dead_before = len(take(daemon, PASSWORD, BUILTIN_DMQ, quiet=0.2))  # (a test before's)
    collector = Collector(daemon)
    killed: list[int] = []
    try:
        collector.start()
        warm_up = send(daemon, PASSWORD, "c.src", "warm-up")  # the query runs on an executor
        collector.wait_for(1, 120)
        assert collector.source_ids, "\n".join(daemon.lines[-40:])
        assert cluster.alive_workers() == 2
        [ours] = [a for a in master_state(cluster)["activeapps"] if a["name"] == "imqbridge jb"]
        assert ours["cores"] == 1, ours
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
        assert take(daemon, PASSWORD, BUILTIN_DMQ, quiet=0.5) == [], f"{dead_before} dead before"

        wait_for(lambda: cluster.alive_workers() == 1, 60, "the master drops the killed worker", interval=0.5)
        began = time.monotonic()
        r = job(daemon, passfile, link.base, "dmq", "report", "-bn", "jb", "--timeout", "4", timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1, r.stderr
        assert lines[0] == f"running on {cluster.url}", r.stderr
        assert lines.count(f"waiting for executors on {cluster.url}: 1 of 1 cores in use by other applications") == 1, (
            r.stderr
        )
        assert lines[-1].startswith(f"Error: no executor on {cluster.url} after 4 s"), r.stderr
        assert time.monotonic() - began < 60
    finally:
        collector.done.set()
        cluster.restore_workers(2)


def test_a_resume_whose_query_cannot_start_fails_with_one_line(link):
    """A resume that leaves the link STOPPED is an error naming why, not "successful";
    `list link -v` shows that one line."""
    daemon, passfile = link.daemon, link.passfile
    assert cli(daemon, passfile, "pause", "link", "-bn", "jb", "-ln", "l1", timeout=120).returncode == 0
    shutil.rmtree(link.checkpoint)
    link.checkpoint.write_text("not a folder")
    r = cli(daemon, passfile, "resume", "link", "-bn", "jb", "-ln", "l1", timeout=120)
    assert r.returncode != 0, r.stdout
    assert "did not take effect: the link is STOPPED" in r.stdout + r.stderr
    assert "cannot start the Spark query" in r.stdout + r.stderr
    r = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
    out = f"{r.returncode} {r.stdout} {r.stderr}"
    line = next((x for x in out.splitlines() if x.startswith("l1 ")), out)
    assert "cannot start the Spark query: " in line and "not a directory" in line
    assert "STOPPED" in line
