"""Spark's Python daemon for imqbridge: pyspark's, with the bridge imported before it forks.

Spark starts the Python processes of its executors through a daemon, `python -m
<spark.python.daemon.module> pyspark.worker`, which forks one worker per task slot (kept for
later tasks: worker reuse). pyspark's daemon imports nothing of the work before it forks, so
each worker imports pyspark's worker and, for a runner=spark link's sink or a drain's job,
the bridge (~0.35 s of CPU apiece; four workers start on the way to a link's first
micro-batch, two per task: the source's reader and the sink's writer). session.py makes this
module Spark's daemon module: it imports those modules once, then runs pyspark's daemon,
whose forks inherit them. Only modules that start no thread may be imported before a fork (a
forked child has only the forking thread; a lock another thread held stays locked): pyarrow
starts two, so nothing here imports it (transfer.py and sink.py import it for type checking
only) and the workers import it after the fork as before; tests/spark/test_session.py holds
both to that. gc.freeze() then moves what was imported out of the collector's generations:
the daemon's gc.collect() after each task no longer walks it, and the forks do not touch
(copy) its pages to do so. Spark's other Python processes (data source planning, the source
runner, the sink's commit) come through this module too, with another worker module named:
they are left as pyspark starts them.
"""

from __future__ import annotations

import gc
import sys

EXECUTOR_WORKER = "pyspark.worker"


def preload() -> None:
    """Import what every executor worker of a Spark link or drain imports (no thread
    started)."""
    import pyspark.sql.worker.write_into_data_source
    import pyspark.worker  # noqa: F401

    from . import drainjob, sink, transfer  # noqa: F401

    gc.collect()
    gc.freeze()


def main() -> None:
    if sys.argv[1:2] == [EXECUTOR_WORKER]:
        preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
