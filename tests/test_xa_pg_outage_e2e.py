"""PostgreSQL stopped and started under a transacted link, end to end: host H (a `serve`
with imq.persist.store=jdbc in a database of this test's own, on a PostgreSQL server that
tests stop and start (conftest's `database`), bridge jb moving
xa.src -> xa.dst at target T over mq://, batches of 10; its XA log in the same database)
and T (another `serve`, file store).

The database is stopped (fast shutdown: H's connections are cut) mid-transfer for 5 s and
started again. H's store and XA log connect again by themselves and the link resumes: T
gets every message once, in order, with nothing left at H's source or in its DMQ; while
the database is down, /readyz says so. (Before, the store failed for good: "accepts no
more changes", and the link stopped.) The units an outage rolled back do not count toward
the backout threshold, also after H is killed and started again.
"""

from __future__ import annotations

import base64
import http.client
import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest

from service_support import Daemon, cli, one_bridge_files, send, take
from test_xa_faults_e2e import IDLE_XML, PASSWORD, XML  # one host H -> target T link for every XA e2e file
from waiting import wait_for

# A transformer that holds the link while the file "hold" exists in $GATE, writing into
# "held" the message it holds and its delivery count.
GATE = """
import os
import time
from pathlib import Path

from bridgemgr.transform import MessageTransformer


class Gate(MessageTransformer):
    def transform(self, message, *args):
        gate = Path(os.environ["GATE"])
        while (gate / "hold").exists():
            (gate / "held.new").write_text(f"{message.text} {message.delivery_count}")
            os.replace(gate / "held.new", gate / "held")
            time.sleep(0.02)
        return message
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N = 1000


def target_and_host_folder(tmp_path: Path) -> tuple[Daemon, Path]:
    """T running (file store, no bridge), and the folder for H's files."""
    base = tmp_path / "target"
    base.mkdir()
    tprops, _ = one_bridge_files(base, "target", IDLE_XML, PASSWORD, activelist="")
    target = Daemon(tprops)
    base = tmp_path / "host"
    base.mkdir()
    return target, base


def metrics_address(daemon: Daemon) -> tuple[str, int]:
    """Where `serve` said its metrics port listens (imq.metrics.port=0: a free port)."""
    url = next(line.split()[1] for line in daemon.lines if line.startswith("metrics: "))
    m = re.match(r"http://([\d.]+):(\d+)/metrics$", url)
    assert m, url
    return m.group(1), int(m.group(2))


def readyz(address: tuple[str, int]) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*address, timeout=30)
    auth = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    try:
        conn.request("GET", "/readyz", headers={"Authorization": "Basic " + auth})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_the_store_and_the_xa_log_reconnect_after_a_database_restart(tmp_path, database):
    target, base = target_and_host_folder(tmp_path)
    props, passfile = one_bridge_files(
        base,
        "host",
        XML.format(password=PASSWORD, target=target.address),
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.jb.transaction.batchSize=10",
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}",
        "imq.persist.file.sync.enabled=true",
        "imq.metrics.port=0",
    )
    passfile.chmod(0o600)
    host = Daemon(props)
    try:
        metrics = metrics_address(host)
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(0.5)  # mid-transfer (anywhere in it: no count marks a moment)
        database.stop_fast()
        status = wait_for(
            lambda: (got := readyz(metrics))[0] != 200 and got,
            15,
            "/readyz to stop being ready with the database down",
            interval=0.2,
        )
        assert status[0] == 503 and "database cannot be reached" in status[1], status
        time.sleep(5)  # the outage: its length is what the store and the XA log ride out
        database.start()
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=120, quiet=2.0)]
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        assert take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5) == []
        wait_for(lambda: readyz(metrics)[0] == 200, 15, "/readyz ready again", interval=0.2)
    finally:
        host.stop()
        target.stop()


