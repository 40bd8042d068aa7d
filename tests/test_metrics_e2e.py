"""The metrics port of a real `serve` (imq.metrics.port), scraped with an HTTP client:
/metrics values after messages moved through a link (some dead-lettered by its
transformer), /readyz while the bridge is stopped and once it runs again, the port
mapper's entry, who may read it (no credentials, a wrong password, an ordinary user, a
user named in imq.metrics.users, the admin), the connection cap; and `list link` (five
columns), `list link -v` and `--json` through the CLI."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridgemgr.admin.portmapper import lookup_services
from bridgemgr.users import UserRepository
from service_support import FAIL_ON_BAD, Daemon, cli, fail_on_bad_bridge, one_bridge_files, send
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PASSWORD = "Metrics-Secret-1"
MALLORY = ("mallory", "Mallory-Pw-1")  # an ordinary user of the broker
PROM = ("prom", "Prom-Scraper-Pw-1")  # group user, named in imq.metrics.users
MAX_CONNECTIONS = 3
XML = fail_on_bad_bridge("mx")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    base: Path = tmp_path_factory.mktemp("metrics")
    (base / "plugins").mkdir()
    (base / "plugins" / "failonbad.py").write_text(FAIL_ON_BAD)
    props, passfile = one_bridge_files(
        base,
        "metrics",
        XML,
        PASSWORD,
        "imq.metrics.port=0",
        f"imq.metrics.users={PROM[0]}",
        f"imq.metrics.max_connections={MAX_CONNECTIONS}",
        "imq.metrics.login.timeout=2",
    )
    passfile.chmod(0o600)
    users = UserRepository(base / "var" / "instances" / "metrics" / "etc" / "passwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(base / "plugins"))  # serve inherits it
        daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        users.add(*MALLORY)
        users.add(*PROM)
        # The traffic the counters below show, sent once here: every test stands alone.
        send(daemon, PASSWORD, "mx.src", *[f"ok {i}" for i in range(20)], *[f"bad {i}" for i in range(3)])
        url = next(line.split()[1] for line in daemon.lines if line.startswith("metrics: "))
        m = re.match(r"http://([\d.]+):(\d+)/metrics$", url)
        assert m, url
        yield daemon, passfile, (m.group(1), int(m.group(2)))
    finally:
        daemon.stop()


def get(
    address: tuple[str, int], path: str, user: tuple[str, str] | None = ("admin", PASSWORD)
) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(*address, timeout=30)
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


def samples(address: tuple[str, int]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, headers, body = get(address, "/metrics")
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(found: dict, metric: str, /, **labels: str) -> float | None:
    return found.get((metric, frozenset(labels.items())))


def test_metrics_count_what_a_link_moved_and_dead_lettered(service):
    _, _, address = service
    link = {"bridge": "jb", "link": "l1"}

    def moved() -> dict | None:
        """The samples once they show the 20 moved and the 3 dead-lettered (the link may
        transfer the 20 before it has received the last bad one: wait for both)."""
        found = samples(address)
        return (
            found
            if (
                value(found, "imq_link_transferred_total", **link) == 20
                and value(found, "imq_link_dead_lettered_total", reason="TRANSFORM_FAILURE", **link) == 3
            )
            else None
        )

    found = wait_for(moved, 30, "20 transferred and 3 dead-lettered in /metrics", interval=0.2)
    assert value(found, "imq_link_received_total", **link) == 23
    assert value(found, "imq_link_dead_lettered_total", reason="TRANSFORM_FAILURE", **link) == 3
    assert value(found, "imq_link_redelivered_total", **link) == 0
    assert value(found, "imq_link_transfer_latency_seconds_count", **link) == 20
    assert value(found, "imq_link_transfer_latency_seconds_bucket", le="+Inf", **link) == 20
    assert abs(value(found, "imq_link_last_transfer_timestamp_seconds", **link) - time.time()) < 60
    assert value(found, "imq_link_source_backlog", **link) == 0
    assert value(found, "imq_link_state", imq_link_state="STARTED", **link) == 1
    assert value(found, "imq_bridge_state", bridge="jb", type="JMS", imq_bridge_state="STARTED") == 1
    src, dst = {"type": "queue", "name": "mx.src"}, {"type": "queue", "name": "mx.dst"}
    assert value(found, "imq_destination_enqueued_total", **src) == 23
    assert value(found, "imq_destination_dequeued_total", **src) == 23
    assert value(found, "imq_destination_messages", **src) == 0
    assert value(found, "imq_destination_consumers", **src) == 1  # the link
    assert value(found, "imq_destination_messages", **dst) == 20
    assert value(found, "imq_destination_messages", type="queue", name="imq.bridge.jms.dmq") == 3
    assert value(found, "imq_store_writable") == 1
    assert value(found, "imq_store_size_bytes") > 0
    assert value(found, "imq_store_commit_seconds_count") > 0
    assert value(found, "imq_connections", service="jms") is not None
    assert value(found, "imq_memory_state", imq_memory_state="green") == 1
    assert value(found, "process_resident_memory_bytes") > 0


def test_list_link_keeps_five_columns_and_v_and_json_show_counters_and_last_error(service):
    daemon, passfile, _ = service
    verbose = wait_for(
        lambda: (r := cli(daemon, passfile, "list", "link", "-bn", "jb", "-v")) and ("(3 times)" in r.stdout) and r,
        30,
        "the link's last error (3 times)",
        interval=0.3,
    )
    titles = verbose.stdout.splitlines()[1].split()
    assert titles[:9] == ["Link", "Name", "Link", "State", "Source", "Target", "Transacted", "Transferred", "DMQ"]
    row = next(line for line in verbose.stdout.splitlines() if line.startswith("l1 "))
    words = row.split()
    assert words[5:8] == ["20", "3", "0"]  # transferred, DMQ, redelivered
    assert float(words[8]) > 0 and words[9] == "0"  # rate, backlog
    assert row.endswith("TRANSFORM_FAILURE: ValueError: bad message (3 times)")
    plain = cli(daemon, passfile, "list", "link", "-bn", "jb")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[1].split() == ["Link", "Name", "Link", "State", "Source", "Target", "Transacted"]
    assert next(line for line in plain.stdout.splitlines() if line.startswith("l1 ")).split() == [
        "l1",
        "STARTED",
        "host:D:queue:mx.src",
        "host:D:queue:mx.dst",
        "false",
    ]
    data = json.loads(cli(daemon, passfile, "list", "link", "-bn", "jb", "--json").stdout)["data"]
    link = data["links"][0]
    counters = link["counters"]
    assert (counters["transferred"], counters["to_dmq"], counters["dmq_reasons"]) == (20, 3, {"TRANSFORM_FAILURE": 3})
    assert counters["last_error"] == "TRANSFORM_FAILURE: ValueError: bad message (3 times)"
    assert counters["rate"] > 0 and link["backlog"] == 0


def test_readyz_says_503_while_the_bridge_is_stopped_then_200(service):
    daemon, passfile, address = service
    assert get(address, "/readyz")[:1] == (200,)
    assert cli(daemon, passfile, "stop", "bridge", "-bn", "jb").returncode == 0
    try:
        status, headers, body = get(address, "/readyz")
        assert status == 503 and headers["content-type"] == "application/json"
        assert json.loads(body) == {"ready": False, "reasons": ["bridge jb is STOPPED, not STARTED"]}
        assert get(address, "/healthz", user=None)[::2] == (200, "ok\n")  # the process is up
        found = samples(address)
        assert value(found, "imq_link_state", bridge="jb", link="l1", imq_link_state="STARTED") == 0
    finally:
        assert cli(daemon, passfile, "start", "bridge", "-bn", "jb").returncode == 0
    status = wait_for(lambda: (got := get(address, "/readyz"))[0] == 200 and got, 30, "/readyz 200", interval=0.2)
    assert json.loads(status[2]) == {"ready": True, "reasons": []}


def test_the_port_mapper_lists_the_metrics_port(service):
    daemon, _, address = service
    host, port = daemon.address.split(":")
    entries = {e.name: e for e in lookup_services(host, int(port))}
    assert (entries["metrics"].protocol, entries["metrics"].type, entries["metrics"].port) == (
        "http",
        "METRICS",
        address[1],
    )


def test_the_connection_cap_refuses_and_idle_connections_are_closed(service):
    _, _, address = service
    idle = [socket.create_connection(address, timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)  # the three are accepted and counted: no count shows it (a scrape is refused)
        status, _, body = get(address, "/healthz", user=None)
        assert status == 503 and "imq.metrics.max_connections=3" in body
        for sock in idle:  # no request within imq.metrics.login.timeout (2 s): closed
            assert sock.recv(100) == b""
    finally:
        for sock in idle:
            sock.close()
    assert get(address, "/healthz", user=None)[0] == 200


def test_only_admins_and_named_readers_get_metrics_and_readyz(service):
    """Last in the module: the failed logins here slow later ones from this address."""
    _, _, address = service
    assert get(address, "/metrics", user=PROM)[0] == 200
    assert get(address, "/readyz", user=PROM)[0] == 200
    status, headers, body = get(address, "/metrics", user=None)
    assert status == 401 and headers["www-authenticate"].startswith('Basic realm="imqbridge metrics"')
    assert "imq_link" not in body
    status, _, body = get(address, "/metrics", user=MALLORY)  # a valid login, but not a reader
    assert status == 403 and "mallory" in body and "imq_link" not in body
    assert get(address, "/readyz", user=MALLORY)[0] == 403
    for wrong in (("admin", "wrong"), ("nobody", "wrong")):  # the same answer, known user or not
        status, _, body = get(address, "/metrics", user=wrong)
        assert (status, body) == (401, "authentication failed: wrong user name or password\n")
    assert get(address, "/metrics")[0] == 200  # the admin, after the failures


def test_the_collector_seldom_walks_messages_held_in_memory(service):
    """3,000 persistent messages held by a queue (in the broker's memory window): Python's
    default threshold (700 more objects made than freed) walks them in a pass every few
    hundred messages; the service's (20,000) in a few at most. python_gc_* shows it."""
    daemon, _, address = service
    before = samples(address)
    send(daemon, PASSWORD, "gc.held", *[f"held {i}" for i in range(3000)])
    after = samples(address)
    passes = {
        g: value(after, "python_gc_collections_total", generation=g)
        - value(before, "python_gc_collections_total", generation=g)
        for g in "012"
    }
    assert passes["0"] <= 5, passes
    assert passes["2"] == 0, passes
    assert value(after, "imq_destination_messages", type="queue", name="gc.held") == 3000
