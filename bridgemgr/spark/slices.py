"""Which records an executor task transfers: from the shared source log or shipped.

Two modes (LinkOptions.ship_log, from imq.bridge.spark.sourcelog): "shared", the executors
read the driver's log at the same path (a local master, or a shared mount the operator
declares), only offsets travel; "shipped" (the default on any other master), the driver
packs each slice's records into the task (SourceLog.pack) and the task spills them into a
folder of its own that the sink's write() reads (task_records).

Rule: never count on the driver's disk on a cluster; a shipped task carries about
SHIP_BYTES at most, so a big batch is cut into more slices.

Design notes: docs/spark.md#internals-sparkslicespy.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..private import private_dir
from .log import Record, SourceLog, parse_segment
from .options import LinkOptions

SHIP_BYTES = 32 * 1024 * 1024  # about this many bytes of records per shipped task at most
# A shipped batch holds about this many shipped tasks at most (or `parallelism` where more):
# the driver packs a whole batch before Spark sends its tasks (SHIP_BYTES each).
SHIP_BATCH_TASKS = 4
SOURCELOG_MODES = ("auto", "shared", "shipped")

Packed = list[tuple[int, int, bytes]]  # packed segments (start, end, bytes): SourceLog.pack


def ships_log(master: str, mode: str = "auto") -> bool:
    """Whether the driver ships records to the executors (imq.bridge.spark.sourcelog):
    "shipped" always, "shared" never, "auto" unless the master is local (the executors
    then run on the driver's machine and read its log)."""
    if mode not in SOURCELOG_MODES:
        raise ValueError(f"imq.bridge.spark.sourcelog is {mode!r}; expected one of {', '.join(SOURCELOG_MODES)}")
    if mode == "auto":
        return not master.strip().startswith("local")
    return mode == "shipped"


def quiet_task_size_warning(spark: Any) -> None:
    """Raise the level of Spark's TaskSetManager logger to ERROR in ``spark``'s JVM: a
    shipped batch's tasks are bigger than its 1000 KiB "maximum recommended task size" by
    design, and it would warn once per batch (its lost-task warnings go too; a failed
    task still fails the query, which the link logs)."""
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("org.apache.spark.scheduler.TaskSetManager", log4j.Level.ERROR)


def ship_parts(log: SourceLog, lo: int, hi: int, parallelism: int) -> int:
    """How many slices [lo, hi) is shipped in: ``parallelism``, or more so that each
    carries about SHIP_BYTES at most (estimated from the segments' sizes)."""
    size = sum(seg.path.stat().st_size for seg in log.segments() if seg.end > lo and seg.start < hi)
    return max(parallelism, -(-size // SHIP_BYTES))


def ship_batch_bytes(parallelism: int) -> int:
    """About how many bytes of records a shipped batch holds at most (the driver packs
    them all, and Spark holds its serialised tasks): a shipped task per task slot, at
    least SHIP_BATCH_TASKS; 1 KiB messages never reach it (10,000 hold ~12 MiB)."""
    return max(parallelism, SHIP_BATCH_TASKS) * SHIP_BYTES


def batch_end(options: LinkOptions, log: SourceLog, lo: int, hi: int) -> int:
    """Where a batch of the log's [lo, hi) ends: at ``hi``, or earlier when the batch is
    shipped (the driver packs it whole) and its segments hold ship_batch_bytes."""
    if not options.ship_log:
        return hi
    return log.end_within(lo, hi, ship_batch_bytes(options.parallelism))


def records(options: LinkOptions, lo: int, hi: int, packed: Packed | None = None) -> Iterator[tuple[Record, str]]:
    """Records lo .. hi-1 with their source provider's name: from ``packed`` (what the
    driver shipped) when given, else from the source log (SourceLogError when a record is
    not there)."""
    if packed is None:
        yield from SourceLog(options.source_log).read(lo, hi)
        return
    for start, _end, data in packed:
        for record, provider in parse_segment(data, f"shipped {start}"):
            if lo <= record.offset < hi:
                yield record, provider


def spill_folder(options: LinkOptions, lo: int, hi: int) -> Path:
    """This executor's folder for a shipped slice: under Spark's files folder of the
    application (removed when the executor ends), named by the link's log and the slice."""
    try:
        from pyspark import SparkFiles

        root = Path(SparkFiles.getRootDirectory())
    except Exception:  # not in a Spark process (tests)
        root = Path(tempfile.gettempdir())
    key = hashlib.sha256(f"{options.source_log}\0{options.link}".encode()).hexdigest()[:16]
    return root / "imqbridge-slices" / f"{key}-{lo}-{hi}"


def spill(options: LinkOptions, lo: int, hi: int, packed: Packed) -> None:
    """(The task's reader) the shipped records of slice [lo, hi) into its spill folder."""
    folder = spill_folder(options, lo, hi)
    private_dir(folder.parent)
    local = SourceLog(folder).open()
    for start, end, data in packed:
        local.put(start, end, data)


@contextlib.contextmanager
def task_records(options: LinkOptions, runs: Sequence[tuple[int, int]]) -> Iterator[Iterator[tuple[Record, str]]]:
    """(The task's sink) the records of ``runs`` (its rows' offsets): from the slice's
    spill folder when the driver ships them (the folder is removed afterwards, however the
    task ends), else from the shared source log."""
    if not options.ship_log or not runs:
        yield (item for lo, hi in runs for item in records(options, lo, hi))
        return
    folder = spill_folder(options, runs[0][0], runs[-1][1])
    local = SourceLog(folder)
    try:
        yield (item for lo, hi in runs for item in local.read(lo, hi))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
