"""A class-data-sharing archive of the Spark JVM's classes for the tests' JVMs: one local
Spark job run with -XX:ArchiveClassesAtExit writes it as its JVM exits; drivers and
executors get it from a properties file (spark.{driver,executor}.defaultJavaOptions) that
PYSPARK_SUBMIT_ARGS names, the cluster's master and workers from SPARK_DAEMON_JAVA_OPTS.
The JVM then maps Spark's classes parsed and verified instead of loading them from the
jars: a local session's start and first job took 6 s of JVM CPU instead of 10 (JDK 17).
(Not JAVA_TOOL_OPTIONS: spark-class reads its launcher JVM's stdout as the command to run,
and a JVM that cannot map the archive, the launcher's classpath being another, says so on
stdout. Not SPARK_CONF_DIR: a classpath with a non-empty folder disables the archive.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what the archive's JVM runs: a session, an RDD job and a DataFrame's (the classes the
# drivers and executors of the tests load first); not a Parquet file's, whose classes made
# the job and the dump take 48 s instead of 35 for the few JVMs that write one
DUMP_JOB = """
import sys
from bridgemgr.spark.session import spark_session
spark = spark_session(app_name="class-archive", master="local[1]",
                      conf={"spark.driver.memory": "512m",
                            "spark.driver.extraJavaOptions": sys.argv[1],
                            "spark.local.dir": sys.argv[2]})
spark.sparkContext.parallelize([1, 2], 1).map(lambda x: x).collect()
spark.range(10).selectExpr("id", "cast(id as string) s").groupBy("s").count().collect()
"""


def class_archive(folder: Path, timeout: float = 300) -> tuple[Path, Path] | None:
    """Write the archive and a Spark properties file naming it into ``folder``: (archive,
    properties), or None when the JVM could not write one (every JVM then loads its
    classes as usual)."""
    archive = folder / "spark.jsa"
    scratch = folder / "scratch"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    job = subprocess.Popen(
        [sys.executable, "-c", DUMP_JOB, f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={archive}", str(scratch)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    try:
        job.wait(timeout)
        while time.monotonic() < deadline:  # the JVM writes the archive as it exits, after Python
            try:
                os.killpg(job.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:  # (whatever is left after the deadline)
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if job.returncode != 0 or not archive.is_file():
        return None
    option = f"-XX:SharedArchiveFile={archive}"
    properties = folder / "spark-defaults.conf"
    properties.write_text(f"spark.driver.defaultJavaOptions {option}\nspark.executor.defaultJavaOptions {option}\n")
    return archive, properties
