"""Spark's Python processes import pyspark from its installed, compiled package.

This folder is on the PYTHONPATH of every Python process Spark starts for
our jobs (session.py puts it there), so Python's site module imports this file at start,
before the process's own module. Spark puts $SPARK_HOME/python/lib/pyspark.zip, the py4j
zip and the spark-core jar first on that path. Two costs came with them in each process
(data source lookup and planning, the source runner, the write planning, the worker
daemons and workers, the sink's commit: several one after the other on the way to a
query's first micro-batch):
- Python never caches bytecode for a zip: each process compiled pyspark's sources again,
  ~1.5 s of CPU apiece (measured: `import pyspark.daemon` 1.5-2.2 s from the zip, 0.4 s
  from the installed package);
- pyspark calls importlib.invalidate_caches() when it adds a task's files to the path,
  and a zip importer then reads its archive's directory again: 7,467 entries, 0.15 s of
  CPU per process (the jar alone holds 5,973, and no Python file).
The archives shipped inside the installed pyspark package found on the path (a pip
install: the same files) leave sys.path and the importer cache; any other (a separate
Spark distribution's) stays where it is. A sitecustomize this one hides (a later one on
the path) still runs.
"""

from __future__ import annotations

import os
import runpy
import sys


def _shipped(entry: str, package: str) -> bool:
    """A pyspark/py4j zip or a jar that came inside the installed pyspark ``package``."""
    name = os.path.basename(entry)
    if name.endswith(".zip") and name.startswith(("pyspark", "py4j")):
        home = os.path.join(package, "python", "lib")
    elif name.endswith(".jar"):
        home = os.path.join(package, "jars")
    else:
        return False
    return os.path.dirname(os.path.realpath(entry)) == os.path.realpath(home)


def without_shipped_archives(path: list[str]) -> list[str]:
    """``path`` without the archives that came inside the installed pyspark package found
    first on ``path`` (anything else, a separate Spark distribution's, stays)."""
    for entry in path:
        if not entry or entry.endswith((".zip", ".jar")):
            continue
        package = os.path.join(entry, "pyspark")
        if os.path.isfile(os.path.join(package, "__init__.py")):
            return [p for p in path if not _shipped(p, package)]
    return path


def _run_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    for entry in sys.path:
        if entry and os.path.realpath(entry) != here:
            other = os.path.join(entry, "sitecustomize.py")
            if os.path.isfile(other):
                runpy.run_path(other, run_name="sitecustomize")
                return


_kept = without_shipped_archives(sys.path)
for _gone in set(sys.path) - set(_kept):
    sys.path_importer_cache.pop(_gone, None)
sys.path[:] = _kept
_run_hidden_sitecustomize()
