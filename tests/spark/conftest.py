"""One SparkSession for every Spark test (starting one costs 7-11 s): local[2], no UI,
two shuffle partitions, 512 MB driver, its own warehouse."""

from __future__ import annotations

import pytest

from bridgemgr.spark.session import spark_session


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
