"""CLI jobs find their bridge through a running service's admin port (op CONFIG) and reach
its host broker over the jms connection service as the service account (never with the
admin login), which the service made at first start (etc/service.password, 0600)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import click
import pytest

from bridgemgr.admin.client import AdminClient
from bridgemgr.admin.login import admin_address
from bridgemgr.admin.protocol import Command
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.providers.embedded.remote import RemoteConnection
from bridgemgr.servicekeys import SERVICE_ACCOUNT
from bridgemgr.spark.jobs import service_job
from service_support import ROOT, Daemon, one_bridge_files

pytestmark = pytest.mark.timeout(120)

XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="jobs.src"/>
  <destination ref-name="dst" name="jobs.dst"/>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base = tmp_path_factory.mktemp("jobs")
    (base / "conf").mkdir()  # the XML is found relative to the properties file
    props, passfile = one_bridge_files(
        base / "conf",
        "jobs",
        XML,
        "Job-Secret-1",
        "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.jb.autostart=false",
        "imq.bridge.jb.runner=spark",
        "imq.bridge.spark.master=local[1]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=3",
        "imq.bridge.jb.link.window=7",
        "imq.bridge.jb.link.windowBytes=64k",
        activelist="jb,stomp",
    )
    daemon = Daemon(props)
    yield daemon, passfile, base
    daemon.stop()


def admin(daemon: Daemon) -> AdminClient:
    host, port, _ = admin_address(daemon.address, 10.0)
    return AdminClient(host, port, "admin", "Job-Secret-1")


@pytest.mark.slow
def test_config_tells_a_job_where_the_bridge_and_the_broker_are(service):
    daemon, _, base = service
    with admin(daemon) as client:
        reply = client.request(Command("CONFIG", None, "jb", None))
        assert reply.ok, reply.message
        data = reply.data
        assert data["xmlurl"] == str(base / "conf" / "jb.xml")  # relative to the properties file
        assert data["runner"] == "spark" and data["type"] == "JMS"
        assert data["spark"]["master"] == "local[1]"
        assert data["spark"]["conf"]["spark.sql.shuffle.partitions"] == "3"
        assert data["jms"].startswith("mqtcp://127.0.0.1:")
        assert (data["linkWindow"], data["linkWindowBytes"]) == (7, 64 * 1024)
        assert "Job-Secret-1" not in str(data)
        missing = client.request(Command("CONFIG", None, "nope", None))
        assert missing.status == 404 and "bridges: jb, stomp" in missing.message
        stomp = client.request(Command("CONFIG", None, "stomp", None))
        assert stomp.status == 400 and "only a JMS bridge" in stomp.message


@pytest.mark.slow
def test_service_job_loads_the_bridge_and_logs_in_to_the_host_broker(service):
    daemon, passfile, base = service
    job = service_job(daemon.address, "jb", "admin", str(passfile))
    assert job.config.name == "jb" and [link.name for link in job.config.links] == ["l1"]
    assert job.runner == "spark" and job.spark_master == "local[1]"
    # a drain's executors bound their window as the bridge's links do
    assert (job.link_window, job.link_window_bytes) == (7, 64 * 1024)
    assert "Job-Secret-1" not in repr(job)
    etc = base / "conf" / "var" / "instances" / "jobs" / "etc"
    assert (job.broker_user, job.broker_password) == (SERVICE_ACCOUNT, (etc / "service.password").read_text().strip())
    assert job.dmq_key == bytes.fromhex((etc / "dmq.key").read_text().strip())
    assert (etc / "service.password").stat().st_mode & 0o077 == 0
    conn = job.host_factory({}).create_connection()  # no user: the service account
    try:
        assert isinstance(conn, RemoteConnection) and conn.username == SERVICE_ACCOUNT
        session = conn.create_session()
        session.create_producer(Queue("jobs.src")).send(
            TextMessage("from a job"), delivery_mode=DeliveryMode.PERSISTENT
        )
        conn.start()
        assert session.create_consumer(Queue("jobs.src")).receive(5).text == "from a job"
    finally:
        conn.close()


@pytest.mark.slow
def test_service_job_errors_name_the_problem(service, tmp_path):
    daemon, passfile, _ = service
    with pytest.raises(click.ClickException, match="no bridge named nope"):
        service_job(daemon.address, "nope", "admin", str(passfile))
    wrong = tmp_path / "wrong.properties"
    wrong.write_text("imq.imqbridgemgr.password=not-it\n")
    with pytest.raises(click.ClickException, match=r"(?i)authentication|login|password"):
        service_job(daemon.address, "jb", "admin", str(wrong), retries=0)


@pytest.mark.slow
def test_a_job_knows_the_backlog_of_a_host_broker_queue_only(service):
    """drain's and dmq archive's ETA: the depth of the link's source (or the DMQ) from the
    admin port's QUERY_DST when the host broker holds it; None when that cannot be told."""
    daemon, passfile, _ = service
    job = service_job(daemon.address, "jb", "admin", str(passfile))
    conn = job.host_factory({}).create_connection()
    try:
        producer = conn.create_session().create_producer(Queue("jobs.backlog"))
        for n in range(7):
            producer.send(TextMessage(f"m{n}"), delivery_mode=DeliveryMode.PERSISTENT)
    finally:
        conn.close()
    assert job.host_queue_depth("jobs.backlog") == 7
    assert job.host_queue_depth("jobs.never-made") is None  # no such queue
    source = job.config.link("l1").source
    assert job.backlog(source.connection_factory_ref, source.destination_ref) == job.host_queue_depth("jobs.src")
    assert job.backlog(source.connection_factory_ref, source.destination_ref, "n > 1") is None
    assert job.backlog(None, None) is None  # a DMQ on no factory of the bridge


