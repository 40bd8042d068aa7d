"""Once-and-only-once, in order, when the target fails inside a commit phase, end to end:
host H (a `serve` with bridge jb, transacted link xa.src -> xa.dst at T over mq://,
batches of 10) and target T (another `serve`, restarted on the same port).

H is held right after logging a commit decision (the fault hook's hold), T is killed with
SIGKILL meanwhile, and H goes on: its own branch commits, T's stays prepared, in doubt.
T comes back after longer than the link's connect-attempt-interval (1 s here). The link must have its
in-doubt transaction committed before it moves new messages: a consumer at T gets every
message once, in order. (Before, the link reconnected at 5 s and moved the next messages
while recovery's retry came at 14 s: the in-doubt batch arrived after them.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from bridgemgr.xa.coordinator import FAULT_ENV
from pgserver import free_port
from service_support import Daemon, cli, one_bridge_files, send, take
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Secret-1"
N = 100

XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="true">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="remote" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="remote" lookup-name="XAConnectionFactory"
                      username="admin" password="{password}" connect-attempt-interval-in-seconds="1">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="mq://{target}"/>
  </connection-factory>
  <destination ref-name="src" name="xa.src"/>
  <destination ref-name="dst" name="xa.dst"/>
</jmsbridge>
"""
IDLE_XML = '<jmsbridge name="idle"><connection-factory ref-name="host"/></jmsbridge>\n'


def target_props(tmp_path: Path) -> Path:
    base = tmp_path / "target"
    base.mkdir()
    props, _ = one_bridge_files(
        base,
        "target",
        IDLE_XML,
        PASSWORD,
        "imq.persist.file.sync.enabled=true",
        f"imq.portmapper.port={free_port()}",
        activelist="",
    )
    return props


def host_service(tmp_path: Path, target: Daemon, remote_property: str = "") -> tuple[Path, Path]:
    """H's files; ``remote_property``: a <property> more for the remote factory."""
    base = tmp_path / "host"
    base.mkdir()
    xml = XML.format(password=PASSWORD, target=target.address).replace(
        "  </connection-factory>", f"    {remote_property}\n  </connection-factory>"
    )
    props, passfile = one_bridge_files(
        base,
        "host",
        xml,
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.jb.transaction.batchSize=10",
        "imq.persist.file.sync.enabled=true",
    )
    passfile.chmod(0o600)
    return props, passfile


def wait_listed(host: Daemon, passfile: Path, prefix: str, seconds: float = 20) -> str:
    """The rest of the line of `list link -bn jb` that starts with ``prefix``, once there."""

    def listed() -> str | None:
        out = cli(host, passfile, "list", "link", "-bn", "jb").stdout
        return next((line[len(prefix) :] for line in out.splitlines() if line.startswith(prefix)), None)

    return wait_for(listed, seconds, f"a link line starting {prefix!r}", interval=0.3)


def test_the_target_killed_in_a_commit_phase_gets_the_in_doubt_batch_first(tmp_path, monkeypatch):
    tprops = target_props(tmp_path)
    target = Daemon(tprops)
    hold = tmp_path / "hold"
    monkeypatch.setenv(FAULT_ENV, f"logged:hold:{hold}")
    props, passfile = host_service(tmp_path, target)
    host = Daemon(props)
    monkeypatch.delenv(FAULT_ENV)
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        hold.touch()
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(hold.with_name("hold.held").exists, 60, "hold.held")  # H logged a decision and waits
        target.proc.kill()
        target.proc.wait(timeout=30)
        hold.unlink()  # H commits: its own branch, and T's fails: in doubt
        down = time.monotonic()
        reason = wait_listed(host, passfile, "Link l1 is STARTING: ")
        assert "in doubt" in reason or "connection" in reason, reason
        time.sleep(max(0.0, down + 2 - time.monotonic()))  # past the link's connect-attempt-interval
        target = Daemon(tprops)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=90, quiet=2.0)]
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        listed = cli(host, passfile, "list", "link", "-bn", "jb").stdout
        assert "Link l1 is" not in listed and " STARTED " in listed, listed  # cleared
    finally:
        host.stop()
        target.stop()


@pytest.mark.parametrize("ack_timeout", [None, 2000])
def test_a_stopped_target_is_noticed_in_seconds_and_gets_everything_once_in_order(tmp_path, monkeypatch, ack_timeout):
    """T is stopped (SIGSTOP) inside a commit phase: its XA commit gets no answer, which
    H notices within the XA call timeout (10 s, or the factory's imqAckTimeout), not after
    90 s of missing heart-beats; once T continues, the in-doubt batch is committed first
    and nothing is lost."""
    tprops = target_props(tmp_path)
    target = Daemon(tprops)
    hold = tmp_path / "hold"
    monkeypatch.setenv(FAULT_ENV, f"logged:hold:{hold}")
    extra = "" if ack_timeout is None else f'<property name="imqAckTimeout" value="{ack_timeout}"/>'
    props, passfile = host_service(tmp_path, target, extra)
    seconds = 10 if ack_timeout is None else ack_timeout // 1000
    host = Daemon(props)
    monkeypatch.delenv(FAULT_ENV)
    bridge_log = tmp_path / "host" / "var" / "instances" / "host" / "bridges" / "jb" / "log.txt"
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        hold.touch()
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(hold.with_name("hold.held").exists, 60, "hold.held")
        target.proc.send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            hold.unlink()
            deadline = stopped + 3 * seconds
            while f"no answer to xa_commit within {seconds} s" not in bridge_log.read_text():
                assert time.monotonic() < deadline, f"the hung commit was not noticed in {seconds} s"
                time.sleep(0.2)
        finally:
            target.proc.send_signal(signal.SIGCONT)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=90, quiet=2.0)]
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
    finally:
        host.stop()
        target.stop()
