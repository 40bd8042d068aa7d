"""benchmarks/console.py: one tiny real run prints every figure it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_tiny_run_reports_overview_api_and_cost():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--bridges", "2", "--links", "2", "--messages", "300", "--requests", "20", "--rounds", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "console.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["overview"]["refreshes"] == 2
    assert out["overview"]["p50_ms"] > 0 and out["overview"]["service_cpu_per_refresh_ms"] >= 0
    load = out["api_under_load"]
    assert load["idle"]["requests"] == 20 and load["link"]["messages"] == 300 and load["link"]["msg_per_s"] > 0
    for key in ("api_under_load", "api_under_load_wide_window"):  # the GETs' figures next to the link's rate
        run = out[key]["under_load"]
        assert run["link_msg_per_s"] == out[key]["link"]["msg_per_s"]
        if run["requests"]:
            assert run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
        else:  # the link moved its 300 before a GET began (seen with link.window 4000)
            assert run["p50_ms"] is run["max_ms"] is None and not out[key]["target_met_p99_50ms_at_10000"]
        assert len(run["load_average_1m"]) == 2 and f"{key}: link.window {out[key]['link_window']}" in done.stderr
    assert out["api_under_load_wide_window"]["link_window"] == 4000
    cost = out["console_cost"]
    assert len(cost["all_no_console"]) == len(cost["all_console_open"]) == 1
    assert cost["overview_refreshes_per_run"][0] >= 1 and cost["ratio"] > 0
    assert out["peak_rss_mb"] > 0