@pytest.mark.slow
def test_a_job_that_cannot_reach_the_service_says_so_in_one_line(tmp_path):
    """-b with a port nothing listens on: one line naming where and what to check, no trace."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the job runs
    passfile = tmp_path / "pw.properties"
    passfile.write_text("imq.imqbridgemgr.password=whatever\n")
    passfile.chmod(0o600)
    for job in (["drain", "-bn", "jb", "-ln", "l1"], ["dmq", "archive", "-bn", "jb", str(tmp_path / "a")]):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bridgemgr.cli",
                *job,
                "-b",
                f"127.0.0.1:{port}",
                "-u",
                "admin",
                "-passfile",
                str(passfile),
                "-rtr",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert lines[0].startswith("Error: ") and f"127.0.0.1:{port}" in lines[0], lines
        assert "Traceback" not in out.stderr


PY4J_RESET = """
import socket, struct, threading

import click

from bridgemgr.spark.jobs import job_options


@click.command()
@job_options(bridge_required=False)
def main(**_):
    jvm = socket.create_server(("127.0.0.1", 0))

    def reset():  # a JVM ended under the call: the connection is reset
        while True:
            conn, _ = jvm.accept()
            conn.recv(100)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=reset, daemon=True).start()
    from py4j.java_gateway import GatewayClient, GatewayParameters

    client = GatewayClient(gateway_parameters=GatewayParameters(port=jvm.getsockname()[1]))
    print("answer", client.send_command("c\\no0\\nrun\\ne\\n"))


main()
"""


@pytest.mark.slow  # two interpreters start (about 1.5 s each)
def test_py4j_logs_of_a_failed_jvm_call_stay_off_a_jobs_stderr_unless_at_debug():
    """A failed drain printed py4j's "Exception while sending command." and its trace (19
    lines) after its one error line as it exited: a job's stderr has no py4j record unless
    -loglevel DEBUG asks for them."""
    pytest.importorskip("py4j")
    plain = subprocess.run([sys.executable, "-c", PY4J_RESET], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and plain.stdout.startswith("answer"), plain.stdout + plain.stderr
    assert plain.stderr == "", plain.stderr
    debug = subprocess.run(
        [sys.executable, "-c", PY4J_RESET, "-loglevel", "DEBUG"], capture_output=True, text=True, timeout=60
    )
    assert "Exception while sending command." in debug.stderr, debug.stderr
