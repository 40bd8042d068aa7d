"""HA cluster properties without a server: imq.cluster.* are known keys, what an HA instance
needs (cluster id, broker id, the jdbc store, the central file) is named by `check`, the
central file (imq.cluster.url) gives every instance its bridge properties, and a bridge
property set for one instance only, or a per-instance key in the central file, is an error
naming file and line."""

from __future__ import annotations

from pathlib import Path

from bridgemgr.props import parse_properties

URL = "imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://db:5432/imq"


def messages(problems) -> list[str]:
    return [f"{Path(p.source).name}:{p.line}: {p.message}" for p in problems if p.severity == "error"]


def test_cluster_keys_are_known_and_typed():
    props, problems = parse_properties(
        [],
        [
            "imq.cluster.ha=true",
            "imq.cluster.clusterid=c1",
            "imq.brokerid=b1",
            "imq.persist.store=jdbc",
            URL,
            "imq.cluster.heartbeat.interval=1",
            "imq.cluster.monitor.interval=4",
        ],
        environ={},
    )
    assert problems == []
    assert (props.get("imq.cluster.ha"), props.get("imq.brokerid"), props.get("imq.cluster.monitor.interval")) == (
        True,
        "b1",
        4,
    )


def test_what_an_ha_instance_lacks_is_named():
    _, problems = parse_properties(
        [],
        ["imq.cluster.ha=true", "imq.brokerid=b 1", "imq.bridge.enabled=true", "imq.cluster.heartbeat.interval=30"],
        environ={},
    )
    found = "\n".join(messages(problems))
    assert "imq.brokerid is 'b 1'; write 1 to 24 letters, digits or _" in found
    assert "imq.cluster.ha is true but imq.cluster.clusterid is not set" in found
    assert "imq.cluster.ha is true but imq.brokerid is not set" in found
    assert "imq.cluster.ha is true but imq.persist.store is not jdbc" in found
    assert "imq.cluster.heartbeat.interval must be shorter than imq.cluster.monitor.interval" in found
    assert "imq.cluster.ha is true with bridges but imq.cluster.url is not set" in found


def test_the_central_file_gives_the_bridges_and_keeps_them(tmp_path):
    central = tmp_path / "central" / "cluster.properties"
    central.parent.mkdir()
    central.write_text(
        "imq.bridge.enabled=true\nimq.bridge.jb.type=jms\nimq.bridge.jb.xmlurl=jb.xml\nimq.bridge.activelist=jb\n"
    )
    own = tmp_path / "broker.properties"
    own.write_text(
        f"imq.cluster.ha=true\nimq.cluster.clusterid=c1\nimq.brokerid=b1\nimq.persist.store=jdbc\n{URL}\n"
        "imq.cluster.url=central/cluster.properties\nimq.bridge.admin.user=admin\n"
        "imq.bridge.jb.autostart=false\n"
    )
    props, problems = parse_properties([own], [], environ={})
    assert props.bridge_type("jb") == "jms" and props.bridge("jb").xml_base == central.parent
    assert messages(problems) == [
        "cluster.properties:4: imq.bridge.activelist is set in the cluster properties (imq.cluster.url); "
        "set it in each broker's own properties",
        "broker.properties:8: imq.bridge.jb.autostart is set for this broker only; in an HA cluster every "
        "bridge property but imq.bridge.activelist, imq.bridge.admin.* and the STOMP bridge's hostname and "
        "ports belongs in the cluster properties (imq.cluster.url): the same on every instance",
    ]


def test_an_instance_sets_its_own_stomp_port_over_the_central_files(tmp_path):
    """Two instances on one host need two STOMP ports: an instance's own file (or -D) sets
    imq.bridge.stomp.tcp.port over the central file's, and the bridge configuration the
    instances must share leaves it out. Before, it was an error ("set for this broker
    only") and a difference from every live member."""
    from bridgemgr.props import bridge_configuration

    (tmp_path / "cluster.properties").write_text("imq.bridge.enabled=true\nimq.bridge.stomp.tcp.port=0\n")
    configs = []
    for brokerid, port in (("b1", 7801), ("b2", 7802)):
        own = tmp_path / f"{brokerid}.properties"
        own.write_text(
            f"imq.cluster.ha=true\nimq.cluster.clusterid=c1\nimq.brokerid={brokerid}\nimq.persist.store=jdbc\n"
            f"{URL}\nimq.cluster.url=cluster.properties\nimq.bridge.activelist=stomp\n"
            f"imq.bridge.stomp.tcp.port={port}\n"
        )
        props, problems = parse_properties([own], [f"imq.bridge.stomp.tls.port={port + 10}"], environ={})
        assert messages(problems) == []
        assert (props.stomp.tcp_port, props.stomp.tls_port) == (port, port + 10)
        configs.append(bridge_configuration(props))
    assert configs[0] == configs[1] == {"imq.bridge.enabled": "true"}


