"""A damaged XA transaction log, end to end: host H (a `serve` with bridge jb, transacted
link src -> dst at T over mq://) and target T (another `serve`). H is killed with SIGKILL
inside a commit phase, leaving a transaction in doubt, and its txlog is then damaged:

- emptied (truncated to 0 bytes) or a byte flipped before its last record: damage no
  crash causes. H's bridge does not start; serve says why, naming the file; the file is
  left as it was; `imqbridgemgr list txn -bn jb` lists the in-doubt transaction and
  `commit txn` finishes it by hand; with the log moved away the bridge starts and moves
  the rest. (Before, recovery presumed abort: the message H had committed was lost.)
- cut by a few bytes (the last record torn, as a crash during its write tears it): the
  torn decision was never acted on, recovery rolls back, and the bridge moves everything.

Every message is counted at T: none lost, none twice, in order.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from bridgemgr.jms.xa import Xid
from bridgemgr.xa.coordinator import FAULT_ENV
from bridgemgr.xa.txlog import FILE_MAGIC, CommitRecord, Participant, frame, scan
from service_support import Daemon, cli, one_bridge_files, send, take
from test_xa_faults_e2e import IDLE_XML, PASSWORD, XML  # one host H -> target T link for every XA e2e file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

N = 30


@pytest.fixture
def target(tmp_path):
    base = tmp_path / "target"
    base.mkdir()
    props, _ = one_bridge_files(base, "target", IDLE_XML, PASSWORD, "imq.persist.file.sync.enabled=true", activelist="")
    daemon = Daemon(props)
    yield daemon
    daemon.stop()


def damage(path: Path, how: str) -> bytes:
    """Damage the log as ``how`` says; its bytes afterwards."""
    data = path.read_bytes()
    end = scan(data, len(FILE_MAGIC)).end
    if how == "emptied":
        os.truncate(path, 0)
    elif how == "torn":
        os.truncate(path, end - 3)
    else:  # a byte flipped in the first record, a good one after it
        spare = Xid(0x494D5142, b"jb|spare.1", b"r#0")
        tail = frame(CommitRecord(b"jb|spare.1", (Participant("jb:remote", spare),)))
        body = bytearray(data[:end] + tail)
        body[len(FILE_MAGIC) + 12] ^= 0xFF
        path.write_bytes(bytes(body))
    return path.read_bytes()


@pytest.mark.parametrize("how", ["emptied", "flipped", "torn"])
def test_a_damaged_txlog_stops_recovery_until_the_operator_resolves_it(tmp_path, target, how, monkeypatch):
    base = tmp_path / "host"
    base.mkdir()
    props, passfile = one_bridge_files(
        base,
        "host",
        XML.format(password=PASSWORD, target=target.address),
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.persist.file.sync.enabled=true",
    )
    passfile.chmod(0o600)
    # torn: killed once the decision is logged (both branches prepared: what a tear leaves);
    # otherwise once H's own branch committed and T's is still prepared
    monkeypatch.setenv(FAULT_ENV, "logged:kill" if how == "torn" else "committed-one:kill")
    host = Daemon(props)
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        assert cli(host, passfile, "start", "bridge", "-bn", "jb").returncode in (0, 1)
        host.proc.wait(timeout=60)  # the fault killed it
    finally:
        host.stop()
    monkeypatch.delenv(FAULT_ENV)
    txlog = base / "var" / "instances" / "host" / "bridges" / "jb" / "txlog.jb"
    damaged = damage(txlog, how)

    host = Daemon(props, settle=True)
    try:
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        if how == "torn":
            assert r.returncode == 0, r.stdout + r.stderr
        else:
            assert r.returncode == 1
            assert f"the transaction log {txlog} is damaged" in r.stderr, r.stderr
            assert "imqbridgemgr list txn -bn jb" in r.stderr
            assert txlog.read_bytes() == damaged  # left as it was
            listed = cli(host, passfile, "list", "txn", "-bn", "jb", "--json")
            assert listed.returncode == 0, listed.stdout + listed.stderr
            txns = json.loads(listed.stdout)["data"]["transactions"]
            assert len(txns) <= 1, txns  # the one the kill left (T may have committed it)
            for txn in txns:
                assert txn["logged"] == ("commit" if how == "flipped" else "unknown")
                assert [b["rm"] for b in txn["branches"]] in (["jb:remote"], ["jb:host", "jb:remote"])
                done = cli(host, passfile, "commit", "txn", "-n", txn["id"], "-bn", "jb")
                assert done.returncode == 0, done.stdout + done.stderr
                assert "was successful" in done.stdout
            again = cli(host, passfile, "list", "txn", "-bn", "jb")
            assert again.returncode == 0 and re.search(r"^jb\|", again.stdout, re.M) is None
            shutil.move(txlog, base / "txlog.jb.damaged")
            r = cli(host, passfile, "start", "bridge", "-bn", "jb")
            assert r.returncode == 0, r.stdout + r.stderr
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, quiet=2.0)]
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
    finally:
        host.stop()
