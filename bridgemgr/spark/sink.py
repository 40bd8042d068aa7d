"""The streaming sink of a runner=spark link: tasks transfer, the driver records counts.

LinkStreamWriter.write() runs in executor tasks, one per log slice of the micro-batch. Each
Python worker keeps one Transfer per link (transfer.py; worker reuse: the next task of the
link finds it), which runs the pipeline steps and sends or gives to the DMQs, and returns
the task's counts (BatchCounts, counts.py). commit() (driver, once per batch) appends them
to the link's stats file, one JSON line per batch id (a retried batch id replaces the
earlier line when read).

Spark unpickles the writer and the counts in short-lived processes too (the write's
planning, the sink's commit on the driver): this module imports nothing of the bridge, the
transfer is imported in the worker that transfers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from ..private import open_private_text
from .counts import BatchCounts, sum_counts
from .options import LinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from .transfer import Transfer

log = logging.getLogger("imq.bridge.spark.sink")


_transfers: dict[LinkOptions, Transfer] = {}


class LinkStreamWriter(DataSourceStreamArrowWriter):
    """Executors: transfer a log slice; driver: record the batch's counts."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BatchCounts:
        return worker_transfer(self.options).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        record_batch(self.options.stats, batchId, sum_counts(m for m in messages if isinstance(m, BatchCounts)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "link %s: batch %d failed; it runs again from the source log at the next start", self.options.link, batchId
        )


def worker_transfer(options: LinkOptions) -> Transfer:
    """This Python worker's Transfer of the link (made by its first task, kept for the
    next: worker reuse)."""
    transfer = _transfers.get(options)
    if transfer is None:
        from .transfer import Transfer

        transfer = _transfers[options] = Transfer(options)
    return transfer


def record_batch(stats: str | Path, batch_id: int, total: BatchCounts) -> None:
    """Append a batch's counts to the link's stats file (one JSON line)."""
    line = {"batch": batch_id, "at": time.time(), **total.__dict__}
    with open_private_text(stats, "a") as out:
        out.write(json.dumps(line) + "\n")


def read_stats(path: str | Path) -> dict[int, dict[str, Any]]:
    """The stats file's lines by batch id (a retried batch's last line wins)."""
    found: dict[int, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:  # a line cut short by a crash
                    continue
                found[int(entry["batch"])] = entry
    except FileNotFoundError:
        pass
    return found
