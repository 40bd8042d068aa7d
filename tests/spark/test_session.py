"""The SparkSession settings come from the broker properties, and workers run our Python."""

from __future__ import annotations

import sys

from bridgemgr.props import load_properties
from bridgemgr.spark.session import DEFAULT_MASTER, spark_settings


def test_settings_from_properties():
    props = load_properties(overrides=["imq.bridge.spark.master=local[3]",
                                       "imq.bridge.spark.conf.spark.sql.shuffle.partitions=7",
                                       "imq.bridge.spark.conf.spark.ui.enabled=true"])
    master, conf = spark_settings(props)
    assert master == "local[3]"
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.ui.enabled"] == "true"  # the user's entry wins over ours


def test_default_master():
    assert spark_settings(None)[0] == DEFAULT_MASTER == "local[*]"


def test_workers_run_this_interpreter(spark):
    rdd = spark.sparkContext.parallelize(range(2), 2)
    executables = set(rdd.map(lambda _: __import__("sys").executable).collect())
    assert executables == {sys.executable}
    assert set(rdd.map(lambda _: __import__("bridgemgr").__name__).collect()) == {"bridgemgr"}
