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
    assert one_line(PY4J) == ("cannot start the Spark query: SparkClassNotFoundException: "
                              "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: imqbridge_link.")
    assert one_line(PYTHON) == ("Spark query failed: [STREAM_FAILED] Query [id = 1] terminated "
                                "with exception: Job aborted: LinkHalted: the transformer failed on ID:1")
    assert one_line("cannot start the Spark query: FileExistsError: [Errno 17] File exists: /x") \
        == "cannot start the Spark query: FileExistsError: [Errno 17] File exists: /x"
    assert "\n" not in one_line(PY4J + PYTHON)
