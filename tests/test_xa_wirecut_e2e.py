"""A transacted link's connection to its target cut at one exact XA request, end to end:
host H (a `serve` with bridge jb, transacted link xa.src -> xa.dst, batches of 50) reaches
target T (another `serve`, its jms service on a fixed port) through a proxy of real
sockets (wirecut.WireCutter) that cuts the connection the moment H's third XA END or
PREPARE arrives: before T sees it, or after T did it and before H hears the answer, and
in some runs T is killed with SIGKILL at that moment too (then started again).

Such a transaction failed before its commit decision: every branch rolls back, its 50
messages come back from H's source and arrive at T once. None of them may also be in
H's DMQ (issue 11's rule: a message goes to the DMQ only when it will not come back), or
redriving the DMQ duplicates them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridgemgr.providers.embedded import wire
from pgserver import free_port
from service_support import Daemon, cli, one_bridge_files, send, take
from test_xa_faults_e2e import IDLE_XML, PASSWORD, XML
from wirecut import WireCutter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

N = 200


@pytest.mark.parametrize(
    "op,forward,kill",
    [
        (wire.Op.XA_END, False, False),
        (wire.Op.XA_END, True, True),
        (wire.Op.XA_PREPARE, False, True),
        (wire.Op.XA_PREPARE, True, False),
        (wire.Op.XA_PREPARE, True, True),
    ],
    ids=["end-cut", "end-done-kill", "prepare-cut-kill", "prepare-done-cut", "prepare-done-kill"],
)
def test_a_transaction_cut_in_end_or_prepare_comes_back_once_and_never_to_the_dmq(
    tmp_path: Path, op: wire.Op, forward: bool, kill: bool
) -> None:
    jms_port = free_port()
    base = tmp_path / "target"
    base.mkdir()
    tprops, _ = one_bridge_files(
        base,
        "target",
        IDLE_XML,
        PASSWORD,
        "imq.persist.file.sync.enabled=true",
        f"imq.jms.tcp.port={jms_port}",
        activelist="",
    )
    target = Daemon(tprops)
    killed = target
    cutter = WireCutter(jms_port, op, nth=3, forward=forward, then=(lambda: killed.proc.kill()) if kill else None)
    base = tmp_path / "host"
    base.mkdir()
    xml = XML.format(password=PASSWORD, target="x").replace("mq://x", f"mqtcp://127.0.0.1:{cutter.port}")
    props, passfile = one_bridge_files(
        base,
        "host",
        xml,
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.jb.transaction.batchSize=50",
        "imq.persist.file.sync.enabled=true",
    )
    passfile.chmod(0o600)
    host = Daemon(props)
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        assert cutter.cut.wait(60), "the link never reached its third XA request"
        if kill:
            target.proc.wait(timeout=30)
            target = Daemon(tprops)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=90, quiet=2.0)]
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        dead = take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5)
        assert dead == [], f"{len(dead)} copies in the DMQ of messages that arrived once"
    finally:
        cutter.close()
        host.stop()
        target.stop()
