"""The XA log's database unreachable under a link whose commits run behind it, end to end:
a `serve` H with imq.persist.store=jdbc (its store and the bridges' XA log in a database of
this test's own, conftest's `database`) runs transacted link l1 from its host queue xa.src to a second
in-process broker (imq.embedded at a path), batchSize 1: two in-process resource managers,
so each transaction's commit phase is the link's Completer's (bridgemgr/xa/completer.py).

For a few seconds every database connection that writes the XA log is cut as soon as it
is seen (pg_terminate_backend on the backends whose query names imq_bridge_txlog), while
the store's own connections are left alone: the completer cannot log commit decisions or
forget finished transactions. Such a transaction is rolled back (presumed abort) and the
link must take that for a lost connection and go on with backoff, never stop, lose or
duplicate: the target gets every message once, in order, and since none of those
rollbacks is a message's fault they do not count toward the backout threshold: the DMQ
stays empty. (Before, the completer's TxLogUnavailable stopped the link for good; then the
units it rolled back behind the failed one reached the threshold and went to the DMQ.)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bridgemgr.jms import Queue
from bridgemgr.providers.embedded import Broker, EmbeddedConnectionFactory
from service_support import Daemon, cli, link_row, one_bridge_files, send, take
from test_xa_faults_e2e import PASSWORD
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N = 600
CUT_SECONDS = 3.0  # the link's backoff doubles with each rollback: 0.3 + 0.6 + 1.2 s by then

XML = """<?xml version="1.0" encoding="UTF-8"?>
<jmsbridge name="jb">
  <link name="l1" transacted="true">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="far" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far" lookup-name="XAConnectionFactory">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="{far}"/>
  </connection-factory>
  <destination ref-name="src" name="xa.src"/>
  <destination ref-name="dst" name="xa.dst"/>
</jmsbridge>
"""


def cut_txlog_connections(conninfo: dict[str, str], until: float, cuts: list[int]) -> None:
    """Terminate every backend whose current or last query names the XA log's table."""
    import psycopg

    with psycopg.connect(**conninfo, autocommit=True) as admin:
        while time.monotonic() < until:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE '%imq_bridge_txlog%' AND pid <> pg_backend_pid()"
            ).fetchall()
            cuts.append(sum(1 for (done,) in rows if done))
            time.sleep(0.01)


@pytest.mark.parametrize("threshold", [5, 1])
def test_a_link_whose_completer_cannot_write_the_xa_log_retries_and_moves_everything_once(
    tmp_path: Path,
    database,
    threshold: int,
) -> None:
    """backoutThreshold 1: a message of a unit rolled back behind the link comes back
    before the link took that unit's outcome; the link takes it first (the outage excuses
    the redelivery), or the message went to the DMQ at its first backout."""
    far = tmp_path / "far"
    base = tmp_path / "host"
    base.mkdir()
    props, passfile = one_bridge_files(
        base,
        "host",
        XML.format(far=far),
        PASSWORD,
        "imq.bridge.jb.autostart=false",
        "imq.bridge.jb.transaction.batchSize=1",
        f"imq.bridge.jb.backoutThreshold={threshold}",
        "imq.persist.store=jdbc",
        f"imq.persist.jdbc.postgresql.property.url={database.url()}",
    )
    passfile.chmod(0o600)
    host = Daemon(props)
    stopped = False
    try:
        send(host, PASSWORD, "xa.src", *(f"m{i}" for i in range(N)))
        r = cli(host, passfile, "start", "bridge", "-bn", "jb")
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(0.5)  # moving
        cuts: list[int] = []
        cutter = threading.Thread(
            target=cut_txlog_connections, args=(database.conninfo(), time.monotonic() + CUT_SECONDS, cuts)
        )
        cutter.start()
        cutter.join()
        assert sum(cuts) > 0, "no XA log connection was cut"

        def moved_all() -> bool:
            row = link_row(host, passfile, "l1")
            assert row[1] != "STOPPED", f"the link stopped: {row}; {host.lines[-5:]}"
            return row[5] == str(N)

        wait_for(moved_all, 90, f"link l1 to have transferred {N}", interval=0.5)
        assert take(host, PASSWORD, "xa.src", quiet=0.5) == []
        assert take(host, PASSWORD, "imq.bridge.jms.dmq", quiet=0.5) == []
        host.stop()
        stopped = True
        broker = Broker(far)
        try:
            with EmbeddedConnectionFactory(broker).create_connection() as conn:
                conn.start()
                consumer = conn.create_session().create_consumer(Queue("xa.dst"))
                got = []
                while (m := consumer.receive(0.5)) is not None:
                    got.append(m.text)
            assert broker.xa_recover() == []
        finally:
            broker.close()
        assert len(got) == N and len(set(got)) == N, (len(got), len(set(got)))
        assert got == [f"m{i}" for i in range(N)]
    finally:
        if not stopped:
            host.stop()
