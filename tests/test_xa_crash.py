"""Once-and-only-once under kill -9: a bridge moving persistent messages over a transacted
link between two embedded brokers (two stores, fsync on: a genuine two-phase commit across
resource managers) runs in a subprocess that is killed with SIGKILL many times, at random
moments and, through the coordinator's fault hook, exactly after the prepares,
between the commit record and the first commit, and between the two commits. Each restart
recovers the in-doubt branches before the link starts. At the end every message is on the
target exactly once, in order within each run, none is left on the source or in the DMQ,
no branch is in doubt at either broker and the transaction log holds no live record."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from bridgemgr.xa.coordinator import FAULT_ENV, is_ours, name_tag
from bridgemgr.xa.sqllog import SqlTxLog
from bridgemgr.xa.txlog import FileTxLog, txlog_path
from stores import jdbc, open_at

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(240)]

CHILD = Path(__file__).with_name("xa_crash_child.py")
ROOT = Path(__file__).resolve().parents[1]
BUILTIN_DMQ = "imq.bridge.jms.dmq"
FAULTS = ["prepared:kill:{p}", "logged:kill:{p}", "committed-one:kill:{p}", None]


def fill(store: str | Path, first: int, last: int) -> None:
    """Messages numbered first .. last-1 onto src."""
    broker = open_at(store, sync=True)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    session = conn.create_session(True)
    producer = session.create_producer(Queue("src"))
    for i in range(first, last):
        producer.send(TextMessage(str(i)), delivery_mode=DeliveryMode.PERSISTENT)
        if i % 500 == 499:
            session.commit()
    session.commit()
    broker.close()


def start_child(paths: list, batch: int, fault: str | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), *map(str, paths), str(batch)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":  # a fault may kill it during recovery's first transactions
        proc.wait()
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, (line, proc.returncode)
        return proc
    return proc


def in_doubt(store: str | Path) -> int:
    """Prepared branches of bridge `crash` in a store (opened and closed here)."""
    broker = open_at(store)
    try:
        return sum(1 for xid in broker.xa_recover() if is_ours(xid, name_tag("crash")))
    finally:
        broker.close()


def depth(store: str | Path, queue: str) -> int:
    broker = open_at(store)
    try:
        return broker.queue_depth(queue)
    finally:
        broker.close()


def run_crashes(
    tmp_path: Path, n: int, batch: int, kills: int, p: float, window: float, source: str | Path | None = None
) -> None:
    """Before each run the source is topped up to n messages (numbered on from the last
    one), so however fast the link is, every run still has work when it is killed; the
    final count covers every message ever sent."""
    source = source or tmp_path / "source"  # the host broker: its store, or a jdbc spec
    target, var = tmp_path / "target", tmp_path / "var"
    paths = [source, target, var]
    doubts, by_fault, sent, left = 0, 0, 0, 0  # left: src's depth after the last run
    runs: list[str] = []  # what each run had and how it ended, for a failure's message
    for i in range(kills):
        # More than n can be waiting: recovery gives an undecided transaction's messages
        # back, and a run killed before it took as many leaves them. The top-up is then
        # none; never negative, which numbered a batch's worth again (a false duplicate).
        added = max(0, n - left)
        fill(source, sent, sent + added)
        sent += added
        fault = FAULTS[i % len(FAULTS)]
        started = time.monotonic()
        proc = start_child(paths, batch, fault.format(p=p) if fault else None)
        how = "killed by the fault hook before ready"
        if proc.returncode is None:
            try:  # the fault hook may kill it first; else a kill at a random moment
                proc.wait(random.uniform(0.05, window) if fault is None else 2 * window)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                how = "killed at a random moment"
            else:
                by_fault += 1
                how = "killed by the fault hook"
            proc.stdout.close()
        else:
            by_fault += 1
        assert proc.returncode == -signal.SIGKILL, "the source emptied before the last kill"
        found = (in_doubt(source), in_doubt(target))
        doubts += sum(found)
        waiting, left = left, depth(source, "src")
        runs.append(
            f"run {i} ({fault or 'no fault'}): {waiting} waiting + up to {sent - 1}, "
            f"{how} after {time.monotonic() - started:.2f} s, in doubt after: "
            f"source {found[0]}, target {found[1]}, src depth {left}"
        )
    assert by_fault, "the fault hook never fired"
    assert doubts, "no kill landed between prepare and commit"
    assert sent > n, "the link never moved anything"

    proc = start_child(paths, batch, None)  # the last run finishes the queue cleanly
    assert proc.stdout.readline().strip() == "done"
    proc.wait(60)
    proc.stdout.close()

    assert depth(source, "src") == 0
    assert depth(source, BUILTIN_DMQ) == 0, "nothing may reach the DMQ"
    assert in_doubt(source) == 0 and in_doubt(target) == 0
    bridge_dir = var / "instances" / "imqbroker" / "bridges" / "crash"
    settings = jdbc(source)
    if settings is None:
        log = FileTxLog(txlog_path(bridge_dir, "crash"))
    else:  # the decisions were in the host broker's database, never in a file
        assert not txlog_path(bridge_dir, "crash").exists()
        connect, paramstyle = settings.txlog_sql()
        log = SqlTxLog(connect, "crash", paramstyle)
    assert log.open() == {}, "every commit record is forgotten after a clean stop"
    log.close()
    broker = open_at(target)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    got: list[int] = []
    copies: dict[int, list[str]] = {}  # each copy: its place on dst and what it carries
    consumer = conn.create_session().create_consumer(Queue("dst"))
    while (m := consumer.receive(0.2)) is not None:
        got.append(int(m.text))
        copies.setdefault(got[-1], []).append(
            f"#{len(got) - 1} {m.message_id} ts={m.timestamp} "
            + " ".join(f"{k}={m.get_object_property(k)}" for k in sorted(m.property_names))
        )
    broker.close()
    counts = Counter(got)
    missing = sorted(set(range(sent)) - set(counts))
    history = "\n".join(runs)
    assert not missing, f"lost {len(missing)}: {missing[:20]}\n{history}"
    duplicated = {i: c for i, c in counts.items() if c > 1}
    assert not duplicated, (
        f"duplicated {len(duplicated)}: {list(duplicated.items())[:20]}\n"
        + "\n".join(f"{i}: {copies[i]}" for i in list(duplicated)[:3])
        + f"\n{history}"
    )
    assert got == sorted(got), "one link keeps the order of its source"


def test_once_and_only_once_through_kill9_batched(tmp_path, store_spec):
    """3,000 messages waiting at each start (more than 3,000 in all; a run moved at most 740
    on a loaded 2-core machine), 10 per XA transaction, 12 kills (each of FAULTS 3 times);
    the host broker on SQLite (log txlog.crash) and on PostgreSQL (log in its database)."""
    run_crashes(tmp_path, 3_000, 10, kills=12, p=0.04, window=0.4, source=store_spec)


def test_once_and_only_once_through_kill9_one_per_transaction(tmp_path):
    """batchSize 1: every message its own two-phase commit (500 waiting at each start; a
    run moved at most 56 on a loaded 2-core machine), 8 kills (each of FAULTS twice)."""
    run_crashes(tmp_path, 500, 1, kills=8, p=0.03, window=0.3)
