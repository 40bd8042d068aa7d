"""examples/monitoring/ against a real scrape: a `serve` with a JMS bridge that moved
messages (three of them to the DMQ), its /metrics parsed. Every PromQL expression of the
Grafana dashboard and of the Prometheus alert rules names series that exist, with labels
they have; docs/operations.md's metrics table names every family as scraped, with its
labels; the HA-only series exists on an HA instance. Where promtool is installed (Debian's
prometheus package): `promtool check rules`, the shipped `promtool test rules` files, and
the alerts evaluated over the real scrape (healthy: none fires; with the link STOPPED and
the store not writable: those two fire, naming the real bridge and link)."""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service_support import FAIL_ON_BAD, Daemon, fail_on_bad_bridge, one_bridge_files, send
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "examples" / "monitoring"
DASHBOARD = MONITORING / "imqbridge-dashboard.json"
RULES = MONITORING / "imqbridge-alerts.yml"
PASSWORD = "Monitoring-Secret-1"
HA_ONLY = {  # series an instance of an HA cluster adds
    "imq_ha_lease_held",
    "imq_ha_handed_off_total",
    "imq_ha_taken_in_total",
    "imq_ha_inbox_rejected_total",
}
HA_LABELS = {"broker_id"}  # ... and the label it puts on every series
TARGET_LABELS = {"job", "instance"}  # what Prometheus adds to every series it scrapes
CHECKED = re.compile(r"\b((?:imq|process|python)_[A-Za-z0-9_:]*)\b(\s*\{[^}]*\})?")
XML = fail_on_bad_bridge("mon")


