"""imq_destination_producers and imq_destination_bytes of a real `serve`, scraped over
HTTP: the link's own (anonymous) producer counts on its target once it has sent there;
a remote mq:// session counts once per destination it sent to, bound or anonymous
producer alike, until it closes; a STOMP connection counts once per destination it sent
to until it disconnects; bytes are counted without a byte limit (persistent and not) and
go back to 0 when the queue is emptied."""

from __future__ import annotations

import base64
import http.client
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridgemgr import connect
from bridgemgr.admin.portmapper import find_service
from bridgemgr.jms import DeliveryMode, Queue, TextMessage
from service_support import Daemon, one_bridge_files, send, take
from stomp_support import Raw
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Dest-Metrics-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="pd.src"/>
  <destination ref-name="dst" name="pd.dst"/>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("dstmetrics")
    props, _ = one_bridge_files(
        base, "dstmetrics", XML, PASSWORD, "imq.metrics.port=0", "imq.bridge.stomp.tcp.port=0", activelist="jb,stomp"
    )
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED", "stomp": "STARTED"}, daemon.lines
        url = next(line.split()[1] for line in daemon.lines if line.startswith("metrics: "))
        m = re.match(r"http://([\d.]+):(\d+)/metrics$", url)
        assert m, url
        yield daemon, (m.group(1), int(m.group(2)))
    finally:
        daemon.stop()


def destination(address: tuple[str, int], metric: str, name: str) -> float | None:
    conn = http.client.HTTPConnection(*address, timeout=30)
    token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
    finally:
        conn.close()
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == metric and s.labels == {"type": "queue", "name": name}:
                return s.value
    return None


def eventually(address, metric: str, name: str, want: float, wait: float = 20) -> None:
    wait_for(
        lambda: destination(address, metric, name) == want, wait, f"{metric}{{name={name}}} == {want}", interval=0.2
    )


def test_the_links_producer_counts_on_its_target_once_it_sent_there(service):
    daemon, address = service
    send(daemon, PASSWORD, "pd.src", "through the link")
    take(daemon, PASSWORD, "pd.dst", expect=1, quiet=0.1)
    eventually(address, "imq_destination_producers", "pd.dst", 1)  # the link's anonymous producer
    assert destination(address, "imq_destination_producers", "pd.src") == 0  # send()'s closed


def test_a_remote_session_counts_per_destination_until_it_closes(service):
    daemon, address = service
    with connect(f"mq://{daemon.address}", username="admin", password=PASSWORD) as conn:
        anonymous = conn.create_session().create_producer()
        for _ in range(3):
            anonymous.send(TextMessage("a"), Queue("pd.remote"))
        bound = conn.create_session().create_producer(Queue("pd.remote"))
        bound.send(TextMessage("b"))
        anonymous.send(TextMessage("c"), Queue("pd.remote2"))
        assert destination(address, "imq_destination_producers", "pd.remote") == 2
        assert destination(address, "imq_destination_producers", "pd.remote2") == 1
    eventually(address, "imq_destination_producers", "pd.remote", 0)
    assert destination(address, "imq_destination_producers", "pd.remote2") == 0


def test_a_stomp_connection_counts_per_destination_until_it_disconnects(service):
    daemon, address = service
    host, port = daemon.address.split(":")
    raw = Raw(find_service(host, int(port), ("stomp",)).port)
    raw.frame("CONNECT", {"accept-version": "1.2", "login": "admin", "passcode": PASSWORD})
    assert raw.wait(lambda f: f.command in ("CONNECTED", "ERROR")).command == "CONNECTED"
    for i in range(3):
        raw.frame("SEND", {"destination": "/queue/pd.stomp", "receipt": f"r{i}"}, b"hello")
        raw.wait(lambda f, i=i: f.command == "RECEIPT" and f.headers.get("receipt-id") == f"r{i}")
    assert destination(address, "imq_destination_producers", "pd.stomp") == 1
    raw.frame("DISCONNECT", {"receipt": "bye"})
    raw.wait(lambda f: f.command == "RECEIPT" and f.headers.get("receipt-id") == "bye")
    raw.close()
    eventually(address, "imq_destination_producers", "pd.stomp", 0)


def test_bytes_are_counted_without_a_byte_limit(service):
    daemon, address = service
    body = "x" * 2000
    send(daemon, PASSWORD, "pd.bytes", *[body] * 5, *[(body, DeliveryMode.NON_PERSISTENT)] * 5)
    assert destination(address, "imq_destination_messages", "pd.bytes") == 10
    counted = destination(address, "imq_destination_bytes", "pd.bytes")
    assert counted is not None and 10 * 2000 < counted < 10 * 2600, counted
    assert len(take(daemon, PASSWORD, "pd.bytes", expect=10, quiet=0.1)) == 10
    eventually(address, "imq_destination_bytes", "pd.bytes", 0)
