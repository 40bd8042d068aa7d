"""A Spark link's last error is one line for `list link`: Py4J's wrapper and the stack
frames go, the innermost exception stays."""

from bridgemgr.spark.runner import one_line

PY4J = """cannot start the Spark query: Py4JJavaError: An error occurred while calling o145.start.
: org.apache.spark.SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] Failed to find the data source: imqbridge_link.
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.dataSourceNotFoundError(QueryExecutionErrors.scala:725)
Caused by: java.lang.ClassNotFoundException: imqbridge_link.DefaultSource
\tat java.base/java.net.URLClassLoader.findClass(URLClassLoader.java:445)
"""
PYTHON = """Spark query failed: [STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted
Traceback (most recent call last):
  File "/x/sink.py", line 3, in write
    raise LinkHalted(text)
bridgemgr.spark.sink.LinkHalted: the transformer failed on ID:1
"""


def test_one_line_keeps_the_first_line_and_the_innermost_exception():
    assert one_line(PY4J) == (
        "cannot start the Spark query: SparkClassNotFoundException: "
        "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: imqbridge_link."
    )
    assert one_line(PYTHON) == (
        "Spark query failed: [STREAM_FAILED] Query [id = 1] terminated "
        "with exception: Job aborted: LinkHalted: the transformer failed on ID:1"
    )
    assert (
        one_line("cannot start the Spark query: FileExistsError: [Errno 17] File exists: /x")
        == "cannot start the Spark query: FileExistsError: [Errno 17] File exists: /x"
    )
    assert "\n" not in one_line(PY4J + PYTHON)


STREAM = (
    "Spark query failed: StreamingQueryException: [STREAM_FAILED] Query [id = "
    "8fcc8217-5d43-4cee-8f2c-c329ee6c0d8f, runId = c519263c-cf51-40ee-a7f5-263e2436ffaf] "
    "terminated with exception: [PYTHON_EXCEPTION] An exception was thrown from the Python "
    "worker: Traceback (most recent call last):\n"
    '  File "/x/log.py", line 56, in read\n'
    '    raise SourceLogError(f"source log {self.folder}: records {expect} .. {hi - 1} are "\n'
    "bridgemgr.spark.log.SourceLogError: source log /var/imq/instances/cluster/bridges/jb/"
    "spark/l1/checkpoint/sourcelog: records 0 .. 1 are not there (was the checkpoint's "
    "sourcelog folder changed?)\n"
)


def test_one_line_keeps_the_whole_cause_of_a_long_streaming_failure():
    """Spark's long first line (the query's ids, the Python wrapper) is cut, not the cause:
    before, the 300 characters ended at "Traceback (most recent call last): SourceLogError"."""
    line = one_line(STREAM)
    assert len(line) <= 300 and "\n" not in line
    assert line.startswith("Spark query failed: StreamingQueryException: [STREAM_FAILED] Query terminated")
    assert line.endswith(
        "SourceLogError: source log /var/imq/instances/cluster/bridges/jb/spark/l1/"
        "checkpoint/sourcelog: records 0 .. 1 are not there (was the checkpoint's "
        "sourcelog folder changed?)"
    )
    assert "runId" not in line and "Traceback" not in line
