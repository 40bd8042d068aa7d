"""benchmarks/compare.py: the figures it reads from a benchmark's JSON and how it sets a
working tree's run beside a ref's, and one real run on a tiny benchmark of its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmarks" / "compare.py")
assert _spec is not None and _spec.loader is not None
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def test_every_number_is_a_figure_named_by_its_path_and_flags_are_not():
    got = compare.figures({"a": {"msg_per_s": 10, "ok": True, "note": "x"}, "p": [1.5, {"q": 2}]})
    assert got == {"a.msg_per_s": 10.0, "p[0]": 1.5, "p[1].q": 2.0}


def test_medians_of_each_side_and_their_ratio():
    ref = [{"x": 10.0, "only_ref": 1.0}, {"x": 30.0}, {"x": 20.0}]
    work = [{"x": 40.0, "only_work": 2.0}, {"x": 22.0}, {"x": 60.0}]
    rows = compare.compare(ref, work)
    assert rows["x"] == {"ref": 20.0, "work": 40.0, "ratio": 2.0}
    assert rows["only_ref"] == {"ref": 1.0, "work": None}
    assert rows["only_work"] == {"ref": None, "work": 2.0}


@pytest.mark.slow
def test_a_run_compares_a_benchmark_on_a_ref_and_the_working_tree(tmp_path):
    """A benchmark script that prints which tree ran it: REF's run and the working tree's
    are each their own (the ref's copy of a script it lacks runs the ref's bridgemgr)."""
    bench = ROOT / "benchmarks" / "_compare_probe.py"
    bench.write_text(
        "import json, bridgemgr, pathlib\n"
        "print(json.dumps({'in_ref': int('compare-' in str(pathlib.Path(bridgemgr.__file__))),"
        " 'one': 1}))\n"
    )
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "compare.py"),
                "HEAD",
                "_compare_probe.py",
                "--rounds",
                "2",
                "--json-only",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        bench.unlink()
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["benchmarks"]["_compare_probe.py"]
    assert rows["in_ref"] == {"ref": 1.0, "work": 0.0, "ratio": 0.0}
    assert rows["one"] == {"ref": 1.0, "work": 1.0, "ratio": 1.0}
