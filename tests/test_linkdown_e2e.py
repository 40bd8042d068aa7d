"""A real `serve` whose link's target (another broker's jms service over mq://) goes down
and comes back: /readyz turns 503 naming the link and why, `list link -v` shows the link
STARTING with that reason, and both clear once it has reconnected, which the service log
says once."""

from __future__ import annotations

import base64
import http.client
import json
import re
from pathlib import Path

import pytest

from bridgemgr.providers.embedded import Broker
from service_support import Daemon, cli, one_bridge_files
from test_jmsbridge_linkdown import Far
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSWORD = "Linkdown-Secret-1"
XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="far" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <connection-factory ref-name="far" lookup-name="ConnectionFactory" connect-attempt-interval-in-seconds="1">
    <property name="java.naming.factory.initial" value="imq.embedded"/>
    <property name="java.naming.provider.url" value="{url}"/>
  </connection-factory>
  <destination ref-name="src" name="ld.src"/>
  <destination ref-name="dst" name="ld.dst"/>
</jmsbridge>
"""


def readyz(address: tuple[str, int]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*address, timeout=30)
    auth = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    try:
        conn.request("GET", "/readyz", headers={"Authorization": "Basic " + auth})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_target_down_shows_in_readyz_and_list_link_until_it_is_back(tmp_path: Path):
    far_broker = Broker(tmp_path / "far")
    far = Far(far_broker)
    props, passfile = one_bridge_files(tmp_path, "linkdown", XML.format(url=far.url), PASSWORD, "imq.metrics.port=0")
    passfile.chmod(0o600)
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        url = next(line.split()[1] for line in daemon.lines if line.startswith("metrics: "))
        m = re.match(r"http://([\d.]+):(\d+)/metrics$", url)
        assert m, url
        address = (m.group(1), int(m.group(2)))
        assert readyz(address) == (200, {"ready": True, "reasons": []})

        far.stop()
        # Before: 200 and STARTED with no error, however long the target stayed down.
        _, body = wait_for(
            lambda: (got := readyz(address))[0] == 503 and "cannot connect" in str(got[1]) and got,
            20,
            "/readyz 503 with the failed connect attempts",
            interval=0.2,
        )
        assert body["ready"] is False and len(body["reasons"]) == 1, body
        reason = body["reasons"][0]
        assert reason.startswith(
            f"link l1 of bridge jb is STARTING: cannot connect with connection-factory far to {far.url}"
        )
        listed = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
        assert listed.returncode == 0, listed.stderr
        assert "Link l1 is STARTING: cannot connect with connection-factory far" in listed.stdout, listed.stdout

        far = far.again()
        wait_for(lambda: readyz(address)[0] == 200, 20, "/readyz 200 again", interval=0.2)
        listed = cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")
        assert "is STARTING" not in listed.stdout, listed.stdout
    finally:
        daemon.stop()
        far.stop()
        far_broker.close()
    log = (tmp_path / "var" / "instances" / "linkdown" / "log" / "log.txt").read_text()
    assert log.count("link l1 reconnected after") == 1, log