def get_metrics(url: str, password: str = PASSWORD) -> str:
    address = urlparse(url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    credentials = base64.b64encode(f"admin:{password}".encode()).decode()
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {credentials}"})
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
        return body
    finally:
        conn.close()


def metrics_url(daemon: Daemon) -> str:
    return next(line.split()[1] for line in daemon.lines if line.startswith("metrics: "))


def series(page: str) -> dict[str, set[str]]:
    """Sample name -> the label names it is scraped with."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


@pytest.fixture(scope="module")
def scrape(tmp_path_factory) -> str:
    """/metrics of a serve whose link moved 20 messages and dead-lettered 3."""
    base: Path = tmp_path_factory.mktemp("monitoring")
    (base / "plugins").mkdir()
    (base / "plugins" / "failonbad.py").write_text(FAIL_ON_BAD)
    props, _ = one_bridge_files(base, "monitoring", XML, PASSWORD, "imq.metrics.port=0")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(base / "plugins"))
        daemon = Daemon(props)
    try:
        assert daemon.bridges == {"jb": "STARTED"}, daemon.lines
        send(daemon, PASSWORD, "mon.src", *[f"ok {i}" for i in range(20)], *[f"bad {i}" for i in range(3)])
        url = metrics_url(daemon)

        def moved() -> str | None:
            page = get_metrics(url)
            done = 'imq_link_transferred_total{bridge="jb",link="l1"} 20.0' in page
            return page if done and 'reason="TRANSFORM_FAILURE"} 3.0' in page else None

        return wait_for(moved, 60, "the link's transfers and dead letters")
    finally:
        daemon.stop()


# --- the expressions ---------------------------------------------------------------------------


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in board["panels"]:
        exprs += [target["expr"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def rule_expressions() -> list[str]:
    """The expr of every rule, as written: on one line, or a block (| or >) below it."""
    exprs, lines = [], RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2) not in ("|", ">", "|-", ">-"):
            exprs.append(m.group(2))
            continue
        block = []
        for more in lines[i + 1 :]:
            if more.strip() and len(more) - len(more.lstrip()) <= len(m.group(1)):
                break
            block.append(more.strip())
        exprs.append(" ".join(block))
    return exprs


def names_and_labels(expr: str) -> list[tuple[str, set[str]]]:
    """Each checked series an expression names, with the label names it matches on."""
    found = []
    for m in CHECKED.finditer(re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        matchers = (m.group(2) or "").strip(" {}")
        labels = {part.split("=")[0].rstrip("!~").strip() for part in matchers.split(",") if part.strip()}
        found.append((m.group(1), labels))
    return found


def test_the_files_name_series(scrape):
    assert len(dashboard_expressions()) >= 20 and len(rule_expressions()) >= 5


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_expression_names_series_that_exist_with_their_labels(scrape, source):
    scraped = series(scrape)
    exprs = dashboard_expressions() if source == "dashboard" else rule_expressions()
    wrong = []
    for expr in exprs:
        for name, labels in names_and_labels(expr):
            if name in HA_ONLY:
                continue
            if name not in scraped:
                wrong.append(f"{name} (no such series) in {expr}")
            elif not labels <= scraped[name] | TARGET_LABELS | HA_LABELS:
                wrong.append(
                    f"{name} has no label {sorted(labels - scraped[name] - TARGET_LABELS - HA_LABELS)} in {expr}"
                )
    assert not wrong, "\n".join(wrong)


def test_the_ha_only_series_exist_on_an_ha_instance(tmp_path, postgresql):
    from ha_support import PASSWORD as HA_PASSWORD
    from ha_support import Cluster, host_xml

    cluster = Cluster(tmp_path, postgresql, {"jb1": host_xml("jb1")})
    try:
        instance = cluster.start("A", "jb1", "imq.metrics.port=0")
        page = get_metrics(metrics_url(instance), HA_PASSWORD)
    finally:
        cluster.stop()
    assert set(series(page)) >= HA_ONLY
    assert '\nimq_ha_lease_held{broker_id="A"} 1.0\n' in page
    unlabelled = [
        s.name for f in text_string_to_metric_families(page) for s in f.samples if s.labels.get("broker_id") != "A"
    ]
    assert not unlabelled, unlabelled  # one Prometheus scraping the cluster tells its instances apart


def test_the_dashboard_is_one_grafana_board_on_a_chosen_prometheus():
    board = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    titles = {panel["title"] for panel in board["panels"]}
    assert {"Link state", "Transfer rate", "Source backlog", "Dead letters by reason", "Transfer latency"} <= titles
    assert {"Messages waiting", "Store writable", "Memory used of the budget"} <= titles


# --- docs/operations.md's table ------------------------------------------------------------------


def documented() -> dict[str, str]:
    """The metrics table of docs/operations.md#metrics: each metric name -> its labels cell."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("\n## Metrics\n") :]
    section = section[: re.search(r"\n##+ ", section[1:]).start() + 1]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            for name in re.findall(r"`([a-z_*]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_the_docs_table_names_every_family_as_scraped_with_its_labels(scrape):
    rows = documented()
    missing = []
    for family in text_string_to_metric_families(scrape):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {label for s in family.samples for label in s.labels} - {"le"}
        row = rows.get(name)
        if row is None:
            row = next((cell for doc, cell in rows.items() if doc.endswith("*") and name.startswith(doc[:-1])), None)
            if row is None:
                missing.append(f"{name}: not in the table")
            continue
        for label in labels:
            if f"`{label}`" not in row:
                missing.append(f"{name}: label {label} not named ({row!r})")
    for name in HA_ONLY:
        if name not in rows:
            missing.append(f"{name}: not in the table")
    assert not missing, "\n".join(missing)
    stale = [name for name in rows if not name.endswith("*") and name not in HA_ONLY and name not in scrape]
    assert not stale, f"in the table but never scraped: {stale}"


# --- promtool ----------------------------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_the_rules_and_passes_their_unit_tests():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    for test in sorted(MONITORING.glob("*_test.yml")):
        tested = promtool("test", "rules", test.name)
        assert tested.returncode == 0, tested.stdout + tested.stderr


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.M)


def annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with its labels filled in (the rules use no $value)."""
    text = RULES.read_text()
    block = text[text.index(f"- alert: {alert}\n") :]
    block = block[: block.find("- alert:", 10) if "- alert:" in block[10:] else len(block)]
    found = dict(re.findall(r'^\s*(summary|description): "(.*)"$', block, re.M))
    return {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v) for k, v in found.items()}


def as_input_series(page: str, change: dict[tuple[str, frozenset], float]) -> list[dict[str, str]]:
    """Every sample of ``page`` as a constant promtool series (``change``: other values),
    as a scrape job imqbridge of instance test:1 would store it."""
    out = []
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            labels = {**s.labels, "job": "imqbridge", "instance": "test:1"}
            value = change.get((s.name, frozenset(s.labels.items())), s.value)
            selector = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{s.name}{{{selector}}}", "values": f"{format(value, 'f')}x40"})
    return out


@needs_promtool
@pytest.mark.parametrize("broken", [False, True], ids=["healthy", "link-stopped-store-not-writable"])
def test_the_alerts_over_the_real_scrape(scrape, tmp_path, broken):
    """The scrape as 40 minutes of constant series: healthy, no alert fires; with link l1
    STOPPED and the store not writable, exactly ImqLinkNotStarted and ImqStoreNotWritable
    fire, with the labels of the real series."""
    change: dict[tuple[str, frozenset], float] = {}
    if broken:
        state = {"bridge": "jb", "link": "l1"}
        change = {
            ("imq_link_state", frozenset({**state, "imq_link_state": "STARTED"}.items())): 0.0,
            ("imq_link_state", frozenset({**state, "imq_link_state": "STOPPED"}.items())): 1.0,
            ("imq_store_writable", frozenset()): 0.0,
        }
    target = {"job": "imqbridge", "instance": "test:1"}
    expected: dict[str, list[dict[str, str]]] = {name: [] for name in alert_names()}
    if broken:
        expected["ImqLinkNotStarted"] = [
            {**target, "bridge": "jb", "link": "l1", "imq_link_state": "STARTED", "severity": "warning"}
        ]
        expected["ImqStoreNotWritable"] = [{**target, "severity": "critical"}]
    tests = [
        {
            "eval_time": "30m",
            "alertname": name,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations(name, labels)} for labels in alerts],
        }
        for name, alerts in expected.items()
    ]
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": as_input_series(scrape, change), "alert_rule_test": tests}],
    }
    (tmp_path / "scrape_test.yml").write_text(json.dumps(spec))  # JSON is YAML
    tested = promtool("test", "rules", "scrape_test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
