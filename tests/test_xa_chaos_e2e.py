"""Chaos over a transacted link, end to end: host H (a `serve` with bridge jb, transacted
link xa.src -> xa.dst at target T over mq://, batches of 10, fsync on) and target T
(another `serve` on a fixed port mapper port). While H moves the messages, random faults
hit both sides, 0-0.1 s apart: T paused (SIGSTOP, 0.05-0.5 s, then SIGCONT), T killed with SIGKILL and
started again, H killed with SIGKILL and started again (its bridge starts by itself and
recovers), and with H's store in PostgreSQL (imq.persist.store=jdbc, its XA log there too)
the database stopped (fast shutdown) and started again. Then every message is counted at
T: none lost, none twice, in order.

The faults come in rounds of ROUND in a random order, each round with one of each kill
kind (and one database restart with jdbc), pauses for the rest: every kind hits the link
in every run (drawn independently, a run could miss one). The link's transformer takes
2 ms a message, so the transfer lasts as long as the faults (unpaced, it moved all N
within the first ~10 faults, and the rest hit an idle link); the faults stop after
MIN_ROUNDS rounds once T holds N messages, or after MAX_ROUNDS (with jdbc a round's three
restarts hold the link longer: 9 rounds took 93 s), and the link moves the rest.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service_support import Daemon, cli, send, take
from test_xa_faults_e2e import PASSWORD, host_service, target_props

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

N = 2000
ROUND, MIN_ROUNDS, MAX_ROUNDS = 10, 2, 3
SEED = int(os.environ.get("CHAOS_SEED", "0")) or random.randrange(1 << 30)
SLOWDOWN = """
import time

from bridgemgr.transform import MessageTransformer


class Slowdown(MessageTransformer):
    def transform(self, message, *args):
        time.sleep(0.002)
        return message
"""


def arrived(target: Daemon, tprops: Path) -> int:
    """How many messages T's xa.dst holds (0 while T cannot answer)."""
    r = cli(target, tprops.parent / "pw.properties", "query", "dst", "-t", "q", "-n", "xa.dst", "--json")
    return json.loads(r.stdout)["data"]["pending"] if r.returncode == 0 else 0


def faults(rng: random.Random, jdbc: bool) -> Iterator[str]:
    """Rounds of ROUND faults: a kill of T, a kill of H, with ``jdbc`` a database restart,
    pauses of T for the rest, each round shuffled."""
    while True:
        deck = ["kill T", "kill H", *(["restart DB"] if jdbc else [])]
        deck += ["pause"] * (ROUND - len(deck))
        rng.shuffle(deck)
        yield from deck


def drained(daemon: Daemon) -> Daemon:
    """Read the service's console from now on (a full pipe would block its logging)."""
    assert daemon.proc.stdout is not None
    threading.Thread(target=daemon.proc.stdout.read, daemon=True).start()
    return daemon


@pytest.mark.parametrize("store", ["file", "jdbc"])
def test_random_faults_on_both_sides_lose_and_duplicate_nothing(tmp_path, request, store, monkeypatch):
    rng = random.Random(SEED)
    tprops = target_props(tmp_path)
    target = drained(Daemon(tprops))
    props, _ = host_service(tmp_path, target)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "slowdown.py").write_text(SLOWDOWN)
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(tmp_path / "plugins"))
    xml = props.parent / "jb.xml"
    xml.write_text(
        xml.read_text().replace(
            '<target connection-factory-ref="remote" destination-ref="dst"/>',
            '<target connection-factory-ref="remote" destination-ref="dst" '
            'message-transformer-class="slowdown.Slowdown"/>',
        )
    )
    text = props.read_text().replace("imq.bridge.jb.autostart=false\n", "")
    db = request.getfixturevalue("database") if store == "jdbc" else None
    if db is not None:
        text += f"imq.persist.store=jdbc\nimq.persist.jdbc.postgresql.property.url={db.url()}\n"
    props.write_text(text)
    host = drained(Daemon(props, settle=False))
    done: dict[str, int] = {"pause": 0, "kill T": 0, "kill H": 0, "restart DB": 0}
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        for count, fault in enumerate(faults(rng, db is not None)):
            rounds_done = count % ROUND == 0 and count >= MIN_ROUNDS * ROUND
            if rounds_done and (count >= MAX_ROUNDS * ROUND or arrived(target, tprops) >= N):
                break  # all there: later faults would hit an idle link
            time.sleep(rng.uniform(0.0, 0.1))
            if fault == "pause":
                target.proc.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.05, 0.5))
                target.proc.send_signal(signal.SIGCONT)
            elif fault == "restart DB":
                assert db is not None
                db.stop_fast()
                time.sleep(rng.uniform(0.2, 3.0))
                db.start()
            elif fault == "kill T":
                target.proc.kill()
                target.proc.wait(timeout=30)
                target = drained(Daemon(tprops))
            else:
                host.proc.kill()
                host.proc.wait(timeout=30)
                host = drained(Daemon(props, settle=False))
            done[fault] += 1
        done["at T after the faults"] = arrived(target, tprops)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=120, quiet=3.0)]
        counts: dict[str, int] = {}
        for text in got:
            counts[text] = counts.get(text, 0) + 1
        lost = [f"m{i}" for i in range(N) if f"m{i}" not in counts]
        twice = sorted(t for t, n in counts.items() if n > 1)
        assert not lost and not twice, (SEED, done, lost[:20], twice[:20])
        assert got == [f"m{i}" for i in range(N)], (SEED, done)
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        assert take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5) == [], (SEED, done)
    finally:
        if target.proc.poll() is None:
            target.proc.send_signal(signal.SIGCONT)
        host.stop()
        target.stop()
        print("chaos seed", SEED, done)
