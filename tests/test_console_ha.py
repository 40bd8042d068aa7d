"""GET /api/v1/cluster on an instance of a real HA cluster (two `serve` processes on one
PostgreSQL database): every instance with its lease, and each bridge's owner; the
console's cluster page shows them in headless Chromium."""

from __future__ import annotations

import base64
import http.client
import json
from datetime import datetime
from types import SimpleNamespace

import pytest

from bridgemgr.admin.portmapper import find_service
from ha_support import PASSWORD, Cluster, host_xml
from waiting import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def cluster_view(instance) -> tuple[int, dict]:
    host, port = instance.address.rsplit(":", 1)
    console = find_service(host, int(port), ("console",)).port
    conn = http.client.HTTPConnection(host, console, timeout=30)
    try:
        token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
        conn.request("GET", "/api/v1/cluster", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_cluster_shows_its_instances_leases_and_bridge_owners(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {"jb1": host_xml("jb1")})
    try:
        a = cluster.start("A", "jb1", "imq.console.port=0")
        cluster.start("B", "", "imq.console.port=0")

        def both_listed():
            status, answer = cluster_view(a)
            listed = [i["brokerid"] for i in answer["data"]["instances"]] if status == 200 else []
            return listed == ["A", "B"] and answer

        answer = wait_for(both_listed, 30, "A and B listed")
        data = answer["data"]
        assert data["instance"] == "A" and data["clusterid"] == cluster.clusterid
        # (a loaded machine may let a lease lapse and the other instance take over: both are shown)
        for row in data["instances"]:
            assert row["state"] in ("live", "taken") and isinstance(row["leaseCurrent"], bool), row
            assert datetime.fromisoformat(row["leaseExpires"]).tzinfo is not None
            assert row["takenBy"] == ({"A": "B", "B": "A"}[row["brokerid"]] if row["state"] == "taken" else None)
        assert any(r["state"] == "live" and r["leaseCurrent"] for r in data["instances"]), data
        assert [b["name"] for b in data["bridges"]] == ["jb1"] and data["bridges"][0]["owner"] in ("A", "B")
    finally:
        cluster.stop()


def test_the_cluster_page_shows_the_instances_and_the_owner(tmp_path, postgresql):
    pages = pytest.importorskip("test_console_pages")  # (skipped without Chromium and selenium)
    cluster = Cluster(tmp_path, postgresql, {"jb1": host_xml("jb1")})
    try:
        a = cluster.start("A", "jb1", "imq.console.port=0")
        cluster.start("B", "", "imq.console.port=0")
        host, port = a.address.rsplit(":", 1)
        console = SimpleNamespace(console=find_service(host, int(port), ("console",)))
        script = (
            "return [...document.querySelectorAll('#cluster table')].map("
            "t => [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent)))"
        )
        with pages.chromium() as driver:
            pages.log_in(driver, console, "admin", PASSWORD)
            driver.get(pages.url(console, "#/cluster"))
            instances, bridges = wait_for(
                lambda: (t := driver.execute_script(script)) and len(t) == 2 and len(t[0]) == 2 and t,
                30,
                "both instances on the cluster page",
            )
            assert [r[0] for r in instances] == ["A", "B"] and all(r[1] in ("live", "taken") for r in instances)
            assert [r[0] for r in bridges] == ["jb1"] and bridges[0][1] in ("A", "B")
            assert pages.text(driver, "#cluster p") == f"cluster {cluster.clusterid}, this instance A"
            errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
            assert not errors, errors
    finally:
        cluster.stop()
