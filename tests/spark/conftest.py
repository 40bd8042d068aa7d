"""One SparkSession for every Spark test (starting one costs 7-11 s): local[2], no UI,
two shuffle partitions, 512 MB driver, its own warehouse; the standalone cluster; and a
class-data-sharing archive of Spark's classes for every Spark JVM the tests start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bridgemgr.spark.session import spark_session

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive(tmp_path_factory):
    """A class-data-sharing archive of Spark's classes (class_archive.py) for every Spark
    JVM the tests start (this process's, serve's, the jobs', the cluster's): each JVM start
    costs ~40% less CPU. PYSPARK_SUBMIT_ARGS names the properties file that gives it to
    drivers and executors. The archive (None if this JVM cannot write one)."""
    from class_archive import class_archive

    # (PYSPARK_SUBMIT_ARGS of the caller's own: left alone, no archive)
    made = None if "PYSPARK_SUBMIT_ARGS" in os.environ else class_archive(tmp_path_factory.mktemp("sparkcds"))
    if made is None:
        yield None
        return
    archive, properties = made
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_SUBMIT_ARGS", f"--properties-file {properties} pyspark-shell")
        yield archive


@pytest.fixture(scope="session")
def spark(tmp_path_factory, spark_class_archive):
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
def cluster(tmp_path_factory, spark_class_archive):
    """A standalone master and two 1-core workers (tests/spark/cluster.py), for the slow
    cluster tests; stopped at the end of the session. Its JVMs map the class archive."""
    from spark_cluster import Cluster

    running = Cluster(
        tmp_path_factory.mktemp("cluster"),
        java_options=CLUSTER_JAVA_OPTIONS,
        daemon_java_options=f"-XX:SharedArchiveFile={spark_class_archive}" if spark_class_archive else "",
    )
    try:
        yield running.start()
    finally:
        running.stop()
