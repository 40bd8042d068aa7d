"""A drain as Spark batch jobs over the source log's offsets (no streaming query).

The drain's own process is the source runner: a Receiver thread receives, logs and only
then acknowledges; BatchDrain takes what is logged, cuts it into slices of offsets and runs
one RDD job per batch, each task send_slices() (the sink's Transfer over its slice), then
records the batch's counts and deletes its log segments.

Rules: at-least-once: what is logged stays in the log until its job returned, and the next
drain with the same checkpoint sends it first; executors unpickle send_slices by reference,
so this module imports only the light options and counts modules at the top.

Design notes: docs/spark.md#internals-sparkdrainjobpy.
"""

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
        item for lo, hi, packed in slices for item in records(options, lo, hi, packed)
    )


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
            threading.Thread(
                target=hold_without_executors,
                args=(self.spark, self.options, lambda: not done.is_set()),
                name=f"executors {self.options.link}",
                daemon=True,
            ).start()
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
            (a, b, receiver.log.pack(a, b) if self.options.ship_log else None) for a, b in offset_slices(lo, hi, parts)
        ]
        self.sc.setJobGroup(self._group, f"batch {batch}: offsets {lo} .. {hi - 1}", interruptOnCancel=True)
        counts = (
            self.sc.parallelize(slices, len(slices))
            .mapPartitions(functools.partial(send_slices, self.options))
            .collect()
        )
        record_batch(self.options.stats, batch, sum_counts(counts))
