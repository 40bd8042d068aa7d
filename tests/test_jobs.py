"""CLI jobs find their bridge through a running service's admin port (op CONFIG) and reach
its host broker over the jms connection service as the service account (never with the
admin login), which the service made at first start (etc/service.password, 0600)."""

from __future__ import annotations

import click
import pytest

from bridgemgr.admin.client import AdminClient
from bridgemgr.admin.login import admin_address
from bridgemgr.admin.protocol import Command
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from bridgemgr.providers.embedded.remote import RemoteConnection
from bridgemgr.servicekeys import SERVICE_ACCOUNT
from bridgemgr.spark.jobs import service_job
from service_support import Daemon, one_bridge_files

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
        base / "conf", "jobs", XML, "Job-Secret-1", "imq.bridge.stomp.tcp.port=0",
        "imq.bridge.jb.autostart=false", "imq.bridge.jb.runner=spark", "imq.bridge.spark.master=local[1]",
        "imq.bridge.spark.conf.spark.sql.shuffle.partitions=3", activelist="jb,stomp")
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
        assert "Job-Secret-1" not in str(data)
        missing = client.request(Command("CONFIG", None, "nope", None))
        assert missing.status == 404 and "bridges: jb, stomp" in missing.message
        stomp = client.request(Command("CONFIG", None, "stomp", None))
        assert stomp.status == 400 and "only a JMS bridge" in stomp.message


def test_service_job_loads_the_bridge_and_logs_in_to_the_host_broker(service):
    daemon, passfile, base = service
    job = service_job(daemon.address, "jb", "admin", str(passfile))
    assert job.config.name == "jb" and [link.name for link in job.config.links] == ["l1"]
    assert job.runner == "spark" and job.spark_master == "local[1]"
    assert "Job-Secret-1" not in repr(job)
    etc = base / "conf" / "var" / "instances" / "jobs" / "etc"
    assert (job.broker_user, job.broker_password) == (
        SERVICE_ACCOUNT, (etc / "service.password").read_text().strip())
    assert job.dmq_key == bytes.fromhex((etc / "dmq.key").read_text().strip())
    assert (etc / "service.password").stat().st_mode & 0o077 == 0
    conn = job.host_factory({}).create_connection()  # no user: the service account
    try:
        assert isinstance(conn, RemoteConnection) and conn.username == SERVICE_ACCOUNT
        session = conn.create_session()
        session.create_producer(Queue("jobs.src")).send(TextMessage("from a job"),
                                                        delivery_mode=DeliveryMode.PERSISTENT)
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
