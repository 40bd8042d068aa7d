"""PostgreSQL stopped and started under a transacted link, end to end: host H (a `serve`
with imq.persist.store=jdbc in a PostgreSQL server of this test's own, bridge jb moving
xa.src -> xa.dst at target T over mq://, batches of 10; its XA log in the same database)
and T (another `serve`, file store).

The database is stopped (fast shutdown: H's connections are cut) mid-transfer for 5 s and
started again. H's store and XA log connect again by themselves and the link resumes: T
gets every message once, in order, with nothing left at H's source or in its DMQ; while
the database is down, /readyz says so. (Before, the store failed for good: "accepts no
more changes", and the link stopped.)
"""

from __future__ import annotations

import base64
import http.client
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from service_support import Daemon, cli, one_bridge_files, send, take
from test_xa_faults_e2e import IDLE_XML, PASSWORD, XML  # one host H -> target T link for every XA e2e file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N = 3000


@pytest.fixture
def database():
    """A PostgreSQL server of this test's own (it is stopped and started)."""
    from pgserver import PostgreSQL, missing_postgresql

    reason = missing_postgresql()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="imqbridge-pg-outage-"))
    server = PostgreSQL(base)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


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
    base = tmp_path / "target"
    base.mkdir()
    tprops, _ = one_bridge_files(base, "target", IDLE_XML, PASSWORD, activelist="")
    target = Daemon(tprops)
    base = tmp_path / "host"
    base.mkdir()
    props, passfile = one_bridge_files(
        base, "host", XML.format(password=PASSWORD, target=target.address), PASSWORD,
        "imq.bridge.jb.autostart=false", "imq.bridge.jb.transaction.batchSize=10",
        "imq.persist.store=jdbc", f"imq.persist.jdbc.postgresql.property.url={database.url()}",
        "imq.persist.file.sync.enabled=true", "imq.metrics.port=0")
    passfile.chmod(0o600)
    host = Daemon(props)
    try:
        metrics = metrics_address(host)
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(0.5)  # mid-transfer
        database.stop_fast()
        deadline = time.monotonic() + 15
        while (status := readyz(metrics))[0] == 200:
            assert time.monotonic() < deadline, "/readyz stayed ready with the database down"
            time.sleep(0.2)
        assert status[0] == 503 and "database cannot be reached" in status[1], status
        time.sleep(5)
        database.start()
        got = [m.text for m in take(target, PASSWORD, "xa.dst", expect=N, wait=120, quiet=2.0)]
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        assert take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5) == []
        deadline = time.monotonic() + 15
        while readyz(metrics)[0] != 200:
            assert time.monotonic() < deadline, readyz(metrics)
            time.sleep(0.2)
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
        base, "host", IDLE_XML, PASSWORD, "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}", "imq.metrics.port=0",
        activelist="")
    host = Daemon(props)
    try:
        metrics = metrics_address(host)
        assert readyz(metrics)[0] == 200
        database.stop_fast()
        stopped = time.monotonic()
        while (status := readyz(metrics))[0] == 200:
            assert time.monotonic() < stopped + 8, "/readyz stayed ready with the database down"
            time.sleep(0.2)
        assert status[0] == 503 and "database cannot be reached" in status[1], status
        database.start()
        started = time.monotonic()
        while (status := readyz(metrics))[0] != 200:
            assert time.monotonic() < started + 15, status
            time.sleep(0.2)
    finally:
        host.stop()
