"""End to end: `imqbridgemgr serve` as a process with a JMS bridge, driven only through
the `imqbridgemgr` CLI (as a process); messages counted in the store afterwards.
Includes a kill -9 of the daemon: the bridge comes back as configured and no message
is lost.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.providers.embedded import EmbeddedConnectionFactory
from service_support import Daemon, cli
from stores import open_at
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
N = 300

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="b1">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <link name="off" enabled="false" transacted="false">
    <source connection-factory-ref="host" destination-ref="dst"/>
    <target connection-factory-ref="host" destination-ref="src"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="e2e.src"/>
  <destination ref-name="dst" name="e2e.dst"/>
</jmsbridge>
"""


def service_files(base: Path, xml: str, *extra: str) -> tuple[Path, Path]:
    """b1.xml, broker properties of instance e2e with bridge b1 and an admin login (plus
    ``extra`` lines), and the admin passfile."""
    (base / "b1.xml").write_text(xml)
    props = base / "broker.properties"
    props.write_text(
        "\n".join(
            [
                f"imq.varhome={base / 'var'}",
                "imq.instancename=e2e",
                "imq.portmapper.port=0",
                "imq.bridge.enabled=true",
                "imq.bridge.admin.user=admin",
                "imq.bridge.admin.password=Secret-1",
                "imq.bridge.activelist=b1",
                "imq.bridge.b1.type=jms",
                "imq.bridge.b1.xmlurl=b1.xml",
                "imq.bridge.b1.autostart=true",
                *extra,
            ]
        )
        + "\n"
    )
    passfile = base / "pw.properties"
    passfile.write_text("imq.imqbridgemgr.password=Secret-1\n")
    return props, passfile


def preload(store: Path | str, n: int) -> None:
    """m0 .. m<n-1>, persistent, on e2e.src of a store (a directory or a jdbc spec)."""
    broker = open_at(store, sync=True)
    producer = EmbeddedConnectionFactory(broker).create_connection().create_session().create_producer(Queue("e2e.src"))
    for i in range(n):
        producer.send(TextMessage(f"m{i}"), delivery_mode=DeliveryMode.PERSISTENT)
    broker.close()


@pytest.fixture
def setup(tmp_path):
    props, passfile = service_files(tmp_path, XML, "imq.persist.file.sync.enabled=true")
    store = tmp_path / "var" / "instances" / "e2e" / "store"
    preload(store, N)
    return props, passfile, store


def link_row(daemon: Daemon, passfile: Path, link: str = "l1") -> list[str]:
    out = cli(daemon, passfile, "list", "link", "-bn", "b1", "-v").stdout
    return next(line.split() for line in out.splitlines() if line.startswith(link + " "))


def wait_transferred(daemon: Daemon, passfile: Path, at_least: int) -> int:
    return wait_for(
        lambda: (done := int(link_row(daemon, passfile)[5])) >= at_least and done,
        60,
        f"link l1 to have transferred {at_least}",
        interval=0.2,
    )


def wait_drained(daemon: Daemon, passfile: Path, queue: str = "e2e.src") -> None:
    """Until ``queue`` holds nothing, waiting or delivered: the link has moved all of it."""

    def held() -> int:
        r = cli(daemon, passfile, "query", "dst", "-t", "q", "-n", queue, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        data = json.loads(r.stdout)["data"]
        return data["pending"] + data["unacked"]

    wait_for(lambda: held() == 0, 60, f"{queue} to be drained", interval=0.2)


def count(store: Path | str, queue: str) -> list[str]:
    """The texts on ``queue`` of a store (a directory or a jdbc spec: tests/stores.py)."""
    broker = open_at(store)
    conn = EmbeddedConnectionFactory(broker).create_connection()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue(queue))
    out = []
    while (m := consumer.receive(0.2)) is not None:
        out.append(m.text)
    broker.close()
    return out


