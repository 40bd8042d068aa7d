"""The driver of a Spark link for tests/spark/test_link_crash.py: runs the link's query
(its own SparkSession, local[2]) until the test kills this process group.

    python link_crash_child.py BRIDGE_XML BROKER_URL CHECKPOINT [shipped]
"""

from __future__ import annotations

import sys
from pathlib import Path

from bridgemgr.spark.runner import link_options, start_query
from bridgemgr.spark.session import spark_session


def main() -> None:
    xml, url, checkpoint = sys.argv[1:4]
    shipped = sys.argv[4:] == ["shipped"]
    spark = spark_session(
        app_name="imqbridge-crash-child",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "512m",
            "spark.local.dir": str(Path(checkpoint).parent / "child-local"),
        },
    )
    options = crash_options(Path(checkpoint), xml, url, shipped)
    query = start_query(spark, options, Path(checkpoint))
    print("started", flush=True)
    query.awaitTermination()


def crash_options(checkpoint: Path, xml: str, url: str, shipped: bool = False):
    """The link's options, the same in the child and in the restart; ``shipped``: the
    driver ships the records to the executors (slices.py)."""
    return link_options(
        checkpoint,
        xmlurl=xml,
        bridge="b",
        link="l",
        broker_url=url,
        parallelism=2,
        max_per_batch=150,
        receive_wait=0.5,
        ship_log=shipped,
    )


if __name__ == "__main__":
    main()
