"""spark.log rolls over: the Spark JVM's output comes through a pipe that a thread writes to
a file bounded as the service log is (jvmlog.py); here a real process writes a lot to it
(tests/spark/test_spark_jvm_log.py: a real Spark JVM and its Python workers)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr.spark.jvmlog import JvmLog, RotatingBytes, SparkLog
from spark_log_support import FILES, LIMIT, check_files


def check_rolled(path: Path, lines: int, last: str) -> None:
    """FILES files of at most LIMIT bytes each (0600, in a 0700 folder), each of whole
    lines, holding lines n .. lines-1 ("line <n> ...") without a gap, then ``last``."""
    texts = check_files(path)
    assert all(t.startswith("line ") and t.endswith("\n") for t in texts[:-1])
    kept = "".join(texts).splitlines()
    assert kept[-1] == last
    numbers = [int(line.split()[1]) for line in kept if line.startswith("line ")]
    assert numbers == list(range(numbers[0], lines)), "a line is missing or out of order"
    assert (FILES - 1) * LIMIT - 200 < sum(len(t) for t in texts) <= FILES * LIMIT


WRITER = (
    "import os, sys\n"
    "for i in range({n}): os.write(2, b'line %d %s\\n' % (i, b'x' * (i % 150)))\n"
    "os.write(2, b'the end, no newline')\n"
)


def test_a_chatty_process_fills_rolling_files_and_nothing_is_lost_at_its_end(tmp_path):
    lines = 40_000  # ~3.3 MB, five times what the files keep
    path = tmp_path / "log" / "spark.log"
    output = JvmLog(SparkLog(path, LIMIT, 0, FILES))
    child = subprocess.Popen([sys.executable, "-c", WRITER.format(n=lines)], stderr=output.write_fd)
    output.started()
    assert child.wait(60) == 0
    output.close(10.0)
    assert output.ended.is_set()
    check_rolled(path, lines, "the end, no newline")


@given(
    lines=st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"-") + b"\n"), min_size=1, max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=2400), max_size=30),
)
def test_lines_read_in_any_pieces_stay_whole_in_their_files(tmp_path_factory, lines, cuts):
    """A pipe is read in chunks that may end mid-line (the chatty test above once saw a file
    end with half a line and the next start with its rest): each file holds whole lines."""
    path = tmp_path_factory.mktemp("pieces") / "spark.log"
    stream = b"".join(lines)
    file = RotatingBytes(path, limit=100, count=1000)
    edges = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for start, end in itertools.pairwise(edges):
        file.write(stream[start:end])
    file.flush()
    file.close()
    older = sorted(path.parent.glob("spark.log.*"), key=lambda p: -int(p.suffix[1:]))
    texts = [p.read_bytes() for p in [*older, path]]
    assert b"".join(texts) == stream
    assert all(len(t) <= 100 for t in texts)
    assert all(t.endswith(b"\n") for t in texts if t), "a file ends mid-line"


@pytest.mark.slow
def test_a_writer_that_outlives_close_neither_holds_it_up_nor_loses_silently(tmp_path):
    """A quiet pipe costs no CPU (the thread waits in poll), a line the writer left unended
    is written once the pipe stays quiet, and close() takes what came, then says on a line
    of its own that later output is not in the file."""
    path = tmp_path / "log" / "spark.log"
    output = JvmLog(SparkLog(path, -1, -1))
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, time\nos.write(2, b'before\\nhalf a line'); time.sleep(60)"],
        stderr=output.write_fd,
    )
    try:
        output.started()
        deadline = time.monotonic() + 30
        while path.read_text() != "before\nhalf a line" and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = time.thread_time(), time.process_time()
        time.sleep(0.5)
        assert time.process_time() - cpu[1] < 0.05, "the reader busy-loops on a quiet pipe"
        start = time.monotonic()
        output.close(0.5)
        assert time.monotonic() - start < 2.0
        assert path.read_text() == (
            "before\nhalf a line\n(the JVM still runs: what it writes from here on is not in this file)\n"
        )
    finally:
        child.kill()
        child.wait()


def test_the_services_spark_log_is_bounded_by_the_service_logs_properties(tmp_path):
    from bridgemgr.props import load_properties

    props = load_properties(
        overrides=[
            f"imq.varhome={tmp_path}",
            "imq.instancename=i1",
            "imq.log.file.rolloverbytes=10m",
            "imq.log.file.rolloversecs=3600",
        ]
    )
    assert SparkLog.for_service(props) == SparkLog(tmp_path / "instances/i1/log/spark.log", 10 << 20, 3600, 10)
