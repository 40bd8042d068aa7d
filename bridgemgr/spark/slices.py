# How it works: where an executor task of a runner=spark link (or a drain) gets the records
# of its log slice. The source log is on the driver's disk (<checkpoint>/sourcelog, log.py),
# and Spark's own checkpoint needs no storage the executors share (the driver alone writes
# it: the query keeps no state). Two modes (LinkOptions.ship_log), chosen by
# imq.bridge.spark.sourcelog (ships_log): "shared", the executors read the log at the same
# path themselves (a local master; or a shared mount the operator declares): only offsets
# travel; "shipped" (the default on any other master: never count on the driver's disk), the
# driver packs each slice's records (log.py's segment format, SourceLog.pack) into the
# InputPartition, which Spark serialises into the task. In the task, the reader (read())
# unpacks them into a folder of the executor's own (spill: a small SourceLog under Spark's
# per-application files folder, not fsynced: scratch) before it yields the slice's offsets,
# and the sink's write(), which Spark runs in another Python process of the same task and
# so on the same machine, reads them there (task_records) and removes the folder. The bytes
# never pass through the JVM as rows (Arrow conversions each way: ~100 us per 1 KiB message
# on 2 cores); what shipping costs is the packing on the driver and one pickled copy per
# task. A task carries about SHIP_BYTES at most (Spark refuses a task above
# spark.rpc.message.maxSize, 128 MiB): a bigger batch is cut into more slices; Spark's
# warning for every stage whose task exceeds 1000 KiB ("a task of very large size"), a
# line per batch, is silenced in a session that ships (quiet_task_size_warning). A shipped
# batch (a link's micro-batch, a drain's job) ends early once its segments' files hold
# ship_batch_bytes (SourceLog.end_within: file sizes, no record read), so that the driver
# packs about that much at most however big the messages; shared batches are not cut (the
# driver holds none of their records). A batch job
# that holds its slices itself (records(): from the packed bytes in memory, or the log)
# needs no spill.
"""Which records an executor task transfers: from the shared source log or shipped."""

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
        raise ValueError(f"imq.bridge.spark.sourcelog is {mode!r}; expected one of "
                         f"{', '.join(SOURCELOG_MODES)}")
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
    log4j.core.config.Configurator.setLevel("org.apache.spark.scheduler.TaskSetManager",
                                            log4j.Level.ERROR)


def ship_parts(log: SourceLog, lo: int, hi: int, parallelism: int) -> int:
    """How many slices [lo, hi) is shipped in: ``parallelism``, or more so that each
    carries about SHIP_BYTES at most (estimated from the segments' sizes)."""
    size = sum(seg.path.stat().st_size for seg in log.segments()
               if seg.end > lo and seg.start < hi)
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


def records(options: LinkOptions, lo: int, hi: int,
            packed: Packed | None = None) -> Iterator[tuple[Record, str]]:
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
def task_records(options: LinkOptions, runs: Sequence[tuple[int, int]]
                 ) -> Iterator[Iterator[tuple[Record, str]]]:
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
