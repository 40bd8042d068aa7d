"""The streaming source of a runner=spark link: offsets over the source log, log slices.

LinkDataSource (format "imqbridge_link", options a LinkOptions) is the Python streaming data
source. Its driver-side reader asks the Receiver how far the source log goes (latestOffset,
partitions, commit); read() runs on executors and yields only log offsets, which the sink's
task reads from the log itself (or from the slice the driver shipped: slices.py).

Rules: a message's bytes never cross into the JVM; this module imports only pyarrow, pyspark
and the light options and slices modules, because Spark unpickles its classes in several
short-lived processes.

Design notes: docs/spark.md#internals-sparksourcepy.
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .options import FORMAT, SCHEMA, LinkOptions, offset_slices
from .slices import Packed, batch_end, ship_parts, spill

if TYPE_CHECKING:
    from .receiver import Receiver

ARROW_ROWS = 8192  # rows (offsets) per Arrow batch that read() yields
_ARROW_SCHEMA = pa.schema([("offset", pa.int64())])


class LinkDataSource(DataSource):
    """A link's source (streamReader) and target (streamWriter) for Structured Streaming."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> LinkStreamReader:
        return LinkStreamReader(LinkOptions.from_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .sink import LinkStreamWriter

        return LinkStreamWriter(LinkOptions.from_options(self.options))


class LogSlice(InputPartition):
    """Offsets lo .. hi-1 of the source log: one executor task; with ``packed``, their
    records too (shipped by the driver: slices.py)."""

    def __init__(self, lo: int, hi: int, packed: Packed | None = None) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi
        self.packed = packed


def slices(lo: int, hi: int, parts: int) -> list[LogSlice]:
    """[lo, hi) cut into at most ``parts`` nearly equal slices (none when empty)."""
    return [LogSlice(a, b) for a, b in offset_slices(lo, hi, parts)]


class LinkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: receive -> log -> acknowledge, ahead of Spark; executor side: read log
    slices."""

    def __init__(self, options: LinkOptions) -> None:
        self.options = options
        # driver side only, made on first use (an executor's instance never connects)
        self._receiver: Receiver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_receiver": None}

    # --- offsets (driver) -----------------------------------------------------------------------
    def _driver(self) -> Receiver:
        if self._receiver is None:
            from .receiver import Receiver

            self._receiver = Receiver(self.options)
        return self._receiver

    def initialOffset(self) -> dict:
        bounds = self._driver().log.bounds()
        return {"offset": bounds[0] if bounds else 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """A queue has no "latest offset" to aim at: a drain takes batches until the source
        has had nothing for receiveWait seconds (latestOffset then returns its start)."""
        self._driver().until_empty = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = int(start["offset"])
        cap = self.options.max_per_batch
        if isinstance(limit, ReadMaxRows):
            cap = max(1, min(cap, limit.max_rows))
        receiver = self._driver()
        end = receiver.logged_beyond(first, self.options.receive_wait)
        if end <= first:
            return start
        return {"offset": batch_end(self.options, receiver.log, first, min(end, first + cap))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        if not self.options.ship_log:
            return slices(lo, hi, self.options.parallelism)
        log = self._driver().log  # executors cannot read it: each slice carries its records
        parts = slices(lo, hi, ship_parts(log, lo, hi, self.options.parallelism))
        for part in parts:
            part.packed = log.pack(part.lo, part.hi)
        return parts

    def commit(self, end: dict) -> None:
        self._driver().log.delete_through(int(end["offset"]))

    def stop(self) -> None:
        """The query terminated: the receiver stops receiving and lets go of the log."""
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None

    # --- executors ------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The slice's offsets; the sink's task reads their records from the source log,
        or from this executor's spill of what the driver shipped (written here first)."""
        assert isinstance(partition, LogSlice)
        if partition.packed is not None:
            spill(self.options, partition.lo, partition.hi, partition.packed)
        for lo in range(partition.lo, partition.hi, ARROW_ROWS):
            hi = min(lo + ARROW_ROWS, partition.hi)
            # from a buffer: pa.array() of Python ints imports pandas (~0.4 s per worker)
            data = pa.py_buffer(array.array("q", range(lo, hi)))
            offsets = pa.Array.from_buffers(pa.int64(), hi - lo, [None, data])
            yield pa.RecordBatch.from_arrays([offsets], schema=_ARROW_SCHEMA)
