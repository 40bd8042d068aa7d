# How it works: this folder is on the PYTHONPATH of every Python process Spark starts for
# our jobs (session.py puts it there), so Python's site module imports this file at start,
# before the process's own module. Spark puts $SPARK_HOME/python/lib/pyspark.zip first on
# that path, and Python never caches bytecode for a zip: each process (data source lookup
# and planning, the source runner, the write planning, the worker daemons, the sink's
# commit: one after the other on the way to a query's first micro-batch) compiled
# pyspark's sources again, ~1.5 s of CPU apiece (measured: `import pyspark.daemon` 1.5-2.2 s
# from the zip, 0.4 s from the installed package). When the zips are the ones shipped inside
# the installed pyspark package (a pip install: the same files), they move behind it on
# sys.path; any other layout (a separate Spark distribution) stays as it is. A
# sitecustomize this one hides (a later one on the path) still runs.
"""Spark's Python processes import pyspark from its installed, compiled package."""

from __future__ import annotations

import os
import runpy
import sys


def installed_pyspark_first(path: list[str]) -> list[str]:
    """``path`` with Spark's pyspark/py4j zips moved to the end when they are the ones
    shipped inside an installed pyspark package found on ``path``."""
    zips = [p for p in path if p.endswith(".zip")
            and os.path.basename(p).startswith(("pyspark", "py4j"))]
    for entry in path:
        if not entry or entry in zips:
            continue
        package = os.path.join(entry, "pyspark")
        if os.path.isfile(os.path.join(package, "__init__.py")):
            shipped = os.path.realpath(os.path.join(package, "python", "lib"))
            if zips and all(os.path.dirname(os.path.realpath(z)) == shipped for z in zips):
                return [p for p in path if p not in zips] + zips
            break
    return path


def _run_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    for entry in sys.path:
        if entry and os.path.realpath(entry) != here:
            other = os.path.join(entry, "sitecustomize.py")
            if os.path.isfile(other):
                runpy.run_path(other, run_name="sitecustomize")
                return


sys.path[:] = installed_pyspark_first(sys.path)
_run_hidden_sitecustomize()
