"""spark.log rolls over with a real Spark JVM: its Python workers' stderr (which the JVM
copies to its own) fills ten files of at most the limit, the JVM's stdout goes there too,
and the last line is there once the job's process has ended (jvmlog.py;
tests/test_spark_log.py tests the pipe alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark_log_support import LIMIT, check_files

ROOT = Path(__file__).resolve().parents[2]
SPARK_JOB = """
import sys
from pathlib import Path
from bridgemgr.spark.jvmlog import SparkLog
from bridgemgr.spark.session import spark_session

def chatty(part):
    import os
    for i in range({lines}):
        os.write(2, b"line %d %s\\n" % (i, b"x" * (i % 150)))
    os.write(2, b"worker done\\n")
    return [1]

def service_line():  # serve's status lines, printed while the JVM starts
    stderr = os.fstat(2).st_ino  # (fd 2 is a pipe into spark.log while the JVM starts)
    while os.fstat(2).st_ino == stderr:
        time.sleep(0.001)
    print("service line", flush=True)

import os, threading, time
printer = threading.Thread(target=service_line, daemon=True)
printer.start()
path = Path(sys.argv[1])
spark = spark_session(app_name="spark-log-test", master="local[1]",
                      conf={{"spark.driver.memory": "512m",
                            "spark.local.dir": str(path.parent / "local")}},
                      jvm_output=SparkLog(path, {limit}, -1))
printer.join()
assert spark.sparkContext.parallelize([0], 1).mapPartitions(chatty).collect() == [1]
jvm = spark.sparkContext._jvm
jvm.System.out.println("jvm stdout line")
jvm.System.out.flush()
print("job done", flush=True)
"""


def test_the_spark_jvm_and_its_python_workers_write_to_a_file_that_rolls_over(tmp_path):
    """A real local SparkSession (jvm_output) whose Python worker writes ~1 MB to its
    stderr (the JVM copies it to its own): spark.log rolls over at the limit, keeps ten
    files, has what the JVM printed on its stdout (not the job's stdout), and has the
    worker's last line when the job's process has ended (the JVM is ended at exit and its
    output read to the end)."""
    lines = 12_000
    path = tmp_path / "logs" / "spark.log"
    out = subprocess.run(
        [sys.executable, "-c", SPARK_JOB.format(lines=lines, limit=LIMIT), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == "service line\njob done\n" and "line " not in out.stderr, out.stderr[-3000:]
    text = "".join(check_files(path))
    assert "worker done" in text and "jvm stdout line" in text  # (printed after the job)
    worker = [line for line in text.splitlines() if line.startswith("line ") or line == "worker done"]
    numbers = [int(line.split()[1]) for line in worker[:-1]]
    assert worker[-1] == "worker done"
    assert numbers == list(range(numbers[0], lines)), "a line is missing or out of order"
