"""HA broker clusters end to end (docs/ha.md): several `serve` instances sharing a database of
a real PostgreSQL server and one central cluster properties file. The chapter's three
start-up rules for imq.bridge.activelist against the ownership table, `list bridge`
showing each bridge's owner, and `check` / `serve` refusing an instance whose bridge
configuration differs from a live member's."""

from __future__ import annotations

import time

import pytest

from ha_support import Cluster, Instance, check, host_xml
from ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_three_activelist_rules(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {n: host_xml(n) for n in ("jb1", "jb2", "jb3")})
    try:
        a = cluster.start("A", "jb1,jb2")
        # Rule 1: bridges not in the table are added as A's, and A runs them.
        assert a.bridges == {"jb1": "STARTED", "jb2": "STARTED"}, a.lines
        listed = a.listed()
        assert {n: (r["state"], r["owner"]) for n, r in listed.items()} == {
            "jb1": ("STARTED", "A"),
            "jb2": ("STARTED", "A"),
        }
        # Rule 2: B names jb2, which A owns: dropped from B's activelist; jb3 is added as B's.
        b = cluster.start("B", "jb2,jb3")
        assert b.bridges == {"jb3": "STARTED"}, b.lines
        assert "bridge jb2 is owned by broker A: removed from imq.bridge.activelist" in "\n".join(b.lines)
        assert {n: (r["state"], r["owner"]) for n, r in b.listed().items()} == {
            "jb1": ("-", "A"),
            "jb2": ("-", "A"),
            "jb3": ("STARTED", "B"),
        }
        r = a.cli_list()
        assert "Owner" in r and [line.split() for line in r.splitlines() if line.startswith("jb3")] == [
            ["jb3", "JMS", "-", "B"]
        ]
    finally:
        cluster.stop()


def test_an_owned_bridge_is_added_to_the_activelist(tmp_path, postgresql):
    cluster = Cluster(tmp_path, postgresql, {"jb1": host_xml("jb1")})
    try:
        a = cluster.start("A", "jb1")
        assert a.bridges == {"jb1": "STARTED"}
        a.stop()
        # Rule 3: A owns jb1 in the table; restarted with an empty activelist it runs jb1.
        a = cluster.start("A", "")
        assert a.bridges == {"jb1": "STARTED"}, a.lines
        assert "bridge jb1 is owned by broker A: added to imq.bridge.activelist" in "\n".join(a.lines)
    finally:
        cluster.stop()


def test_check_and_serve_refuse_another_bridge_configuration(tmp_path, postgresql):
    cluster = Cluster(tmp_path / "one", postgresql, {"jb1": host_xml("jb1")})
    try:
        cluster.start("A", "jb1")
        props, passfile = cluster.files("B", "")
        assert check(props).returncode == 0
        # B's central file sets another batch size and has another jb1.xml.
        other = tmp_path / "other"
        other.mkdir()
        (other / "jb1.xml").write_text(host_xml("jb1").replace('name="jb1.out"', 'name="elsewhere"'))
        (other / "cluster.properties").write_text(
            cluster.central.read_text() + "imq.bridge.jb1.transaction.batchSize=5\n"
        )
        text = props.read_text().replace(f"file:{cluster.central}", f"file:{other / 'cluster.properties'}")
        props.write_text(text)
        r = check(props)
        assert r.returncode == 1, r.stdout + r.stderr
        assert (
            "the bridge configuration differs from live broker A's in "
            "imq.bridge.jb1.transaction.batchSize, imq.bridge.jb1.xmlurl (sha256 of the file)"
        ) in r.stderr
        with pytest.raises(AssertionError) as refused:
            Instance(props, passfile, "B")
        assert "the service cannot start: HA cluster: the bridge configuration differs from live broker A's" in str(
            refused.value
        )
        # The same broker id twice: refused while A's lease is live.
        props_a2, _ = cluster.files("A", "")
        r = check(props_a2)
        assert r.returncode == 1 and "broker id A is in use by a live instance" in r.stderr
    finally:
        cluster.stop()


def test_instances_without_bridges_renew_their_leases_and_take_over_stores(tmp_path, postgresql):
    from ha_support import MONITOR, PASSWORD
    from service_support import send, take
    from waiting import wait_for

    cluster = Cluster(tmp_path, postgresql, {}, "imq.bridge.enabled=false")
    try:
        a, b = cluster.start("A", ""), cluster.start("B", "")
        send(a, PASSWORD, "q", *(f"m{i}" for i in range(10)))
        time.sleep(2 * MONITOR)  # both renew: neither is taken over while alive
        assert not a.when("took over") and not b.when("took over"), a.lines + b.lines
        a.kill()
        wait_for(lambda: b.when("took over broker A"), 3 * MONITOR)
        assert [m.text for m in take(b, PASSWORD, "q", 10, 10, 0.3)] == [f"m{i}" for i in range(10)]
    finally:
        cluster.stop()


def test_the_cluster_compares_the_bridge_configuration_the_service_tells_it(postgresql):
    """providers/embedded/cluster.py knows no bridge keys: the service (and check) hand it
    props.bridge_configuration, and it names the keys in which a live member differs."""
    import uuid

    from bridgemgr.props import bridge_configuration, load_properties
    from bridgemgr.providers.embedded.cluster import cluster_problems, open_cluster

    database = postgresql.create_database("cfg" + uuid.uuid4().hex[:10])

    def props(brokerid: str, *more: str):
        return load_properties(
            [],
            [
                "imq.cluster.ha=true",
                "imq.cluster.clusterid=c1",
                f"imq.brokerid={brokerid}",
                "imq.persist.store=jdbc",
                f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
                *more,
            ],
            environ={},
        )

    shared = {"imq.bridge.enabled": "true", "imq.bridge.jb1.type": "jms", "imq.bridge.jb1.xmlurl": "http://h/jb1.xml"}
    a = open_cluster(props("A"), "a", shared)
    try:
        b = props("B")
        assert bridge_configuration(b) == {"imq.bridge.enabled": "false"}
        assert cluster_problems(b, shared) == []
        assert cluster_problems(b, {**shared, "imq.bridge.jb1.type": "stomp"}) == [
            "the bridge configuration differs from live broker A's in imq.bridge.jb1.type; every instance "
            "of HA cluster c1 needs the same (imq.cluster.url)"
        ]
    finally:
        a.leave()


def test_two_instances_on_one_host_each_run_a_stomp_bridge_on_its_own_port(tmp_path, postgresql):
    """Each instance's own imq.bridge.stomp.tcp.port. Before, a STOMP port set per instance
    was refused ("set for this broker only"; every instance had to use the same one, so two
    could not share a host)."""
    from service_support import stomp_port

    cluster = Cluster(tmp_path, postgresql, {"jb1": host_xml("jb1")})
    try:
        ports = {brokerid: free_port() for brokerid in ("A", "B")}
        running = [
            cluster.start(brokerid, "jb1,stomp", f"imq.bridge.stomp.tcp.port={port}")
            for brokerid, port in ports.items()
        ]
        assert [i.bridges.get("stomp") for i in running] == ["STARTED", "STARTED"], [i.lines for i in running]
        assert [stomp_port(i) for i in running] == list(ports.values())
    finally:
        cluster.stop()
