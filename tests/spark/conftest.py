"""One SparkSession for every Spark test (starting one costs 7-11 s): local[2], no UI,
two shuffle partitions, 512 MB driver, its own warehouse."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridgemgr.spark.session import spark_session

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark")
    session = spark_session(
        app_name="imqbridge-tests",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "512m",
            "spark.sql.warehouse.dir": str(base / "warehouse"),
            "spark.local.dir": str(base / "local"),
        },
    )
    yield session
    session.stop()


# The cluster's JVMs (master, workers, the executors of every test's application) without
# C2, the optimising JIT, and with one GC thread: on a 2-core runner C2 took half the CPU
# of a cluster's start (24 s of JVM CPU, 12 without), from the tests' own processes; what
# the tests check does not depend on how fast the JVM's code is. (Not in spark_cluster.py:
# the benchmarks' cluster keeps the JVM's defaults.)
CLUSTER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A standalone master and two 1-core workers (tests/spark/cluster.py), for the slow
    cluster tests; stopped at the end of the session."""
    from spark_cluster import Cluster

    running = Cluster(tmp_path_factory.mktemp("cluster"), java_options=CLUSTER_JAVA_OPTIONS)
    try:
        yield running.start()
    finally:
        running.stop()
