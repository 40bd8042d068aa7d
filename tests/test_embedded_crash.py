"""Crash tests: a broker in a subprocess is killed with SIGKILL mid-traffic, many times;
then the store is reopened and every message is counted.

Each runs on the SQLite store and on the jdbc store (a real PostgreSQL server).
Guarantees checked, with the store's fsync on and off (off is the default: it decides
only what an OS crash may lose): a send that returned is never lost; a committed
transaction is all there, an uncommitted one not at all; a prepared XA branch comes
back from recover() and, resolved as a TM would, moves every message exactly once;
an unacknowledged message is never lost.
"""

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

from bridgemgr.jms import DeliveryMode, Queue, TextMessage, xa
from bridgemgr.jms.xa import Xid
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from stores import open_at

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(240)]

CHILD = Path(__file__).with_name("crash_child.py")
ROOT = Path(__file__).resolve().parents[1]
SRC, DST = Queue("src"), Queue("dst")
ROUNDS = 3  # kills per test: each round starts a child afresh, most of its time


def run_and_kill(
    mode: str, store: str | Path, rnd: int, kill_after: int, sync: str = "sync", window: int = 1000
) -> list[str]:
    """Run the child until it printed ``kill_after`` lines (or ended), then SIGKILL it."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", CRASH_MEMORY_WINDOW=str(window))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(store), str(rnd), sync], stdout=subprocess.PIPE, text=True, env=env
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        if len(lines) >= kill_after:
            time.sleep(random.random() * 0.003)  # land anywhere in the next operation
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    lines += [line.strip() for line in proc.stdout.read().splitlines()]  # printed before the kill
    proc.stdout.close()
    assert lines and lines[0] == "ready", lines[:3]
    return lines[1:]


def open_and_drain(store: str | Path, dest: Queue, window: int = 1000) -> list:
    broker = open_at(store, memory_window=window)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(dest)
    out = []
    while (m := consumer.receive(0.2)) is not None:
        out.append(m)
    broker.close()
    return out


def preload(store: str | Path, n: int) -> list[str]:
    broker = open_at(store, sync=True)
    producer = EmbeddedConnectionFactory(broker).create_connection().create_session().create_producer(SRC)
    for i in range(n):
        producer.send(TextMessage(f"m{i}"), delivery_mode=DeliveryMode.PERSISTENT)
    broker.close()
    return [f"m{i}" for i in range(n)]


@pytest.mark.parametrize(("window", "sync"), [(1000, "nosync"), (1000, "sync"), (3, "nosync")])  # 3: paged out
def test_confirmed_sends_survive_kill9(store_spec, window, sync):
    store = store_spec
    confirmed: dict[int, set[int]] = {}
    for rnd in range(ROUNDS):
        lines = run_and_kill("send", store, rnd, random.randint(20, 250), sync, window=window)
        confirmed[rnd] = {int(line.split(":")[1]) for line in lines if line.startswith("sent")}
    texts = [m.text for m in open_and_drain(store, DST, window)]
    assert len(texts) == len(set(texts)), "a message was stored twice"
    for rnd, ok in confirmed.items():
        present = sorted(int(t.split(":")[1]) for t in texts if t.startswith(f"{rnd}:"))
        assert ok <= set(present), f"round {rnd}: confirmed sends lost: {sorted(ok - set(present))[:10]}"
        assert present == list(range(len(present))), f"round {rnd}: a gap in the stored sequence"
        assert len(present) <= max(ok) + 2, f"round {rnd}: more messages than were sent"


@pytest.mark.parametrize("sync", ["sync", "nosync"])
def test_transactions_are_all_or_nothing_after_kill9(store_spec, sync):
    store = store_spec
    committed: dict[int, set[str]] = {}
    for rnd in range(ROUNDS):
        lines = run_and_kill("tx", store, rnd, random.randint(5, 40), sync)
        committed[rnd] = {line.split()[1] for line in lines if line.startswith("committed")}
    msgs = open_and_drain(store, DST)
    batches = Counter(m.get_string_property("batch") for m in msgs)
    partial = {b: n for b, n in batches.items() if n != 10}
    assert not partial, f"partially visible transactions: {partial}"
    for rnd, ok in committed.items():
        assert ok <= set(batches), f"round {rnd}: committed transactions lost: {sorted(ok - set(batches))}"
        assert len([b for b in batches if b.startswith(f"{rnd}:")]) <= len(ok) + 1


def test_unacknowledged_messages_survive_kill9_of_a_consumer(tmp_path):
    store = tmp_path / "store"
    everything = set(preload(store, 2000))
    acked: set[str] = set()
    in_hand: set[str] = set()  # received, maybe acknowledged when the kill came
    for rnd in range(ROUNDS):
        lines = run_and_kill("consume", store, rnd, random.randint(50, 300))
        got = {line.split()[1] for line in lines if line.startswith("got")}
        done = {line.split()[1] for line in lines if line.startswith("acked")}
        assert len(got - done) <= 1
        acked |= done
        in_hand |= got - done
    remaining = [m.text for m in open_and_drain(store, SRC)]
    assert len(remaining) == len(set(remaining))
    lost = everything - acked - in_hand - set(remaining)
    assert not lost, f"messages lost: {sorted(lost)[:10]}"
    # The kills landed while the consumer acknowledged. Whether an acknowledgement reached
    # the disk before its kill is timing (an acknowledged message that comes back is a
    # redelivery, which at-least-once allows), so how many remain is not asserted.
    assert acked


@pytest.mark.parametrize("window", [1000, 3])
def test_xa_transfers_are_exactly_once_across_kill9(store_spec, window):
    store = store_spec
    everything = preload(store, 150)
    for rnd in range(ROUNDS):
        lines = run_and_kill("xa", store, rnd, random.randint(6, 40), window=window)
        printed = {line.split()[1] for line in lines if line.startswith("prepared")}
        # Recovery as a transaction manager does it: commit what it had decided to
        # commit (printed as prepared), presume abort for the rest.
        broker = open_at(store, sync=True, memory_window=window)
        res = EmbeddedConnectionFactory(broker).create_xa_connection().create_xa_session().xa_resource
        in_doubt = res.recover(xa.TMSTARTRSCAN | xa.TMENDRSCAN)
        assert len(in_doubt) <= 1, f"more than one branch in doubt: {in_doubt}"
        for x in in_doubt:
            if x.gtrid.decode() in printed:
                res.commit(x, False)
            else:
                res.rollback(x)
        assert res.recover(xa.TMSTARTRSCAN) == []
        broker.close()
    lines = run_and_kill("xa", store, ROUNDS, 10**9, window=window)  # run to the end
    assert lines[-1] == "empty"
    moved = Counter(m.text for m in open_and_drain(store, DST, window))
    assert set(moved) == set(everything), f"lost: {sorted(set(everything) - set(moved))[:10]}"
    dupes = {t: n for t, n in moved.items() if n > 1}
    assert not dupes, f"moved more than once: {dupes}"
    assert open_and_drain(store, SRC, window) == []


def test_prepared_branch_locks_survive_kill9(store_spec):
    """Killed right after prepare: the branch is in doubt, its source message locked."""
    store = store_spec
    preload(store, 1)
    lines = run_and_kill("xa", store, 0, 2)  # ready + prepared
    assert lines[0].startswith("prepared")
    broker = open_at(store)
    conn = EmbeddedConnectionFactory(broker).create_xa_connection()
    conn.start()
    res = conn.create_xa_session().xa_resource
    in_doubt = res.recover(xa.TMSTARTRSCAN)
    probe = conn.create_session().create_consumer(SRC)
    if in_doubt:  # killed before commit finished
        assert in_doubt == [Xid(7, b"0-0", b"rm")]
        assert probe.receive(0.1) is None
        res.rollback(in_doubt[0])
        assert probe.receive(1).text == "m0"
    broker.close()
