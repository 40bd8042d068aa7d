"""What the Spark JVM's log pipe costs (bridgemgr/spark/jvmlog.py); prints JSON.

    PYTHONPATH=. .venv/bin/python benchmarks/spark_log.py [--mbytes N] [--rounds R]

A child process writes N MB of log-like lines (60-200 bytes) to its stderr as fast as it
can, as a chatty Spark JVM would; its stderr is a JvmLog's pipe, whose thread writes them
to spark.log rolling over at 10 MiB (10 files). Reported per round (median over rounds):
the pipe's throughput (MB/s, from the child's start to the last byte written), the CPU
seconds of this process (the reader thread: nothing else runs here) per 100 MB, and the
same for a plain `cat > file` reading the same stream (what a copy costs at all). On a
quiet pipe the thread waits in poll(): idle_cpu_ms is this process's CPU over 2 s of
silence.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridgemgr.spark.jvmlog import JvmLog, SparkLog  # noqa: E402

WRITER = """
import os, sys
line = [b"%d WARN org.apache.spark.Something: %s\\n" % (i, b"x" * (i % 140)) for i in range(1000)]
block = b"".join(line)
left = int(sys.argv[1]) * 1_000_000
while left > 0:
    os.write(2, block[:left])
    left -= len(block)
"""


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def through_pipe(folder: Path, mbytes: int) -> dict[str, float]:
    output = JvmLog(SparkLog(folder / "spark.log", 10 << 20, -1))
    start, used = time.monotonic(), cpu()
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(mbytes)], stderr=output.write_fd)
    output.started()
    child.wait()
    output.close(60)
    took, used = time.monotonic() - start, cpu() - used
    assert output.ended.is_set()
    return {"mb_per_s": mbytes / took, "cpu_s_per_100mb": used * 100 / mbytes}


def through_cat(folder: Path, mbytes: int) -> dict[str, float]:
    start, used = time.monotonic(), children_cpu()
    with open(folder / "cat.log", "wb") as out:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(mbytes)], stderr=subprocess.PIPE)
        cat = subprocess.Popen(["cat"], stdin=writer.stderr, stdout=out)
        assert writer.stderr is not None
        writer.stderr.close()
        writer.wait()
        cat.wait()
    took = time.monotonic() - start
    # (children_cpu counts the writer too: take the pipe round's writer cost off by running it alone)
    return {"mb_per_s": mbytes / took, "cpu_s_with_writer": children_cpu() - used}


def writer_alone(mbytes: int) -> float:
    used = children_cpu()
    subprocess.run([sys.executable, "-c", WRITER, str(mbytes)], stderr=subprocess.DEVNULL, check=True)
    return children_cpu() - used


def idle(folder: Path) -> float:
    output = JvmLog(SparkLog(folder / "idle.log", -1, -1))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], stderr=output.write_fd)
    output.started()
    time.sleep(0.5)
    used = cpu()
    time.sleep(2.0)
    used = cpu() - used
    child.wait()
    output.close(5)
    return used * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pipe, cat = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            pipe.append(through_pipe(Path(tmp), args.mbytes))
            alone = writer_alone(args.mbytes)
            result = through_cat(Path(tmp), args.mbytes)
            cat.append(
                {
                    "mb_per_s": result["mb_per_s"],
                    "cpu_s_per_100mb": (result["cpu_s_with_writer"] - alone) * 100 / args.mbytes,
                }
            )
        files = sorted(p.name for p in Path(tmp).glob("spark.log*"))
        biggest = max((Path(tmp) / name).stat().st_size for name in files)
        idle_ms = idle(Path(tmp))
    print(
        json.dumps(
            {
                "mbytes": args.mbytes,
                "rounds": args.rounds,
                "pipe": {k: round(statistics.median(r[k] for r in pipe), 3) for k in pipe[0]},
                "cat": {k: round(statistics.median(r[k] for r in cat), 3) for k in cat[0]},
                "files": len(files),
                "largest_file": biggest,
                "idle_cpu_ms": round(idle_ms, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