def test_an_idle_store_is_not_ready_while_its_database_is_down(tmp_path, database):
    """Nothing is written: the store's periodic probe notices the database going away
    (/readyz 503 within a few seconds) and coming back (ready again). Before, an idle store
    read ready until its first failed write."""
    base = tmp_path / "host"
    base.mkdir()
    props, _ = one_bridge_files(
        base,
        "host",
        IDLE_XML,
        PASSWORD,
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}",
        "imq.metrics.port=0",
        activelist="",
    )
    host = Daemon(props)
    try:
        metrics = metrics_address(host)
        assert readyz(metrics)[0] == 200
        database.stop_fast()
        status = wait_for(
            lambda: (got := readyz(metrics))[0] != 200 and got,
            8,
            "/readyz to stop being ready with the database down",
            interval=0.2,
        )
        assert status[0] == 503 and "database cannot be reached" in status[1], status
        database.start()
        wait_for(lambda: readyz(metrics)[0] == 200, 15, "/readyz ready again", interval=0.2)
    finally:
        host.stop()


def held(gate: Path, seconds: float = 30) -> tuple[str, int]:
    """The message the gate holds now and its delivery count (waiting for it)."""
    wait_for((gate / "held").exists, seconds, "the link to reach the gate")
    text, count = (gate / "held").read_text().split()
    return text, int(count)


def gated_xml(base: Path, target: Daemon, password: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """jb.xml (H's link to ``target``, logging in with ``password``) whose target step
    runs the gate transformer, from ``base``/plugins; the gate's folder ``base``/gate,
    closed ("hold")."""
    plugins, gate = base / "plugins", base / "gate"
    plugins.mkdir()
    gate.mkdir()
    (plugins / "gate.py").write_text(GATE)
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(plugins))
    monkeypatch.setenv("GATE", str(gate))
    (gate / "hold").touch()
    xml = XML.format(password=password, target=target.address).replace(
        '<target connection-factory-ref="remote" destination-ref="dst"/>',
        '<target connection-factory-ref="remote" destination-ref="dst" message-transformer-class="gate.Gate"/>',
    )
    return xml, gate


def roll_back_in_an_outage(database, gate: Path) -> None:
    """With the gate holding m0 (delivered once): the database goes down and the gate
    opens, so the link's unit fills and fails to complete, rolled back again and again
    (excused: the outage's fault); the database comes back and the gate holds m0 again,
    once it has been delivered 3+ times."""
    assert held(gate) == ("m0", 1)
    database.stop_fast()
    (gate / "hold").unlink()  # the unit fills and fails to complete, again and again
    time.sleep(3)  # the outage: rollbacks again and again while it lasts
    (gate / "held").unlink()
    (gate / "hold").touch()  # the link is held at its next try of m0
    database.start()
    now = wait_for(lambda: (got := held(gate, 60))[1] >= 3 and got, 60, "m0 delivered 3+ times", interval=0.1)
    assert now[0] == "m0", now


def test_outage_rollbacks_stay_excused_after_the_host_is_killed(tmp_path, database, monkeypatch):
    """backoutThreshold=2. The database goes down while the link holds a unit; the link's
    attempts to complete it roll it back, excused (the outage's fault), until the first
    message has been delivered 3+ times. H is then killed (kill -9) with that message in
    its unit and started again: it comes back once more, and one crash is one backout,
    under the threshold. Every message reaches T once, in order; none in the DMQ.
    (Before, the excuses lived in memory only: after the restart the message read as
    backed out 3+ times and its unit went to the DMQ, BACKOUT_THRESHOLD_REACHED.)"""
    n = 30
    target, base = target_and_host_folder(tmp_path)
    xml, gate = gated_xml(base, target, PASSWORD, monkeypatch)
    props, passfile = one_bridge_files(
        base,
        "host",
        xml,
        PASSWORD,
        "imq.bridge.jb.transaction.batchSize=10",
        "imq.bridge.jb.backoutThreshold=2",
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}",
        "imq.persist.file.sync.enabled=true",
    )
    passfile.chmod(0o600)
    host = Daemon(props)
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(n)))
        roll_back_in_an_outage(database, gate)
        os.kill(host.proc.pid, signal.SIGKILL)
        host.proc.wait(timeout=30)
        (gate / "hold").unlink()
        host = Daemon(props)
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=n, wait=60, quiet=1.0)]
        assert got == [f"m{i}" for i in range(n)], got
        dead = take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5)
        assert dead == [], [(m.text, m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON")) for m in dead]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        excused = base / "var" / "instances" / "host" / "bridges" / "jb" / "excused.l1"
        assert excused.read_text() == "{}"  # committed: nothing is excused any more
        assert stat.S_IMODE(excused.stat().st_mode) == 0o600
    finally:
        host.stop()
        target.stop()
