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
    session = spark_session(app_name="imqbridge-tests", master="local[2]", conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "512m",
        "spark.sql.warehouse.dir": str(base / "warehouse"),
        "spark.local.dir": str(base / "local"),
    })
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A standalone master and two 1-core workers (tests/spark/cluster.py), for the slow
    cluster tests; stopped at the end of the session."""
    from spark_cluster import Cluster

    running = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield running.start()
    finally:
        running.stop()