def test_operate_a_bridge_through_the_cli(setup):
    props, passfile, store = setup
    daemon = Daemon(props)
    try:
        assert "bridge b1 (JMS): STARTED" in daemon.lines
        r = cli(daemon, passfile, "list", "bridge")
        assert r.returncode == 0, r.stderr
        assert re.search(r"^b1\s+JMS\s+STARTED$", r.stdout, re.M)
        assert "The operation [list] on the bridge(s) was successful." in r.stdout
        assert wait_transferred(daemon, passfile, N) == N

        r = cli(daemon, passfile, "list", "bridge", "-bn", "b1")
        assert re.search(r"^b1\s+JMS\s+STARTED\s+2$", r.stdout, re.M)
        assert re.search(r"^l1\s+STARTED\s+host:\w:queue:e2e.src\s+host:\w:queue:e2e.dst\s+false$", r.stdout, re.M)
        assert re.search(r"^off\s+UNINITIALIZED", r.stdout, re.M)

        for op, state in (("pause", "PAUSED"), ("resume", "STARTED"), ("stop", "STOPPED"), ("start", "STARTED")):
            r = cli(daemon, passfile, op, "link", "-bn", "b1", "-ln", "l1")
            assert r.returncode == 0, r.stderr
            assert f"The operation [{op}] on the link was successful." in r.stdout
            assert link_row(daemon, passfile)[1] == state

        r = cli(daemon, passfile, "stop", "bridge", "-bn", "b1")
        assert r.returncode == 0 and "The operation [stop] on the bridge was successful." in r.stdout
        r = cli(daemon, passfile, "pause", "link", "-bn", "b1", "-ln", "l1")
        assert r.returncode == 1 and "the bridge is STOPPED" in r.stderr
        r = cli(daemon, passfile, "start", "bridge", "-bn", "nope")
        assert r.returncode == 1 and "no bridge named nope (bridges: b1)" in r.stderr
        r = cli(daemon, passfile, "start", "bridge", "-bn", "b1", "-t", "stomp")
        assert r.returncode == 1
        r = cli(daemon, passfile, "start", "bridge", "-bn", "b1")
        assert r.returncode == 0
        r = cli(daemon, passfile, "list", "bridge", "--json")
        assert '"state": "STARTED"' in r.stdout

        bad = passfile.with_name("bad.properties")
        bad.write_text("imq.imqbridgemgr.password=wrong\n")
        r = cli(daemon, bad, "list", "bridge")
        assert r.returncode == 1 and "authentication failed" in r.stderr
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        rest, _ = daemon.proc.communicate(timeout=60)
    assert daemon.proc.returncode == 0, rest
    assert sorted(count(store, "e2e.dst"), key=lambda t: int(t[1:])) == [f"m{i}" for i in range(N)]


def test_kill9_of_the_daemon_then_restart(setup):
    props, passfile, store = setup
    daemon = Daemon(props)
    wait_transferred(daemon, passfile, 1)
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait()
    daemon = Daemon(props)  # the lock of the killed daemon is gone with it
    try:
        assert "bridge b1 (JMS): STARTED" in daemon.lines
        r = cli(daemon, passfile, "list", "bridge")
        assert re.search(r"^b1\s+JMS\s+STARTED$", r.stdout, re.M)
        wait_drained(daemon, passfile)  # the restarted bridge drained what was left
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.communicate(timeout=60)
    moved = count(store, "e2e.dst")
    assert set(moved) == {f"m{i}" for i in range(N)}, "messages lost across kill -9"
    assert len(moved) - N <= 1, "more than the in-flight message duplicated"
    assert count(store, "e2e.src") == []


