# How it works: `imqbridgemgr drain` runs a link as plain Spark jobs, one per batch, not as
# a streaming query: a query over a Python data source first has Spark start its helper
# processes one after another (the source's lookup and creation, the source runner, read
# and write planning, the sink's commit: ~5.6 s on 2 cores), which a one-off drain pays in
# full. Here the drain's own process is the source runner: a Receiver (receiver.py) thread
# receives, logs (fsync) and only then acknowledges, up to two batches ahead of the batch
# being sent, as a link's does. BatchDrain's thread takes what is logged from the log's
# first offset (at most maxPerBatch, and when shipped about slices.ship_batch_bytes; the
# first batch is the first segment logged, so the executors start early), cuts it into
# slices of offsets (TASKS_PER_SLOT per task slot,
# `parallelism`: the job's tail does not wait for one slow task while the other slots
# idle; one slot, one slice: the log's order) and runs one RDD job over them: each task
# is send_slices(), the sink's Transfer.transfer over its slice's records (the same steps,
# stamping, confirm window and DMQs as a link's task, in the executor's reused Python
# worker). The records come as a link's task gets them (slices.py, LinkOptions.ship_log):
# read by the task from the driver's log (a local master), or, when the executors cannot
# read it (any other master, by default), packed by the driver into the slice itself (the
# RDD's element: SourceLog.pack, more slices when a batch is big) and read by the task from
# those bytes (slices.records). When the job returns, every send of the batch is confirmed: its counts
# are appended to the stats file (record_batch, as a link's commit does) and the log's
# segments below its end are deleted. Batches run one after the other (with one task slot
# in the log's order, as a link's); receiving the next batch overlaps the executors'
# sending of this one. The drain
# ends when the receiver has had nothing for receiveWait and all it logged is sent.
#
# Failures: a task that fails (a lost target, a transformer's HALT) fails the job once
# Spark's task retries are spent, and the drain ends with that error; what is logged stays
# in the log, and the next drain with the same checkpoint sends it first (at-least-once:
# a duplicate carries the stamped source message id). A kill -9 loses nothing: what was
# not logged was not acknowledged, what was logged is sent by the next drain. On a
# cluster, a thread watches the application's executors (runner.hold_without_executors):
# with none, the receiver takes nothing more from the source (receiver.py's hold) and
# drain.py stops the drain after --timeout s without one (cancel()), what is logged kept.
# Executors unpickle send_slices by reference: this module imports only the light options
# and counts modules at the top.
"""A drain as Spark batch jobs over the source log's offsets (no streaming query)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from .counts import BatchCounts, sum_counts
from .options import LinkOptions, offset_slices

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .receiver import Receiver
    from .slices import Packed

Slice = tuple[int, int, "Packed | None"]  # offsets [lo, hi) and, when shipped, their records

# tasks per task slot in a batch's job: a slot whose task ends first takes another instead
# of idling until the slowest task of the batch ends (one slot: one task, the log's order)
TASKS_PER_SLOT = 4


def send_slices(options: LinkOptions, slices: Iterable[Slice]) -> Iterator[BatchCounts]:
    """(An executor task) transfer the records of the task's slices (from the source log,
    or the packed records the driver shipped in them); its counts."""
    from .sink import worker_transfer
    from .slices import records

    yield worker_transfer(options).transfer(
        item for lo, hi, packed in slices for item in records(options, lo, hi, packed))


class BatchDrain:
    """The driver of a drain: receive -> log -> acknowledge (a Receiver's thread) and one
    Spark job per logged batch (this object's thread), until the source is empty."""

    def __init__(self, spark: SparkSession, options: LinkOptions) -> None:
        self.spark = spark
        self.sc = spark.sparkContext
        self.options = options
        self.error: BaseException | None = None  # why the drain stopped early
        self._receiver: Receiver | None = None
        self._cancelled = threading.Event()
        self._group = f"imqbridge drain {options.bridge}.{options.link}"
        self._thread = threading.Thread(target=self._run, daemon=True, name=self._group)

    def start(self) -> BatchDrain:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the drain has ended (after up to ``timeout`` s)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """Stop after (or cancel) the job running, and the receiving (a held receiver
        waits for nothing more): what is logged stays in the log."""
        self._cancelled.set()
        self.sc.cancelJobGroup(self._group)
        receiver = self._receiver
        if receiver is not None:
            receiver.stop()
        self.wait(self.options.receive_wait + 30.0)

    def _run(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # the CLI's thread reports it
            self.error = exc

    def run(self) -> None:
        """Batches until the source has had nothing for receiveWait and the log is sent."""
        from .receiver import Receiver, hold_receiving
        from .runner import hold_without_executors
        from .sink import read_stats
        from .slices import batch_end, quiet_task_size_warning

        hold_receiving(self.options.source_log, False)  # (a hold a dead drain left)
        done = threading.Event()  # (ends the executor watch)
        receiver = self._receiver = Receiver(self.options)
        receiver.until_empty = True
        if self.options.ship_log:
            quiet_task_size_warning(self.spark)
        if not (self.sc.master or "local").startswith("local"):
            threading.Thread(target=hold_without_executors,
                             args=(self.spark, self.options, lambda: not done.is_set()),
                             name=f"executors {self.options.link}", daemon=True).start()
        try:
            bounds = receiver.log.bounds()
            lo = bounds[0] if bounds else 0
            batch = max(read_stats(self.options.stats), default=-1) + 1  # after a dead drain's
            while not self._cancelled.is_set():
                end = receiver.logged_beyond(lo, self.options.receive_wait)
                if end <= lo:
                    return
                hi = batch_end(self.options, receiver.log, lo, min(end, lo + self.options.max_per_batch))
                self._send(receiver, batch, lo, hi)
                receiver.log.delete_through(hi)
                lo, batch = hi, batch + 1
        finally:
            done.set()
            receiver.stop()

    def _send(self, receiver: Receiver, batch: int, lo: int, hi: int) -> None:
        """One Spark job: offsets [lo, hi) in slices, one task each (with their records when
        the executors cannot read the log); the batch's counts go to the stats file once
        every task's sends are confirmed."""
        from .sink import record_batch
        from .slices import ship_parts

        parallelism = self.options.parallelism
        parts = parallelism if parallelism == 1 else parallelism * TASKS_PER_SLOT
        if self.options.ship_log:
            parts = ship_parts(receiver.log, lo, hi, parts)
        slices: list[Slice] = [
            (a, b, receiver.log.pack(a, b) if self.options.ship_log else None)
            for a, b in offset_slices(lo, hi, parts)]
        self.sc.setJobGroup(self._group, f"batch {batch}: offsets {lo} .. {hi - 1}",
                            interruptOnCancel=True)
        counts = (self.sc.parallelize(slices, len(slices))
                  .mapPartitions(functools.partial(send_slices, self.options))
                  .collect())
        record_batch(self.options.stats, batch, sum_counts(counts))
