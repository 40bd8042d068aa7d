"""docs/transformers.md, tried by doing what it says: its example transformer, its unit test
and its bridge XML are taken from the page's fenced blocks (`# file: NAME` or
`<!-- file: NAME -->` on their first line); the unit test runs with pytest, and the module,
dropped into a temporary <instance>/lib/ext, runs on a real `serve` link: orders arrive
stamped, urgent ones branched, test ones dropped, and the audit copies are in the DMQ."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_support import Daemon, send, take

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "transformers.md"
PASSWORD = "guide-pw-5e1d"


def guide_files() -> dict[str, str]:
    """The page's fenced blocks that name a file, by file name."""
    files = {}
    for block in re.findall(r"^```[a-z]*\n(.*?)^```$", GUIDE.read_text(), re.M | re.S):
        first = block.splitlines()[0]
        if m := re.fullmatch(r"(?:# file: (\S+)|<!-- file: (\S+) -->)", first):
            files[m.group(1) or m.group(2)] = block
    return files


def test_the_guide_names_its_files():
    assert set(guide_files()) == {"order_router.py", "test_order_router.py", "orders.xml"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_guides_unit_test_passes_without_a_link(tmp_path):
    files = guide_files()
    for name in ("order_router.py", "test_order_router.py"):
        (tmp_path / name).write_text(files[name])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_order_router.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=100,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_guides_transformer_runs_on_a_link_from_instance_lib_ext(tmp_path):
    files = guide_files()
    ext = tmp_path / "var" / "instances" / "guide" / "lib" / "ext"
    ext.mkdir(parents=True)
    (ext / "order_router.py").write_text(files["order_router.py"])
    (tmp_path / "orders.xml").write_text(files["orders.xml"])
    props = tmp_path / "broker.properties"
    props.write_text(
        "\n".join(
            [
                f"imq.varhome={tmp_path / 'var'}",
                "imq.instancename=guide",
                "imq.portmapper.port=0",
                "imq.jms.tcp.port=0",
                "imq.bridge.enabled=true",
                "imq.bridge.admin.user=admin",
                f"imq.bridge.admin.password={PASSWORD}",
                "imq.bridge.activelist=orders",
                "imq.bridge.orders.type=jms",
                "imq.bridge.orders.xmlurl=orders.xml",
            ]
        )
        + "\n"
    )
    daemon = Daemon(props)
    try:
        assert daemon.bridges == {"orders": "STARTED"}, daemon.lines
        send(
            daemon,
            PASSWORD,
            "orders.in",
            "order 1",
            "URGENT order 2",
            "TEST order 3",
            "order 4",
            "URGENT order 5",
            "TEST order 6",
        )
        out = take(daemon, PASSWORD, "orders.out", expect=2)
        urgent = take(daemon, PASSWORD, "orders.urgent", expect=2)
        audit = take(daemon, PASSWORD, "imq.bridge.jms.dmq", expect=2)
    finally:
        daemon.stop()
    assert [(m.text, m.get_string_property("region")) for m in out] == [("order 1", "emea"), ("order 4", "emea")]
    assert [m.text for m in urgent] == ["URGENT order 2", "URGENT order 5"]
    # one audit copy each per link start: the first branched and the first dropped message
    reasons = {m.get_string_property("JMS_SUN_JMSBRIDGE_DMQ_REASON"): m.object.text for m in audit}
    assert reasons == {"FIRST_TRANSFORMER_BRANCHTO": "URGENT order 2", "FIRST_TRANSFORMER_NOTRANSFER": "TEST order 3"}
