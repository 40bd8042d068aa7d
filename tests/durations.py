"""Write tests/durations.json, the seconds each scheduling unit of tests/conftest.py
(`worker_unit`: a file, or tests/spark whole) took in a run, from that run's JUnit XML:

    tests/run --junitxml=run.xml && .venv/bin/python tests/durations.py run.xml

conftest.py hands the longest units out first, so no worker starts a long file while the
others are done. Only the order depends on it: a stale or missing entry costs time, never
a test."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import worker_unit  # noqa: E402


def source_file(classname: str) -> str | None:
    """tests.spark.test_x.Class -> tests/spark/test_x.py (the longest prefix that is a file)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (HERE.parent / path).is_file():
            return path.as_posix()
    return None


def main(junit: str) -> None:
    seconds: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = source_file(case.get("classname") or "")
        if path is not None:
            unit = worker_unit(path)
            seconds[unit] = seconds.get(unit, 0.0) + float(case.get("time") or 0)
    out = {unit: round(s, 1) for unit, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    (HERE / "durations.json").write_text(json.dumps(out, indent=0) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