def test_stomp_bridge_and_remote_clients_through_the_service(setup):
    """STOMP in, JMS bridge across, STOMP out; the STOMP bridge started and stopped with
    `-t STOMP` and listed by the port mapper only while it runs; an mq:// client of
    another process reaches the same broker."""
    import stomp

    from bridgemgr import connect
    from bridgemgr.admin.portmapper import lookup_services

    props, passfile, _store = setup
    text = props.read_text().replace("imq.bridge.activelist=b1", "imq.bridge.activelist=b1,stomp")
    props.write_text(text + "imq.bridge.stomp.tcp.port=0\n")
    daemon = Daemon(props)
    try:
        host, port = daemon.address.split(":")
        services = {e.name: e.port for e in lookup_services(host, int(port))}
        assert {"portmapper", "jms", "bridgeadmin", "stomp"} <= set(services)
        wait_transferred(daemon, passfile, N)

        got: list[str] = []
        listener = type("L", (stomp.ConnectionListener,), {"on_message": lambda self, f: got.append(f.body)})()
        client = stomp.Connection12([(host, services["stomp"])])
        client.set_listener("", listener)
        client.connect("admin", "Secret-1", wait=True)
        client.subscribe("/queue/e2e.dst", id="1", ack="auto")
        client.send("/queue/e2e.src", "via stomp", headers={"persistent": "true"})
        wait_for(lambda: len(got) >= N + 1, 30, f"{N + 1} messages over STOMP")
        client.disconnect(receipt="bye")  # waits for the receipt: no delivery to this client after it
        assert "via stomp" in got and len(got) == N + 1

        with connect(f"mq://{daemon.address}", username="admin", password="Secret-1") as conn:
            conn.start()
            session = conn.create_session()
            session.create_producer(Queue("e2e.src")).send(TextMessage("via mq"))
            consumer = session.create_consumer(Queue("e2e.dst"))
            assert consumer.receive(30).text == "via mq"

        r = cli(daemon, passfile, "stop", "bridge", "-t", "STOMP")
        assert r.returncode == 0, r.stderr
        assert "stomp" not in {e.name for e in lookup_services(host, int(port))}
        r = cli(daemon, passfile, "pause", "bridge", "-t", "STOMP")
        assert r.returncode == 2  # the STOMP bridge cannot be paused (usage error, as the original)
        r = cli(daemon, passfile, "start", "bridge", "-t", "STOMP")
        assert r.returncode == 0, r.stderr
        assert "stomp" in {e.name for e in lookup_services(host, int(port))}
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.communicate(timeout=60)


def test_admin_port_over_tls_with_secure(setup, tmp_path):
    trustme = pytest.importorskip("trustme", reason="trustme is a test dependency (pip install -e .[test])")
    props, passfile, _store = setup
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "admin.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    props.write_text(
        props.read_text() + f"imq.bridge.admin.tls.enabled=true\n"
        f"imq.bridge.admin.tls.certfile={tmp_path / 'admin.pem'}\n"
        f"imq.jms.tls.enabled=true\nimq.jms.tls.certfile={tmp_path / 'admin.pem'}\n"
    )
    daemon = Daemon(props)
    try:
        env_ca = ["--cafile", str(tmp_path / "ca.pem")]
        r = cli(daemon, passfile, "list", "bridge", "-secure", *env_ca)
        assert r.returncode == 0, r.stderr
        assert re.search(r"^b1\s+JMS\s+STARTED$", r.stdout, re.M)
        r = cli(daemon, passfile, "list", "bridge", "-secure")  # the system CAs do not trust it
        assert r.returncode == 1 and "TLS" in r.stderr
        import ssl

        from bridgemgr import connect
        from bridgemgr.admin.portmapper import lookup_services

        host, port = daemon.address.split(":")
        ssljms = next(e for e in lookup_services(host, int(port)) if e.name == "ssljms")
        assert ssljms.protocol == "tls"
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with connect(f"mqssl://{host}:{ssljms.port}", username="admin", password="Secret-1", ssl_context=ctx) as conn:
            conn.start()
            assert conn.create_session().create_consumer(Queue("e2e.dst")).receive(30) is not None
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.communicate(timeout=60)


def test_a_broken_bridge_stays_stopped_others_start_and_garbage_is_refused(setup, tmp_path):
    import json
    import socket

    from bridgemgr.admin.portmapper import find_service

    props, passfile, _store = setup
    (tmp_path / "broken.xml").write_text("<jmsbridge name='broken'><link></jmsbridge>")
    props.write_text(
        props.read_text().replace("imq.bridge.activelist=b1", "imq.bridge.activelist=broken,b1")
        + f"imq.bridge.broken.type=jms\nimq.bridge.broken.xmlurl={tmp_path / 'broken.xml'}\n"
    )
    daemon = Daemon(props)
    try:
        assert "bridge broken (JMS): STOPPED" in daemon.lines
        assert "bridge b1 (JMS): STARTED" in daemon.lines
        assert any("broken.xml" in line and "ERROR" in line for line in daemon.lines)
        r = cli(daemon, passfile, "start", "bridge", "-bn", "broken")
        assert r.returncode == 1 and "broken.xml" in r.stderr
        host, port = daemon.address.split(":")
        admin = find_service(host, int(port), ("bridgeadmin",))
        with socket.create_connection((host, admin.port), timeout=10) as s:
            s.sendall(b"\x00\xff garbage \n")
            reply = json.loads(s.makefile("rb").readline())
        assert reply["status"] == 400
        assert cli(daemon, passfile, "list", "bridge").returncode == 0  # still serving
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.communicate(timeout=60)


