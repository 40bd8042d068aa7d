"""GET /api/v1/cluster on an instance of a real HA cluster (two `serve` processes on one
PostgreSQL database): every instance with its lease, and each bridge's owner."""

from __future__ import annotations

import base64
import http.client
import json

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

        def both_live():
            status, answer = cluster_view(a)
            instances = answer["data"]["instances"] if status == 200 else []
            return [(i["brokerid"], i["state"], i["leaseCurrent"]) for i in instances] == [
                ("A", "live", True),
                ("B", "live", True),
            ] and answer

        answer = wait_for(both_live, 30, "A and B live")
        assert answer["data"]["instance"] == "A" and answer["data"]["clusterid"] == cluster.clusterid
        assert [(b["name"], b["owner"]) for b in answer["data"]["bridges"]] == [("jb1", "A")]
        assert all(i["leaseExpires"] and i["takenBy"] is None for i in answer["data"]["instances"])
    finally:
        cluster.stop()
