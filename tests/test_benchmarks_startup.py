"""benchmarks/startup.py: one real round prints every figure it promises."""

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
def test_one_round_reports_both_starts_and_the_cli():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--starts", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for start in ("first_start", "restart"):
        assert set(out[start]) == {"wall_s", "cpu_s", "rss_mib"}, out
        assert 0 < out[start]["cpu_s"]["median"] <= out[start]["cpu_s"]["max"], out
        assert out[start]["rss_mib"]["median"] > 10, out  # a Python process with the broker loaded
    assert out["cli"]["wall_s"]["median"] > 0 and out["starts"] == 1, out