def test_no_admin_credentials_no_admin_port(setup):
    from bridgemgr.admin.portmapper import lookup_services

    props, _passfile, _store = setup
    props.write_text("\n".join(line for line in props.read_text().splitlines() if "admin.password" not in line) + "\n")
    daemon = Daemon(props)
    try:
        host, port = daemon.address.split(":")
        assert "bridgeadmin" not in {e.name for e in lookup_services(host, int(port))}
        assert any("the admin port stays closed" in line for line in daemon.lines)
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.communicate(timeout=60)


JDBC_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="b1" log-message-transfer="false">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="far" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far" lookup-name="XAConnectionFactory">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="{far}"/>
  </connection-factory>
  <destination ref-name="src" name="e2e.src"/>
  <destination ref-name="dst" name="e2e.dst"/>
</jmsbridge>
"""


def test_jdbc_store_with_a_transacted_link_through_kill9(tmp_path, postgresql):
    """imq.persist.store=jdbc: the host broker's store and the bridge's XA log live in
    PostgreSQL (schema imq_<instance>), no store.db and no txlog file; a transacted link to
    a second broker moves every message exactly once across a kill -9 of the service; the
    database password is never printed. (Transfers are not logged: the test reads the
    service's output only at its end, and a full pipe would stall the service.)"""
    import psycopg

    with psycopg.connect(**postgresql.conninfo(), autocommit=True) as admin:
        admin.execute("CREATE ROLE bridge LOGIN PASSWORD 'Db-Secret-7'")
        admin.execute("CREATE DATABASE imqstore OWNER bridge")
    far = tmp_path / "far"
    url = postgresql.url("imqstore").split("?")[0]
    props, passfile = service_files(
        tmp_path,
        JDBC_XML.format(far=far),
        "imq.persist.store=jdbc",
        "imq.persist.jdbc.dbVendor=postgresql",
        f"imq.persist.jdbc.postgresql.property.url={url}",
        "imq.persist.jdbc.postgresql.user=bridge",
        "imq.persist.jdbc.postgresql.password=Db-Secret-7",
        "imq.bridge.b1.transaction.batchSize=5",
    )
    spec = f"{url}?user=bridge&password=Db-Secret-7#imq_e2e"
    n = 2000
    preload(spec, n)

    daemon = Daemon(props)
    printed = list(daemon.lines)
    wait_transferred(daemon, passfile, 1)
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait()
    printed += daemon.proc.stdout.read().splitlines()
    daemon = Daemon(props)
    try:
        printed += daemon.lines
        assert any("schema imq_e2e" in line for line in printed), printed[:20]
        wait_drained(daemon, passfile)
        r = cli(daemon, passfile, "list", "link", "-bn", "b1")
        assert re.search(r"^l1\s+STARTED\s.*\strue\s", r.stdout, re.M), r.stdout
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        rest, _ = daemon.proc.communicate(timeout=60)
    printed += rest.splitlines()
    assert daemon.proc.returncode == 0, rest
    assert not any("Db-Secret-7" in line for line in printed), "the database password was printed"

    instance = tmp_path / "var" / "instances" / "e2e"
    assert not (instance / "store" / "store.db").exists()
    assert not list(instance.rglob("txlog.*")), "the XA log belongs in the database"
    with psycopg.connect(**postgresql.conninfo("imqstore")) as db:
        assert db.execute("SELECT count(*) FROM imq_e2e.imq_bridge_txlog").fetchone()[0] == 0
    moved = count(far, "e2e.dst")
    assert sorted(moved, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(n)], (
        "a transacted link moves every message exactly once"
    )
    assert count(spec, "e2e.src") == []
