"""The SparkSession settings come from the broker properties, and workers run our Python."""

from __future__ import annotations

import importlib.util
import struct
import sys
import uuid
from pathlib import Path

import pytest

import bridgemgr
from bridgemgr.props import load_properties
from bridgemgr.spark.session import DEFAULT_MASTER, spark_settings

SITECUSTOMIZE = Path(__file__).resolve().parents[2] / "bridgemgr/spark/sitepath/sitecustomize.py"


def test_settings_from_properties():
    props = load_properties(
        overrides=[
            "imq.bridge.spark.master=local[3]",
            "imq.bridge.spark.conf.spark.sql.shuffle.partitions=7",
            "imq.bridge.spark.conf.spark.ui.enabled=true",
        ]
    )
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
    # pyspark from the installed package (compiled), not Spark's pyspark.zip
    files = set(rdd.map(lambda _: __import__("pyspark").__file__).collect())
    assert not any(".zip" in f for f in files), files


def test_the_driver_jvm_runs_without_the_optimising_jit(spark):
    """Our default reaches the JVM (C2 compiling cost more CPU than it saved: session.py)."""
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in args


def test_workers_find_the_package_compiled(spark):
    """Spark's Python processes load bridgemgr's bytecode, not compile it again each: every
    module has a cache file that matches its source (what Python checks before using it)."""
    package = Path(bridgemgr.__file__).parent
    stale = []
    for source in package.rglob("*.py"):
        try:
            head = Path(importlib.util.cache_from_source(str(source))).read_bytes()[8:16]
        except OSError:
            head = b""
        st = source.stat()
        if head != struct.pack("<II", int(st.st_mtime) & 0xFFFF_FFFF, st.st_size & 0xFFFF_FFFF):
            stale.append(str(source.relative_to(package)))
    assert not stale


def test_the_archives_shipped_with_the_installed_pyspark_leave_the_path(tmp_path):
    """Spark's zips and jar are the installed package's own files: off the path, so no
    process compiles pyspark from a zip or reads 7,467 archive entries again."""
    spec = importlib.util.spec_from_file_location("sitepath_under_test", SITECUSTOMIZE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "jars").mkdir()
    (site / "pyspark" / "__init__.py").write_text("")
    shipped = [
        str(lib / "pyspark.zip"),
        str(lib / "py4j-0.10.9.9-src.zip"),
        str(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar"),
    ]
    assert module.without_shipped_archives([*shipped, "/app", str(site)]) == ["/app", str(site)]
    # another Spark distribution's archives stay, and so does everything without a pyspark
    other = [str(tmp_path / "spark/python/lib/pyspark.zip"), "/app", "/deps.zip", str(site)]
    assert module.without_shipped_archives(other) == other
    assert module.without_shipped_archives([*shipped, "/app"]) == [*shipped, "/app"]


def test_workers_have_no_spark_archive_on_their_path(spark):
    found = (
        spark.sparkContext.parallelize(range(2), 2)
        .map(lambda _: [p for p in __import__("sys").path if p.endswith((".zip", ".jar")) and "pyspark" in p])
        .collect()
    )
    assert found == [[], []]


PRELOAD_PROBE = """
import gc, os, sys
from bridgemgr.spark import daemon
daemon.preload()
print(len(os.listdir("/proc/self/task")), "pyarrow" in sys.modules,
      "bridgemgr.spark.transfer" in sys.modules, "pyspark.worker" in sys.modules,
      gc.get_freeze_count() > 0)
"""


def test_the_daemon_preloads_the_bridge_and_starts_no_thread():
    """What daemon.py imports before Spark's daemon forks: the sink's transfer and pyspark's
    worker, with no thread started (a fork keeps only the forking thread: a lock held by
    another stays locked in the child) and so without pyarrow, which starts two."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(bridgemgr.__file__).parents[1],
    ).stdout.split()
    assert out == ["1", "False", "True", "True", "True"], out


def test_executor_workers_fork_from_our_daemon(spark):
    """Our default reaches Spark: executors' workers are forks of daemon.py's process, so
    they find the bridge imported and the imported heap frozen."""

    def probe(_):
        import gc
        import os
        import sys

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmd:
            parent = cmd.read().split(b"\0")
        return (
            b"bridgemgr.spark.daemon" in parent and b"pyspark.worker" in parent,
            "bridgemgr.spark.transfer" in sys.modules,
            gc.get_freeze_count() > 0,
        )

    found = set(spark.sparkContext.parallelize(range(2), 2).map(probe).collect())
    assert found == {(True, True, True)}


@pytest.mark.slow
def test_a_module_in_two_plugin_folders_is_shipped_once_from_the_first(spark, tmp_path):
    """The same transformer module in $IMQ_BRIDGE_TRANSFORMER_PATH and lib/ext: before, the
    second addPyFile failed ("File x.py was already registered with a different path") and
    the link did not start. Now the first folder's file goes, the one the service imports."""
    from bridgemgr.spark.session import ship_plugins

    module = f"plugin_{uuid.uuid4().hex[:8]}"
    folders = [tmp_path / "env", tmp_path / "lib" / "ext"]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / f"{module}.py").write_text(f"WHERE = {folder.name!r}\n")
    assert ship_plugins(spark, folders) == [str(folders[0] / f"{module}.py")]
    assert ship_plugins(spark, folders) == []  # shipped already, unchanged
    found = spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__(module).WHERE).collect()
    assert found == ["env", "env"]