def test_a_missing_central_file_is_named(tmp_path):
    _, problems = parse_properties([], [f"imq.cluster.url=file:{tmp_path}/nowhere.properties"], environ={})
    assert messages(problems) == ["nowhere.properties:None: cannot read the properties file: No such file or directory"]


def test_the_central_file_may_be_served_over_http(tmp_path):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "cluster.properties").write_text(
        "imq.bridge.enabled=true\nimq.bridge.jb.type=jms\nimq.bridge.jb.xmlurl=http://example.invalid/jb.xml\n"
    )
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        props, problems = parse_properties(
            [],
            [
                f"imq.cluster.url={url}/cluster.properties",
                "imq.cluster.ha=true",
                "imq.cluster.clusterid=c1",
                "imq.brokerid=b1",
                "imq.persist.store=jdbc",
                URL,
            ],
            environ={},
        )
        assert messages(problems) == [] and props.bridge_type("jb") == "jms"
        assert props.origin("imq.bridge.jb.type").source == f"{url}/cluster.properties"
        _, problems = parse_properties([], [f"imq.cluster.url={url}/nowhere.properties"], environ={})
        assert (
            len(messages(problems)) == 1
            and "cannot read the cluster properties: HTTP Error 404" in messages(problems)[0]
        )
    finally:
        server.shutdown()
        server.server_close()


def test_an_ha_instance_without_psycopg_names_the_extra(tmp_path, monkeypatch):
    """Before, the service ended in a raw ModuleNotFoundError (the cluster code imported
    psycopg itself); now serve says "the service cannot start: imq.cluster.ha needs psycopg:
    pip install 'imqbridge[postgres]'"."""
    import sys

    import pytest

    from bridgemgr.jms.errors import StoreError
    from bridgemgr.props import load_properties
    from bridgemgr.service import BridgeServiceManager

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as where it is not installed
    props = load_properties(
        [],
        [
            f"imq.varhome={tmp_path}",
            "imq.cluster.ha=true",
            "imq.cluster.clusterid=c1",
            "imq.brokerid=b1",
            "imq.persist.store=jdbc",
            URL,
        ],
        environ={},
    )
    with pytest.raises(StoreError, match=r"imq\.cluster\.ha needs psycopg: pip install 'imqbridge\[postgres\]'"):
        BridgeServiceManager(props).start()


def test_a_conventional_cluster_is_refused_with_its_reason(tmp_path):
    props_file = tmp_path / "broker.properties"
    props_file.write_text("imq.instancename=b1\nimq.cluster.brokerlist=host1:7676,host2:7676\n")
    _, problems = parse_properties([props_file], [], environ={})
    assert messages(problems) == [
        "broker.properties:2: imq.cluster.brokerlist is set but imq.cluster.ha is not true: the "
        "conventional cluster model (brokers that route messages to each other, no shared store) "
        "is not supported, so this broker would run alone and a message sent to it would reach only "
        "its own consumers and bridges; remove the property, or make the brokers an HA cluster "
        "(imq.cluster.ha=true, a shared jdbc store: docs/ha.md)"
    ]
    _, problems = parse_properties(
        [],
        [
            "imq.cluster.ha=true",
            "imq.cluster.clusterid=c1",
            "imq.brokerid=b1",
            "imq.persist.store=jdbc",
            URL,
            "imq.cluster.brokerlist=host1:7676",
        ],
        environ={},
    )
    assert [(p.severity, p.message) for p in problems] == [
        (
            "warning",
            "imq.cluster.brokerlist is ignored in an HA cluster: its instances find each other in the shared store",
        )
    ]
